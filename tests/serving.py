"""The server as a separate process, for tests that kill it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from azqueue.devstorage import Azurite
from azqueue.testing.processes import ServeProcess, serving
from tests.servers import ROOT
from tests.worker.helpers import checkout_env


@asynccontextmanager
async def serve(azurite: Azurite, prefix: str, amqp_url: str, port: int,
                release: Path | None = None, **extra: str) -> AsyncIterator[ServeProcess]:
    """`azqueue serve` as a process of its own on ``port`` (``amqp_url`` "": events off),
    ready once it answers ping; stopped at the end unless it is gone already. With
    ``release``, the ``azqueue`` package of that directory serves (another release's
    source tree), with this environment's dependencies."""
    variables = {
        "AZQUEUE_STORAGE_CONNECTION_STRING": azurite.connection_string,
        "AZQUEUE_STORAGE_PREFIX": prefix, "AZQUEUE_TIP_SECRETS": "test-secret-0123456789abcdef",
        "AZQUEUE_ROOT_CLIENT_ID": ROOT.client_id, "AZQUEUE_ROOT_ACCESS_TOKEN": ROOT.access_token,
        "AZQUEUE_AMQP_URL": amqp_url, "AZQUEUE_EVENTS_RECOVERY_DELAY": "1",
        "AZQUEUE_EVENTS_RESOLVER_INTERVAL": "0.3", "AZQUEUE_LOG_LEVEL": "WARNING", **extra}
    async with serving(variables, port=port, env=checkout_env(), source=release,
                       seconds=20.0) as server:
        yield server
