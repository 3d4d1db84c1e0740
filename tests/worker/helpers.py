"""Running workers for tests: in-process `Worker`s and `azqueue worker` subprocesses."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from azqueue.testing import processes
from azqueue.testing.tasks import status
from azqueue.worker import Credentials, Worker, WorkerConfig
from azqueue.worker import shell
from tests.servers import ROOT, Server
from tests.waiting import eventually

AZQUEUE = str(processes.AZQUEUE)
CREDENTIALS = Credentials(ROOT.client_id, ROOT.access_token)


def config(server: Server, queue: str, worker_id: str, **overrides: Any) -> WorkerConfig:
    values: dict[str, Any] = {"root_url": server.root_url, "credentials": CREDENTIALS,
                              "task_queue_id": queue, "worker_group": "tests",
                              "worker_id": worker_id, "idle_sleep": 0.3, **overrides}
    return WorkerConfig(**values)


@asynccontextmanager
async def running(*workers: Worker) -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks = [asyncio.ensure_future(w.start()) for w in workers]
    try:
        yield tasks
    finally:
        await asyncio.gather(*(w.stop() for w in workers))
        await asyncio.gather(*tasks)


async def does_nothing(run: object) -> None:
    """A handler that completes its run at once."""


def shell_worker(server: Server, queue: str, worker_id: str, **overrides: Any) -> Worker:
    return Worker(config(server, queue, worker_id, **overrides), shell.run_command)


# The checkout these tests belong to: an `azqueue` subprocess imports its azqueue (first on
# PYTHONPATH), not the one the console script was installed from.
CHECKOUT = str(Path(__file__).resolve().parents[2])


def ctrl_c_reaches_it() -> None:
    """``preexec_fn`` of a command a test interrupts with SIGINT, as Ctrl-C does: a suite
    started in the background (``nohup``, ``&``: the shell ignores SIGINT there) would
    hand the command that ignored SIGINT, and it would never see the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def checkout_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with this checkout first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != CHECKOUT]
    env["PYTHONPATH"] = os.pathsep.join([CHECKOUT, *rest])
    return env


def cli_env(server: Server) -> dict[str, str]:
    """The environment of an `azqueue` command run by the root client."""
    return {**checkout_env(), "TASKCLUSTER_ROOT_URL": server.root_url,
            "TASKCLUSTER_CLIENT_ID": ROOT.client_id, "TASKCLUSTER_ACCESS_TOKEN": ROOT.access_token}


def spawn(server: Server, queue: str, worker_id: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([AZQUEUE, "worker", "--task-queue", queue, "--worker-id", worker_id,
                             *extra], env=cli_env(server), stderr=subprocess.PIPE)


def finish(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> str:
    if process.poll() is None:
        process.send_signal(sig)
    _, err = process.communicate(timeout=30)
    return err.decode(errors="replace")


async def wait_status(http: aiohttp.ClientSession, server: Server, task_id: str,
                      done: Callable[[dict[str, Any]], bool],
                      timeout: float = 60.0) -> dict[str, Any]:
    """The task's status once ``done(status)`` holds."""
    last: dict[str, Any] = {}

    async def reached() -> dict[str, Any] | None:
        last.update(await status(http, server.api, task_id))
        return dict(last) if done(last) else None

    try:
        result: dict[str, Any] = await eventually(
            reached, what=f"task {task_id} to reach the expected state", timeout=timeout,
            interval=0.2)
    except AssertionError as e:
        raise AssertionError(f"{e}; its status: {last}") from None
    return result


async def log_of(http: aiohttp.ClientSession, server: Server, task_id: str, run_id: int) -> str:
    async with http.get(f"{server.api}/task/{task_id}/runs/{run_id}/artifacts/"
                        f"{shell.LOG_ARTIFACT}") as r:
        assert r.status == 200, await r.text()
        return await r.text()
