"""The Azure queues of a task queue nobody uses any more are deleted by the expiry pass
once its record expired (five days after it was last used), unless they hold messages;
the task queue's next task makes them again, on any replica, and is claimed."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest

from azqueue.config import StorageSettings
from azqueue.model.priority import ORDER
from azqueue.testing import sas
from azqueue.testing.faultproxy import FaultProxy
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition
from tests.servers import Server, ServerFactory
from tests.waiting import eventually

PAST_RECORD = timedelta(days=6)  # task queue records expire five days after their use


def _pending(storage: StorageInspector, task_queue_id: str) -> set[str]:
    return {storage.pending_queue(task_queue_id, p) for p in ORDER}


async def _left(storage: StorageInspector, task_queue_id: str) -> set[str]:
    """The task queue's pending queues that exist."""
    return _pending(storage, task_queue_id) & set(await storage.queue_names())


async def _claim_work(http: aiohttp.ClientSession, server: Server,
                      task_queue_id: str) -> list[str]:
    code, body = await sas.post(
        http, f"{server.api}/claim-work/{task_queue_id.replace('/', '%2F')}",
        {"workerGroup": "wg", "workerId": "w", "tasks": 1})
    assert code == 200, body
    return [claim["status"]["taskId"] for claim in body["tasks"]]


async def _run(http: aiohttp.ClientSession, server: Server, task_queue_id: str) -> str:
    """A task created, claimed through claimWork and completed: its tip is gone."""
    task_id = await create(http, server.api, definition(task_queue_id))
    assert await _claim_work(http, server, task_queue_id) == [task_id]
    code, body = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
    assert code == 200, body
    return task_id


async def test_an_idle_task_queues_queues_are_deleted_and_its_next_tasks_are_claimed(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector) -> None:
    # Two replicas: `putter` made the queues and believes they exist; `sweeper`'s expiry
    # pass deletes them.
    putter = await make_server()
    sweeper = await make_server()
    task_queue_id = f"idle/q{secrets.token_hex(6)}"
    await _run(http, putter, task_queue_id)
    urls = await sas.poll_task_urls(http, putter.api, *task_queue_id.split("/"))
    assert await _left(storage, task_queue_id) == _pending(storage, task_queue_id)

    # Used just now: its record holds, its queues stay.
    await sweeper.services.expiry.expire(datetime.now(UTC))
    assert await _left(storage, task_queue_id) == _pending(storage, task_queue_id)

    # Past its record's expiry: the seven queues go; the SAS URLs handed out before poll
    # empty (404 QueueNotFound, which is an empty queue).
    await sweeper.services.expiry.expire(datetime.now(UTC) + PAST_RECORD)
    assert await _left(storage, task_queue_id) == set()
    assert await sas.poll_once(http, urls) == []

    # A task created on the replica that believed the queues existed is claimed through
    # claimWork, and the next through the SAS URLs handed out before the deletion.
    task_id = await create(http, putter.api, definition(task_queue_id))
    assert await _claim_work(http, putter, task_queue_id) == [task_id]
    task_id = await create(http, putter.api, definition(task_queue_id))
    [message] = await sas.poll_once(http, urls)
    assert message.tip["taskId"] == task_id
    code, body = await sas.claim(http, putter.api, message)
    assert code == 200, body


async def test_queues_holding_a_pending_or_a_claimed_tip_are_kept(
        server: Server, http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    pending_queue = f"idle/q{secrets.token_hex(6)}"
    claimed_queue = f"idle/q{secrets.token_hex(6)}"
    pending = await create(http, server.api, definition(pending_queue, priority="high"))
    claimed = await create(http, server.api, definition(claimed_queue))
    assert await _claim_work(http, server, claimed_queue) == [claimed]  # its tip invisible

    await server.services.expiry.expire(datetime.now(UTC) + PAST_RECORD)
    # Each keeps the queue its tip is in (the empty six go).
    assert await _left(storage, pending_queue) == {storage.pending_queue(pending_queue,
                                                                         ORDER[2])}
    assert await _left(storage, claimed_queue) == {storage.pending_queue(claimed_queue,
                                                                         ORDER[-1])}
    assert await _claim_work(http, server, pending_queue) == [pending]
    code, body = await sas.post(http, f"{server.api}/task/{claimed}/runs/0/completed")
    assert code == 200, body


async def test_a_tip_deleted_with_its_queue_is_queued_again_by_the_tip_repair(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector) -> None:
    # A put between the expiry pass's count (empty) and its delete: the delete takes the
    # tip with the queue. The tip repair gives the pending run a new tip, the queue made
    # again by the process that believed it existed.
    server = await make_server(tip_repair_delay=1.0, deadline_resolver_interval=0.5)
    task_queue_id = f"idle/q{secrets.token_hex(6)}"
    task_id = await create(http, server.api, definition(task_queue_id))
    await storage.queue(storage.pending_queue(task_queue_id)).delete_queue()
    await eventually(lambda: _claim_work(http, server, task_queue_id),
                     lambda claimed: claimed == [task_id], what="the task claimed",
                     timeout=60.0)


async def test_a_task_created_after_another_replica_deleted_its_queue_is_claimed(
        server: Server, http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    # The server made the queue and believes it exists; another replica's expiry pass
    # deleted it since (here, straight in storage): the put is answered 404 and the queue
    # made again.
    task_queue_id = f"idle/q{secrets.token_hex(6)}"
    await _run(http, server, task_queue_id)
    await storage.queue(storage.pending_queue(task_queue_id)).delete_queue()
    task_id = await create(http, server.api, definition(task_queue_id))
    assert await _claim_work(http, server, task_queue_id) == [task_id]


async def _deleted_moments_ago(proxy: FaultProxy, storage: StorageInspector,
                               task_queue_id: str, refusals: int) -> None:
    """The task queue's lowest queue deleted (as another replica's expiry pass does),
    and Azure answering what it answers for a while after a delete: its put 409
    QueueBeingDeleted, and the next ``refusals`` attempts to make it again too."""
    name = storage.pending_queue(task_queue_id)
    await storage.queue(name).delete_queue()
    proxy.once("POST", f"{name}/messages", "being deleted")
    for _ in range(refusals):
        proxy.once("PUT", name, "being deleted")


async def test_a_task_whose_queue_is_being_deleted_waits_for_it_and_is_claimed(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    server = await make_server(storage=StorageSettings(proxy.connection_string(),
                                                       storage_prefix))
    task_queue_id = f"idle/q{secrets.token_hex(6)}"
    await _run(http, server, task_queue_id)
    await _deleted_moments_ago(proxy, storage, task_queue_id, refusals=2)
    task_id = await create(http, server.api, definition(task_queue_id))
    assert proxy.counts["queue being deleted"] == 3
    assert await _claim_work(http, server, task_queue_id) == [task_id]


@pytest.mark.parametrize("then", ["claimed", "the replica closes"])
async def test_a_task_whose_queue_is_deleted_longer_than_its_request_can_wait_gets_its_tip(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        http: aiohttp.ClientSession, storage: StorageInspector, then: str) -> None:
    # createTask does not fail for it: the task is stored, and its tip queued once the
    # queue can be made again (the tip repair, three minutes on, would come too late
    # for this test); a replica that closes right after the answer queues it before it
    # stops.
    server = await make_server(storage=StorageSettings(proxy.connection_string(),
                                                       storage_prefix), request_budget=2.0)
    task_queue_id = f"idle/q{secrets.token_hex(6)}"
    await _run(http, server, task_queue_id)
    await _deleted_moments_ago(proxy, storage, task_queue_id, refusals=5)
    task_id = await create(http, server.api, definition(task_queue_id))
    if then == "claimed":
        await eventually(lambda: _claim_work(http, server, task_queue_id),
                         lambda claimed: claimed == [task_id], what="the task claimed")
    else:
        await server.services.definitions.close()
        assert await storage.message_count(storage.pending_queue(task_queue_id)) == 1
        assert (await storage.stored(task_id)).live_tip is not None
    assert proxy.counts["queue being deleted"] == 6
