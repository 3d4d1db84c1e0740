"""Fixtures shared by every test: a real Azurite for the session, servers per test.

Each test gets its own storage name prefix instead of a flushed account, and the
servers it starts are stopped (and their queues and tables deleted) after it. Every
success answer of those servers is checked against Taskcluster's output schema of its
method (``tests/replies.py``): a test that got one that departs fails.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from typing import Any

import aiohttp
import pytest

from azqueue.api.app import create_app
from azqueue.config import Settings, StorageSettings
from azqueue.devstorage import Azurite, free_port
from azqueue.storage.account import StorageAccount
from azqueue.storage.queues import Queues
from azqueue.storage.tasks import TaskStore
from azqueue.testing.faultproxy import FaultProxy
from azqueue.testing.hawk import hawk_signer
from azqueue.testing.storage import StorageInspector
from tests.replies import ReplyCheck
from tests.servers import ROOT, Server, ServerFactory


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the broker (the ``amqp_url`` fixture) is marked ``rabbitmq``; the
    ``slow`` tests run first (in their order), so that in processes running at once
    (``scripts/test``) none of them starts last and holds the end of the run."""
    for item in items:
        if "amqp_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.rabbitmq)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


REPLY_CHECK = pytest.StashKey[ReplyCheck]()
# How long the test servers' claimWork calls wait for work (a test may set another): a
# worker stopped at the end of a test waits for its last call to be answered.
CLAIM_WORK_WAIT = 2.0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """A test fails if its servers gave an answer its method's output schema refuses;
    when it fails anyway, its failure says so too."""
    check = item.stash.get(REPLY_CHECK, None)
    try:
        result = yield
    except Exception as failure:
        if check is not None and (departures := check.take()):
            failure.add_note(departures)
        raise
    if check is not None and (departures := check.take()):
        raise AssertionError(departures)
    return result


@pytest.fixture(scope="session")
async def azurite() -> AsyncIterator[Azurite]:
    instance = await Azurite.start()
    yield instance
    await instance.stop()


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 where connections are refused for the whole test: it is bound
    and never listened on, so nothing else (another test process, a server starting in
    the background) can take it, as it could a port that was merely free a moment ago."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])


@pytest.fixture
def storage_prefix() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
async def make_server(request: pytest.FixtureRequest, azurite: Azurite,
                      storage_prefix: str) -> AsyncIterator[ServerFactory]:
    """Start servers sharing one storage prefix (replicas of one deployment), their
    answers checked against Taskcluster's output schemas."""
    servers: list[Server] = []
    check = request.node.stash[REPLY_CHECK] = ReplyCheck()

    async def start(**overrides: Any) -> Server:
        overrides.setdefault("claim_work_wait", CLAIM_WORK_WAIT)
        settings = Settings(
            storage=StorageSettings(azurite.connection_string, storage_prefix),
            tip_secrets=overrides.pop("tip_secrets", ("test-secret-0123456789abcdef",)),
            root=overrides.pop("root", ROOT), host="127.0.0.1", port=free_port(),
        ).with_(**overrides)
        servers.append(await Server.start(settings, check.install(create_app(settings))))
        return servers[-1]

    yield start
    for server in reversed(servers):
        await server.stop()
    await _delete_storage(azurite.connection_string, storage_prefix)
    assert not (departures := check.take()), departures


async def _delete_storage(conn: str, prefix: str) -> None:
    """Everything of the test's prefix, as the plugin deletes it: queues, tables and blob
    containers (``StorageAccount.delete_all``)."""
    account = StorageAccount(StorageSettings(conn, prefix))
    try:
        await account.delete_all()
    finally:
        await account.close()


@pytest.fixture
async def server(make_server: ServerFactory) -> Server:
    return await make_server()


@pytest.fixture
async def storage(azurite: Azurite, storage_prefix: str) -> AsyncIterator[StorageInspector]:
    """What the test's servers keep in storage (their shared prefix), read straight from
    Azurite: not through a test's fault proxy, not counted by the servers."""
    async with StorageInspector(StorageSettings(azurite.connection_string,
                                                storage_prefix)) as inspector:
        yield inspector


@pytest.fixture
async def account(azurite: Azurite, storage_prefix: str) -> AsyncIterator[StorageAccount]:
    """A storage account of the test's own on its servers' prefix, straight to Azurite
    (not counted by the servers): for a test that writes what the API would not (a row
    of an earlier release, a message of its own) through the stores built on it."""
    account = StorageAccount(StorageSettings(azurite.connection_string, storage_prefix))
    yield account
    await account.close()


@pytest.fixture
def task_store(account: StorageAccount) -> TaskStore:
    """The test's own ``TaskStore`` on its servers' task table (``account``)."""
    return TaskStore(account)


@pytest.fixture
def queues(account: StorageAccount) -> Queues:
    """The test's own ``Queues`` on its servers' queues (``account``)."""
    return Queues(account)


@pytest.fixture
async def proxy(azurite: Azurite) -> AsyncIterator[FaultProxy]:
    """A fault proxy in front of the test Azurite (servers reach it through
    ``proxy.connection_string``), with no faults until a test asks for some."""
    proxy = FaultProxy(azurite.ports)
    await proxy.start()
    yield proxy
    await proxy.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A session whose requests to the queue API are signed with the root client."""
    async with aiohttp.ClientSession(
            middlewares=(hawk_signer(ROOT.client_id, ROOT.access_token),)) as session:
        yield session


@pytest.fixture
async def anonymous() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
