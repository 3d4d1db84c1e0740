"""Workers as the queue sees them: quarantine (claimWork and SAS claims), the pending
counts a provisioner reads, and the record of a worker's recent tasks."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
import taskcluster

from azqueue.config import StorageSettings
from azqueue.storage.keys import encode as key
from azqueue.testing import sas
from azqueue.testing.faultproxy import FaultProxy
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition, iso, status
from azqueue.worker.client import Credentials
from azqueue.worker.sas import SasSource
from tests.integration.test_claim_work import callers_waiting, claim_work
from tests.servers import ROOT, Server, ServerFactory
from tests.waiting import eventually


def _worker_url(server: Server, task_queue_id: str, worker_id: str, *, group: str = "wg",
                declare: bool = False) -> str:
    provisioner_id, worker_type = task_queue_id.split("/")
    workers = "" if declare else "/workers"
    return (f"{server.api}/provisioners/{provisioner_id}/worker-types/{worker_type}"
            f"{workers}/{group}/{worker_id}")


async def _put(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.put(url, json=body) as r:
        answer: dict[str, Any] = await r.json()
        assert r.status == 200, answer
        return answer


async def _quarantine(http: aiohttp.ClientSession, server: Server, task_queue_id: str,
                      worker_id: str, until: datetime) -> None:
    await _put(http, _worker_url(server, task_queue_id, worker_id),
               {"quarantineUntil": iso(until), "quarantineInfo": "tests"})


async def _declare(http: aiohttp.ClientSession, server: Server, task_queue_id: str,
                   worker_id: str) -> None:
    await _put(http, _worker_url(server, task_queue_id, worker_id, declare=True),
               {"expires": iso(datetime.now(UTC) + timedelta(days=1))})


async def _get(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url) as r:
        answer: dict[str, Any] = await r.json()
        assert r.status == 200, answer
        return answer


async def test_a_quarantined_worker_gets_no_work_from_claim_work_until_quarantine_until(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'Quarantining a worker allows the machine to remain alive but not accept jobs. Once
    the quarantineUntil time has elapsed, the worker resumes accepting jobs' (Taskcluster's
    worker-response schema): claimWork answers no tasks, as Taskcluster's does."""
    server = await make_server(claim_work_wait=1.0)
    tq = "prov/quarantine-cw"
    await _declare(http, server, tq, "w1")
    await _quarantine(http, server, tq, "w1", datetime.now(UTC) + timedelta(hours=1))
    task_id = await create(http, server.api, definition(tq))

    assert await claim_work(http, server, tq, worker_id="w1") == []
    assert (await status(http, server.api, task_id))["state"] == "pending"
    got = await claim_work(http, server, tq, worker_id="w2")  # others still get the task
    assert [c["status"]["taskId"] for c in got] == [task_id]

    # A quarantine that ends on its own: no further call lifts it.
    await _quarantine(http, server, tq, "w1", datetime.now(UTC) + timedelta(seconds=2))
    second = await create(http, server.api, definition(tq))
    claimed = await eventually(lambda: claim_work(http, server, tq, worker_id="w1"),
                               what="w1 claims once its quarantine has passed")
    assert [c["status"]["taskId"] for c in claimed] == [second]


async def _quarantined_caller_waiting(http: aiohttp.ClientSession, server: Server,
                                      task_queue_id: str) -> asyncio.Task[list[Any]]:
    """A claimWork call of worker w1, quarantined for an hour, waiting on ``server``."""
    await _declare(http, server, task_queue_id, "w1")
    await _quarantine(http, server, task_queue_id, "w1",
                      datetime.now(UTC) + timedelta(hours=1))
    waiting = asyncio.create_task(claim_work(http, server, task_queue_id, worker_id="w1"))
    await callers_waiting(server, task_queue_id)
    return waiting


async def _claimed_at_first_try(http: aiohttp.ClientSession, server: Server,
                                messages: list[sas.QueueMessage], task_id: str,
                                waiting: asyncio.Task[list[Any]]) -> None:
    """The tip given back, polled (``messages``), claims ``task_id`` for a SAS worker
    (w2) at its first try; the quarantined caller got nothing."""
    assert [(m.tip["taskId"], m.tip["runId"]) for m in messages] == [(task_id, 0)]
    code, claim = await sas.claim(http, server.api, messages[0], worker_id="w2")
    assert code == 200, claim
    assert claim["status"]["taskId"] == task_id and claim["runId"] == 0, claim
    assert await waiting == []


async def test_a_task_created_while_a_quarantined_worker_waits_goes_to_others_at_once(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """A quarantined worker waits in claimWork on the replica where a task of its queue is
    created: the tip, put hidden as that caller's claim would hold it, is not claimed by
    it and is given back as run 0's, visible at once, and a SAS worker following the
    worker rules claims the task within seconds (the tip repair is ten minutes away).
    The tip was not recorded when it was handed over (a claimWork caller's claim needs no
    record); given back, it is, so the SAS worker's first claim of it succeeds."""
    server = await make_server(claim_work_wait=3.0, claim_work_poll_interval=60.0,
                               tip_repair_delay=600.0)
    tq = "prov/quarantine-wait"
    waiting = await _quarantined_caller_waiting(http, server, tq)
    task_id = await create(http, server.api, definition(tq))

    urls = await sas.poll_task_urls(http, server.api, "prov", "quarantine-wait")
    queue = urls["queues"][6]
    messages = await eventually(lambda: sas.get_messages(http, queue["signedPollUrl"]),
                                what="the tip given back, visible")
    await _claimed_at_first_try(http, server, messages, task_id, waiting)


async def test_a_tip_given_back_before_its_task_is_stored_is_recorded_once_it_is(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        http: aiohttp.ClientSession) -> None:
    """As above, but the quarantined caller gives the tip back while storage still holds
    the task's insert: the tip is recorded once the task is stored, and the SAS worker
    that polled it meanwhile claims the task with it at its first try."""
    server = await make_server(
        storage=StorageSettings(proxy.connection_string(), storage_prefix),
        claim_work_wait=3.0, claim_work_poll_interval=60.0, tip_repair_delay=600.0)
    tq = "prov/quarantine-held"
    waiting = await _quarantined_caller_waiting(http, server, tq)
    urls = await sas.poll_task_urls(http, server.api, "prov", "quarantine-held")
    insert = proxy.hold("POST", "/$batch")
    creating = asyncio.create_task(create(http, server.api, definition(tq)))
    try:
        messages = await eventually(
            lambda: sas.get_messages(http, urls["queues"][6]["signedPollUrl"]),
            what="the tip given back, visible")
        assert insert.reached.is_set() and not creating.done()
    finally:
        insert.release()
    task_id = await creating
    await _claimed_at_first_try(http, server, messages, task_id, waiting)


async def test_a_quarantined_workers_sas_claim_is_403_and_its_tip_goes_to_others_at_once(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """A quarantined worker's claimTask is refused 403 WorkerQuarantined ('401 or 403 ...
    leave the message', docs/workers/sas.md), and the tip it presented is visible again at
    once: another worker polls it and claims the task. Lifting the quarantine (a quarantineUntil
    in the past) takes effect at once on this replica."""
    server = await make_server()
    tq = "prov/quarantine-sas"
    task_id = await create(http, server.api, definition(tq))
    await _declare(http, server, tq, "w1")
    await _quarantine(http, server, tq, "w1", datetime.now(UTC) + timedelta(hours=1))
    urls = await sas.poll_task_urls(http, server.api, "prov", "quarantine-sas")
    [message] = await sas.poll_once(http, urls)

    code, body = await sas.claim(http, server.api, message, worker_id="w1")
    assert (code, body["code"]) == (403, "WorkerQuarantined"), body
    assert "quarantined until" in body["message"]
    assert (await status(http, server.api, task_id))["state"] == "pending"
    [again] = await sas.poll_once(http, urls)  # not hidden for the poll's 30 s
    assert again.message_id == message.message_id
    code, body = await sas.claim(http, server.api, again, worker_id="w2")
    assert code == 200 and body["status"]["runs"][0]["workerId"] == "w2", body

    await _quarantine(http, server, tq, "w1", datetime.now(UTC) - timedelta(seconds=1))
    second = await create(http, server.api, definition(tq))
    [message] = await sas.poll_once(http, urls)
    code, body = await sas.claim(http, server.api, message, worker_id="w1")
    assert code == 200 and body["status"]["taskId"] == second, body


async def test_pending_counts_across_priorities_count_each_pending_run_once(
        server: Server, http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    """'the provisioner would over-provision aggressively as it would be unable to tell the
    number of pending tasks' (docs/workers/sas.md): the count leaves out the tips held by running claims
    and the stale tip of a task cancelled while pending, which Azure's approximate message
    count includes."""
    tq = "prov/counts"
    for priority, n in (("high", 2), ("very-low", 1), ("lowest", 3)):
        for _ in range(n):
            await create(http, server.api, definition(tq, priority=priority))
    await create(http, server.api, definition("prov/counts-other"))
    counts_url = f"{server.api}/task-queues/{tq.replace('/', '%2F')}/counts"
    pending_url = f"{server.api}/pending/{tq.replace('/', '%2F')}"

    assert (await _get(http, pending_url))["pendingTasks"] == 6
    [claimed] = await claim_work(http, server, tq)
    assert claimed["status"]["runs"][0]["state"] == "running"
    last = await create(http, server.api, definition(tq))
    async with http.post(f"{server.api}/task/{last}/cancel", json={}) as r:
        assert r.status == 200, await r.text()

    counts = await eventually(lambda: _get(http, counts_url),
                              lambda c: c["pendingTasks"] == 5,
                              what="5 pending: 6, less the claimed, the cancelled not counted")
    assert counts["taskQueueId"] == tq
    # 5 pending tips, the claimed run's, the cancelled task's, over the seven queues
    assert await storage.pending_count(tq) == 7


async def test_a_worker_is_listed_after_claiming_with_its_recent_tasks(
        server: Server, http: aiohttp.ClientSession) -> None:
    """'recentTasks: List of 20 most recent tasks claimed by the worker' (Taskcluster's
    worker-response schema), for a SAS worker as for claimWork."""
    tq = "prov/listed"
    task_id = await create(http, server.api, definition(tq))
    urls = await sas.poll_task_urls(http, server.api, "prov", "listed")
    [message] = await sas.poll_once(http, urls)
    code, body = await sas.claim(http, server.api, message, worker_id="sas-1")
    assert code == 200, body

    listing = await eventually(
        lambda: _get(http, f"{server.api}/provisioners/prov/worker-types/listed/workers"),
        lambda r: r["workers"], what="sas-1 listed")
    assert [(w["workerId"], w["latestTask"]) for w in listing["workers"]] == [
        ("sas-1", {"taskId": task_id, "runId": 0})]
    worker = await _get(http, _worker_url(server, tq, "sas-1"))
    assert worker["recentTasks"] == [{"taskId": task_id, "runId": 0}]
    assert worker["lastDateActive"] >= worker["firstClaim"]


async def test_a_declared_expiry_is_not_moved_back_by_activity_or_an_earlier_declaration(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'The expiration time is not allowed to move backward' (Taskcluster's
    queue_worker_seen): a worker declared until a later date keeps it while it works."""
    server = await make_server(claim_work_wait=1.0)
    tq = "prov/declared"
    later = iso(datetime.now(UTC) + timedelta(days=3))
    url = _worker_url(server, tq, "w1", declare=True)
    assert (await _put(http, url, {"expires": later}))["expires"] == later
    earlier = iso(datetime.now(UTC) + timedelta(days=2))
    assert (await _put(http, url, {"expires": earlier}))["expires"] == later

    task_id = await create(http, server.api, definition(tq))
    assert [c["status"]["taskId"] for c in await claim_work(http, server, tq, worker_id="w1")] \
        == [task_id]
    worker = await eventually(lambda: _get(http, _worker_url(server, tq, "w1")),
                              lambda w: w["recentTasks"], what="the claim recorded")
    assert worker["expires"] == later


async def test_quarantine_details_keep_the_latest_changes_that_fit_a_table_property(
        server: Server, http: aiohttp.ClientSession) -> None:
    """quarantineInfo may hold 4000 characters (Taskcluster's quarantine-worker-request
    schema); a table string property holds 32K: older details make way for newer ones."""
    tq = "prov/details"
    await _declare(http, server, tq, "w1")
    until = iso(datetime.now(UTC) + timedelta(hours=1))
    for n in range(10):
        answer = await _put(http, _worker_url(server, tq, "w1"),
                            {"quarantineUntil": until, "quarantineInfo": f"{n}" * 4000})
    details = answer["quarantineDetails"]
    assert 1 < len(details) < 10 and details[-1]["quarantineInfo"] == "9" * 4000
    assert (await _get(http, _worker_url(server, tq, "w1")))["quarantineDetails"] == details


@pytest.mark.slow
async def test_a_quarantine_reaches_another_replica_within_its_copys_lifetime(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """Replicas share nothing but storage: one that read the quarantined workers before the
    quarantine sees it once its copy is older than 10 s, then refuses the worker's claims."""
    first, second = await make_server(), await make_server()
    tq = "prov/replicas"
    await _declare(http, first, tq, "w1")
    info = second.services.workers
    assert await info.quarantined_until(tq, "wg", "w1") is None  # the second reads its copy
    await _quarantine(http, first, tq, "w1", datetime.now(UTC) + timedelta(hours=1))
    await eventually(lambda: info.quarantined_until(tq, "wg", "w1"),
                     lambda until: until is not None, what="the second replica sees it")
    task_id = await create(http, second.api, definition(tq))
    code, body = await sas.post(http, f"{second.api}/task/{task_id}/runs/0/claim",
                                {"workerGroup": "wg", "workerId": "w1"})
    assert (code, body["code"]) == (403, "WorkerQuarantined"), body


async def test_expired_workers_and_task_queues_are_deleted_unless_quarantined(
        server: Server, http: aiohttp.ClientSession) -> None:
    """'Date and time after which the worker will be automatically deleted by the queue'
    (Taskcluster's worker-response schema); quarantined workers stay until their
    quarantine ends."""
    tq = "prov/expiring"
    await _declare(http, server, tq, "gone")
    await _declare(http, server, tq, "held")
    await _quarantine(http, server, tq, "held", datetime.now(UTC) + timedelta(days=7))
    info = server.services.workers  # its expiry pass, run here at chosen times
    # Workers expire a day after they were last seen, task queues five days after.
    assert await info.expire(datetime.now(UTC) + timedelta(days=2)) == 1  # "gone"
    deleted = await info.expire(datetime.now(UTC) + timedelta(days=6))
    assert deleted == 2  # the task queue, its provisioner
    for url, code in ((_worker_url(server, tq, "gone"), 404),
                      (_worker_url(server, tq, "held"), 200),
                      (f"{server.api}/task-queues/{tq.replace('/', '%2F')}", 404)):
        async with http.get(url) as r:
            assert r.status == code, (url, await r.text())


async def test_a_quarantined_sdk_sas_worker_says_so_and_waits_instead_of_blaming_its_credentials(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    """The SDK's SAS source, refused 403 WorkerQuarantined, leaves the tip (visible again
    for others) and waits its longest idle sleep before polling again."""
    server = await make_server()
    tq = "prov/quarantine-sdk"
    task_id = await create(http, server.api, definition(tq))
    await _declare(http, server, tq, "w1")
    await _quarantine(http, server, tq, "w1", datetime.now(UTC) + timedelta(hours=1))
    async with aiohttp.ClientSession() as session:
        source = SasSource(session, server.root_url, Credentials(ROOT.client_id,
                           ROOT.access_token), tq, "wg", "w1", max_idle_sleep=0.5)
        started = asyncio.get_running_loop().time()
        assert await source.get(1, asyncio.Event()) == []
        assert asyncio.get_running_loop().time() - started >= 0.3
    assert any("is quarantined until" in r.getMessage() and r.levelname == "WARNING"
               for r in caplog.records)
    assert not any("credentials" in r.getMessage() for r in caplog.records)
    assert (await status(http, server.api, task_id))["state"] == "pending"


async def test_a_worker_is_listed_while_its_first_claim_work_call_still_waits(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """A worker is known from its first request for work on (listWorkers, and so `task
    create`'s check for a task queue nobody asks), not once that request's wait is over;
    its first claims are recorded as they come, not a record interval later."""
    server = await make_server(claim_work_wait=120.0)
    tq = "prov/first-call"
    url = f"{server.api}/provisioners/prov/worker-types/first-call/workers"
    waiting = asyncio.ensure_future(claim_work(http, server, tq, worker_id="early"))
    try:
        listing = await eventually(lambda: _get(http, url), lambda r: r["workers"],
                                   what="the waiting worker listed")
        assert [w["workerId"] for w in listing["workers"]] == ["early"]
        assert not waiting.done()
        task_id = await create(http, server.api, definition(tq))
        assert [c["status"]["taskId"] for c in await waiting] == [task_id]
        worker = await eventually(lambda: _get(http, _worker_url(server, tq, "early")),
                                  lambda w: w["recentTasks"], what="its first claim recorded",
                                  timeout=20)
        assert worker["recentTasks"] == [{"taskId": task_id, "runId": 0}]
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


async def test_an_sdk_sas_worker_is_listed_from_its_first_poll_before_any_claim(
        server: Server, http: aiohttp.ClientSession) -> None:
    """The SDK's SAS worker names itself to pollTaskUrls: listWorkers shows it while it
    has found no work yet. A poll naming half a worker is refused saying what to send."""
    tq = "prov/sas-first-poll"
    url = f"{server.api}/provisioners/prov/worker-types/sas-first-poll/workers"
    async with aiohttp.ClientSession() as session:
        source = SasSource(session, server.root_url, Credentials(ROOT.client_id,
                           ROOT.access_token), tq, "wg", "polling", max_idle_sleep=0.5)
        assert await source.get(1, asyncio.Event()) == []
    listing = await eventually(lambda: _get(http, url), lambda r: r["workers"],
                               what="the polling SAS worker listed")
    assert [w["workerId"] for w in listing["workers"]] == ["polling"]
    async with http.get(f"{server.api}/poll-task-url/prov/sas-first-poll?workerGroup=wg") as r:
        answer = await r.json()
        assert r.status == 400, answer
    assert "`workerGroup` ('wg') and `workerId` (None) go together" in answer["message"]
    # Credentials that may poll but not act as the worker they name are served their URLs
    # and record no worker.
    now = datetime.now(UTC)
    poll_only = taskcluster.createTemporaryCredentials(
        ROOT.client_id, ROOT.access_token, now - timedelta(minutes=1), now + timedelta(hours=1),
        [f"queue:poll-task-urls:{tq}"])
    async with aiohttp.ClientSession() as session:
        source = SasSource(session, server.root_url, Credentials(
            poll_only["clientId"], poll_only["accessToken"], poll_only["certificate"]),
            tq, "wg", "impostor", max_idle_sleep=0.5)
        assert await source.get(1, asyncio.Event()) == []
    assert [w["workerId"] for w in (await _get(http, url))["workers"]] == ["polling"]


async def test_a_worker_deleted_while_it_is_being_quarantined_is_not_known(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    """The expiry pass may delete a worker's row between quarantineWorker's read and its
    write: the answer is the 404 of a worker not known, not a 500."""
    server = await make_server(storage=StorageSettings(proxy.connection_string(),
                                                       storage_prefix))
    tq = "prov/vanishing"
    await _declare(http, server, tq, "w1")
    write = proxy.hold("PATCH", storage.table_name("workers"))
    quarantine = asyncio.create_task(http.put(_worker_url(server, tq, "w1"), json={
        "quarantineUntil": iso(datetime.now(UTC) + timedelta(hours=1)),
        "quarantineInfo": "tests"}))
    try:
        await asyncio.wait_for(write.reached.wait(), 30)
        [row] = await storage.rows("workers", key(tq))
        await storage.table("workers").delete_entity(row["PartitionKey"], row["RowKey"])
    finally:
        write.release()
    async with await quarantine as r:
        assert r.status == 404, await r.text()
        assert "w1" in (await r.json())["message"]
