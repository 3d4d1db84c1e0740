"""What autoscalers read: a waiting backlog counted once, however long it waits; claimed
runs counted within seconds of their claim and no longer once resolved."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import aiohttp
import pytest
import taskcluster.aio

from azqueue.config import StorageSettings
from azqueue.model import timeutil
from azqueue.testing import sas
from azqueue.testing.faultproxy import FaultProxy
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import definition, slugid
from tests.servers import ROOT, Server, ServerFactory
from tests.waiting import eventually

BACKLOG = 200
LOOKS = 10


def _queue(server: Server) -> taskcluster.aio.Queue:
    return taskcluster.aio.Queue({"rootUrl": server.root_url, "maxRetries": 0, "credentials": {
        "clientId": ROOT.client_id, "accessToken": ROOT.access_token}})


async def _backlog(queue: taskcluster.aio.Queue, task_queue_id: str, n: int) -> list[str]:
    ids = [slugid() for _ in range(n)]
    limit = asyncio.Semaphore(16)

    async def create(task_id: str) -> None:
        async with limit:
            await queue.createTask(task_id, definition(task_queue_id))

    await asyncio.gather(*(create(t) for t in ids))
    return ids


async def _pending(queue: taskcluster.aio.Queue, task_queue_id: str) -> tuple[int, int]:
    counts: dict[str, Any] = await queue.taskQueueCounts(task_queue_id)
    pending: dict[str, Any] = await queue.pendingTasks(task_queue_id)
    return counts["pendingTasks"], pending["pendingTasks"]


@pytest.mark.slow
async def test_a_backlog_is_counted_once_however_many_times_the_repair_looks_at_it(
        make_server: ServerFactory, storage: StorageInspector) -> None:
    """The tip repair looks at a waiting task at growing intervals (3, 6, 12 … minutes by
    default): each look must leave its tip alone, so neither the counts nor the pending
    queue's length grow with the backlog's age."""
    server = await make_server(run_resolvers=False, tip_repair_delay=1.0)
    queue = _queue(server)
    task_queue_id = f"prov/backlog{slugid()[:6].replace('-', 'x').replace('_', 'y').lower()}"
    ids = await _backlog(queue, task_queue_id, BACKLOG)
    # A task stored late after its tip has a second one (``_another_if_late``), which
    # Azure's count includes: the looks must add none.
    pending_queue = storage.pending_queue(task_queue_id)
    before = await storage.message_count(pending_queue)
    assert before >= BACKLOG
    repair = server.services.resolution.repair
    for look in range(1, LOOKS + 1):
        # As the deadline resolver would, each look later than the one before.
        now = timeutil.utcnow() + timedelta(seconds=look * repair.delay.total_seconds() * 2)
        limit = asyncio.Semaphore(16)

        async def one(task_id: str) -> None:
            async with limit:
                await repair.look(await storage.stored(task_id), now)

        await asyncio.gather(*(one(t) for t in ids))
    # The pending queue's own length, as a KEDA azure-queue scaler reads it.
    assert await storage.message_count(pending_queue) == before
    assert await _pending(queue, task_queue_id) == (before, before)
    sampled = await server.services.counts.pending_tips(task_queue_id)
    assert sampled["lowest"] == before  # the metric's gauge


async def test_a_tip_a_worker_took_and_lost_is_replaced_at_the_next_look(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector) -> None:
    server = await make_server(run_resolvers=False, tip_repair_delay=1.0)
    task_id = slugid()
    await _queue(server).createTask(task_id, definition("prov/losttip"))
    queue = (await sas.poll_task_urls(http, server.api, "prov", "losttip"))["queues"][6]
    [message] = await sas.get_messages(http, queue["signedPollUrl"])
    assert await sas.delete_message(http, queue["signedDeleteUrl"], message) == 204  # lost
    repair = server.services.resolution.repair
    now = timeutil.utcnow() + timedelta(seconds=2)
    await repair.look(await storage.stored(task_id), now)
    [again] = await sas.get_messages(http, queue["signedPollUrl"])
    assert again.tip["taskId"] == task_id and again.tip["runId"] == 0
    code, claim = await sas.claim(http, server.api, again)
    assert code == 200, claim


async def test_claims_are_counted_and_listed_at_once_and_leave_when_resolved(
        make_server: ServerFactory, storage: StorageInspector) -> None:
    """Counted by the replica that did not make the claims too (from the notes every
    replica writes), within seconds rather than once the claim index has them (30 s).
    The backlog is longer than Azure's peek (32): its pending count is the queue's
    approximate count (every message, a second tip of a task stored late after its first
    included) less the messages the claims hold."""
    first, second = await make_server(), await make_server()
    task_queue_id = f"prov/claimed{slugid()[:6].replace('-', 'x').replace('_', 'y').lower()}"
    on_first, on_second = _queue(first), _queue(second)
    ids = await _backlog(on_first, task_queue_id, 40)
    messages = await storage.message_count(storage.pending_queue(task_queue_id))
    assert messages >= 40
    assert (await on_first.pendingTasks(task_queue_id))["pendingTasks"] == messages
    got = await on_first.claimWork(task_queue_id, {"tasks": 5, "workerGroup": "g",
                                                   "workerId": "w"})
    claimed = sorted(c["status"]["taskId"] for c in got["tasks"])
    assert len(claimed) == 5 and set(claimed) <= set(ids)

    async def counts(queue: taskcluster.aio.Queue) -> tuple[int, int, list[str]]:
        c = await queue.taskQueueCounts(task_queue_id)
        listed = await queue.listClaimedTasks(task_queue_id)
        return c["pendingTasks"], c["claimedTasks"], sorted(t["taskId"] for t in listed["tasks"])

    # The replica that claimed answers at once; the other within seconds.
    assert await counts(on_first) == (messages - 5, 5, claimed)
    await eventually(lambda: counts(on_second), lambda c: c == (messages - 5, 5, claimed),
                     what="the other replica counting the claims", timeout=15)
    for task_id in claimed:
        await on_first.reportCompleted(task_id, "0")
    # The replica that resolved them no longer counts them at once. The runs' messages
    # are deleted after the reports' answers: the approximate pending count leaves them
    # out once they are gone.
    assert (await counts(on_first))[1:] == (0, [])
    await eventually(lambda: counts(on_first), lambda c: c == (messages - 5, 0, []),
                     what="the resolved runs' messages leaving the pending count", timeout=15)
    await eventually(lambda: counts(on_second), lambda c: c == (messages - 5, 0, []),
                     what="the other replica no longer counting them", timeout=15)


async def test_a_resolved_run_leaves_its_replicas_claimed_count_before_its_message_is_settled(
        make_server: ServerFactory, proxy: FaultProxy, storage_prefix: str,
        http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    """A report is answered before the message its run held is deleted: from its answer
    on, the replica that took it no longer counts the run as claimed (nor lists it),
    however long that delete takes."""
    server = await make_server(storage=StorageSettings(proxy.connection_string(),
                                                       storage_prefix))
    queue = _queue(server)
    [task_id] = await _backlog(queue, "prov/settling", 1)
    urls = await sas.poll_task_urls(http, server.api, "prov", "settling")
    [message] = await sas.get_messages(http, urls["queues"][6]["signedPollUrl"])
    code, claim = await sas.claim(http, server.api, message)
    assert code == 200, claim
    assert (await queue.taskQueueCounts("prov/settling"))["claimedTasks"] == 1
    pending = storage.pending_queue("prov/settling")
    delete = proxy.hold("DELETE", f"/{pending}/messages/")
    try:
        await queue.reportCompleted(task_id, "0")
        await asyncio.wait_for(delete.reached.wait(), 30)
        assert (await queue.taskQueueCounts("prov/settling"))["claimedTasks"] == 0
        assert (await queue.listClaimedTasks("prov/settling"))["tasks"] == []
        assert await storage.message_count(pending) == 1  # its delete not yet applied
    finally:
        delete.release()
    await eventually(lambda: storage.message_count(pending), lambda n: n == 0,
                     what="the run's message deleted after the report's answer")


async def test_a_run_resolved_through_another_replica_leaves_every_claimed_count(
        make_server: ServerFactory) -> None:
    """Claimed through one replica and reported through the other: both stop counting the
    run within seconds of the report, long before the claiming replica would have indexed
    it (30 s after the claim) and so learned of the resolution by itself."""
    claiming, reporting = await make_server(), await make_server()
    task_queue_id = f"prov/across{slugid()[:6].replace('-', 'x').replace('_', 'y').lower()}"
    on_claiming, on_reporting = _queue(claiming), _queue(reporting)
    [task_id] = await _backlog(on_claiming, task_queue_id, 1)
    got = await on_claiming.claimWork(task_queue_id, {"tasks": 1, "workerGroup": "g",
                                                      "workerId": "w"})
    assert [c["status"]["taskId"] for c in got["tasks"]] == [task_id]

    async def claimed(queue: taskcluster.aio.Queue) -> tuple[int, list[str]]:
        counts = await queue.taskQueueCounts(task_queue_id)
        listed = await queue.listClaimedTasks(task_queue_id)
        return counts["claimedTasks"], [t["taskId"] for t in listed["tasks"]]

    assert await claimed(on_claiming) == (1, [task_id])
    await eventually(lambda: claimed(on_reporting), lambda c: c == (1, [task_id]),
                     what="the other replica counting the claim", timeout=15)
    await on_reporting.reportCompleted(task_id, "0")
    for queue, which in ((on_reporting, "reported"), (on_claiming, "claimed")):
        await eventually(lambda: claimed(queue), lambda c: c == (0, []),
                         what=f"the replica the run was {which} through no longer counting it",
                         timeout=15)
