"""A downstream project's tests of its worker, using only the plugin's documented fixtures
(run by test_pytest_plugin.py in a project of its own)."""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
import taskcluster
import taskcluster.aio
from azqueue.worker import TaskFailed, TaskRun

QUEUE = "downstream/builder"
seen_in_first_test: list[str] = []


def task(command: str) -> dict:
    now = datetime.now(UTC)
    return {"taskQueueId": QUEUE, "created": taskcluster.stringDate(now),
            "deadline": taskcluster.stringDate(now + timedelta(hours=1)),
            "payload": {"command": command},
            "metadata": {"name": command, "description": "a downstream task",
                         "owner": "dev@example.com", "source": "https://example.com/ci"}}


def create(queue: taskcluster.Queue, command: str) -> str:
    task_id = taskcluster.slugId()
    queue.createTask(task_id, task(command))
    return task_id


def state(queue: taskcluster.Queue, task_id: str) -> str:
    return queue.status(task_id)["status"]["state"]


def read_artifact(queue: taskcluster.Queue, task_id: str, run_id: int, name: str) -> bytes:
    """The artifact's content; a failure says which URL answered what, and what became of
    the task's runs: their states, their artifacts and the last line of their logs."""
    url = queue.buildUrl("getArtifact", task_id, run_id, name)
    try:
        return urllib.request.urlopen(url).read()
    except urllib.error.HTTPError as e:
        where = "the queue" if e.url == url else f"the redirect to {e.url}"
        answer = e.read().decode(errors="replace")
        runs = [(r["runId"], r["state"], r.get("reasonResolved"), [
            a["name"] for a in queue.listArtifacts(task_id, r["runId"])["artifacts"]],
            log_end(queue, task_id, r["runId"]))
            for r in queue.status(task_id)["status"]["runs"]]
        raise AssertionError(f"GET {url} answered {e.code} from {where}: {answer}\nruns "
                             f"(id, state, reason, artifacts, log's end): {runs}") from e


def log_end(queue: taskcluster.Queue, task_id: str, run_id: int) -> str:
    """The last line of the run's log, or why there is none."""
    url = queue.buildUrl("getArtifact", task_id, run_id, "public/logs/live.log")
    try:
        lines = urllib.request.urlopen(url).read().decode(errors="replace").splitlines()
    except urllib.error.HTTPError as e:
        return f"no log ({e.code})"
    return lines[-1] if lines else "an empty log"


def test_tasks_created_with_the_official_client_are_run_by_the_handler(
        azqueue_server, azqueue_worker):
    queue = azqueue_server.queue()
    ids = [create(queue, f"build {i}") for i in range(3)]
    ran: list[str] = []

    async def handler(run: TaskRun) -> None:
        ran.append(run.payload["command"])

    worker = azqueue_worker(QUEUE, handler, capacity=2)
    worker.drain(timeout=60)
    assert sorted(ran) == ["build 0", "build 1", "build 2"]
    assert [state(queue, i) for i in ids] == ["completed"] * 3
    seen_in_first_test.extend(ids)


def test_a_second_test_sees_none_of_the_first_tests_tasks(azqueue_server):
    queue = azqueue_server.queue()
    assert seen_in_first_test
    assert queue.listPendingTasks(QUEUE)["tasks"] == []
    for task_id in seen_in_first_test:
        try:
            queue.status(task_id)
        except taskcluster.TaskclusterRestFailure as e:
            assert e.status_code == 404
        else:
            raise AssertionError(f"task {task_id} of the first test is still there")


def test_a_raising_handler_fails_its_run(azqueue_server, azqueue_worker):
    queue = azqueue_server.queue()
    failing, crashing = create(queue, "fail"), create(queue, "crash")

    async def handler(run: TaskRun) -> None:
        if run.payload["command"] == "fail":
            raise TaskFailed("the build failed")
        raise RuntimeError("a bug in the worker")

    azqueue_worker(QUEUE, handler).drain()
    assert state(queue, failing) == "failed"
    crashed = queue.status(crashing)["status"]["runs"][0]
    assert (crashed["state"], crashed["reasonResolved"]) == ("exception", "internal-error")


def test_nothing_of_the_previous_tests_server_logs_here(caplog):
    """The test before drained a worker: its server, stopped, writes nothing more."""
    caplog.set_level(logging.DEBUG)
    end = time.monotonic() + 3
    while time.monotonic() < end:
        late = [r.getMessage() for r in caplog.records if r.name.startswith("azqueue")]
        assert not late, late
        time.sleep(0.2)


def test_the_sas_worker_runs_tasks_too(azqueue_server, azqueue_worker):
    queue = azqueue_server.queue()
    task_id = create(queue, "sas")
    ran: list[str] = []

    async def handler(run: TaskRun) -> None:
        ran.append(run.task_id)

    azqueue_worker(QUEUE, handler, mode="sas").drain()
    assert ran == [task_id]
    assert state(queue, task_id) == "completed"


async def test_an_asyncio_test_drives_the_same_fixtures(azqueue_server, azqueue_worker):
    async with taskcluster.aio.createSession() as session:
        queue = taskcluster.aio.Queue(azqueue_server.options(), session=session)
        task_id = taskcluster.slugId()
        await queue.createTask(task_id, task("async"))
        ticks: list[int] = []

        async def tick() -> None:  # the test's own loop keeps running while it drains
            while True:
                ticks.append(1)
                await asyncio.sleep(0.01)

        async def handler(run: TaskRun) -> None:
            await asyncio.sleep(0.2)

        ticking = asyncio.ensure_future(tick())
        await azqueue_worker(QUEUE, handler).drain_async()
        ticking.cancel()
        assert ticks
        assert (await queue.status(task_id))["status"]["state"] == "completed"


def test_tasks_complete_while_storage_is_throttled(azqueue_server, azqueue_worker,
                                                    azure_storage_faults):
    queue = azqueue_server.queue()
    azure_storage_faults.set(busy=0.2)
    ids = [create(queue, f"busy {i}") for i in range(3)]

    async def handler(run: TaskRun) -> None:
        pass

    azqueue_worker(QUEUE, handler).drain()
    azure_storage_faults.clear()
    assert [state(queue, i) for i in ids] == ["completed"] * 3
    assert sum(n for what, n in azure_storage_faults.counts.items() if what.endswith("busy"))


def test_drain_gives_up_after_its_timeout_saying_what_is_left(azqueue_server, azqueue_worker):
    queue = azqueue_server.queue()
    task_id = create(queue, "hang")

    async def handler(run: TaskRun) -> None:
        await asyncio.Event().wait()

    with pytest.raises(AssertionError, match=r"did not drain it within 2 s: 1 run\(s\) still "
                                             r"running"):
        azqueue_worker(QUEUE, handler).drain(timeout=2)
    run = queue.status(task_id)["status"]["runs"][0]
    assert (run["state"], run["reasonResolved"]) == ("exception", "worker-shutdown")


def test_a_plain_function_handler_is_refused_naming_it(azqueue_worker):
    def build(run):
        pass

    with pytest.raises(TypeError, match="the handler .*build is not an async function"):
        azqueue_worker(QUEUE, build)


def test_artifacts_arrive_through_throttling_and_a_lost_put(azqueue_server, azqueue_worker,
                                                            azure_storage_faults):
    queue = azqueue_server.queue()
    ids = [create(queue, f"artifact {i}") for i in range(4)]

    async def handler(run: TaskRun) -> None:
        await run.upload_artifact("public/out.txt", run.payload["command"].encode(),
                                  "text/plain")

    azure_storage_faults.set(busy=0.3)
    azure_storage_faults.once("PUT", "-artifacts/", "timed out")
    azqueue_worker(QUEUE, handler).drain(timeout=120)
    azure_storage_faults.clear()
    assert [state(queue, i) for i in ids] == ["completed"] * 4
    for i, task_id in enumerate(ids):
        assert read_artifact(queue, task_id, 0, "public/out.txt") == f"artifact {i}".encode()


def test_the_reason_a_run_failed_is_at_the_end_of_its_log(azqueue_server, azqueue_worker):
    queue = azqueue_server.queue()
    task_id = create(queue, "add")

    async def handler(run: TaskRun) -> None:
        raise TaskFailed("a and b must be numbers")

    azqueue_worker(QUEUE, handler).drain()
    log = read_artifact(queue, task_id, 0, "public/logs/live.log").decode()
    assert log.endswith("the run ended failed: a and b must be numbers\n"), log


@pytest.mark.azqueue(claim_timeout=3)
def test_a_claim_expires_in_seconds_with_the_marker(azqueue_server):
    queue = azqueue_server.queue()
    task_id = create(queue, "abandoned")
    claims = queue.claimWork(QUEUE, {"workerGroup": "g", "workerId": "gone", "tasks": 1})
    assert [c["status"]["taskId"] for c in claims["tasks"]] == [task_id]
    deadline = time.monotonic() + 60
    while (run := queue.status(task_id)["status"]["runs"][0])["state"] == "running":
        assert time.monotonic() < deadline, "the claim did not expire within 60 s"
        time.sleep(0.5)
    assert (run["state"], run["reasonResolved"]) == ("exception", "claim-expired")


def test_events_are_awaited_without_a_broker(azqueue_server, azqueue_worker, azqueue_events):
    queue = azqueue_server.queue()
    task_id = create(queue, "evented")

    async def handler(run: TaskRun) -> None:
        pass

    azqueue_worker(QUEUE, handler).drain()
    message = azqueue_events.wait_for("task-completed", task_id, timeout=30)
    assert (message["status"]["taskId"], message["status"]["state"], message["runId"]) == (
        task_id, "completed", 0)
    assert message["workerGroup"] == "azqueue-testing"
    assert azqueue_events.wait_for("task-pending", task_id)["runId"] == 0
