"""The throwaway azqueue of the ``azqueue_server`` fixture (``AzqueueServer``): a server on
its own storage prefix and port, with a fresh root client, and what a test does with it
(its clients' options, tasks created with Taskcluster's defaults, waiting for a
resolution)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from azqueue.api.app import create_app
from azqueue.config import Client, Settings, StorageSettings
from azqueue.devstorage import free_port
from azqueue.storage.account import StorageAccount
from azqueue.testing.events import RecordedEvents
from azqueue.testing.inprocess import InProcessServer
from azqueue.testing.resolutions import Resolution, definition, wait
from azqueue.worker.client import Credentials

if TYPE_CHECKING:
    import taskcluster

log = logging.getLogger(__name__)

ROOT_CLIENT_ID = "azqueue-test-root"
EVENTS_OFF = ("task events are off in this azqueue_server: ask for the azqueue_events "
              "fixture to record them, or give pytest --azqueue-events=AMQP_URL to publish "
              "them to a broker")
# The server's claimWork waits this long for work: a drained worker's last claimWork
# call, which drain() waits for, ends that much after the last task.
CLAIM_WORK_WAIT = 1.0
CLAIM_WORK_POLL_INTERVAL = 0.3
SHUTDOWN_TIMEOUT = 0.1
# How long the credentials of temporary_credentials() hold, and how far back they start
# (a clock a little behind the server's).
TEMPORARY_LIFETIME = timedelta(hours=6)
TEMPORARY_SLACK = timedelta(minutes=5)

def new_prefix() -> str:
    """A fresh storage prefix: every queue, table and container of a server starts with it."""
    return "t" + uuid.uuid4().hex[:12]


def server_settings(connection_string: str, prefix: str, amqp_url: str = "",
                    **overrides: Any) -> Settings:
    """Settings of a throwaway server on its own port: a fresh root client (scope ``*``)
    and tip secret, claimWork answering within ``CLAIM_WORK_WAIT`` seconds, events on
    only with ``amqp_url``; ``overrides`` sets fields of ``Settings`` by name (TypeError
    naming the known ones for any other). ``clients`` may be a mapping of client ids to
    their scopes: each gets a fresh access token."""
    clients = overrides.get("clients")
    if isinstance(clients, Mapping):
        overrides["clients"] = tuple(
            Client(str(client_id), secrets.token_urlsafe(24), _scopes(client_id, scopes))
            for client_id, scopes in clients.items())
    known = {f.name for f in dataclasses.fields(Settings)} - {"storage", "root", "host", "port"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"unknown azqueue setting(s) {', '.join(unknown)}; the settings a test "
                        f"may set: {', '.join(sorted(known))}")
    settings = Settings(
        storage=StorageSettings(connection_string, prefix),
        tip_secrets=(secrets.token_urlsafe(24),),
        root=Client(ROOT_CLIENT_ID, secrets.token_urlsafe(24), ("*",)),
        host="127.0.0.1", port=free_port(), amqp_url=amqp_url,
        claim_work_wait=CLAIM_WORK_WAIT, claim_work_poll_interval=CLAIM_WORK_POLL_INTERVAL)
    return dataclasses.replace(settings, **overrides)


def _scopes(client_id: object, scopes: object) -> tuple[str, ...]:
    if isinstance(scopes, str) or not isinstance(scopes, Sequence):
        raise TypeError(f"the scopes of client {client_id!r} must be a list of strings, "
                        f"not {scopes!r}")
    return tuple(str(s) for s in scopes)


@dataclass
class AzqueueServer:
    """A running azqueue: ``root_url``, the root client's ``client_id`` and
    ``access_token``, ``options()`` for the official clients and ``queue()``, a
    ``taskcluster.Queue`` with them. Its state lives under ``prefix`` on its storage."""

    settings: Settings
    _server: InProcessServer = field(repr=False)

    @property
    def root_url(self) -> str:
        return self.settings.public_root_url

    @property
    def client_id(self) -> str:
        return self.settings.root.client_id

    @property
    def access_token(self) -> str:
        return self.settings.root.access_token

    @property
    def prefix(self) -> str:
        return self.settings.storage.prefix

    @property
    def credentials(self) -> Credentials:
        return Credentials(self.client_id, self.access_token)

    def credentials_of(self, client: Credentials | str | None = None) -> Credentials:
        """The credentials ``client`` names: the root client's for None, those of the
        server's client of that id for a string (``@pytest.mark.azqueue(clients=...)``),
        a ``Credentials`` as it is."""
        if client is None:
            return self.credentials
        if isinstance(client, Credentials):
            return client
        for known in self.settings.clients:
            if known.client_id == client:
                return Credentials(known.client_id, known.access_token)
        ids = ", ".join(c.client_id for c in self.settings.clients) or "none"
        raise KeyError(f"no client {client!r} in this azqueue_server (its clients: {ids}); "
                       f"add it with @pytest.mark.azqueue(clients={{{client!r}: [scopes]}})")

    def temporary_credentials(self, scopes: Sequence[str]) -> Credentials:
        """Temporary credentials of the root client holding only ``scopes`` (as
        Taskcluster's auth service issues them), for a client as scoped as a real one."""
        import taskcluster

        if isinstance(scopes, str):
            raise TypeError(f"scopes must be a list of strings, not the string {scopes!r}")
        now = datetime.now(UTC)
        made = taskcluster.createTemporaryCredentials(
            self.client_id, self.access_token, now - TEMPORARY_SLACK, now + TEMPORARY_LIFETIME,
            list(scopes))
        return Credentials(made["clientId"], made["accessToken"], made["certificate"])

    def options(self, client: Credentials | str | None = None) -> dict[str, Any]:
        """What ``taskcluster.Queue(...)`` (and ``taskcluster.aio.Queue``) take, with the
        root client's credentials or those ``client`` names (see ``credentials_of``)."""
        return {"rootUrl": self.root_url,
                "credentials": self.credentials_of(client).as_options()}

    def queue(self, client: Credentials | str | None = None) -> taskcluster.Queue:
        """The official synchronous client, with the root client's credentials or those
        ``client`` names (see ``credentials_of``)."""
        try:
            import taskcluster
        except ImportError:
            raise RuntimeError("azqueue_server.queue() needs the official Taskcluster client: "
                               "pip install taskcluster") from None
        return taskcluster.Queue(self.options(client))

    def create_task(self, task_queue_id: str, payload: dict[str, Any] | None = None, *,
                    task_id: str | None = None, **fields: Any) -> str:
        """Create a task with Taskcluster's defaults filled in (``created`` now, ``deadline``
        in an hour, ``metadata``; see ``azqueue.testing.resolutions.definition``) and
        return its taskId (a new slugId unless ``task_id``); ``fields`` are fields of the
        task definition by name."""
        import taskcluster

        task_id = task_id or taskcluster.slugId()
        self.queue().createTask(task_id, definition(task_queue_id, payload, **fields))
        return task_id

    async def create_task_async(self, task_queue_id: str, payload: dict[str, Any] | None = None,
                                *, task_id: str | None = None, **fields: Any) -> str:
        """``create_task()`` for a test on an event loop of its own, which keeps running."""
        return await asyncio.to_thread(self.create_task, task_queue_id, payload,
                                       task_id=task_id, **fields)

    def wait(self, task_id: str, timeout: float = 60.0) -> Resolution:
        """The task's ``Resolution`` (``state``, ``reason``, ``runs``) once it is resolved;
        ``WaitTimeout`` (an AssertionError) after ``timeout`` seconds, saying what the
        task and its task queue hold. It only watches: a worker must run the task."""
        return wait(self.queue(), task_id, timeout)

    async def wait_async(self, task_id: str, timeout: float = 60.0) -> Resolution:
        """``wait()`` for a test on an event loop of its own, which keeps running."""
        return await asyncio.to_thread(self.wait, task_id, timeout)

    @classmethod
    async def start(cls, settings: Settings, events: RecordedEvents | None = None
                    ) -> AzqueueServer:
        """Serve ``settings``; with ``events``, its events are on and recorded there
        rather than published to a broker."""
        if events is None and not settings.amqp_url:
            log.info("%s", EVENTS_OFF)
        # What is still being answered when the test is over (a worker's last claimWork
        # call, given up) is cancelled at once rather than waited for, and so is what a
        # client gave up before: nothing of a test's server runs on after its test.
        server = await InProcessServer.start(
            settings, create_app(settings, events=events, events_off=None),
            shutdown_timeout=SHUTDOWN_TIMEOUT, handler_cancellation=True)
        return cls(settings, server)

    async def stop(self, keep_storage: bool = False) -> None:
        """Stop serving; delete every queue, table and container of its prefix unless
        ``keep_storage``."""
        await self._server.stop()
        if not keep_storage:
            account = StorageAccount(self.settings.storage)
            try:
                await account.delete_all()
            finally:
                await account.close()
