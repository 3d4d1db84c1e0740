"""Azure's own failures, injected by a proxy in front of the test Azurite: throttling
(503 ServerBusy) and writes applied whose answer is lost (500 OperationTimedOut, or a
dropped connection). The rates default to 5% and 5%; set AZQUEUE_TEST_FAULTS="busy,lost"
(shares, e.g. "0.05,0.10") to change them."""

from __future__ import annotations

import asyncio
import logging
import os
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import pytest
import taskcluster.aio

from azqueue.config import StorageSettings
from azqueue.model import timeutil
from azqueue.service.runs import changes, triggers, workclaimer
from azqueue.testing import sas
from azqueue.testing.faultproxy import FaultProxy, Faults
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import definition, slugid, status
from tests.integration.test_claim_work import callers_waiting
from tests.servers import ROOT, Server, ServerFactory
from tests.waiting import eventually

BUSY, LOST = (float(x) for x in os.environ.get("AZQUEUE_TEST_FAULTS", "0.05,0.05").split(","))
TASKS = 240
# Short, so that the test sees a repair: in production it is minutes.
REPAIR_DELAY = 3.0
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=30)


@pytest.fixture
async def faulty_servers(proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str
                         ) -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    """Start replicas whose storage is behind the fault proxy."""

    async def start(**overrides: Any) -> Server:
        return await make_server(**{
            "storage": StorageSettings(proxy.connection_string(), storage_prefix),
            "tip_repair_delay": REPAIR_DELAY, "deadline_resolver_interval": 0.5,
            "claim_resolver_interval": 0.5, **overrides})

    yield start
    proxy.faults = Faults()


class Clients:
    """What the clients saw: every answer of the queue API by endpoint and status, and
    the requests that got no answer in time."""

    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http
        self.answers: Counter[tuple[str, int]] = Counter()
        self.failures: list[str] = []

    async def call(self, endpoint: str, method: str, url: str,
                   body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        try:
            async with self.http.request(method, url, json=body, timeout=CLIENT_TIMEOUT) as r:
                data = await r.json()
                self.answers[(endpoint, r.status)] += 1
                if r.status >= 500:
                    self.failures.append(f"{endpoint} answered {r.status}: {data}")
                return r.status, data
        except (TimeoutError, aiohttp.ClientError) as e:
            self.failures.append(f"{endpoint}: {type(e).__name__}: {e}")
            return 0, {}

    async def claim_work(self, api: str, task_queue: str, worker_id: str
                         ) -> list[dict[str, Any]]:
        """A claimWork call for up to four tasks: the claims it answered (none if it
        failed)."""
        code, body = await self.call(
            "claimWork", "POST", f"{api}/claim-work/{task_queue.replace('/', '%2F')}",
            {"workerGroup": "wg", "workerId": worker_id, "tasks": 4})
        return list(body["tasks"]) if code == 200 else []


@pytest.mark.slow
async def test_through_throttling_and_lost_answers_every_task_is_resolved_exactly_once(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession) -> None:
    """A few hundred tasks through two replicas, SAS and claimWork workers, with storage
    throttled and losing answers: no 5xx and no time-out for any client, every task
    claimed once and completed once (one run), none left pending without a tip."""
    replicas = [await faulty_servers(), await faulty_servers()]
    proxy.faults = Faults(busy=BUSY, lost=LOST)
    clients = Clients(http)
    claimed: dict[str, list[tuple[int, str]]] = {}
    completed: Counter[str] = Counter()
    created: list[str] = []
    done = asyncio.Event()

    async def create(i: int, queue: str) -> None:
        task_id = slugid()
        code, body = await clients.call("createTask", "PUT",
                                        f"{replicas[i % 2].api}/task/{task_id}",
                                        definition(queue))
        assert code == 200 or code == 0 or code >= 500, body
        if code == 200:
            created.append(task_id)

    async def work(api: str, task_id: str, run_id: int, worker: str) -> None:
        claimed.setdefault(task_id, []).append((run_id, worker))
        code, body = await clients.call("reportCompleted", "POST",
                                        f"{api}/task/{task_id}/runs/{run_id}/completed")
        if code == 200:
            completed[task_id] += 1

    async def sas_worker(i: int) -> None:
        api = replicas[i % 2].api
        urls: dict[str, Any] = {}
        while not done.is_set():
            if not urls:
                code, urls = await clients.call("pollTaskUrls", "GET",
                                                f"{api}/poll-task-url/prov/faults-sas")
                if code != 200:
                    urls = {}
                    continue
            queue = urls["queues"][6]
            try:
                async with http.get(f"{queue['signedPollUrl']}&numofmessages=4"
                                    "&visibilitytimeout=5") as r:
                    text = await r.text()
                    if r.status != 200:  # throttled: poll again, as a worker does
                        await asyncio.sleep(0.1)
                        continue
            except aiohttp.ClientError:
                continue
            messages = [sas.QueueMessage(m.findtext("MessageId", ""),
                                         m.findtext("PopReceipt", ""), 0,
                                         m.findtext("MessageText", ""))
                        for m in ET.fromstring(text).findall("QueueMessage")]
            if not messages:
                await asyncio.sleep(0.2)
            for m in messages:
                tip = m.tip
                code, claim = await clients.call(
                    "claimTask", "POST", f"{api}/task/{tip['taskId']}/runs/{tip['runId']}/claim",
                    {"workerGroup": "wg", "workerId": f"sas{i}", "messageId": m.message_id,
                     "receipt": m.pop_receipt, "signature": tip["signature"]})
                if code == 200:
                    await work(api, tip["taskId"], claim["runId"], f"sas{i}")
                elif 400 <= code < 500:  # not ours: delete the tip (docs/workers/sas.md)
                    try:
                        async with http.delete(sas.delete_url(queue["signedDeleteUrl"], m)) as r:
                            await r.read()
                    except aiohttp.ClientError:
                        pass

    async def claim_work_worker(i: int) -> None:
        api = replicas[i % 2].api
        while not done.is_set():
            for claim in await clients.claim_work(api, "prov/faults-cw", f"cw{i}"):
                await work(api, claim["status"]["taskId"], claim["runId"], f"cw{i}")

    workers = [asyncio.create_task(sas_worker(i)) for i in range(4)] + \
              [asyncio.create_task(claim_work_worker(i)) for i in range(4)]
    try:
        limit = asyncio.Semaphore(16)

        async def limited(i: int) -> None:
            async with limit:
                await create(i, "prov/faults-sas" if i % 2 else "prov/faults-cw")

        await asyncio.gather(*(limited(i) for i in range(TASKS)))
        await eventually(lambda: _completed(completed, created), what="every task completed",
                         timeout=60, interval=0.5)
    finally:
        done.set()
        await asyncio.gather(*workers, return_exceptions=True)
    proxy.faults = Faults()

    assert clients.failures == [], clients.failures[:10]
    assert len(created) == TASKS
    twice = {t: c for t, c in claimed.items() if len(c) != 1}
    assert twice == {} and set(claimed) == set(created), f"handed out twice or never: {twice}"
    assert completed == Counter({t: 1 for t in created})
    for task_id in created[::8]:
        final = await status(http, replicas[0].api, task_id)
        assert [r["state"] for r in final["runs"]] == ["completed"], final
    _faults_happened(proxy)


def _hold_next_insert(server: Server) -> tuple[asyncio.Event, asyncio.Event]:
    """Make the next task insert of ``server`` wait: the first event is set when it does,
    and it goes on once the second is."""
    tasks = server.services.definitions.tasks
    insert = tasks.insert
    reached, release = asyncio.Event(), asyncio.Event()

    async def held(*args: Any, **kwargs: Any) -> Any:
        tasks.insert = insert  # type: ignore[method-assign]
        reached.set()
        await release.wait()
        return await insert(*args, **kwargs)

    tasks.insert = held  # type: ignore[method-assign]
    return reached, release


@pytest.mark.slow
async def test_through_throttling_and_lost_answers_every_dependent_runs_once_after_its_dependency(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession) -> None:
    """Each of a dozen running tasks is reported completed while ten tasks that depend on
    it are being created through two replicas, at 10 ms a storage round trip, with
    storage throttled and losing answers: the completion lands between the steps of
    those definitions (the windows of docs/concepts.md; one of them has its insert held
    until the report is answered, after the read beside it). No 5xx and no time-out for
    any client; every dependent is claimed once, completed once, and only after its
    dependency's report was sent."""
    settings = {"dependencies_recovery_delay": 2.0, "dependency_resolver_interval": 0.5}
    replicas = [await faulty_servers(**settings), await faulty_servers(**settings)]
    clients = Clients(http)
    loop = asyncio.get_running_loop()
    reported: dict[str, float] = {}  # a dependency's report sent, on the loop's clock
    claimed: dict[str, list[float]] = {}
    completed: Counter[str] = Counter()
    depends: dict[str, str] = {}
    done = asyncio.Event()

    async def create(i: int, body: dict[str, Any]) -> str | None:
        task_id = slugid()
        code, answer = await clients.call("createTask", "PUT",
                                          f"{replicas[i % 2].api}/task/{task_id}", body)
        assert code == 200 or code == 0 or code >= 500, answer
        return task_id if code == 200 else None

    async def report(i: int, task_id: str, run_id: int) -> None:
        reported.setdefault(task_id, loop.time())
        code, _ = await clients.call(
            "reportCompleted", "POST",
            f"{replicas[i % 2].api}/task/{task_id}/runs/{run_id}/completed")
        if code == 200:
            completed[task_id] += 1

    async def worker(i: int) -> None:
        api = replicas[i % 2].api
        while not done.is_set():
            for claim in await clients.claim_work(api, "prov/faults-dependents", f"deps{i}"):
                claimed.setdefault(claim["status"]["taskId"], []).append(loop.time())
                await report(i, claim["status"]["taskId"], claim["runId"])

    async def dependent(i: int, required: str) -> None:
        created = await create(i, definition("prov/faults-dependents",
                                             dependencies=[required]))
        if created is not None:
            depends[created] = required

    parents = [await create(p, definition("prov/faults-parents")) for p in range(12)]
    for p, parent in enumerate(parents):
        assert parent is not None, clients.failures
        code, _ = await clients.call("claimTask", "POST",
                                     f"{replicas[p % 2].api}/task/{parent}/runs/0/claim",
                                     {"workerGroup": "wg", "workerId": "parents"})
        assert code == 200, clients.failures
    workers = [asyncio.create_task(worker(i)) for i in range(4)]
    proxy.delay, proxy.faults = 0.005, Faults(busy=BUSY, lost=LOST)
    try:
        for p, parent in enumerate(parents):
            assert parent is not None
            # The first of the ten inserts is held while the completion is reported: the
            # read beside that insert sees the dependency running (unless a fault holds
            # it up), and the completion finds no task there to tell.
            reached, release = _hold_next_insert(replicas[p % 2])
            creating = asyncio.gather(*(dependent(p + i, parent) for i in range(10)))
            await asyncio.wait_for(reached.wait(), 30)
            await report(p, parent, 0)
            release.set()
            await creating
        await eventually(lambda: all(completed[t] for t in [*parents, *depends]),
                         what="every task completed", timeout=60, interval=0.5)
    finally:
        done.set()
        await asyncio.gather(*workers, return_exceptions=True)
        proxy.delay, proxy.faults = 0.0, Faults()

    assert clients.failures == [], clients.failures[:10]
    assert len(depends) == 120
    twice = {t: c for t, c in claimed.items() if len(c) != 1}
    assert twice == {}, f"claimed more than once: {twice}"
    assert completed == Counter({t: 1 for t in [*parents, *depends]})
    early = [t for t, required in depends.items() if claimed[t][0] < reported[required]]
    assert early == [], "claimed before the report of their dependency was sent"
    for task_id in list(depends)[::10]:
        final = await status(http, replicas[0].api, task_id)
        assert [(r["state"], r["reasonCreated"]) for r in final["runs"]] == \
            [("completed", "scheduled")], final
    _faults_happened(proxy)


def _faults_happened(proxy: FaultProxy) -> None:
    """The proxy throttled requests and lost answers (else the test proves nothing)."""
    counts = proxy.counts
    assert sum(v for k, v in counts.items() if k.endswith("busy")) > 0, counts
    assert sum(v for k, v in counts.items() if k.endswith(("dropped", "timed out"))) > 0, counts


async def _completed(completed: Counter[str], created: list[str]) -> int:
    return all(completed[t] for t in created) and len(created) == TASKS


async def test_a_pending_task_whose_tip_was_deleted_gets_another_within_the_repair_delay(
        faulty_servers: Callable[..., Awaitable[Server]], http: aiohttp.ClientSession) -> None:
    """A worker deletes a tip it was refused (docs/workers/sas.md), here as when its claim gave
    up waiting for a task stored late; the pending task is left with no tip. The deadline
    message, first visible the repair delay after createTask, gives it another."""
    server = await faulty_servers()
    task_id = slugid()
    async with http.put(f"{server.api}/task/{task_id}", json=definition("prov/repair")) as r:
        assert r.status == 200, await r.text()
    urls = await sas.poll_task_urls(http, server.api, "prov", "repair")
    queue = urls["queues"][6]
    [message] = await sas.get_messages(http, queue["signedPollUrl"])
    assert message.tip["taskId"] == task_id
    assert await sas.delete_message(http, queue["signedDeleteUrl"], message) == 204

    async def poll() -> list[sas.QueueMessage]:
        return await sas.get_messages(http, queue["signedPollUrl"])

    [again] = await eventually(poll, what="another tip for the pending task", timeout=30)
    assert again.tip == {**again.tip, "taskId": task_id, "runId": 0}
    code, claim = await sas.claim(http, server.api, again)
    assert code == 200, claim
    assert (await status(http, server.api, task_id))["state"] == "running"


async def test_an_outage_is_answered_503_with_retry_after_and_resolvers_catch_up_after_it(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession) -> None:
    """Storage answering nothing but ServerBusy: a client is answered 503 with
    Retry-After and a {code, message} body (not held, not a 500); the deadline resolver
    keeps trying, and once storage is back resolves the task whose deadline passed
    meanwhile."""
    server = await faulty_servers(request_budget=1.0)
    task_id = slugid()
    body = definition("prov/outage", deadline=timedelta(seconds=2))
    async with http.put(f"{server.api}/task/{task_id}", json=body) as r:
        assert r.status == 200, await r.text()
    deadline = timeutil.parse(body["deadline"])
    proxy.faults = Faults(busy=1.0)
    try:
        async with http.get(f"{server.api}/task/{task_id}/status") as r:
            answer = await r.json()
            assert r.status == 503, answer
            assert int(r.headers["Retry-After"]) > 0
        assert answer["code"] == "StorageUnavailable" and "try again" in answer["message"]

        async def now() -> datetime:
            return timeutil.utcnow()

        await eventually(now, lambda t: t > deadline + timedelta(seconds=1),
                         what="the deadline passed during the outage")
    finally:
        proxy.faults = Faults()
    final = await eventually(lambda: status(http, server.api, task_id),
                             lambda s: s["state"] == "exception", what="deadline resolved")
    assert final["runs"][0]["reasonResolved"] == "deadline-exceeded"


@pytest.mark.parametrize("fault", ["timed out", "dropped"])
async def test_a_claim_whose_rewrite_was_applied_but_not_answered_is_still_a_claim(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, fault: str) -> None:
    """The tip's rewrite is applied and its answer lost: sent again, it is told the
    receipt no longer matches. The claim goes on without holding the message (it
    reappears at takenUntil and is refused then) instead of refusing the worker."""
    server = await faulty_servers()
    task_id = await _create(http, server, "prov/lostclaim")
    urls = await sas.poll_task_urls(http, server.api, "prov", "lostclaim")
    [message] = await sas.get_messages(http, urls["queues"][6]["signedPollUrl"])
    proxy.once("PUT", f"/messages/{message.message_id}", fault)
    code, claim = await sas.claim(http, server.api, message)
    assert code == 200, claim
    assert (await status(http, server.api, task_id))["runs"][0]["state"] == "running"
    code, done = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
    assert code == 200 and done["status"]["state"] == "completed", done


async def test_a_second_tip_of_a_run_claimed_without_its_receipt_is_refused_to_its_worker(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession) -> None:
    """A claim whose rewrite was applied and not answered holds the run without the
    message's receipt. Its worker, handed another tip of that run (a repeated createTask
    put one), is told it is a duplicate (409), not given the run a second time; the claim
    sent again with its own message is answered as before."""
    server = await faulty_servers()
    body = definition("prov/secondtip")
    task_id = slugid()
    for _ in range(2):  # the same definition again: a second tip of run 0
        async with http.put(f"{server.api}/task/{task_id}", json=body) as r:
            assert r.status == 200, await r.text()
    urls = await sas.poll_task_urls(http, server.api, "prov", "secondtip")
    first, second = await sas.get_messages(http, urls["queues"][6]["signedPollUrl"], 2)
    proxy.once("PUT", f"/messages/{first.message_id}", "timed out")
    code, claim = await sas.claim(http, server.api, first)
    assert code == 200, claim
    code, refused = await sas.claim(http, server.api, second)
    assert code == 409 and "duplicate tip" in refused["message"], refused
    code, again = await sas.claim(http, server.api, first)
    assert code == 200 and again["takenUntil"] == claim["takenUntil"], again


async def test_a_reclaim_whose_message_update_was_applied_but_not_answered_is_a_reclaim(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession) -> None:
    """reclaimTask pushes the held message out and its answer is lost: the reclaim is
    answered all the same (takenUntil extended), and the run can be completed."""
    server = await faulty_servers()
    task_id = await _create(http, server, "prov/lostreclaim")
    urls = await sas.poll_task_urls(http, server.api, "prov", "lostreclaim")
    [message] = await sas.get_messages(http, urls["queues"][6]["signedPollUrl"])
    code, claim = await sas.claim(http, server.api, message)
    assert code == 200, claim
    proxy.once("PUT", f"/messages/{message.message_id}", "timed out")
    code, reclaim = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/reclaim")
    assert code == 200, reclaim
    assert reclaim["takenUntil"] >= claim["takenUntil"]
    code, done = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
    assert code == 200 and done["status"]["state"] == "completed", done


async def _put_task(http: aiohttp.ClientSession, server: Server, task_id: str,
                    body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with http.put(f"{server.api}/task/{task_id}", json=body) as r:
        return r.status, await r.json()


async def _create(http: aiohttp.ClientSession, server: Server, task_queue_id: str) -> str:
    task_id = slugid()
    async with http.put(f"{server.api}/task/{task_id}", json=definition(task_queue_id)) as r:
        assert r.status == 200, await r.text()
    return task_id


async def test_a_report_is_answered_once_stored_while_its_message_is_deleted_after(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    """reportCompleted answers once the resolution is stored: the delete of the message
    the run held goes out after the answer, so a delete that storage is slow to take
    holds up neither the worker nor the resolution, and the message goes all the same."""
    server = await faulty_servers()
    task_id = await _create(http, server, "prov/reportfirst")
    urls = await sas.poll_task_urls(http, server.api, "prov", "reportfirst")
    [message] = await sas.get_messages(http, urls["queues"][6]["signedPollUrl"])
    code, claim = await sas.claim(http, server.api, message)
    assert code == 200, claim
    pending = storage.pending_queue("prov/reportfirst")
    delete = proxy.hold("DELETE", f"/{pending}/messages/")
    try:
        code, done = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
        assert code == 200 and done["status"]["state"] == "completed", done
        assert await storage.message_count(pending) == 1  # its delete not yet applied
        await asyncio.wait_for(delete.reached.wait(), 30)
    finally:
        delete.release()
    await eventually(lambda: storage.message_count(pending), lambda n: n == 0,
                     what="the run's message deleted after the report's answer")


async def test_a_burst_of_reports_settles_every_message_with_a_bounded_number_after_answers(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, storage: StorageInspector,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Many reports at once: only ``MAX_SETTLING`` (2 here) of their messages are deleted
    after the answer; the other reports delete theirs before they are answered, so a
    burst leaves no more requests behind it than that. Every message goes. (Every delete
    is held back by storage until all have been sent: the reports answered meanwhile are
    those whose delete is left to after the answer.)"""
    monkeypatch.setattr(changes, "MAX_SETTLING", 2)
    server = await faulty_servers()
    task_queue_id, count = "prov/burst", 8
    task_ids = [await _create(http, server, task_queue_id) for _ in range(count)]
    urls = await sas.poll_task_urls(http, server.api, "prov", "burst")
    messages = await sas.get_messages(http, urls["queues"][6]["signedPollUrl"], count)
    assert sorted(m.tip["taskId"] for m in messages) == sorted(task_ids)
    for message in messages:
        code, claim = await sas.claim(http, server.api, message)
        assert code == 200, claim
    pending = storage.pending_queue(task_queue_id)
    deletes = [proxy.hold("DELETE", f"/{pending}/messages/") for _ in range(count)]
    reports = [asyncio.create_task(sas.post(http, f"{server.api}/task/{t}/runs/0/completed"))
               for t in task_ids]
    try:
        await asyncio.wait_for(asyncio.gather(*(d.reached.wait() for d in deletes)), 30)
        assert server.services.resolution.changes.settling == 2
        answered = await eventually(lambda: _done(reports), lambda n: n == 2,
                                    what="the reports whose delete is left to after them")
        assert answered == 2
    finally:
        for held in deletes:
            held.release()
    for code, done in await asyncio.gather(*reports):
        assert code == 200 and done["status"]["state"] == "completed", done
    await eventually(lambda: storage.message_count(pending), lambda n: n == 0,
                     what="every run's message deleted")
    assert server.services.resolution.changes.settling == 0


async def _done(tasks: list[asyncio.Task[Any]]) -> int:
    return sum(t.done() for t in tasks)


async def test_shutdown_waits_for_messages_being_settled_and_names_those_left(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, storage: StorageInspector,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A replica stopping while the message of a run it resolved is still being settled
    waits for it only so long (``SETTLE_GRACE``, a moment here), then says which runs'
    messages it left: they reappear when their claims end."""
    monkeypatch.setattr(changes, "SETTLE_GRACE", 0.2)
    server = await faulty_servers()
    task_id = await _create(http, server, "prov/leftover")
    urls = await sas.poll_task_urls(http, server.api, "prov", "leftover")
    [message] = await sas.get_messages(http, urls["queues"][6]["signedPollUrl"])
    code, claim = await sas.claim(http, server.api, message)
    assert code == 200, claim
    delete = proxy.hold("DELETE", f"/{storage.pending_queue('prov/leftover')}/messages/")
    try:
        code, done = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
        assert code == 200, done
        await asyncio.wait_for(delete.reached.wait(), 30)
        with caplog.at_level(logging.WARNING, logger="azqueue.service.runs.changes"):
            await server.stop()
    finally:
        delete.release()
    left = [r.getMessage() for r in caplog.records if "not settled" in r.getMessage()]
    assert len(left) == 1 and f"{task_id}/0" in left[0], left


async def _caller_waiting(http: aiohttp.ClientSession, server: Server,
                          task_queue_id: str) -> asyncio.Task[tuple[int, dict[str, Any]]]:
    """A claimWork call for ``task_queue_id`` waiting on ``server``, its poller done with
    its first look at the queues: a task it gets after that was handed to it."""
    waiting = asyncio.create_task(sas.post(
        http, f"{server.api}/claim-work/{task_queue_id.replace('/', '%2F')}",
        {"workerGroup": "wg", "workerId": "cw", "tasks": 1}))
    await callers_waiting(server, task_queue_id)
    entry = server.services.work.waiting.entry(task_queue_id)
    await eventually(lambda: not entry.dirty, interval=0.05,
                     what="the caller's poller done with its first look at the queues")
    return waiting


@asynccontextmanager
async def _created_while_handed(
        http: aiohttp.ClientSession, server: Server, proxy: FaultProxy,
        storage: StorageInspector, task_queue_id: str, task_id: str
        ) -> AsyncIterator[asyncio.Task[tuple[int, dict[str, Any]]]]:
    """createTask of ``task_id``, held while a waiting caller claims the tip it was
    handed (put already as the claim holds it: no rewrite): the task's insert is held
    back by storage until the caller waits for it. The body runs then, the insert not yet
    made; it is let through after it. Yields the createTask under way."""
    insert = proxy.hold("POST", "/$batch")
    entry = server.services.work.waiting.entry(task_queue_id)
    creating = asyncio.create_task(_put_task(http, server, task_id,
                                             definition(task_queue_id)))
    try:
        await eventually(lambda: any(w.busy for w in entry.waiters), interval=0.02,
                         what="the caller claiming the tip it was handed")
        assert insert.reached.is_set() and not creating.done()
        yield creating
    finally:
        insert.release()


@pytest.mark.parametrize("taken", ["free", "by another definition"])
async def test_a_waiting_claim_work_caller_takes_the_tip_before_its_task_is_stored(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, storage: StorageInspector, taken: str) -> None:
    """On the replica that creates a task, a claimWork caller waiting for its task queue
    is handed the tip as soon as its put is answered (put already as its claim holds it)
    before the task is stored (here the task's insert is held back by storage); the
    claim is written once the insert is. Meanwhile the task is not there
    for readers (404: createTask has not answered). If the insert stores nothing because
    the taskId belongs to another task (createTask answers 409), the tip is deleted, the
    caller gets no task, and the other task is untouched."""
    server = await faulty_servers(claim_work_poll_interval=60.0, claim_work_wait=3.0)
    task_queue_id, task_id = "prov/handearly", slugid()
    if taken != "free":
        code, body = await _put_task(http, server, task_id, definition("prov/handother"))
        assert code == 200, body
    waiting = await _caller_waiting(http, server, task_queue_id)
    async with _created_while_handed(http, server, proxy, storage, task_queue_id,
                                     task_id) as creating:
        if taken == "free":
            async with http.get(f"{server.api}/task/{task_id}/status") as r:
                assert r.status == 404, await r.text()
    code, created = await creating
    assert code == (200 if taken == "free" else 409), created
    code, answer = await waiting
    assert code == 200, answer
    if taken == "free":
        assert [c["status"]["taskId"] for c in answer["tasks"]] == [task_id], answer
        assert (await status(http, server.api, task_id))["runs"][0]["state"] == "running"
        code, done = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
        assert code == 200, done
    else:
        assert answer["tasks"] == [], answer
        [run] = (await status(http, server.api, task_id))["runs"]
        assert run["state"] == "pending", run
    pending = storage.pending_queue(task_queue_id)
    await eventually(lambda: storage.message_count(pending), lambda n: n == 0,
                     what="no message left in the caller's queue")


async def test_a_create_task_refused_for_another_task_queue_leaves_that_tasks_tip_claimable(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    """While a createTask naming an existing task's taskId in another task queue is being
    inserted (to be refused: 409), a claimWork caller of the existing task's queue that
    polls that task's own tip claims it as usual: the claim is decided on the stored
    task, not on the definition being inserted, so a tenant cannot have another's tip
    deleted by reusing its taskId."""
    server = await faulty_servers(claim_work_poll_interval=60.0, claim_work_wait=3.0)
    task_id = slugid()
    code, body = await _put_task(http, server, task_id, definition("prov/handvictim"))
    assert code == 200, body
    trigger = proxy.hold("POST", "-deadline-batches/messages")
    refused = asyncio.create_task(_put_task(http, server, task_id,
                                            definition("prov/handhostile")))
    try:
        await asyncio.wait_for(trigger.reached.wait(), 30)
        code, answer = await sas.post(http, f"{server.api}/claim-work/prov%2Fhandvictim",
                                      {"workerGroup": "wg", "workerId": "cw", "tasks": 1})
    finally:
        trigger.release()
    assert code == 200, answer
    assert [c["status"]["taskId"] for c in answer["tasks"]] == [task_id], answer
    code, body = await refused
    assert code == 409, body
    assert (await status(http, server.api, task_id))["runs"][0]["state"] == "running"


async def test_a_tip_put_for_a_caller_that_went_away_meanwhile_is_given_to_everyone(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    """createTask finds a claimWork caller waiting on its replica and puts the tip as the
    caller's claim will hold it (hidden); the caller hangs up before the put is answered.
    The tip is then made the run's, visible, before createTask answers: a SAS worker
    polls it and claims run 0 (the tip repair is ten minutes away)."""
    server = await faulty_servers(claim_work_poll_interval=60.0, claim_work_wait=20.0,
                                  tip_repair_delay=600.0)
    task_queue_id = "prov/hungup"
    waiting = await _caller_waiting(http, server, task_queue_id)
    entry = server.services.work.waiting.entry(task_queue_id)
    put = proxy.hold("POST", f"/{storage.pending_queue(task_queue_id)}/messages")
    task_id = slugid()
    creating = asyncio.create_task(_put_task(http, server, task_id, definition(task_queue_id)))
    try:
        await asyncio.wait_for(put.reached.wait(), 30)
        assert entry.reserved == 1
        waiting.cancel()
        await eventually(lambda: not any(w.connected() for w in entry.waiters), interval=0.02,
                         what="the caller gone")
    finally:
        put.release()
    code, created = await creating
    assert code == 200, created
    assert entry.reserved == 0
    urls = await sas.poll_task_urls(http, server.api, "prov", "hungup")
    [message] = await sas.get_messages(http, urls["queues"][6]["signedPollUrl"])
    code, claim = await sas.claim(http, server.api, message)
    assert code == 200 and claim["status"]["taskId"] == task_id and claim["runId"] == 0, claim


async def test_a_handed_tip_whose_claim_may_be_stored_is_not_given_back(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    """A claimWork caller waiting on the creating replica is handed the task's tip; its
    claim's write is applied but its answer lost, and no read can tell (storage refuses
    them). The claim may be stored, so the message stays as the claim holds it, hidden:
    it is not given back as run 0's tip for another worker to poll, and the run, which
    the write did claim, can be reclaimed with it."""
    server = await faulty_servers(claim_work_poll_interval=60.0, claim_work_wait=3.0,
                                  tip_repair_delay=600.0)
    task_queue_id, task_id = "prov/maybestored", slugid()
    waiting = await _caller_waiting(http, server, task_queue_id)
    task_row = f"/{storage.table_name('tasks')}(PartitionKey='{task_id}'"
    proxy.once("PUT", task_row, "timed out")  # the claim's write: applied, answer lost
    for _ in range(20):
        proxy.once("GET", task_row, "refused")  # every read that would tell
    code, created = await _put_task(http, server, task_id, definition(task_queue_id))
    assert code == 200, created
    code, answer = await waiting
    assert code == 200 and answer["tasks"] == [], answer
    assert proxy.forget_once() < 20  # the claim's reads were refused; storage is back
    [run] = (await status(http, server.api, task_id))["runs"]
    assert run["state"] == "running" and run["workerId"] == "cw", run
    urls = await sas.poll_task_urls(http, server.api, "prov", "maybestored")
    assert await sas.get_messages(http, urls["queues"][6]["signedPollUrl"]) == []
    code, reclaimed = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/reclaim")
    assert code == 200, reclaimed


@pytest.mark.parametrize("failing", ["the claim's write", "the read after a lost insert"])
async def test_a_tip_handed_before_its_task_was_stored_comes_back_when_its_claim_fails(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, storage: StorageInspector, failing: str) -> None:
    """A claimWork caller waiting on the replica that creates a task is handed its tip as
    soon as it is put (put already as its claim holds it), while the task is inserted.
    If storage then fails
    the claim (its write is refused; or the insert was applied, its answer lost, and the
    reads that would tell are refused: createTask answers 500), the run is not left
    pending with its only tip hidden until the claim would have ended: the tip is given
    back at once, and the caller, still waiting, claims the task with it. (The tip
    repair is minutes away, and polling effectively off: only the tip given back can
    explain it.)"""
    server = await faulty_servers(claim_work_poll_interval=60.0, claim_work_wait=20.0,
                                  tip_repair_delay=600.0)
    task_queue_id, task_id = "prov/handback", slugid()
    waiting = await _caller_waiting(http, server, task_queue_id)
    task_row = f"/{storage.table_name('tasks')}(PartitionKey='{task_id}'"
    if failing == "the claim's write":
        proxy.once("PUT", task_row, "refused")
    else:
        proxy.once("POST", "$batch", "timed out")  # the insert, applied
        proxy.once("GET", task_row, "refused")  # the insert's read after its retry's 409
        proxy.once("GET", task_row, "refused")  # the claim's read
    async with _created_while_handed(http, server, proxy, storage, task_queue_id,
                                     task_id) as creating:
        pass
    code, created = await creating
    assert code == (200 if failing == "the claim's write" else 500), created
    code, answer = await waiting
    assert code == 200, answer
    assert [c["status"]["taskId"] for c in answer["tasks"]] == [task_id], answer
    assert proxy.counts["table refused"] == (1 if failing == "the claim's write" else 2)
    [run] = (await status(http, server.api, task_id))["runs"]
    assert run["state"] == "running" and run["workerId"] == "cw", run
    code, done = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
    assert code == 200, done
    pending = storage.pending_queue(task_queue_id)
    await eventually(lambda: storage.message_count(pending), lambda n: n == 0,
                     what="no message left in the caller's queue")


async def test_a_tip_whose_handed_claim_failed_is_recorded_for_a_sas_worker(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    """As above, but the caller's wait is over when storage refuses its claim's write: the
    tip, which was handed over as put with the insert (not recorded: a claimWork claim
    needs no record), is given back as run 0's and recorded, and a SAS worker that polls
    it claims the task at its first try."""
    wait = 3.0
    server = await faulty_servers(claim_work_poll_interval=60.0, claim_work_wait=wait,
                                  tip_repair_delay=600.0)
    task_queue_id, task_id = "prov/restored", slugid()
    waiting = await _caller_waiting(http, server, task_queue_id)
    proxy.once("PUT", f"/{storage.table_name('tasks')}(PartitionKey='{task_id}'", "refused")
    async with _created_while_handed(http, server, proxy, storage, task_queue_id,
                                     task_id) as creating:
        await asyncio.sleep(wait)  # the caller's wait is over before its claim is
    code, created = await creating
    assert code == 200, created
    code, answer = await waiting
    assert (code, answer["tasks"]) == (200, []), answer
    assert proxy.counts["table refused"] == 1
    urls = await sas.poll_task_urls(http, server.api, *task_queue_id.split("/"))
    [message] = await eventually(
        lambda: sas.get_messages(http, urls["queues"][6]["signedPollUrl"]),
        what="the tip given back, visible")
    code, claim = await sas.claim(http, server.api, message, worker_id="sas")
    assert code == 200, claim
    assert (claim["status"]["taskId"], claim["runId"]) == (task_id, 0), claim


async def test_a_create_task_whose_client_gave_up_still_stores_the_task_with_its_tip(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession) -> None:
    """aiohttp does not cancel a handler whose client went away: a createTask whose
    client timed out while storage was slow finishes (task stored, tip claimable), so it
    leaves no task behind without a tip."""
    server = await faulty_servers()
    task_id = slugid()
    proxy.once("POST", "/messages", "stalled")  # the task's tip or its deadline message
    with pytest.raises(TimeoutError):
        async with http.put(f"{server.api}/task/{task_id}", json=definition("prov/gaveup"),
                            timeout=aiohttp.ClientTimeout(total=0.2)) as r:
            await r.read()

    async def stored() -> int:
        async with http.get(f"{server.api}/task/{task_id}/status") as r:
            return r.status

    await eventually(stored, lambda code: code == 200, what="the task stored")
    urls = await sas.poll_task_urls(http, server.api, "prov", "gaveup")
    [message] = await eventually(lambda: sas.get_messages(http, urls["queues"][6]["signedPollUrl"]),
                                 what="the task's tip")
    code, claim = await sas.claim(http, server.api, message)
    assert code == 200 and claim["status"]["taskId"] == task_id, claim


async def test_the_official_client_rides_out_a_short_outage_by_retrying_the_503(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        caplog: pytest.LogCaptureFixture) -> None:
    """Storage answers ServerBusy to a score of requests in a row, more than one request's
    retries: the server answers 503, and the unmodified official client, retrying 5xx as
    it does, creates, claims and completes the task."""
    server = await faulty_servers(run_resolvers=False)
    credentials = {"clientId": ROOT.client_id, "accessToken": ROOT.access_token}
    async with taskcluster.aio.createSession() as session:
        queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "credentials": credentials},
                                      session=session)
        task_id = slugid()
        # The task queue's first task makes its seven queues, at once: made before the
        # outage, they leave createTask its usual requests.
        await queue.createTask(slugid(), definition("prov/official"))
        with caplog.at_level(logging.WARNING, logger="azqueue.api.middleware"):
            # More than all the attempts (8 each) of createTask's requests, which go out at
            # once and share the outage, so that each of them gives up.
            for _ in range(64):
                proxy.once("*", "", "busy")
            created = await queue.createTask(task_id, definition("prov/official"))
            assert created["status"]["state"] == "pending"
            for _ in range(20):  # on the task's entity only, which background work spares
                proxy.once("*", task_id, "busy")
            claim = await queue.claimTask(task_id, 0, {"workerGroup": "wg",
                                                       "workerId": "official"})
            assert claim["status"]["state"] == "running"
        done = await queue.reportCompleted(task_id, 0)
        assert [r["state"] for r in done["status"]["runs"]] == ["completed"]
    answered = [r.getMessage() for r in caplog.records if "answered 503" in r.getMessage()]
    assert any("/task/" in m and "PUT" in m for m in answered), answered
    assert any("/claim" in m for m in answered), answered


@pytest.mark.parametrize("order", ["the other poll claims first", "claimWork claims first",
                                   "nobody else polls"])
async def test_a_claim_work_claim_that_outlives_its_hold_claims_the_run_once(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, storage: StorageInspector, monkeypatch: pytest.MonkeyPatch,
        order: str) -> None:
    """claimWork hides a tip it received only for ``CLAIM_WORK_HOLD`` (1 s here). Its
    claim's rewrite of the message is held back by the proxy until the tip is visible
    again. If a SAS worker polled it meanwhile, the rewrite meets a changed pop receipt
    and the task decides between the two claims: the run is claimed once, nobody is
    answered an error, and no message is left behind. If nobody polled it, the rewrite's
    receipt still holds and the claim is made as usual."""
    monkeypatch.setattr(workclaimer, "CLAIM_WORK_HOLD", timedelta(seconds=1))
    server = await faulty_servers(claim_work_wait=2.0, tip_repair_delay=120.0)  # no repair tip
    task_queue_id = "prov/lapsed"
    task_id = await _create(http, server, task_queue_id)  # before the call: polled, not handed
    pending = storage.pending_queue(task_queue_id)
    rewrite = proxy.hold("PUT", f"/{pending}/messages/")
    calling = asyncio.create_task(sas.post(
        http, f"{server.api}/claim-work/prov%2Flapsed", {"workerGroup": "wg",
                                                         "workerId": "cw", "tasks": 1}))
    try:
        await asyncio.wait_for(rewrite.reached.wait(), 30)
        urls = await sas.poll_task_urls(http, server.api, "prov", "lapsed")
        queue = urls["queues"][6]
        if order == "nobody else polls":
            await eventually(lambda: storage.peek(pending),
                             what="the tip visible again after the hold")
            rewrite.release()
        else:
            [message] = await eventually(lambda: sas.get_messages(http, queue["signedPollUrl"]),
                                         what="the tip polled again after the hold")
            assert message.tip["taskId"] == task_id
            if order == "the other poll claims first":
                code, claim = await sas.claim(http, server.api, message, worker_id="sas")
                assert code == 200, claim
                rewrite.release()
            else:
                rewrite.release()
                code, claim_work = await calling
                assert code == 200 and len(claim_work["tasks"]) == 1, claim_work
                code, refused = await sas.claim(http, server.api, message, worker_id="sas")
                assert code == 409, refused
                assert await sas.delete_message(http, queue["signedDeleteUrl"], message) == 204
        code, answer = await calling
    finally:
        rewrite.release()
        calling.cancel()
    assert code == 200, answer
    claimer = "sas" if order == "the other poll claims first" else "cw"
    assert [c["status"]["taskId"] for c in answer["tasks"]] == ([] if claimer == "sas"
                                                                 else [task_id]), answer
    [run] = (await status(http, server.api, task_id))["runs"]
    assert run["state"] == "running" and run["workerId"] == claimer, run
    code, done = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
    assert code == 200 and [r["state"] for r in done["status"]["runs"]] == ["completed"], done
    # The message went with the run: held by the claim and deleted when it was resolved,
    # or deleted by the worker whose claim was refused.
    await eventually(lambda: storage.message_count(pending), lambda n: n == 0,
                     what="the run's message deleted")


@pytest.mark.parametrize("fault", ["timed out", "dropped"])
async def test_claim_work_looks_again_when_the_tips_a_lost_receive_hid_reappear(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, storage: StorageInspector, fault: str) -> None:
    """The poller's receive is applied (the tip hidden for the hold) and its answer lost;
    sent again, it finds nothing. With polling effectively off (60 s), the caller still
    gets the task: the poller knew the receive may have hidden tips, and looked again
    once they were visible again. (No tip repair meanwhile: it would hand a new tip over.)"""
    server = await faulty_servers(claim_work_poll_interval=60.0, tip_repair_delay=120.0,
                                  claim_work_wait=20.0)
    task_id = await _create(http, server, "prov/lostreceive")
    pending = storage.pending_queue("prov/lostreceive")
    proxy.once("GET", f"/{pending}/messages", fault)
    code, answer = await sas.post(http, f"{server.api}/claim-work/prov%2Flostreceive",
                                  {"workerGroup": "wg", "workerId": "cw", "tasks": 1})
    assert code == 200, answer
    assert [c["status"]["taskId"] for c in answer["tasks"]] == [task_id], answer
    assert proxy.counts[f"queue {fault}"] == 1, proxy.counts


async def test_trigger_puts_that_stall_hold_up_the_create_tasks_after_them_only_briefly(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica has two puts of deadline triggers in flight at most. When both wait for
    answers that do not come, the createTasks after them are not held up until those
    attempts time out (5 s): a put that has been slow for ``SLOW_PUT`` lets another start,
    and every createTask is answered once its own trigger is stored."""
    monkeypatch.setattr(triggers, "SLOW_PUT", 0.2)
    server = await faulty_servers()
    stalled = [proxy.hold("POST", "-deadline-batches/messages") for _ in range(2)]
    first = asyncio.create_task(_create(http, server, "prov/stalled-triggers"))
    await asyncio.wait_for(stalled[0].reached.wait(), 30)
    second = asyncio.create_task(_create(http, server, "prov/stalled-triggers"))
    await asyncio.wait_for(stalled[1].reached.wait(), 30)
    third = asyncio.create_task(_create(http, server, "prov/stalled-triggers"))
    try:
        done, _ = await asyncio.wait({first, second, third}, timeout=60,
                                     return_when=asyncio.FIRST_COMPLETED)
        # The stalled two are answered only after their attempts' 5 s time-out.
        assert done == {third}
    finally:
        for held in stalled:
            held.release()
    created = await asyncio.gather(first, second, third)
    for task_id in created:
        assert (await status(http, server.api, task_id))["state"] == "pending"


async def test_a_task_stored_while_its_deadline_trigger_failed_gets_one_after(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    """createTask of a task that is its own group inserts it while its deadline trigger
    and its tip are put: when storage refuses the trigger, the task is stored without it
    and createTask answers 500, as for any createTask that failed part-way. The replica
    puts the trigger again by itself, so the task is resolved at its deadline even if
    its client never repeats the call."""
    server = await faulty_servers()
    task_id, body = slugid(), definition("prov/no-trigger", deadline=timedelta(seconds=3))
    proxy.once("POST", "-deadline-batches/messages", "refused")
    async with http.put(f"{server.api}/task/{task_id}", json=body) as r:
        assert r.status == 500, await r.text()
    assert (await storage.task(task_id)).task_id == task_id  # stored all the same
    resolved = await eventually(lambda: status(http, server.api, task_id),
                                lambda s: s["state"] == "exception", timeout=60,
                                what="the task resolved at its deadline")
    assert resolved["runs"][0]["reasonResolved"] == "deadline-exceeded", resolved
    assert proxy.counts["queue refused"] == 1


async def test_a_tip_put_with_its_task_whose_record_failed_is_replaced_by_a_recorded_one(
        faulty_servers: Callable[..., Awaitable[Server]], proxy: FaultProxy,
        http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    """The tip of a task inserted at once with it is recorded after createTask answered.
    A worker that polls the tip before the record is stored waits for it; when storage
    refuses the record, the worker's claim is refused (it deletes the tip) and the
    pending run gets a recorded tip at once, which it claims."""
    server = await faulty_servers()
    task_id = slugid()
    task_row = f"/{storage.table_name('tasks')}(PartitionKey='{task_id}'"
    proxy.once("PATCH", task_row, "refused")
    async with http.put(f"{server.api}/task/{task_id}", json=definition("prov/no-record")) as r:
        assert r.status == 200, await r.text()
    await eventually(lambda: proxy.counts["table refused"], lambda n: n == 1,
                     what="the record of the tip refused")
    urls = await sas.poll_task_urls(http, server.api, "prov", "no-record")
    queue = urls["queues"][6]
    [unrecorded] = await sas.get_messages(http, queue["signedPollUrl"])
    code, err = await sas.claim(http, server.api, unrecorded)
    assert code == 400 and "does not carry a tip" in err["message"], err
    assert await sas.delete_message(http, queue["signedDeleteUrl"], unrecorded) == 204
    [fresh] = await sas.get_messages(http, queue["signedPollUrl"])
    code, claim = await sas.claim(http, server.api, fresh)
    assert code == 200 and claim["status"]["taskId"] == task_id, claim
