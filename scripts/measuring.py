"""What measure_cancel.py, measure_polls.py and measure_trickle.py share: ``azqueue
serve`` as a process on a private Azurite, and a session signed with its root client."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from benchlib import ROOT_ID, ROOT_TOKEN, signed_session, start_server

from azqueue.devstorage import Azurite

__all__ = ["ROOT_ID", "ROOT_TOKEN", "dev_server"]


@asynccontextmanager
async def dev_server(**settings: str) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    """``azqueue serve`` (extra ``AZQUEUE_*`` settings in ``settings``) on an Azurite of
    its own: its API URL and a session signed as its root client ROOT_ID/ROOT_TOKEN."""
    azurite = await Azurite.start()
    try:
        with tempfile.TemporaryDirectory(prefix="azqueue-measure-") as logs:
            server = await start_server(azurite.connection_string, Path(logs) / "server.log",
                                        **settings)
            try:
                async with signed_session() as http:
                    yield server.api, http
            finally:
                await server.stop()
    finally:
        await azurite.stop()
