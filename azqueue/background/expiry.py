"""The expiry resolver: deletes expired artifacts and tasks now and then (see
``azqueue.service.expiry``)."""

from __future__ import annotations

import asyncio

from azqueue.background import every
from azqueue.model import timeutil
from azqueue.service.artifacts import ArtifactService
from azqueue.service.expiry import expire
from azqueue.service.queue import QueueService


async def run(queue: QueueService, artifacts: ArtifactService, interval: float,
              stop: asyncio.Event) -> None:
    await every(interval, lambda: expire(queue, artifacts, timeutil.utcnow()), stop,
                "expiry resolver")
