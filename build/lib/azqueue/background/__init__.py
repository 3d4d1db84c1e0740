"""Resolver loops, one per module; each runs in the server process or alone."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from azqueue import metrics
from azqueue.errors import TRANSIENT

log = logging.getLogger(__name__)

T = TypeVar("T")


async def one_pass(step: Callable[[], Awaitable[T]], name: str, interval: float) -> T | None:
    """Run one pass of a resolver, counted in its metrics; None if it failed (an outage of
    storage or broker is logged in one line, anything else with its traceback)."""
    try:
        handled = await step()
    except TRANSIENT as e:
        metrics.resolver_pass(name, False)
        log.warning("%s: %s; retrying in %.1fs", name, e, interval)
    except Exception:
        metrics.resolver_pass(name, False)
        log.exception("%s: step failed; retrying in %.1fs", name, interval)
    else:
        metrics.resolver_pass(name, True, handled)
        return handled
    return None


async def every(interval: float, step: Callable[[], Awaitable[object]], stop: asyncio.Event,
                name: str) -> None:
    """Run ``step`` every ``interval`` seconds (jittered) until ``stop`` is set.

    A failing step is retried at the next interval; the loop only ends on stop.
    """
    metrics.resolver_started(name, interval)
    while not stop.is_set():
        await one_pass(step, name, interval)
        try:
            await asyncio.wait_for(stop.wait(), interval * random.uniform(0.8, 1.2))
        except TimeoutError:
            pass
