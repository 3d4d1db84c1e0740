"""What the benchmarks share: `azqueue dev` in a subprocess, and a signed session to it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from azqueue.devstorage import free_port  # noqa: E402
from tests.readiness import until_serving  # noqa: E402
from tests.signing import hawk_signer  # noqa: E402

ROOT_ID, ROOT_TOKEN = "root", "bench-root-access-token-0123456789"


@asynccontextmanager
async def dev_server(connections: int = 100,
                     **env: str) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    """``azqueue dev`` on a free port (extra AZQUEUE_* settings in ``env``); yields the API
    base URL and a session whose requests to it are signed with the root client."""
    port = free_port()
    server = subprocess.Popen(
        [str(ROOT / ".venv/bin/azqueue"), "dev", "--port", str(port)],
        env={**os.environ, "AZQUEUE_LOG_LEVEL": "WARNING", "AZQUEUE_ROOT_CLIENT_ID": ROOT_ID,
             "AZQUEUE_ROOT_ACCESS_TOKEN": ROOT_TOKEN, **env},
        stdout=subprocess.DEVNULL)
    api = f"http://127.0.0.1:{port}/api/queue/v1"
    try:
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=connections),
                middlewares=(hawk_signer(ROOT_ID, ROOT_TOKEN),)) as http:
            await until_serving(http, api)
            yield api, http
    finally:
        server.terminate()
        server.wait(timeout=30)
