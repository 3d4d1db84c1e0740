"""Waiting for a server started in another process to answer."""

from __future__ import annotations

import aiohttp

from tests.waiting import eventually


async def until_serving(http: aiohttp.ClientSession, api: str, seconds: float = 30.0) -> None:
    """Return once ``<api>/ping`` answers 200, polling every 0.1 s; raise AssertionError
    if it has not after ``seconds``."""
    async def ping() -> int | str:
        try:
            async with http.get(f"{api}/ping") as r:
                return r.status
        except aiohttp.ClientError as e:
            return f"{type(e).__name__}: {e}"

    await eventually(ping, lambda answer: answer == 200, what=f"{api}/ping answering 200",
                     timeout=seconds, interval=0.1)
