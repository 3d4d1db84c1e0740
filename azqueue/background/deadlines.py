"""The deadline resolver: resolves unresolved runs exception/deadline-exceeded.

createTask stores the task's deadline trigger (``service.runs.triggers``, several tasks to a
message), invisible until the task's deadline (at most 5 days ahead, under Azure's 7-day
limit) or, first, until the tip repair delay (``service.runs.repair``: before the deadline,
each time it surfaces, a missing tip is repaired and the trigger postponed to the next
look). This loop receives the due messages every ``interval`` seconds, resolves each
task's unresolved run through the model's ``resolve_deadline`` transition, settles its
message and deletes the trigger. A message received but not finished (its process died,
or storage failed while handling a task of it: the others are handled meanwhile)
reappears after ``INVISIBLE_FOR`` and is handled again (the transition is idempotent).

Earlier releases' triggers (one message per task, in a queue of their own) are handled
every ``LEGACY_EVERY``-th pass: a minute at the default interval. Such a trigger is not
put any more (but by replicas of those releases while an upgrade rolls out, which handle
their own queue at every pass), so it costs a request a minute, not one a pass.
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta

from azqueue.background import every
from azqueue.service.runs.resolution import Resolution

INVISIBLE_FOR = timedelta(minutes=2)
LEGACY_EVERY = 12


async def resolve_due_deadlines(resolution: Resolution, legacy: bool = True) -> int:
    """Handle due deadline triggers until none is left (with ``legacy``, earlier
    releases' too); how many tasks were looked at."""
    total = 0
    for old in (True, False) if legacy else (False,):  # the earlier queue first: it waits most
        while handled := await resolution.resolve_deadlines(INVISIBLE_FOR, legacy=old):
            total += handled
    return total


async def run(resolution: Resolution, interval: float, stop: asyncio.Event) -> None:
    passes = itertools.count()
    await every(interval, lambda: resolve_due_deadlines(
        resolution, legacy=next(passes) % LEGACY_EVERY == 0), stop, "deadline resolver")
