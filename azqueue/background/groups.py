"""The group-passes resolver: finishes cancelTaskGroup and changeTaskGroupPriority.

A call handles the first ``GROUP_BATCH`` members of a large group and leaves a trigger
for the rest in ``<prefix>-group-passes`` (see ``service.tasks.groups``). This loop takes the
due triggers every ``AZQUEUE_GROUP_RESOLVER_INTERVAL`` seconds and handles one batch of
each, until none is left; a trigger it took and did not finish reappears after
``PASS_HOLD`` for any replica.
"""

from __future__ import annotations

import asyncio

from azqueue.background import every
from azqueue.service.tasks.groups import TaskGroups

async def finish_due_passes(groups: TaskGroups) -> int:
    """Handle batches until no trigger is due; how many batches were handled."""
    total = 0
    while handled := await groups.resume():
        total += handled
    return total


async def run(groups: TaskGroups, interval: float, stop: asyncio.Event) -> None:
    await every(interval, lambda: finish_due_passes(groups), stop, "group-passes resolver")
