"""What the measuring scripts share: ``azqueue serve`` as a process on an Azurite of its
own, started and stopped around what a script measures (``serving``; ``dev_server`` adds
a session signed with its root client)."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import aiohttp
from benchlib import ROOT_ID, ROOT_TOKEN, signed_session, start_server

from azqueue.devstorage import Azurite
from azqueue.testing.processes import ServeProcess

__all__ = ["ROOT_ID", "ROOT_TOKEN", "dev_server", "serving"]


@asynccontextmanager
async def serving(source: Path | None = None, /, **settings: str
                  ) -> AsyncIterator[tuple[Azurite, ServeProcess]]:
    """``azqueue serve`` (extra ``AZQUEUE_*`` settings in ``settings``; with ``source``,
    the ``azqueue`` package of that source tree) on an Azurite of its own, both stopped on
    exit: the Azurite and the server (its ``api``, ``port`` and ``process.pid``), whose
    root client is ROOT_ID/ROOT_TOKEN."""
    async with AsyncExitStack() as stack:
        azurite = await Azurite.start()
        stack.push_async_callback(azurite.stop)
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="azqueue-measure-")))
        server = await start_server(azurite.connection_string, logs / "server.log", source,
                                    **settings)
        stack.push_async_callback(server.stop)
        yield azurite, server


@asynccontextmanager
async def dev_server(**settings: str) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    """``serving(**settings)``: its API URL and a session signed as its root client."""
    async with serving(**settings) as (_, server), signed_session() as http:
        yield server.api, http

