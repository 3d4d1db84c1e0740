"""The expiry resolver: deletes expired artifacts and tasks now and then (see
``azqueue.service.upkeep.expiry``)."""

from __future__ import annotations

import asyncio

from azqueue.background import every
from azqueue.model import timeutil
from azqueue.service.upkeep.expiry import Expiry


async def run(expiry: Expiry, interval: float, stop: asyncio.Event) -> None:
    await every(interval, lambda: expiry.expire(timeutil.utcnow()), stop, "expiry resolver")
