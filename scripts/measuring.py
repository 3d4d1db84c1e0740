"""What the measuring scripts share: a server on an Azurite of its own, started and
stopped around what a script measures, as ``azqueue serve`` (``serving``; ``dev_server``
adds a session signed with its root client) or in this process (``in_process``)."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from benchlib import ROOT_ID, ROOT_TOKEN, TIP_SECRET, signed_session, start_server

from azqueue.config import Client, Settings, StorageSettings
from azqueue.devstorage import Azurite, free_port
from azqueue.testing.inprocess import InProcessServer
from azqueue.testing.processes import ServeProcess

__all__ = ["ROOT", "ROOT_ID", "ROOT_TOKEN", "dev_server", "in_process", "serving"]

ROOT = Client(ROOT_ID, ROOT_TOKEN, ("*",))


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


@asynccontextmanager
async def in_process(**settings: Any) -> AsyncIterator[tuple[Azurite, InProcessServer]]:
    """The server in this process (extra ``Settings`` fields in ``settings``) on an
    Azurite of its own, its tables and queues prefixed ``measure``, its root client ROOT,
    both stopped on exit: the Azurite and the server (its ``settings``, ``root_url``,
    ``api`` and ``services``)."""
    async with AsyncExitStack() as stack:
        azurite = await Azurite.start()
        stack.push_async_callback(azurite.stop)
        server = await InProcessServer.start(Settings(
            storage=StorageSettings(azurite.connection_string, "measure"),
            tip_secrets=(TIP_SECRET,), root=ROOT, host="127.0.0.1", port=free_port(),
            **settings))
        stack.push_async_callback(server.stop)
        yield azurite, server
