"""The worker metadata methods, counts and listings, driven by the unmodified official
client, each answer checked against Taskcluster's own output schema (``reference``;
``task-queue-counts-list-response.json``, which Taskcluster's rendering lacks, is
written from services/queue/schemas/v1/task-queue-counts-list-response.yml)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import taskcluster
import taskcluster.aio
from taskcluster.exceptions import TaskclusterRestFailure

from azqueue.api.app import ROUTES
from azqueue.api.routing import API
from azqueue.config import Client
from azqueue.testing.tasks import definition, iso, slugid
from tests.compat.reference import assert_matches
from tests.servers import ROOT, Server, ServerFactory
from tests.waiting import eventually

CREDENTIALS = {"clientId": ROOT.client_id, "accessToken": ROOT.access_token}


def check(schema: str, answer: dict[str, Any]) -> dict[str, Any]:
    """``answer``, once valid against Taskcluster's output schema ``schema``."""
    assert_matches(schema, answer)
    return answer


def queue(server: Server, credentials: dict[str, str] | None = None) -> taskcluster.Queue:
    return taskcluster.Queue({"rootUrl": server.root_url, "maxRetries": 0,
                              "credentials": credentials or CREDENTIALS})


async def unless_404(call: Awaitable[dict[str, Any]]) -> dict[str, Any] | None:
    """The answer, or None for a 404 (for what is written just after a request)."""
    try:
        return await call
    except TaskclusterRestFailure as e:
        if e.status_code == 404:
            return None
        raise


def status_of(e: pytest.ExceptionInfo[TaskclusterRestFailure]) -> int:
    return int(e.value.status_code)


class Sync:
    """The sync client's methods, each run in a thread (so the test's server keeps serving)."""

    def __init__(self, client: taskcluster.Queue) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)
        return call


async def _drive(server: Server) -> None:
    q = Sync(queue(server))
    tq = "prov-wm/wt-a"
    now = datetime.now(UTC)
    high = [slugid() for _ in range(2)]
    low = [slugid() for _ in range(3)]
    for task_id in high:
        await q.createTask(task_id, definition(tq, priority="high"))
    for task_id in low:
        await q.createTask(task_id, definition(tq))
    await q.createTask(slugid(), definition("prov-wm/wt-b"))

    # pendingTasks and the counts: 'a provisioner ... must be able to tell the number of
    # pending tasks' (docs/workers/sas.md).
    pending = check("pending-tasks-response", await q.pendingTasks(tq))
    assert pending == {"provisionerId": "prov-wm", "workerType": "wt-a", "taskQueueId": tq,
                       "pendingTasks": 5}
    counts = check("task-queue-counts-response", await q.taskQueueCounts(tq))
    assert (counts["pendingTasks"], counts["claimedTasks"]) == (5, 0)
    batch = check("task-queue-counts-list-response", await q.taskQueueCountsBatch(
        {"taskQueueIds": [tq, "prov-wm/wt-b", "prov-wm/none"]}))
    assert [(c["taskQueueId"], c["pendingTasks"]) for c in batch["taskQueueCounts"]] == [
        (tq, 5), ("prov-wm/wt-b", 1), ("prov-wm/none", 0)]

    listed = check("list-pending-tasks-response", await q.listPendingTasks(tq))
    assert {t["taskId"] for t in listed["tasks"][:2]} == set(high)  # highest priority first
    assert {t["taskId"] for t in listed["tasks"]} == {*high, *low}
    assert all(t["task"]["taskQueueId"] == tq for t in listed["tasks"])
    first = check("list-pending-tasks-response",
                  await q.listPendingTasks(tq, query={"limit": 2}))
    rest = check("list-pending-tasks-response", await q.listPendingTasks(
        tq, query={"limit": 10, "continuationToken": first["continuationToken"]}))
    assert [t["taskId"] for t in first["tasks"] + rest["tasks"]] == \
        [t["taskId"] for t in listed["tasks"]]

    # A worker asks for work and claims: it, its task queue and provisioner become known.
    claimed = (await q.claimWork(tq, {"workerGroup": "wg", "workerId": "w1", "tasks": 1}))["tasks"]
    assert [c["status"]["taskId"] for c in claimed] == high[:1]

    # Recorded just after the answers, off the requests' path.
    provisioners = check("list-provisioners-response", await eventually(
        q.listProvisioners, lambda r: "prov-wm" in [p["provisionerId"] for p in r["provisioners"]],
        what="prov-wm listed"))
    check("provisioner-response", await q.getProvisioner("prov-wm"))
    worker_types = check("list-workertypes-response", await eventually(
        lambda: q.listWorkerTypes("prov-wm"), lambda r: len(r["workerTypes"]) == 2,
        what="both worker types listed"))
    assert [w["workerType"] for w in worker_types["workerTypes"]] == ["wt-a", "wt-b"]
    one = check("list-workertypes-response",
                await q.listWorkerTypes("prov-wm", query={"limit": 1}))
    two = check("list-workertypes-response", await q.listWorkerTypes(
        "prov-wm", query={"continuationToken": one["continuationToken"]}))
    assert [w["workerType"] for w in one["workerTypes"] + two["workerTypes"]] == ["wt-a", "wt-b"]
    worker_type = check("workertype-response", await q.getWorkerType("prov-wm", "wt-a"))
    assert worker_type["taskQueueId"] == tq and worker_type["expires"] > iso(now)
    task_queues = check("list-taskqueues-response", await q.listTaskQueues())
    assert {tq, "prov-wm/wt-b"} <= {t["taskQueueId"] for t in task_queues["taskQueues"]}
    task_queue = check("taskqueue-response", await q.getTaskQueue(tq))
    assert task_queue["lastDateActive"] >= iso(now - timedelta(seconds=5))

    workers = check("list-workers-response", await eventually(
        lambda: q.listWorkers("prov-wm", "wt-a"),
        lambda r: r["workers"] and "latestTask" in r["workers"][0],
        what="w1 listed with its claim"))
    assert workers["workers"] == [{"workerGroup": "wg", "workerId": "w1",
                                   "firstClaim": workers["workers"][0]["firstClaim"],
                                   "latestTask": {"taskId": high[0], "runId": 0}}]
    worker = check("worker-response", await q.getWorker("prov-wm", "wt-a", "wg", "w1"))
    assert worker["recentTasks"] == [{"taskId": high[0], "runId": 0}]

    expires = iso(now + timedelta(days=3))
    declared = check("worker-response", await q.declareWorker("prov-wm", "wt-a", "wg", "w2",
                                                        {"expires": expires}))
    assert declared["expires"] == expires and declared["recentTasks"] == []
    again = check("worker-response", await q.getWorker("prov-wm", "wt-a", "wg", "w2"))
    assert again["expires"] == expires

    until = iso(now + timedelta(hours=1))
    quarantined = check("worker-response", await q.quarantineWorker(
        "prov-wm", "wt-a", "wg", "w1", {"quarantineUntil": until, "quarantineInfo": "disk full"}))
    assert quarantined["quarantineUntil"] == until
    assert [(d["clientId"], d["quarantineInfo"]) for d in quarantined["quarantineDetails"]] == [
        (ROOT.client_id, "disk full")]
    only = check("list-workers-response", await q.listWorkers("prov-wm", "wt-a",
                                                        query={"quarantined": "true"}))
    assert [(w["workerId"], w.get("quarantineUntil")) for w in only["workers"]] == [("w1", until)]
    others = await q.listWorkers("prov-wm", "wt-a", query={"quarantined": "false"})
    assert [w["workerId"] for w in others["workers"]] == ["w2"]

    with pytest.raises(TaskclusterRestFailure) as info:
        await q.quarantineWorker("prov-wm", "wt-a", "wg", "nobody", {"quarantineUntil": until})
    assert status_of(info) == 404
    with pytest.raises(TaskclusterRestFailure) as info:
        await q.getWorker("prov-wm", "wt-a", "wg", "nobody")
    assert status_of(info) == 404
    with pytest.raises(TaskclusterRestFailure) as info:
        await q.getTaskQueue("prov-wm/never")
    assert status_of(info) == 404
    with pytest.raises(TaskclusterRestFailure) as info:
        await q.listWorkers("prov-wm", "wt-a", query={"quarantined": "maybe"})
    assert status_of(info) == 400 and "quarantined" in str(info.value)

    claims = check("list-claimed-tasks-response", await q.listClaimedTasks(tq))
    # Listed at once: the replica's notes of its claims, before the claim index has them.
    assert [(t["taskId"], t["runId"], t["workerId"]) for t in claims["tasks"]] == \
        [(high[0], 0, "w1")]




async def test_the_official_client_drives_every_worker_method(make_server: ServerFactory) -> None:
    await _drive(await make_server(claim_work_wait=2.0))


async def test_claimed_tasks_are_listed_and_counted_from_the_claim_index(
        server: Server) -> None:
    """listClaimedTasks and claimedTasks read the claim index, which has a row for a run
    still running min(30 s, claimTimeout / 2) after its claim (written here at once)."""
    q = queue(server)
    tq = "prov-wm/claimed"
    task_ids = sorted(slugid() for _ in range(3))
    for task_id in task_ids:
        await asyncio.to_thread(q.createTask, task_id, definition(tq))
        await asyncio.to_thread(q.claimTask, task_id, 0, {"workerGroup": "wg", "workerId": "w9"})
    await server.services.index.flush(everything=True)
    listed = check("list-claimed-tasks-response",
                   await asyncio.to_thread(q.listClaimedTasks, tq))
    assert [(t["taskId"], t["runId"], t["workerId"]) for t in listed["tasks"]] == \
        [(t, 0, "w9") for t in task_ids]
    first = await asyncio.to_thread(q.listClaimedTasks, tq, query={"limit": 2})
    rest = await asyncio.to_thread(q.listClaimedTasks, tq,
                                   query={"continuationToken": first["continuationToken"]})
    assert [t["taskId"] for t in first["tasks"] + rest["tasks"]] == task_ids
    counts = await asyncio.to_thread(q.taskQueueCounts, tq)
    assert (counts["pendingTasks"], counts["claimedTasks"]) == (0, 3)


async def test_the_aio_client_reads_workers_and_counts(make_server: ServerFactory) -> None:
    server = await make_server(claim_work_wait=2.0)
    async with taskcluster.aio.createSession() as session:
        q = taskcluster.aio.Queue({"rootUrl": server.root_url, "maxRetries": 0,
                                   "credentials": CREDENTIALS}, session=session)
        tq = "prov-aio/wt"
        await q.createTask(slugid(), definition(tq))
        claimed = await q.claimWork(tq, {"workerGroup": "wg", "workerId": "aio", "tasks": 1})
        assert len(claimed["tasks"]) == 1
        worker = check("worker-response", await eventually(
            lambda: unless_404(q.getWorker("prov-aio", "wt", "wg", "aio")),
            lambda r: r is not None and r["recentTasks"], what="the worker recorded"))
        assert worker["recentTasks"][0]["taskId"] == claimed["tasks"][0]["status"]["taskId"]
        check("task-queue-counts-response", await q.taskQueueCounts(tq))
        queues = await eventually(q.listTaskQueues,
                                  lambda r: tq in [t["taskQueueId"] for t in r["taskQueues"]],
                                  what=f"{tq} listed")
        check("list-taskqueues-response", queues)


async def test_worker_methods_need_the_reference_scopes(make_server: ServerFactory) -> None:
    """Scopes as the Queue reference declares them: declareWorker needs
    queue:declare-worker:<provisionerId>/<workerType>/<workerGroup>/<workerId>#<property>
    for each property set."""
    limited = Client("limited", "limited-access-token-0123456789",
                     ("queue:declare-worker:prov-s/wt/wg/w1#expires", "queue:get-worker:*"))
    server = await make_server(clients=(limited,), anonymous_scopes=())
    q = queue(server, {"clientId": limited.client_id, "accessToken": limited.access_token})
    expires = iso(datetime.now(UTC) + timedelta(days=1))
    await asyncio.to_thread(q.declareWorker, "prov-s", "wt", "wg", "w1", {"expires": expires})
    for call in (lambda: q.declareWorker("prov-s", "wt", "wg", "w2", {"expires": expires}),
                 lambda: q.quarantineWorker("prov-s", "wt", "wg", "w1",
                                            {"quarantineUntil": expires}),
                 lambda: q.pendingTasks("prov-s/wt"),
                 lambda: q.taskQueueCountsBatch({"taskQueueIds": ["prov-s/wt"]}),
                 lambda: q.listProvisioners()):
        with pytest.raises(TaskclusterRestFailure) as info:
            await asyncio.to_thread(call)
        assert status_of(info) == 403, info.value


def test_every_method_of_the_official_client_has_a_route() -> None:
    """docs/api/index.md: 'Every one of the 50 methods of taskcluster 113.2's Queue has a
    route': in the table the server serves, each method of the official client's
    ``Queue.funcinfo`` (the worker methods and all the others) is declared once, under its
    name, at its HTTP method and path, and no route is declared twice."""
    official = {name: (f["method"].upper(), API + f["route"])
                for name, f in taskcluster.Queue.funcinfo.items()}
    assert len(official) >= 50
    for name, target in official.items():
        assert [(r.method, r.path) for r in ROUTES if r.name == name] == [target], name
    names = [r.name for r in ROUTES]
    assert sorted({n for n in names if names.count(n) > 1}) == []


async def test_declare_worker_refuses_a_worker_type_its_answer_could_not_carry(
        make_server: ServerFactory) -> None:
    """A worker's ``workerType`` is a task's (worker-response refers to task.json's
    pattern: lowercase letters, digits and ``-``): declareWorker refuses another one (400)
    rather than answer what Taskcluster's schema rejects, and stores nothing."""
    server = await make_server()
    q = taskcluster.aio.Queue({"rootUrl": server.root_url, "maxRetries": 0,
                               "credentials": CREDENTIALS})
    expires = iso(datetime.now(UTC) + timedelta(days=1))
    for worker_type in ("logical_not", "Upper", "-dash", "dash-"):
        with pytest.raises(TaskclusterRestFailure) as info:
            await q.declareWorker("prov-wt", worker_type, "wg", "w1", {"expires": expires})
        assert status_of(info) == 400, (worker_type, info.value)
        assert "workerType" in str(info.value.body["message"]), info.value.body
        assert await unless_404(q.getWorker("prov-wt", worker_type, "wg", "w1")) is None
    check("worker-response", await q.declareWorker("prov-wt", "lower-case-9", "wg", "w1",
                                                   {"expires": expires}))
