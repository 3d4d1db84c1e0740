"""The dependency resolver: passes on resolutions whose process died before it did.

Before a task with dependents is resolved, a trigger message goes into the internal
queue ``<prefix>-dependencies``, invisible for ``AZQUEUE_DEPENDENCIES_RECOVERY_DELAY``;
the process deletes it once the tasks waiting on it were told. A trigger that reappears
was not: this loop tells them (telling twice does nothing more) and deletes it.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from azqueue.background import every
from azqueue.service.runs.dependencies import Dependencies

INVISIBLE_FOR = timedelta(minutes=2)


async def pass_on_recovered(dependencies: Dependencies) -> int:
    total = 0
    while handled := await dependencies.recover(INVISIBLE_FOR):
        total += handled
    return total


async def run(dependencies: Dependencies, interval: float, stop: asyncio.Event) -> None:
    await every(interval, lambda: pass_on_recovered(dependencies), stop, "dependency resolver")
