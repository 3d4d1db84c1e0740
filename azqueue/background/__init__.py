"""Resolver loops, one per module; each runs in the server process or alone."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


async def every(interval: float, step: Callable[[], Awaitable[object]], stop: asyncio.Event,
                name: str) -> None:
    """Run ``step`` every ``interval`` seconds (jittered) until ``stop`` is set.

    A failing step is logged and retried at the next interval; the loop only ends on stop.
    """
    while not stop.is_set():
        try:
            await step()
        except Exception:
            log.exception("%s: step failed; retrying in %.1fs", name, interval)
        try:
            await asyncio.wait_for(stop.wait(), interval * random.uniform(0.8, 1.2))
        except TimeoutError:
            pass
