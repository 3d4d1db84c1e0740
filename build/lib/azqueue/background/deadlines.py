"""The deadline resolver: resolves unresolved runs exception/deadline-exceeded.

createTask puts a message into the internal deadline queue, invisible until the task's
deadline (at most 5 days ahead, under Azure's 7-day limit) or, first, until the tip
repair delay (``service.repair``: before the deadline, each time it surfaces, a missing
tip is repaired and the message postponed to the next look). This loop receives the due
messages every ``interval`` seconds, resolves the task's unresolved run through the
model's ``resolve_deadline`` transition, settles its message and deletes the trigger. A
message received but not finished (its process died, or storage failed while handling
it: the others are handled meanwhile) reappears after ``INVISIBLE_FOR`` and is handled
again (the transition is idempotent).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from azqueue.background import every
from azqueue.service.resolution import Resolution

INVISIBLE_FOR = timedelta(minutes=2)


async def resolve_due_deadlines(resolution: Resolution) -> int:
    """Handle due deadline messages until none is left; how many were handled."""
    total = 0
    while handled := await resolution.resolve_deadlines(INVISIBLE_FOR):
        total += handled
    return total


async def run(resolution: Resolution, interval: float, stop: asyncio.Event) -> None:
    await every(interval, lambda: resolve_due_deadlines(resolution), stop, "deadline resolver")
