"""Waiting is nearly free and still quick (docs/capacity.md, "At rest"): callers waiting on
one replica are woken by the doorbell when a tip becomes visible on another, and make no
request to the pending queues meanwhile. Without a broker the doorbell is a table every
replica reads (``service.dispatch.doorbell``); tests/events/test_doorbell.py runs the same with
the broker's.

Every test here turns the pollers' own looks off (``claim_work_poll_interval`` and the
fallback at an hour): only a ring can wake a waiting caller before its wait ends.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest

from azqueue.config import StorageSettings
from azqueue.service.dispatch import tablebell
from azqueue.testing import sas
from azqueue.testing.faultproxy import FaultProxy
from azqueue.testing.tasks import create, definition
from tests.integration.test_claim_work import claim_work
from tests.servers import Server, ServerFactory
from tests.waiting import eventually, stays

HOUR = 3600.0
# Waiting callers wait this long: far longer than a ring takes, far shorter than a look
# of the pollers' own (an hour).
WAIT = 30.0
DOORBELL = 0.2


def quiet(**overrides: Any) -> dict[str, Any]:
    """Settings of a replica whose pollers never look by themselves."""
    return {"claim_work_poll_interval": HOUR, "claim_work_fallback_interval": HOUR,
            "claim_work_wait": WAIT, "doorbell_interval": DOORBELL, **overrides}


async def settled(server: Server, task_queue_id: str) -> None:
    """Until the doorbell covers ``task_queue_id`` on ``server`` (every replica knows it
    waits there), and the look that follows has been made."""
    doorbell = server.services.work.doorbell
    await eventually(lambda: doorbell.covers(task_queue_id), what="the doorbell to cover "
                     f"{task_queue_id}", interval=0.1)
    # Covered once every replica has read the ear; then the callers waiting here are rung
    # to look once more (a tip put before that was rung to nobody): past that look.
    entry = server.services.work.waiting.entry(task_queue_id)
    if entry.waiters:
        await eventually(lambda: (entry.rings, sorted(entry.dirty)),
                         lambda seen: seen[0] > 0 and not seen[1], interval=0.05,
                         what=f"the look of the callers on {task_queue_id} once covered")


async def wakes_across_replicas(http: aiohttp.ClientSession, a: Server, b: Server,
                                task_queue_id: str) -> None:
    """A caller waiting on ``b`` gets a task created on ``a``, long before its wait ends."""
    waiting = asyncio.create_task(claim_work(http, b, task_queue_id))
    await settled(b, task_queue_id)
    assert not waiting.done()
    task_id = await create(http, a.api, definition(task_queue_id))
    [claim] = await asyncio.wait_for(waiting, WAIT / 2)
    assert claim["status"]["taskId"] == task_id


async def test_a_task_created_on_one_replica_wakes_a_caller_waiting_on_another(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    a, b = await make_server(**quiet()), await make_server(**quiet())
    await wakes_across_replicas(http, a, b, "prov/bell")


async def test_a_claim_that_expires_on_one_replica_wakes_a_caller_waiting_on_another(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """The tip of an expired claim reappears by itself, which nobody rings: the claim
    resolver of the replica that made the claim wakes at takenUntil, resolves the run and
    rings its retry."""
    a = await make_server(**quiet(claim_timeout=3.0))
    b = await make_server(**quiet(claim_timeout=3.0, run_resolvers=False))
    task_id = await create(http, a.api, definition("prov/expire"))
    [first] = await claim_work(http, a, "prov/expire")
    assert first["status"]["taskId"] == task_id and first["runId"] == 0
    waiting = asyncio.create_task(claim_work(http, b, "prov/expire", worker_id="next"))
    [retry] = await asyncio.wait_for(waiting, WAIT)
    assert retry["status"]["taskId"] == task_id and retry["runId"] == 1
    assert retry["status"]["runs"][0]["reasonResolved"] == "claim-expired"


async def test_a_dependency_resolved_and_a_rerun_on_one_replica_wake_a_caller_on_another(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """Tips that no createTask puts ring too: the dependent scheduled when its dependency
    completes, and the new run of a rerun task."""
    a, b = await make_server(**quiet()), await make_server(**quiet())
    dependency = await create(http, a.api, definition("prov/first"))
    dependent = await create(http, a.api, definition("prov/then", dependencies=[dependency]))
    [claim] = await claim_work(http, a, "prov/first")
    waiting = asyncio.create_task(claim_work(http, b, "prov/then"))
    await settled(b, "prov/then")
    assert not waiting.done()
    code, body = await sas.post(http, f"{a.api}/task/{dependency}/runs/0/completed")
    assert code == 200, body
    [scheduled] = await asyncio.wait_for(waiting, WAIT / 2)
    assert scheduled["status"]["taskId"] == dependent

    waiting = asyncio.create_task(claim_work(http, b, "prov/first", worker_id="again"))
    await settled(b, "prov/first")
    code, body = await sas.post(http, f"{a.api}/task/{dependency}/rerun")
    assert code == 200, body
    [rerun] = await asyncio.wait_for(waiting, WAIT / 2)
    assert rerun["status"]["taskId"] == dependency and rerun["runId"] == 1
    assert claim["runId"] == 0


async def test_a_tip_repaired_on_one_replica_wakes_a_caller_waiting_on_another(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """A pending task left without a tip (a worker deleted it) gets another from the tip
    repair, the deadline resolver's look the repair delay after createTask: on a replica
    where nobody waits, and the caller waiting on the other hears of it."""
    a = await make_server(**quiet(tip_repair_delay=6.0, deadline_resolver_interval=0.3))
    b = await make_server(**quiet(run_resolvers=False))
    task_id = await create(http, a.api, definition("prov/repaired"))
    urls = await sas.poll_task_urls(http, a.api, "prov", "repaired")
    queue = urls["queues"][6]
    [message] = await sas.get_messages(http, queue["signedPollUrl"])
    assert message.tip["taskId"] == task_id
    assert await sas.delete_message(http, queue["signedDeleteUrl"], message) == 204
    waiting = asyncio.create_task(claim_work(http, b, "prov/repaired"))
    await settled(b, "prov/repaired")
    assert not waiting.done()  # no tip until the repair
    [claim] = await asyncio.wait_for(waiting, WAIT)
    assert claim["status"]["taskId"] == task_id and claim["runId"] == 0


async def test_an_idle_sas_worker_waiting_on_one_replica_hears_of_a_task_created_on_another(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """pollTaskUrls with ``pending=true&wait=<s>``: an idle SAS worker waits for a visible
    tip instead of asking again and again, and hears of one put by another replica."""
    a, b = await make_server(**quiet()), await make_server(**quiet())
    url = f"{b.api}/poll-task-url/prov/idle?pending=true&wait=20"

    async def ask() -> dict[str, Any]:
        async with http.get(url) as r:
            assert r.status == 200, await r.text()
            body: dict[str, Any] = await r.json()
            return body

    assert (await ask())["pending"]["queues"] == [False] * 7  # no ring for 20 s
    await settled(b, "prov/idle")
    asking = asyncio.create_task(ask())
    await stays(asking.done, lambda done: not done, what="pollTaskUrls waiting", for_=0.5)
    await create(http, a.api, definition("prov/idle", priority="high"))
    answer = await asyncio.wait_for(asking, 15)
    assert answer["pending"]["queues"] == [False, False, True] + [False] * 4
    [message] = await sas.get_messages(http, answer["queues"][2]["signedPollUrl"], 1)
    code, _ = await sas.claim(http, b.api, message)
    assert code == 200


async def test_poll_task_urls_refuses_a_wait_it_cannot_honour(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    server = await make_server()
    for query in ("pending=true&wait=soon", "pending=true&wait=-1", "pending=true&wait=61",
                  "wait=5"):
        async with http.get(f"{server.api}/poll-task-url/prov/w?{query}") as r:
            body = await r.json()
            assert r.status == 400, (query, body)
        assert body["code"] == "InputValidationError" and "`wait`" in body["message"], query


@pytest.mark.slow
async def test_callers_waiting_on_idle_task_queues_make_no_queue_requests(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        http: aiohttp.ClientSession) -> None:
    """Callers on five task queues on each of two replicas, nothing to do: once settled,
    their waiting costs no request to the Azure queues at all (the doorbell table is read
    once per interval per replica, whatever the number of task queues)."""
    storage = StorageSettings(proxy.connection_string(), storage_prefix)
    replicas = [await make_server(**quiet(storage=storage, run_resolvers=False))
                for _ in range(2)]
    queues = [f"prov/idle{i}" for i in range(5)]
    waiting = [asyncio.create_task(claim_work(http, r, q, worker_id=f"w{n}"))
               for n, r in enumerate(replicas) for q in queues]
    for r in replicas:
        for q in queues:
            await settled(r, q)
    before = proxy.counts.copy()
    started = asyncio.get_running_loop().time()
    await stays(lambda: (proxy.counts["queue forwarded"] - before["queue forwarded"],
                         sum(w.done() for w in waiting)),
                lambda seen: seen == (0, 0), for_=5.0,
                what="no request to the Azure queues, every caller waiting")
    seconds = asyncio.get_running_loop().time() - started
    table_requests = proxy.counts["table forwarded"] - before["table forwarded"]
    # The doorbell's reads, a few per second per replica, not per task queue.
    assert table_requests <= 2 * (seconds / DOORBELL + 2)
    # A third replica, where nobody waits, creates a task: one of the two callers gets it.
    creator = await make_server(**quiet(storage=storage, run_resolvers=False))
    task_id = await create(http, creator.api, definition(queues[3]))
    done, _ = await asyncio.wait([waiting[3], waiting[len(queues) + 3]], timeout=WAIT / 2,
                                 return_when=asyncio.FIRST_COMPLETED)
    [claim] = done.pop().result()
    assert claim["status"]["taskId"] == task_id
    for w in waiting:
        w.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)




async def test_a_replica_that_cannot_remove_its_ears_while_stopping_still_stops(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    """A stopping replica removes its ears from the doorbell table as a courtesy; when
    storage does not answer that in time (thousands of ears, or storage slow), it says so
    and stops: the ears expire by themselves."""
    caplog.set_level(logging.INFO, logger="azqueue.service.dispatch.tablebell")
    monkey = pytest.MonkeyPatch()
    monkey.setattr(tablebell, "FORGET_WITHIN", 1.0)
    try:
        server = await make_server(**quiet(
            storage=StorageSettings(proxy.connection_string(), storage_prefix),
            claim_work_wait=2.0))
        waiting = asyncio.create_task(claim_work(http, server, "prov/leaving"))
        await settled(server, "prov/leaving")
        assert await waiting == []
        # Every table write from now on, among them the removal of the ears (another may
        # be the record of the task queue its caller asked about, written meanwhile).
        held = [proxy.hold("POST", "$batch") for _ in range(3)]
        try:
            await asyncio.wait_for(server.stop(), 30)
        finally:
            for h in held:
                h.release()
    finally:
        monkey.undo()
    assert any("ears on 1 task queue(s) were left in the table" in r.getMessage()
               for r in caplog.records)
