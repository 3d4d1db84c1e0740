"""Servers in processes of their own (``azqueue serve``, Azurite): waiting until they
listen or answer, and stopping them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess

import aiohttp


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
