"""The events resolver: publishes events whose change was stored but not published.

Every state change leaves a trigger in ``<prefix>-events`` that its own process deletes
once the change's events are out. A trigger that becomes visible (after
``AZQUEUE_EVENTS_RECOVERY_DELAY``) means that process died or the broker was away; this
loop, on any replica, publishes the task's remaining outbox rows and deletes it.
"""

from __future__ import annotations

import asyncio

from azqueue.background import every
from azqueue.events.outbox import EventOutbox


async def recover_all(outbox: EventOutbox) -> int:
    total = 0
    while handled := await outbox.recover():
        total += handled
    return total


async def run(outbox: EventOutbox, interval: float, stop: asyncio.Event) -> None:
    await every(interval, lambda: recover_all(outbox), stop, "events resolver")
