"""Whose a task group is: the schedulerId its first task recorded.

The record (``storage.groups``, row ``~scheduler``) is written once, by a conditional
insert, by the first task other than the group's own to join it (``definitions`` checks
every other task against it and refuses one of another schedulerId); the group methods
(``groups``) take the group's schedulerId from it. No record at all (a group of one,
whose own task writes none, or a group of an earlier version), or one an earlier
release's own task wrote before that task was inserted, is checked against the group's
tasks the first time it is read, and then marked verified.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from azqueue import errors
from azqueue.model import timeutil
from azqueue.storage.groups import GroupStore, Owner
from azqueue.storage.tasks import TaskStore

# Reads of a group's schedulerId record that may find it changed before one gives up.
MAX_GROUP_OWNER_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class GroupOwners:
    """Reading (and verifying) the schedulerId record of task groups."""

    tasks: TaskStore
    groups: GroupStore

    async def scheduler(self, task_group_id: str, owner: Owner | None) -> str | None:
        """The schedulerId the group belongs to, given its record ``owner``; None if it
        has neither a record nor tasks.

        A verified record says it (no request). A record its own task wrote before it was
        inserted, or no record (a group of an earlier version), is checked against the
        group's tasks once: the own task's schedulerId, else the first member row's (every
        member written since has the recorded one) wins over the record, which is then
        marked verified."""
        for _ in range(MAX_GROUP_OWNER_ATTEMPTS):
            if owner is not None and owner.verified:
                return owner.scheduler_id
            own, members = await asyncio.gather(self.tasks.find(task_group_id),
                                                self.groups.members(task_group_id))
            mine = [m for m in members if m.task_id != task_group_id]
            schedulers = [m.scheduler_id for m in mine if m.scheduler_id is not None]
            expires = [m.expires for m in mine if m.expires is not None]
            if own is not None and own.definition["taskGroupId"] == task_group_id:
                schedulers.insert(0, own.definition["schedulerId"])
                expires.append(own.definition["expires"])
            if owner is None:
                if not schedulers:
                    return None
                latest = max(expires, key=timeutil.parse,
                             default=timeutil.fmt(timeutil.utcnow()))
                if await self.groups.record_owner(task_group_id, schedulers[0], latest,
                                                  verified=True, members=bool(mine)):
                    return schedulers[0]
            else:
                actual = next((s for s in schedulers if s != owner.scheduler_id),
                              owner.scheduler_id)
                if await self.groups.settle_owner(task_group_id, owner, actual):
                    return actual
            owner = await self.groups.owner(task_group_id)  # changed meanwhile
        raise errors.StorageError(f"the record of task group {task_group_id} kept changing "
                                  "while it was read; try again")
