"""How a worker gets work: the order of its polls, their cost, and its sleeps when idle.

docs/workers/sas.md: "the worker must poll the Azure queues in order they are given", "the
parameter &numofmessages=N may be appended ... N can be up to 32", "If at end of the
array, the worker should sleep a second or so, and start polling from the start of the
list"; docs/workers/sas.md: "if the worker received multiple <QueueMessage> entries ... it must
also claim these tasks".
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp
import pytest

from azqueue.model.priority import Priority
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition, slugid, status
from azqueue.worker import TaskRun, Worker
from azqueue.worker.sas import EMPTY_POLL, POLL, SasSource, idle_delay
from tests.servers import ServerFactory
from tests.waiting import eventually
from tests.worker.helpers import CREDENTIALS, config, running

BACKLOG = 5
PAUSE = 0.4  # seconds a handler takes in test_a_higher_priority_task_...


@pytest.mark.parametrize("pause, recheck", [(0.0, 3600), (PAUSE, PAUSE / 4)],
                         ids=["short-tasks", "tasks-outlasting-the-recheck"])
async def test_a_sas_worker_polls_once_per_task_at_a_backlog_below_the_top_queue(
        make_server: ServerFactory, http: aiohttp.ClientSession, pause: float,
        recheck: float) -> None:
    """A backlog in the last queue (``lowest``, the default priority) costs one Azure
    poll per task, not seven: the worker keeps polling the queue it finds work in, and a
    pass from the top (the first, or one after a task outlasted ``priority_recheck``)
    polls only ``lowest``, as the queue's sample shows the six above it empty."""
    server = await make_server()
    queue = f"prov/backlog{int(pause * 10)}"
    for _ in range(BACKLOG):
        await create(http, server.api, definition(queue))
    polls_at_claim: list[tuple[int, int]] = []

    async def handler(run: TaskRun) -> None:
        polls_at_claim.append((worker.requests[POLL], worker.requests[EMPTY_POLL]))
        await asyncio.sleep(pause)

    worker = Worker(config(server, queue, "w", mode="sas", priority_recheck=recheck), handler)
    async with running(worker):
        await eventually(lambda: worker.completed == BACKLOG, what="the backlog to be run")
    assert polls_at_claim == [(k, 0) for k in range(1, BACKLOG + 1)]


async def test_without_a_sample_a_pass_polls_the_seven_queues_in_order(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'the worker must poll the Azure queues in order they are given' (docs/workers/sas.md): without the
    queue's sample a pass from the top polls every queue until one has work, then the
    worker keeps to that one."""
    server = await make_server()
    for _ in range(BACKLOG):
        await create(http, server.api, definition("prov/unsampled"))
    seen = []
    async with aiohttp.ClientSession() as session:
        source = SasSource(session, server.root_url, CREDENTIALS, "prov/unsampled", "g", "w",
                           priority_recheck=3600, hints=False)
        for _ in range(BACKLOG):
            assert len(await source.get(1, asyncio.Event())) == 1
            seen.append((source.requests[POLL], source.requests[EMPTY_POLL]))
    # The k-th task: six empty polls of the queues above `lowest`, then k polls of `lowest`.
    assert seen == [(6 + k, 6) for k in range(1, BACKLOG + 1)]


@pytest.mark.parametrize("recheck, high_at", [(PAUSE / 2, 1), (3600, BACKLOG)],
                         ids=["recheck-due", "recheck-not-due"])
async def test_a_higher_priority_task_created_during_a_backlog_is_claimed_at_the_next_recheck(
        make_server: ServerFactory, http: aiohttp.ClientSession, recheck: float,
        high_at: int) -> None:
    """'the worker must poll the Azure queues in order they are given' (docs/workers/sas.md), within
    ``priority_recheck``: a worker sticky on ``lowest`` goes back to the top once its last
    pass from the top is ``priority_recheck`` seconds old, so a ``highest`` task created
    while the backlog runs is claimed before the backlog is drained. Until then (or with
    a recheck that is never due) it keeps to the queue it finds work in."""
    server = await make_server()
    lows = [await create(http, server.api, definition("prov/recheck")) for _ in range(BACKLOG)]
    claimed: list[str] = []
    high: list[str] = []

    async def handler(run: TaskRun) -> None:
        claimed.append(run.task_id)
        if not high:  # the first task: a higher-priority one arrives, then time passes
            high.append(await create(http, server.api,
                                     definition("prov/recheck", priority="highest")))
            await asyncio.sleep(PAUSE)

    worker = Worker(config(server, "prov/recheck", "w", mode="sas", priority_recheck=recheck),
                    handler)
    async with running(worker):
        await eventually(lambda: worker.completed == BACKLOG + 1, what="every task to be run")
    assert claimed[0] in lows
    assert claimed.index(high[0]) == high_at
    assert sorted(claimed) == sorted([*lows, *high])


@pytest.mark.parametrize("mode", ["sas", "claim-work"])
async def test_a_worker_asks_for_exactly_its_free_capacity(
        make_server: ServerFactory, http: aiohttp.ClientSession, mode: str) -> None:
    """'tasks is the number of tasks it is willing to process' (docs/workers/sdk.md); 'numofmessages=N ...
    the maximum number of messages desired' (docs/workers/sas.md): a worker of capacity 3 facing five
    pending tasks claims three in one request and leaves two for others."""
    server = await make_server(claim_work_wait=1.0)
    tasks = [await create(http, server.api, definition("prov/capacity")) for _ in range(5)]
    release = asyncio.Event()
    asked: list[tuple[int, int]] = []  # (free capacity asked for, claims received)

    class Recording(Worker):
        def _source(self, session: aiohttp.ClientSession) -> Any:
            get = super()._source(session)

            async def source(n: int) -> list[Any]:
                claims: list[Any] = await get(n)
                if claims:
                    asked.append((n, len(claims)))
                return claims
            return source

    async def handler(run: TaskRun) -> None:
        await release.wait()

    worker = Recording(config(server, "prov/capacity", "w", mode=mode, capacity=3), handler)
    async with running(worker):
        await eventually(lambda: asked, what="the first claims")
        assert asked == [(3, 3)]
        states = [(await status(http, server.api, t))["state"] for t in tasks]
        assert sorted(states) == ["pending"] * 2 + ["running"] * 3
        release.set()
        await eventually(lambda: worker.completed == 5, what="every task to be run")
    assert sum(got for _, got in asked) == 5
    assert all(got <= wanted <= 3 for wanted, got in asked)


async def test_the_messages_of_one_poll_are_claimed_at_once_each_deleted_after_its_4xx(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector) -> None:
    """'if the worker received multiple <QueueMessage> entries ... it must also claim these
    tasks' (docs/workers/sas.md) and 'the worker must delete messages if the queue.claimTask operations
    fails with a 4xx error' (docs/workers/sas.md): the claims of one poll are in flight together, and the
    tip that is refused is deleted while the others are claimed."""
    server = await make_server()
    tasks = [await create(http, server.api, definition("prov/batch")) for _ in range(4)]
    qclient = storage.queue(storage.pending_queue("prov/batch", Priority.LOWEST))
    await qclient.send_message(base64.b64encode(json.dumps(
        {"taskId": slugid(), "runId": 0, "signature": "not-a-signature"}).encode()).decode())
    async with aiohttp.ClientSession() as session:
        source = SasSource(session, server.root_url, CREDENTIALS, "prov/batch", "g", "w")
        claim_task = source.queue.claimTask
        in_flight, most = 0, 0

        async def counting_claim_task(*args: Any, **kwargs: Any) -> Any:
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            try:
                return await claim_task(*args, **kwargs)
            finally:
                in_flight -= 1

        source.queue.claimTask = counting_claim_task
        claims = await source.get(5, asyncio.Event())
    assert sorted(c["status"]["taskId"] for c in claims) == sorted(tasks)
    assert most == 5
    # The four claimed tips stay (they now enforce the claims); the refused one is gone.
    assert (await qclient.get_queue_properties()).approximate_message_count == 4


def test_the_sleep_after_empty_passes_grows_from_idle_sleep_to_max_idle_sleep() -> None:
    """'sleep a second or so' after an empty pass (docs/workers/sas.md), doubling while nothing comes, up
    to ``max_idle_sleep``; the jitter factor spreads workers out."""
    assert [idle_delay(k, 1.0, 5.0, 1.0) for k in range(1, 7)] == [1, 2, 4, 5, 5, 5]
    assert idle_delay(1, 1.0, 5.0, 0.75) == 0.75
    assert idle_delay(10_000, 1.0, 5.0, 1.25) == 6.25


async def test_idle_passes_poll_no_queue_and_finding_work_resets_the_idle_sleep(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """Idle, a pass asks the queue which queues hold tips and, shown none, polls none of
    the seven; after empty passes the worker sleeps longer. The first task created is
    found with one poll of its own queue, and the worker is back to ``idle_sleep`` for
    the next empty pass."""
    server = await make_server()
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        source = SasSource(session, server.root_url, CREDENTIALS, "prov/reset", "g", "w",
                           idle_sleep=0.01, max_idle_sleep=0.05)
        source.long_poll = False  # idle, it sleeps between passes rather than waiting
        for _ in range(3):
            assert await source.get(1, stop) == []
        assert source.empty_passes == 3
        assert source.requests[POLL] == 0
        task_id = await create(http, server.api, definition("prov/reset", priority="high"))
        [claim] = await source.get(1, stop)
        assert claim["status"]["taskId"] == task_id
        assert (source.requests[POLL], source.requests[EMPTY_POLL]) == (1, 0)
        assert source.empty_passes == 0
        assert await source.get(1, stop) == []
        assert source.empty_passes == 1


async def test_a_queue_the_worker_found_empty_after_the_sample_is_not_polled_again(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """When the backlog runs out, the worker's own empty poll is newer than the queue's
    sample (which may still show tips there): the pass after it polls nothing."""
    server = await make_server()
    for _ in range(2):
        await create(http, server.api, definition("prov/ranout"))
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        source = SasSource(session, server.root_url, CREDENTIALS, "prov/ranout", "g", "w",
                           idle_sleep=0.01, max_idle_sleep=0.05, priority_recheck=3600)
        for _ in range(2):
            assert len(await source.get(1, stop)) == 1
        assert await source.get(1, stop) == []
    assert (source.requests[POLL], source.requests[EMPTY_POLL]) == (3, 1)


async def test_an_idle_sas_worker_waits_in_poll_task_urls_and_wakes_for_another_replicas_task(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """An idle SAS worker asks pollTaskUrls to wait for a tip instead of sleeping between
    passes (docs/capacity.md, "At rest"): with sleeps of an hour between idle passes and
    no looks of the replicas' own, it still runs a task created on another replica within
    moments, and polls no Azure queue while it waits."""
    from tests.integration.test_doorbell import quiet, settled

    a, b = await make_server(**quiet()), await make_server(**quiet())
    queue = "prov/sasidle"
    done = asyncio.Event()

    async def handler(run: TaskRun) -> None:
        done.set()

    worker = Worker(config(b, queue, "w", mode="sas", idle_sleep=3600, max_idle_sleep=3600),
                    handler)
    async with running(worker):
        await eventually(lambda: worker.requests["pollTaskUrls"] >= 2,
                         what="the worker waiting in pollTaskUrls")
        await settled(b, queue)
        polls = worker.requests[POLL]
        await create(http, a.api, definition(queue))
        await asyncio.wait_for(done.wait(), 30)
    assert worker.requests[POLL] == polls + 1  # the poll that found the task
