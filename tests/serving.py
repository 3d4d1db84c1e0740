"""The server as a separate process, for tests that kill it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from azqueue.devstorage import Azurite
from azqueue.testing.processes import until_serving
from tests.servers import ROOT
from tests.worker.helpers import checkout_env

AZQUEUE = str(Path(sys.executable).parent / "azqueue")


@asynccontextmanager
async def serve(azurite: Azurite, prefix: str, amqp_url: str, port: int,
                release: Path | None = None, **extra: str) -> AsyncIterator[subprocess.Popen[bytes]]:
    """`azqueue serve` as a process of its own on ``port`` (``amqp_url`` "": events off),
    ready once it answers ping; terminated at the end unless it is gone already. With
    ``release``, the ``azqueue`` package of that directory serves (another release's
    source tree), with this environment's dependencies."""
    env = {**checkout_env(), "AZQUEUE_STORAGE_CONNECTION_STRING": azurite.connection_string,
           "AZQUEUE_STORAGE_PREFIX": prefix, "AZQUEUE_TIP_SECRETS": "test-secret-0123456789abcdef",
           "AZQUEUE_ROOT_CLIENT_ID": ROOT.client_id, "AZQUEUE_ROOT_ACCESS_TOKEN": ROOT.access_token,
           "AZQUEUE_AMQP_URL": amqp_url, "AZQUEUE_PORT": str(port),
           "AZQUEUE_EVENTS_RECOVERY_DELAY": "1", "AZQUEUE_EVENTS_RESOLVER_INTERVAL": "0.3",
           "AZQUEUE_LOG_LEVEL": "WARNING", **extra}
    if release is None:
        process = subprocess.Popen([AZQUEUE, "serve"], env=env)
    else:
        process = subprocess.Popen(
            [sys.executable, "-c", "import sys; from azqueue.cli import main; sys.exit(main())",
             "serve"], env={**env, "PYTHONPATH": str(release)}, cwd=release)
    try:
        async with aiohttp.ClientSession() as probe:
            await until_serving(probe, f"http://127.0.0.1:{port}/api/queue/v1", 20.0)
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
        await asyncio.to_thread(process.wait, 30)
