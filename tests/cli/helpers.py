"""Running the real `azqueue` entry point as a user does: a subprocess, its output and exit
code."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Mapping

from tests.servers import Server
from tests.worker.helpers import AZQUEUE, checkout_env, cli_env


async def azqueue(*args: str, env: Mapping[str, str] | None = None, timeout: float = 60,
                  stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``azqueue ARGS``, run to its end (``timeout`` bounds a stuck one), importing this
    checkout's azqueue; ``stdin`` is what it reads on its standard input (none without)."""
    return await asyncio.to_thread(
        subprocess.run, [AZQUEUE, *args], env=checkout_env(env),
        capture_output=True, text=True, timeout=timeout,
        **({"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}))


async def as_root(server: Server, *args: str, timeout: float = 60, stdin: str | None = None
                  ) -> subprocess.CompletedProcess[str]:
    """``azqueue ARGS`` with the root client's TASKCLUSTER_* variables for ``server``."""
    return await azqueue(*args, env=cli_env(server), timeout=timeout, stdin=stdin)


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The error an `azqueue` command ended with, checked to be one line and no traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines, f"no error printed; stdout: {done.stdout!r}"
    return lines[-1]
