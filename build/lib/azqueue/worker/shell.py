"""The task handler of ``azqueue worker``: run the payload's command in a subprocess.

Payload: ``{command: [program, arg, ...], env: {NAME: value}, maxRunTime: seconds}``.
The output (stdout and stderr) is written to a log file as it comes; while the command
runs, what is new in that file is appended to the artifact ``public/logs/live.log`` (an
append blob, readable from the start) every ``log_interval`` seconds, in pieces of at
most 4 MiB (``azqueue.worker.livelog``), and the rest before the run is reported; a log
that cannot be written then is exception ``internal-error``. Exit 0: completed; any
other exit, or running past ``maxRunTime`` (the process group is killed): failed; a
payload that does not fit: exception ``malformed-payload`` with the explanation in the
log. The command does not inherit the worker's environment (and so never its
credentials): it gets PATH, HOME, LANG, TZ, the payload's ``env``, TASK_ID and RUN_ID. It
runs in a fresh scratch directory (``azqueue-<taskId>-<runId>-*`` in the system's
temporary directory), removed with all it holds once the command has ended; a canceled
run (or one the worker lost, or a worker stopped at once) kills the command's process
group, and its log ends with what the command printed until then and a line saying why
it was killed, appended and finished as far as the run still takes artifacts.

The command runs as the worker's own user, so it can do whatever that user can: read
the files the worker reads (a token file among them) and, were it not for
``hide_environment()``, the worker's initial environment in ``/proc/<pid>/environ``.
A worker that runs tasks it does not trust runs them as another user, in a container
or a virtual machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from azqueue.worker.errors import MalformedPayload, TaskFailed
from azqueue.worker.livelog import LiveLog, LogNotWritten
# The log it streams is the run's log, where the worker writes why a run failed.
from azqueue.worker.run import LOG_ARTIFACT as LOG_ARTIFACT
from azqueue.worker.run import LOG_CONTENT_TYPE, TaskRun

log = logging.getLogger(__name__)

DEFAULT_MAX_RUN_TIME = 3600
MAX_RUN_TIME = 86400
INHERITED = ("PATH", "HOME", "LANG", "TZ")
# Seconds to read what a killed command printed last.
COPY_AFTER_KILL = 5.0


PR_SET_DUMPABLE = 4


def hide_environment() -> bool:
    """Make this process not dumpable (Linux ``prctl(PR_SET_DUMPABLE, 0)``): the files of
    ``/proc/<pid>`` then belong to root, so a process of the same user that is not
    privileged, such as a task's command, can neither read the worker's environment
    (``/proc/<pid>/environ``, where a ``TASKCLUSTER_ACCESS_TOKEN`` passed to it stays
    however ``os.environ`` changes) nor attach to it with ptrace. Root still can. The
    command itself is dumpable again once it is executed. False where this is not
    possible (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        done: bool = libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if not done:
        log.warning("could not make the worker's process undumpable (errno %d): tasks of "
                    "its user can read its environment", ctypes.get_errno())
    return done


def check_payload(payload: Any) -> tuple[list[str], dict[str, str], int]:
    """The command, env and maxRunTime of a payload; MalformedPayload saying what is wrong."""
    if not isinstance(payload, dict):
        raise MalformedPayload("the payload must be an object "
                               '{"command": [...], "env": {...}, "maxRunTime": seconds}')
    unknown = sorted(set(payload) - {"command", "env", "maxRunTime"})
    if unknown:
        raise MalformedPayload(f"unknown payload field(s) {unknown}; allowed: command, env, "
                               "maxRunTime")
    command = payload.get("command")
    if (not isinstance(command, list) or not command
            or not all(isinstance(c, str) for c in command)):
        raise MalformedPayload('`command` must be a non-empty list of strings, e.g. '
                               '["sh", "-c", "make test"]')
    env = payload.get("env", {})
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise MalformedPayload("`env` must map names to string values")
    max_run_time = payload.get("maxRunTime", DEFAULT_MAX_RUN_TIME)
    if (not isinstance(max_run_time, int) or isinstance(max_run_time, bool)
            or not 1 <= max_run_time <= MAX_RUN_TIME):
        raise MalformedPayload(f"`maxRunTime` must be a whole number of seconds from 1 to "
                               f"{MAX_RUN_TIME}")
    return command, env, max_run_time


def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


async def run_command(run: TaskRun) -> None:
    with tempfile.TemporaryDirectory(prefix=f"azqueue-{run.task_id}-{run.run_id}-",
                                     ignore_cleanup_errors=True) as scratch:
        await _run_in(run, scratch)


async def _run_in(run: TaskRun, scratch: str) -> None:
    """Run the command with its output going to a file that ``LiveLog`` streams to the
    live log while it runs; the rest is appended before the outcome is reported."""
    with tempfile.TemporaryFile() as output:
        def write(data: bytes) -> None:
            output.write(data)
            output.flush()  # the streamer reads the file by its descriptor

        write(f"[azqueue] task {run.task_id} run {run.run_id}\n".encode())
        live = LiveLog(run, LOG_ARTIFACT, output.fileno(), LOG_CONTENT_TYPE)
        await live.start()
        streamer = asyncio.ensure_future(live.follow(run.log_interval))
        try:
            await _execute(run, scratch, write)
        except asyncio.CancelledError:  # canceled, lost or stopped: the rest, no report
            # A stop of the worker while this is under way must not cut the log short.
            closing = asyncio.ensure_future(_close_canceled(run, live, streamer))
            try:
                await asyncio.shield(closing)
            except asyncio.CancelledError:
                await closing
            raise
        except Exception:  # the outcome; reported once the log is whole
            await _close(live, streamer)
            raise
        await _close(live, streamer)


async def _close(live: LiveLog, streamer: asyncio.Future[None]) -> None:
    """Stop the streamer and append the rest of the log; ``LogNotWritten`` (the run ends
    ``intermittent-task``) if it cannot be written."""
    live.stop()
    await streamer
    await live.close()


async def _close_canceled(run: TaskRun, live: LiveLog, streamer: asyncio.Future[None]) -> None:
    """Append the rest of the log of a run the handler was cancelled on and finish it,
    as far as the run still takes artifacts (20 minutes after an exception); a warning
    if it cannot be written."""
    try:
        await _close(live, streamer)
    except LogNotWritten as e:
        log.warning("task %s/%d: %s", run.task_id, run.run_id, e)


async def _execute(run: TaskRun, scratch: str, write: Callable[[bytes], None]) -> None:
    """Check the payload and run its command, writing what it prints with ``write``;
    the outcome is raised as ``azqueue.worker.errors`` says."""
    try:
        command, env, max_run_time = check_payload(run.payload)
    except MalformedPayload as e:
        write(f"[azqueue] malformed payload: {e}\n".encode())
        raise
    child_env = {k: os.environ[k] for k in INHERITED if k in os.environ}
    child_env.update(env)
    child_env.update(TASK_ID=run.task_id, RUN_ID=str(run.run_id))
    write(f"[azqueue] running {command!r} in {scratch} (maxRunTime {max_run_time}s)\n".encode())
    try:
        process = await asyncio.create_subprocess_exec(
            *command, env=child_env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            cwd=scratch, start_new_session=True)
    except OSError as e:
        write(f"[azqueue] cannot start {command[0]!r}: {e}\n".encode())
        raise TaskFailed(f"cannot start {command[0]!r}: {e}") from None
    log.info("task %s/%d: started %s as process %d in %s", run.task_id, run.run_id,
             " ".join(command)[:200], process.pid, scratch)

    async def copy_output() -> None:
        assert process.stdout is not None
        while chunk := await process.stdout.read(65536):
            write(chunk)

    copier = asyncio.ensure_future(copy_output())
    try:
        await asyncio.wait_for(process.wait(), max_run_time)
    except TimeoutError:
        _kill(process)
        await process.wait()
        await copier
        write(f"\n[azqueue] killed: the command ran longer than maxRunTime "
              f"({max_run_time}s)\n".encode())
        raise TaskFailed(f"exceeded maxRunTime ({max_run_time}s)") from None
    except asyncio.CancelledError:
        _kill(process)
        await process.wait()
        # What it printed up to the kill (a descendant that left the process group may
        # hold the pipe open: not waited for long).
        await asyncio.wait({copier}, timeout=COPY_AFTER_KILL)
        copier.cancel()
        why = run.lost_because if run.lost else "the worker is shutting down"
        write(f"\n[azqueue] killed: {why}\n".encode())
        raise
    await copier
    write(f"\n[azqueue] exit code {process.returncode}\n".encode())
    if process.returncode != 0:
        raise TaskFailed(f"the command exited with {process.returncode}")
