"""`azqueue task log [--follow]`, run as a user runs it, against a real worker's live log."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path
from typing import IO, AnyStr

import aiohttp

from azqueue.cli.exitcodes import WAIT_EXIT_CODES
from azqueue.testing.tasks import create, definition
from tests.cli.helpers import as_root
from tests.servers import Server
from tests.waiting import eventually
from tests.worker.helpers import (AZQUEUE, cli_env, ctrl_c_reaches_it, running, shell_worker,
                                  wait_status)

INTERVAL = 0.2  # the worker's log interval: short, so the test waits little


async def _line(stream: IO[AnyStr], timeout: float = 60) -> AnyStr:
    """The next line of a subprocess's pipe (``timeout`` bounds a stuck test)."""
    return await asyncio.wait_for(asyncio.to_thread(stream.readline), timeout)


async def test_follow_prints_lines_while_the_task_runs_and_ends_with_its_outcome(
        server: Server, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    go = tmp_path / "go"
    task_id = await create(http, server.api, definition("prov/follow", payload={"command": [
        "sh", "-c", f"printf 'first: %s\\n' ünïcödé; while [ ! -e {go} ]; do sleep 0.05; done; "
                    "printf 'after %s\\n' go; exit 3"]}))
    follower = subprocess.Popen([AZQUEUE, "task", "log", "--follow", task_id],
                                env=cli_env(server), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    try:
        assert follower.stdout is not None and follower.stderr is not None
        waiting = await _line(follower.stderr)  # before any worker runs
        assert waiting == f"azqueue: {task_id} is pending; waiting for a worker to claim it\n".encode()
        async with running(shell_worker(server, "prov/follow", "followed",
                                        log_interval=INTERVAL)):
            lines = [await _line(follower.stdout)]
            while not lines[-1].startswith(b"first: "):
                lines.append(await _line(follower.stdout))
            assert lines[-1] == "first: ünïcödé\n".encode()
            assert (await wait_status(http, server, task_id, lambda s: True))["state"] == "running"
            go.touch()
            rest, errors = await asyncio.to_thread(follower.communicate, timeout=60)
    finally:
        go.touch()
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == WAIT_EXIT_CODES["failed"] == 3, errors
    printed = b"".join(lines) + rest
    assert printed.startswith(f"[azqueue] task {task_id} run 0\n".encode())
    # The shell's last line, then the worker's reason for the outcome.
    assert printed.endswith(b"after go\n\n[azqueue] exit code 3\n\n"
                            b"[azqueue] the run ended failed: the command exited with 3\n")
    assert printed.count("first: ünïcödé\n".encode()) == 1
    # Without --follow: what is there, byte for byte the same once it is all there.
    whole = await asyncio.to_thread(subprocess.run, [AZQUEUE, "task", "log", task_id],
                                    env=cli_env(server), capture_output=True, timeout=60)
    assert (whole.returncode, whole.stdout) == (0, printed)


async def test_follow_of_a_completed_task_prints_its_log_and_exits_0_and_ctrl_c_is_quiet(
        server: Server, http: aiohttp.ClientSession) -> None:
    done = await create(http, server.api, definition("prov/follow-done", payload={
        "command": ["echo", "all done"]}))
    async with running(shell_worker(server, "prov/follow-done", "done", log_interval=INTERVAL)):
        await wait_status(http, server, done, lambda s: s["state"] == "completed")
    printed = await as_root(server, "task", "log", "--follow", done)
    assert printed.returncode == WAIT_EXIT_CODES["completed"] == 0, printed.stderr
    assert "all done\n" in printed.stdout and printed.stderr == ""

    pending = await create(http, server.api, definition("prov/nobody-follows-here"))
    follower = subprocess.Popen([AZQUEUE, "task", "log", "--follow", pending],
                                env=cli_env(server), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=ctrl_c_reaches_it)
    try:
        assert follower.stderr is not None
        assert "is pending; waiting for a worker" in await _line(follower.stderr)
        follower.send_signal(signal.SIGINT)
        out, err = await asyncio.to_thread(follower.communicate, timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert (follower.returncode, out, err) == (130, "", "")


async def test_follow_of_a_task_canceled_before_it_ran_says_there_is_no_log(
        server: Server, http: aiohttp.ClientSession) -> None:
    task_id = await create(http, server.api, definition("prov/follow-canceled"))
    async with http.post(f"{server.api}/task/{task_id}/cancel") as r:
        assert r.status == 200, await r.text()
    printed = await as_root(server, "task", "log", "--follow", task_id)
    assert printed.returncode == WAIT_EXIT_CODES["exception"], printed.stderr
    assert printed.stderr == (f"azqueue: run 0 of {task_id} is exception and has no "
                              "public/logs/live.log\n")


async def test_a_canceled_runs_log_ends_with_its_output_and_why_it_was_killed(
        server: Server, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    """cancelTask while the command runs: the worker kills it, appends what it printed up
    to then (none of it was appended yet: the log interval is long) and a last line
    saying why, and finishes the log, so `task log --follow` prints it all and exits as
    for an exception."""
    started = tmp_path / "started"
    task_id = await create(http, server.api, definition("prov/follow-cancel", payload={
        "command": ["sh", "-c", f"echo printed before the cancel; touch {started}; sleep 600"]}))
    async with running(shell_worker(server, "prov/follow-cancel", "canceled",
                                    log_interval=600, status_interval=0.5)):
        await wait_status(http, server, task_id, lambda s: s["state"] == "running")
        await eventually(started.exists, what="the command to print its line")
        async with http.post(f"{server.api}/task/{task_id}/cancel") as r:
            assert r.status == 200, await r.text()

        async def ended() -> str | None:
            printed = await as_root(server, "task", "log", "--follow", task_id)
            return printed.stdout if "[azqueue] canceled" in printed.stdout else None

        text = await eventually(ended, what="the canceled run's log to be finished whole",
                                interval=1.0)
    assert "printed before the cancel\n" in text
    assert text.endswith("\n[azqueue] killed: the task was canceled\n\n[azqueue] canceled: "
                         "the task was canceled (cancelTask) and its run stopped\n"), text
    printed = await as_root(server, "task", "log", "--follow", task_id)
    assert (printed.returncode, printed.stdout) == (WAIT_EXIT_CODES["exception"], text)
