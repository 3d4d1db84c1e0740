"""Servers in processes of their own (``azqueue serve``, Azurite): starting ``azqueue
serve`` (``ServeProcess``, ``serving``), waiting until they listen or answer, and
stopping them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import aiohttp

from azqueue.devstorage import free_port

# The `azqueue` of the environment running this (.venv/bin/python: .venv/bin/azqueue).
AZQUEUE = Path(sys.executable).parent / "azqueue"
# The command line of the `azqueue` package found first on PYTHONPATH.
_FROM_SOURCE = ("-c", "import sys; from azqueue.cli import main; sys.exit(main())")


class NotServing(AssertionError):
    """A server did not listen or answer in time, or its process exited first."""


def _exited(process: subprocess.Popen[bytes] | None, what: str) -> None:
    if process is not None and process.poll() is not None:
        raise NotServing(f"{what}: its process exited with {process.returncode}")


async def until_serving(http: aiohttp.ClientSession, api: str, seconds: float = 30.0, *,
                        process: subprocess.Popen[bytes] | None = None) -> None:
    """Return once ``<api>/ping`` answers 200, polling every 0.1 s; ``NotServing`` (with
    the last answer or error) after ``seconds``, or as soon as ``process`` has exited."""
    what = f"{api}/ping answering 200"
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while True:
        _exited(process, what)
        try:
            async with http.get(f"{api}/ping") as r:
                if r.status == 200:
                    return
                last = f"{r.status}"
        except aiohttp.ClientError as e:
            last = f"{type(e).__name__}: {e}"
        if loop.time() >= end:
            raise NotServing(f"{what}: not within {seconds:g}s; last seen: {last}")
        await asyncio.sleep(0.1)


async def stop_process(process: subprocess.Popen[bytes], seconds: float = 10.0) -> None:
    """SIGTERM to the process group (the process was started with
    ``start_new_session=True``), SIGKILL after ``seconds`` or if this wait is cancelled;
    waits without blocking the event loop, which may still have its last requests to
    serve."""
    try:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while process.poll() is None and loop.time() < end:
            await asyncio.sleep(0.05)
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@dataclass
class ServeProcess:
    """``azqueue serve`` in a process of its own, in a session of its own (``stop()``
    ends whatever it started too): its API on ``port`` of 127.0.0.1."""

    process: subprocess.Popen[bytes]
    port: int

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api(self) -> str:
        return f"{self.root_url}/api/queue/v1"

    @classmethod
    async def start(cls, variables: Mapping[str, str], *, port: int | None = None,
                    env: Mapping[str, str] | None = None, log: Path | None = None,
                    source: Path | None = None, seconds: float = 60.0) -> ServeProcess:
        """Start ``azqueue serve`` configured by the ``AZQUEUE_*`` ``variables``, on
        ``port`` (default: a free one). It runs in ``env`` (default: this process's
        environment) less the ``AZQUEUE_*`` variables there; its output is appended to
        ``log`` (default: this process's). With ``source``, the ``azqueue`` package of
        that directory serves (another release's source tree), with this environment's
        dependencies. Returns once it answers ping; ``NotServing`` (the process stopped)
        if it does not within ``seconds`` or exits first."""
        port = free_port() if port is None else port
        base = os.environ if env is None else env
        environment = {k: v for k, v in base.items() if not k.startswith("AZQUEUE_")}
        environment.update({**variables, "AZQUEUE_PORT": str(port)})
        command = [str(AZQUEUE), "serve"]
        if source is not None:
            command = [sys.executable, *_FROM_SOURCE, "serve"]
            environment["PYTHONPATH"] = str(source)
        with contextlib.ExitStack() as files:
            out: IO[Any] | None = None if log is None else files.enter_context(open(log, "ab"))
            process = subprocess.Popen(command, env=environment, cwd=source,
                                       stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                       start_new_session=True)
        server = cls(process, port)
        try:
            async with aiohttp.ClientSession() as http:
                await until_serving(http, server.api, seconds, process=process)
        except BaseException:
            await server.stop()
            raise
        return server

    async def stop(self, seconds: float = 10.0) -> None:
        """``stop_process``: SIGTERM, SIGKILL after ``seconds``."""
        await stop_process(self.process, seconds)


@asynccontextmanager
async def serving(variables: Mapping[str, str], **options: Any) -> AsyncIterator[ServeProcess]:
    """``ServeProcess.start(variables, **options)``, stopped at the end."""
    server = await ServeProcess.start(variables, **options)
    try:
        yield server
    finally:
        await server.stop()
