"""Waiting for a server started in another process to answer."""

from __future__ import annotations

import asyncio

import aiohttp


async def until_serving(http: aiohttp.ClientSession, api: str, seconds: float = 30.0) -> None:
    """Return once ``<api>/ping`` answers 200, polling every 0.1 s for up to ``seconds``."""
    for _ in range(int(seconds * 10)):
        try:
            async with http.get(f"{api}/ping") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
