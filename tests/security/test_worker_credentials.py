"""`azqueue worker` keeps its own credentials from the commands it runs: a command's
environment is the payload's plus a small base, the worker's `/proc/<pid>/environ` is
closed to them, and the token can come from a file so that it is in no environment."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from pathlib import Path

import aiohttp
import pytest

from azqueue.testing.tasks import create, definition, slugid
from tests.cli.helpers import azqueue, one_line_error
from tests.servers import IN_CI, ROOT, Server
from tests.worker.helpers import AZQUEUE, cli_env, finish, log_of, wait_status

REPO = Path(__file__).resolve().parents[2]
# Root reads any process's environ: run as root, the tests run the worker (and so its
# tasks) as `nobody`, allowed to read root's files (the interpreter may be under /root)
# but with no other privilege, as a worker of an ordinary user is.
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
SHOW_ENVIRONMENTS = ("echo '--- own'; env; echo '--- worker'; "
                     "tr '\\0' '\\n' < /proc/$PPID/environ; echo '--- end'")


def _worker_env(server: Server, **changes: str | None) -> dict[str, str]:
    """The root client's variables for `azqueue worker`, this checkout's azqueue first."""
    env = {**cli_env(server), "PYTHONPATH": str(REPO)}
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def _spawn(env: dict[str, str], queue: str, worker_id: str) -> subprocess.Popen[bytes]:
    """`azqueue worker`, as an unprivileged user (`nobody` when the tests run as root)."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            if IN_CI:
                pytest.fail("setpriv (util-linux) is needed to run the worker as nobody")
            pytest.skip("no setpriv to run the worker as another user than root")
        prefix = AS_NOBODY
    return subprocess.Popen([*prefix, AZQUEUE, "worker", "--task-queue", queue,
                             "--worker-id", worker_id], env=env, stderr=subprocess.PIPE, cwd="/")


async def test_a_task_reads_the_worker_s_token_neither_in_its_environment_nor_the_worker_s(
        server: Server, http: aiohttp.ClientSession) -> None:
    """The worker got its token in TASKCLUSTER_ACCESS_TOKEN; the task prints its own
    environment and tries to read the worker's (its parent's /proc/<pid>/environ, which
    Linux lets a process of the same user read unless the worker is undumpable): the
    public log holds neither the token nor the worker's other variables."""
    task_id = await create(http, server.api, definition("prov/env-leak", payload={
        "command": ["sh", "-c", SHOW_ENVIRONMENTS], "env": {"MINE": "from-the-payload"}}))
    env = _worker_env(server, AZQUEUE_SOMETHING_SECRET="worker-only-value-0123456789")
    worker = _spawn(env, "prov/env-leak", "leaky")
    try:
        await wait_status(http, server, task_id, lambda s: s["state"] in (
            "completed", "failed", "exception"))
    finally:
        output = await asyncio.to_thread(finish, worker, signal.SIGTERM)
    log = await log_of(http, server, task_id, 0)
    assert "\n--- end" in log, (log, output)
    assert ROOT.access_token not in log, log
    assert "worker-only-value" not in log and "TASKCLUSTER_" not in log, log
    own = log.split("\n--- own\n", 1)[1].split("\n--- worker\n", 1)[0]
    names = {line.split("=", 1)[0] for line in own.splitlines() if "=" in line}
    assert names <= {"PATH", "HOME", "LANG", "TZ", "MINE", "TASK_ID", "RUN_ID", "PWD",
                     "SHLVL", "_", "OLDPWD"}, names
    assert "MINE=from-the-payload" in own


async def test_the_worker_reads_its_access_token_from_a_file(
        server: Server, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    """TASKCLUSTER_ACCESS_TOKEN_FILE instead of TASKCLUSTER_ACCESS_TOKEN: the worker
    claims and completes the task, and its token was never in its environment (the task
    sees the worker's environment without it, were it able to read it)."""
    token_file = tmp_path / "token"
    token_file.write_text(ROOT.access_token + "\n")
    token_file.chmod(0o644)  # the worker may run as another user here
    tmp_path.chmod(0o755)
    task_id = await create(http, server.api, definition("prov/token-file", payload={
        "command": ["sh", "-c", "echo hello from the task"]}))
    env = _worker_env(server, TASKCLUSTER_ACCESS_TOKEN=None,
                      TASKCLUSTER_ACCESS_TOKEN_FILE=str(token_file))
    worker = _spawn(env, "prov/token-file", "filed")
    try:
        s = await wait_status(http, server, task_id, lambda s: s["state"] in (
            "completed", "failed", "exception"))
    finally:
        output = await asyncio.to_thread(finish, worker, signal.SIGTERM)
    assert s["state"] == "completed", (s, output)
    assert "hello from the task" in await log_of(http, server, task_id, 0)


async def test_a_token_file_that_cannot_be_read_is_one_line_naming_the_variable(
        server: Server, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-file"
    done = await azqueue("worker", "--task-queue", "prov/no-token", env=_worker_env(
        server, TASKCLUSTER_ACCESS_TOKEN=None, TASKCLUSTER_ACCESS_TOKEN_FILE=str(missing)))
    assert done.returncode == 1
    assert one_line_error(done) == (f"azqueue: TASKCLUSTER_ACCESS_TOKEN_FILE={str(missing)!r}: "
                                    "cannot read it (No such file or directory)")
    both = await azqueue("task", "status", slugid(), env=_worker_env(
        server, TASKCLUSTER_ACCESS_TOKEN_FILE=str(missing)))
    assert both.returncode == 1
    assert "set TASKCLUSTER_ACCESS_TOKEN or TASKCLUSTER_ACCESS_TOKEN_FILE, not both" in \
        one_line_error(both)
