"""A tenant whose scopes cover many task queue names (``queue:poll-task-urls:wild/*``)
asks about name after name: what a name leaves behind in storage and in the server's
memory must be bounded, and reclaimed once nobody has used the name for a while."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
import taskcluster.aio

from azqueue.config import Client
from azqueue.testing import sas
from azqueue.testing.hawk import hawk_signer
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition, slugid
from azqueue.worker.sas import EMPTY_POLL, SasSource
from tests.servers import ROOT, ServerFactory
from tests.waiting import eventually

WILD = Client("tenant-w", "tenant-w-access-token-0123456789", (
    "queue:poll-task-urls:wild/*", "queue:claim-work:wild/*", "queue:worker-id:wild/*",
    "queue:create-task:lowest:wild/*", "queue:create-task:project:none", "queue:scheduler-id:-",
    "queue:resolve-task:*"))


def _signed(client: Client) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(middlewares=(hawk_signer(client.client_id,
                                                          client.access_token),))


async def test_poll_task_urls_of_new_names_make_no_azure_queue_and_their_urls_poll_empty(
        make_server: ServerFactory, storage: StorageInspector) -> None:
    server = await make_server(clients=(WILD,))
    before = await storage.queue_names()
    async with _signed(WILD) as http:
        for i in range(20):
            urls = await sas.poll_task_urls(http, server.api, "wild", f"name-{i}")
            assert await sas.poll_once(http, urls) == []  # what an empty queue answers
            async with http.get(f"{server.api}/poll-task-url/wild/other-{i}?pending=true") as r:
                assert r.status == 200, await r.text()
                assert not any((await r.json())["pending"]["queues"])
    assert await storage.queue_names() == before


async def test_claim_work_on_new_names_makes_no_azure_queue(
        make_server: ServerFactory, storage: StorageInspector) -> None:
    server = await make_server(clients=(WILD,), claim_work_wait=0.5)
    before = await storage.queue_names()
    async with _signed(WILD) as http:
        for i in range(10):
            async with http.post(f"{server.api}/claim-work/wild%2Fname-{i}", json={
                    "workerGroup": "wild", "workerId": "w", "tasks": 1}) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["tasks"] == []
    assert await storage.queue_names() == before


async def test_a_worker_polling_before_the_first_task_gets_it_once_it_is_created(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    # The urls of a task queue with no queue yet: polled by a worker written from the
    # docs and by the SDK's source, both find the task created after they started.
    server = await make_server()
    urls = await sas.poll_task_urls(http, server.api, "prov", "late")
    assert await sas.poll_once(http, urls) == []
    task_id = slugid()
    queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "credentials": {
        "clientId": ROOT.client_id, "accessToken": ROOT.access_token}})
    await queue.createTask(task_id, definition("prov/late", priority="high"))
    [message] = await sas.poll_once(http, urls)
    assert message.tip["taskId"] == task_id
    # The SDK's source takes the queues of a task queue with no task yet as empty ones.
    source = SasSource(http, server.root_url, None, "prov/never", "wg", "w", hints=False)
    assert await source.get(1, asyncio.Event()) == []
    assert source.requests[EMPTY_POLL] == 7
    assert "polling an Azure queue answered" not in caplog.text


async def test_the_ears_of_names_nobody_uses_any_more_leave_the_doorbell_table(
        make_server: ServerFactory, storage: StorageInspector) -> None:
    # Events off: each new name asked with pending=true is an ear in the doorbell table,
    # rewritten while its callers ask; once they stop, the ears expire and their rows go.
    server = await make_server(clients=(WILD,), task_queue_idle_expiry=2.0,
                               doorbell_interval=0.2)

    async def ears() -> list[str]:
        return [k for k in await storage.row_keys("doorbell", "bell") if k.startswith("e:")]

    async with _signed(WILD) as http:
        for i in range(20):
            async with http.get(f"{server.api}/poll-task-url/wild/ear-{i}?pending=true") as r:
                assert r.status == 200, await r.text()
    await eventually(ears, lambda keys: len(keys) == 20, what="the ears noted")
    await eventually(ears, lambda keys: keys == [], what="the expired ears deleted",
                     timeout=60.0)


async def test_the_azure_queues_of_names_a_task_was_created_in_go_once_nobody_uses_them(
        make_server: ServerFactory, storage: StorageInspector) -> None:
    # A tenant that may create tasks in any `wild/*` name makes seven queues in each name
    # it creates a task in; once its tasks are done and nobody used those names for the
    # records' expiry (five days), the expiry pass leaves the queues as they were before.
    server = await make_server(clients=(WILD,), claim_work_wait=0.5)
    before = await storage.queue_names()
    async with _signed(WILD) as http:
        for i in range(10):
            task_id = await create(http, server.api, definition(f"wild/made-{i}"))
            async with http.post(f"{server.api}/claim-work/wild%2Fmade-{i}", json={
                    "workerGroup": "wild", "workerId": "w", "tasks": 1}) as r:
                assert r.status == 200, await r.text()
                assert len((await r.json())["tasks"]) == 1
            async with http.post(f"{server.api}/task/{task_id}/runs/0/completed") as r:
                assert r.status == 200, await r.text()
    assert len(await storage.queue_names()) == len(before) + 70
    await server.services.expiry.expire(datetime.now(UTC) + timedelta(days=6))
    assert await storage.queue_names() == before
