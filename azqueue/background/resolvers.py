"""Which resolver loops a process runs, started and stopped in one place.

``azqueue serve`` runs them all next to the API (``create_app``); ``azqueue resolve``
runs the ones it is asked for alone. Both start them here, so both run the same loops
with the same settings.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Collection, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from azqueue.background import claims, deadlines, dependencies, events, expiry
from azqueue.background import groups as group_passes
from azqueue.config import Settings
from azqueue.service.wiring import Services

log = logging.getLogger(__name__)

# How long stopping waits for a loop to end before cancelling it.
STOP_TIMEOUT = 10.0

Loop = Coroutine[Any, Any, None]

# Each resolver's loop, or None when the deployment does not have what it needs.
_LOOPS: dict[str, Callable[[Services, Settings, asyncio.Event], Loop | None]] = {
    "claims": lambda services, settings, stop: claims.run(
        services.resolution, services.index, settings.claim_resolver_interval, stop),
    "deadlines": lambda services, settings, stop: deadlines.run(
        services.resolution, settings.deadline_resolver_interval, stop),
    "dependencies": lambda services, settings, stop: dependencies.run(
        services.dependencies, settings.dependency_resolver_interval, stop),
    "expiry": lambda services, settings, stop: expiry.run(
        services.expiry, settings.expiry_interval, stop),
    "events": lambda services, settings, stop: None if not services.outbox.on else events.run(
        services.outbox, settings.events_resolver_interval, stop),
    "groups": lambda services, settings, stop: group_passes.run(
        services.groups, settings.group_resolver_interval, stop),
}
NAMES: tuple[str, ...] = tuple(_LOOPS)


@asynccontextmanager
async def running(services: Services, settings: Settings,
                  names: Collection[str] = NAMES) -> AsyncIterator[list[str]]:
    """Run the resolvers ``names`` that are configured (events: only with an AMQP URL)
    until the block ends, giving the names of those started; then stop them, cancelling
    any that has not ended within ``STOP_TIMEOUT``."""
    stop = asyncio.Event()
    tasks: dict[str, asyncio.Task[None]] = {}
    for name in names:
        loop = _LOOPS[name](services, settings, stop)
        if loop is not None:
            tasks[name] = asyncio.create_task(loop, name=f"{name} resolver")
    log.info("running resolvers: %s", ", ".join(tasks) or "none")
    try:
        yield list(tasks)
    finally:
        stop.set()
        if tasks:
            _, pending = await asyncio.wait(tasks.values(), timeout=STOP_TIMEOUT)
            for task in pending:
                log.warning("%s did not stop within %.0fs; cancelled", task.get_name(),
                            STOP_TIMEOUT)
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
