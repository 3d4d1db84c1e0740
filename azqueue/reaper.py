"""Ends a process group once the process that started it is gone, however it went
(SIGTERM, SIGKILL, a crash), as testcontainers' reaper ends a test session's containers.

``watch(pgid, data)`` starts this file as a process of its own session (a signal sent to
the owner's process group does not reach it), reading a pipe whose only write end the
owner holds. The kernel closes that end when the owner exits, in whatever way: the
reaper then sends SIGTERM to the group (SIGKILL after ``GRACE`` seconds) and removes
``data``. An owner that stops the group itself first calls ``release``: the reaper reads
a byte and leaves. This file uses the standard library alone: it runs as a script, with
``python -I``, whatever the owner's import path was."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

GRACE = 10.0
RELEASE = b"."


def watch(pgid: int, data: str | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """A reaper of the process group ``pgid`` (and of the folder ``data``) for as long as
    this process lives: the reaper's process and the pipe's write end to ``release``."""
    read_end, write_end = os.pipe()  # not inherited by the owner's other children
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), str(pgid), *([data] if data else [])],
            stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return process, write_end


def release(process: subprocess.Popen[bytes], write_end: int, timeout: float = 5.0) -> None:
    """Tell the reaper the owner stopped the group itself, and wait for it to leave."""
    with contextlib.suppress(OSError):
        os.write(write_end, RELEASE)
    os.close(write_end)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(pgid: int, data: str | None) -> None:
    """SIGTERM to the group, SIGKILL to what is left after ``GRACE`` seconds; then remove
    ``data``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
        end = time.monotonic() + GRACE
        while _alive(pgid) and time.monotonic() < end:
            time.sleep(0.1)
        os.killpg(pgid, signal.SIGKILL)
    if data:
        shutil.rmtree(data, ignore_errors=True)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pgid = int(argv[1])
    data = argv[2] if len(argv) > 2 else None
    if os.read(0, 1) != RELEASE:  # end of file: the owner is gone without a word
        reap(pgid, data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
