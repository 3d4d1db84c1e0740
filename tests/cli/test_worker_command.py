"""`azqueue worker` and the worker SDK as an operator sees them: a cancel that stops the
command within seconds, a line per step of each task, a scratch directory per task, and
errors that stop the worker or are retried as they deserve."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
import taskcluster

from azqueue.testing.processes import alive
from azqueue.testing.tasks import create, definition, status
from azqueue.worker import Credentials, QueueRefused, Worker, WorkerConfig, WorkerState
from tests.cli.helpers import as_root, azqueue, one_line_error
from tests.servers import ROOT, Server, ServerFactory
from tests.waiting import eventually
from tests.worker.helpers import (cli_env, config, does_nothing, finish, log_of,
                                  running, spawn, wait_status)


async def test_a_cancel_stops_the_command_long_before_the_next_reclaim(
        server: Server, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    """`azqueue task cancel` while `azqueue worker` runs the task: the worker learns of it
    from the task's status (every --status-interval seconds), kills the command's
    process group and makes no report ('halt execution ... and forget all about the
    task', docs/workers/sdk.md), although its claim lasts 20 minutes and its next reclaim is
    19 minutes away."""
    pid_file = tmp_path / "pid"
    task_id = await create(http, server.api, definition("prov/cancel-now", payload={
        "command": ["sh", "-c", f"sleep 600 & echo $! > {pid_file}; wait"]}))
    worker = spawn(server, "prov/cancel-now", "canceled-soon", "--status-interval", "1")
    try:
        await wait_status(http, server, task_id, lambda s: s["state"] == "running")
        pid = int(await eventually(lambda: pid_file.exists() and pid_file.read_text().strip(),
                                   what="the command to start its child"))
        canceled = await as_root(server, "task", "cancel", task_id)
        assert canceled.returncode == 0, canceled.stderr
        # The child sleeps ten minutes and the claim has twenty: gone well before that
        # means the status check found the cancel and the process group was killed.
        await eventually(lambda: not alive(pid), timeout=60,
                         what="the command's child to be killed after the cancel")
    finally:
        output = await asyncio.to_thread(finish, worker, signal.SIGTERM)
    assert f"task {task_id}/0: the task was canceled; stopped it, no report" in output, output
    s = await status(http, server.api, task_id)
    assert [(r["state"], r["reasonResolved"]) for r in s["runs"]] == [("exception", "canceled")]
    async with http.get(f"{server.api}/task/{task_id}/runs/0/artifacts") as r:
        # Only the live log, there since the run started, ending with why the command
        # was killed and that the task was canceled (no exit code line).
        assert [a["name"] for a in (await r.json())["artifacts"]] == ["public/logs/live.log"]
    text = await log_of(http, server, task_id, 0)
    assert "[azqueue] exit code" not in text
    assert text.endswith("[azqueue] killed: the task was canceled\n\n[azqueue] canceled: the task "
                         "was canceled (cancelTask) and its run stopped\n"), output


async def test_each_task_logs_claimed_started_resolved_and_runs_in_a_removed_scratch_dir(
        server: Server, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    """The operator sees a line when a task is claimed, started and resolved; the
    command runs in a fresh directory of its own, gone once the task is done."""
    where = tmp_path / "where"
    tasks = [await create(http, server.api, definition("prov/scratch", payload={
        "command": ["sh", "-c", f"pwd >> {where}; ls -A; echo left-behind > file"]}))
        for _ in range(2)]
    worker = spawn(server, "prov/scratch", "scratcher")
    try:
        for task_id in tasks:
            await wait_status(http, server, task_id, lambda s: s["state"] == "completed")
    finally:
        output = await asyncio.to_thread(finish, worker, signal.SIGTERM)
    dirs = where.read_text().split()
    assert len(set(dirs)) == 2, dirs  # one directory per task
    for task_id, directory in zip(tasks, dirs, strict=True):
        assert f"azqueue-{task_id}-0-" in directory
        assert not Path(directory).exists(), f"{directory} was left behind"
        for step in ("claimed", rf"started sh -c .* as process \d+ in {re.escape(directory)}",
                     "resolved completed"):
            assert re.search(rf"INFO .*task {task_id}/0: {step}", output), (step, output)
    listing = await as_root(server, "task", "log", tasks[0])
    assert "[azqueue] exit code 0" in listing.stdout  # `ls -A` found nothing from before


async def test_the_worker_stops_on_wrong_credentials(server: Server) -> None:
    """A 401 cannot be fixed by retrying: the worker exits non-zero with one line."""
    env = {**cli_env(server), "TASKCLUSTER_ACCESS_TOKEN": "not-the-token-of-root-at-all"}
    done = await azqueue("worker", "--task-queue", "prov/wrong-token", env=env)
    assert done.returncode == 1
    error = one_line_error(done)
    assert error.startswith("azqueue: worker: the queue at "), error
    assert "401 AuthenticationFailed" in error


@pytest.mark.parametrize("mode", ["claim-work", "sas"])
async def test_credentials_without_the_scopes_stop_the_sdk_worker(
        server: Server, mode: str) -> None:
    """Missing scopes (403) cannot be fixed by retrying: `start()` raises QueueRefused
    saying which were missing, instead of retrying forever."""
    now = datetime.now(UTC)
    status_only = taskcluster.createTemporaryCredentials(
        ROOT.client_id, ROOT.access_token, now - timedelta(minutes=1), now + timedelta(hours=1),
        ["queue:status:*"])
    worker = Worker(config(server, "prov/no-scopes", "w", mode=mode, credentials=Credentials(
        status_only["clientId"], status_only["accessToken"], status_only["certificate"])),
        does_nothing)
    with pytest.raises(QueueRefused) as refused:
        await asyncio.wait_for(worker.start(), 60)
    assert refused.value.status == 403
    assert "InsufficientScopes" in str(refused.value)
    assert worker.state is WorkerState.STOPPED


def test_an_invalid_task_queue_is_refused_before_the_worker_starts() -> None:
    with pytest.raises(ValueError, match="task_queue_id must be <provisionerId>/<workerType>"):
        WorkerConfig(root_url="http://127.0.0.1:1", credentials=None,
                     task_queue_id="no-slash", worker_group="g", worker_id="w")


@pytest.mark.slow
async def test_a_queue_that_is_away_is_a_warning_retried_with_backoff(
        caplog: pytest.LogCaptureFixture, refused_port: int) -> None:
    """Nothing listens at the rootUrl: each failure is one WARNING line, and the pauses
    between tries grow (1, 2, 4 … times idle_sleep, with jitter) instead of hammering."""
    caplog.set_level(logging.WARNING, logger="azqueue.worker")
    worker = Worker(WorkerConfig(root_url=f"http://127.0.0.1:{refused_port}",
                                 credentials=Credentials(ROOT.client_id, ROOT.access_token),
                                 task_queue_id="prov/away", worker_group="g", worker_id="w",
                                 idle_sleep=0.05), does_nothing)

    def pauses() -> list[float]:
        return [float(m[1]) for r in caplog.records
                if (m := re.search(r"retrying in ([\d.]+) s", r.getMessage()))]

    async with running(worker):
        await eventually(lambda: len(pauses()) >= 4, what="four failed tries")
        assert worker.state is WorkerState.RUNNING
    ours = [r for r in caplog.records if r.name.startswith("azqueue.worker")]
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in ours)
    assert all("getting work failed" in r.getMessage() for r in ours)
    first, _, third, *_ = pauses()
    assert first <= 0.05 * 1.5 + 0.05 < 0.2 <= third  # jitter is 1 to 1.5 times


async def test_a_handler_that_cannot_reach_the_queue_is_no_worker_bug(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    """A handler failing because the queue went away (an upload's connection refused) is
    logged as a warning, not 'the handler failed (a worker bug)' with a traceback."""
    server = await make_server(claim_work_wait=1.0)
    task_id = await create(http, server.api, definition("prov/gone-away"))

    async def handler(run: object) -> None:
        raise aiohttp.ClientConnectionError("Cannot connect to host 127.0.0.1:1")

    caplog.set_level(logging.INFO, logger="azqueue.worker")
    async with running(Worker(config(server, "prov/gone-away", "w"), handler)):
        s = await wait_status(http, server, task_id, lambda s: s["state"] == "exception")
    assert s["runs"][0]["reasonResolved"] == "intermittent-task"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(r.levelno == logging.WARNING and "could not reach the queue" in r.getMessage()
               for r in caplog.records)


async def test_without_anonymous_status_the_watch_asks_with_the_worker_s_credentials(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """A deployment without anonymous scopes refuses the anonymous status call: the
    worker asks again with its own credentials, and a cancel still stops the handler
    long before the next reclaim."""
    server = await make_server(anonymous_scopes=(), claim_work_wait=1.0)
    task_id = await create(http, server.api, definition("prov/no-anonymous"))
    started = asyncio.Event()

    async def handler(run: object) -> None:
        started.set()
        await asyncio.sleep(600)

    worker = Worker(config(server, "prov/no-anonymous", "w", status_interval=0.5), handler)
    async with running(worker):
        await asyncio.wait_for(started.wait(), 60)
        async with http.post(f"{server.api}/task/{task_id}/cancel") as r:
            assert r.status == 200, await r.text()
        await eventually(lambda: not worker._running, timeout=60,
                         what="the handler to be stopped after the cancel")
    s = await status(http, server.api, task_id)
    assert [(r["state"], r["reasonResolved"]) for r in s["runs"]] == [("exception", "canceled")]
    assert worker.completed == 0


async def test_a_log_of_twenty_megabytes_is_uploaded_and_printed_whole(
        server: Server, http: aiohttp.ClientSession) -> None:
    """A command printing ~21 MB: the worker streams its log file to the artifact (never
    reading it whole into memory) and `azqueue task log` prints every line of it."""
    task_id = await create(http, server.api, definition("prov/big-log", payload={
        "command": ["seq", "1", "3000000"]}))
    worker = spawn(server, "prov/big-log", "big-logger")
    try:
        await wait_status(http, server, task_id, lambda s: s["state"] == "completed")
    finally:
        await asyncio.to_thread(finish, worker, signal.SIGTERM)
    printed = await as_root(server, "task", "log", task_id)
    assert printed.returncode == 0, printed.stderr
    numbers = [line for line in printed.stdout.splitlines() if line.isdigit()]
    assert numbers == [str(i) for i in range(1, 3000001)]
    assert printed.stdout.rstrip().endswith("[azqueue] exit code 0")
