"""Fixtures of the worker's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from azqueue.devstorage import Azurite
from azqueue.testing.faultproxy import FaultProxy


@pytest.fixture
async def blob_proxy(azurite: Azurite) -> AsyncIterator[FaultProxy]:
    """A fault proxy in front of Azurite's blob service (a server's public blob endpoint,
    so that the worker's requests with SAS URLs go through it)."""
    proxy = FaultProxy({"blob": azurite.blob_port})
    await proxy.start()
    yield proxy
    await proxy.stop()
