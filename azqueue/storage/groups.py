"""Task group membership in Azure Tables, for listTaskGroup and task-group-resolved.

PartitionKey = taskGroupId, RowKey = taskId, ``resolved``. The group's own task (the
one whose taskId is the taskGroupId, Taskcluster's default group) has no row until it is
resolved: listings and group checks read that task itself. Any other member is added
before its task is written and (with events on) marked resolved when the task's final
resolution is published,
so "no member unresolved" means the group is resolved. A member whose task never got
written (its createTask died in between) is dropped once it is older than ``ORPHAN_AGE``.

The row ``~announced`` (``~`` is not a taskId character) says which set of members was
last announced resolved, and by which task's resolution: resolutions racing to announce
the same set write it conditionally, and only the winner publishes.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

from azure.core import MatchConditions
from azure.data.tables import UpdateMode

from azqueue.storage.account import StorageAccount
from azqueue.storage.tables import TableStore
from azqueue.storage.errors import EntityExists, EntityNotFound, ETagMismatch, translate
from azqueue.storage.rows import key_page

ORPHAN_AGE = timedelta(minutes=5)
ANNOUNCED = "~announced"


class GroupStore(TableStore):
    """The task groups table."""

    def __init__(self, account: StorageAccount) -> None:
        super().__init__(account, "groups")

    async def add(self, task_group_id: str, task_id: str) -> None:
        """Add an unresolved member (an existing member is left as it is)."""
        try:
            with translate(f"adding task {task_id} to group {task_group_id}"):
                await self._rest.create_entity(self.name, {"PartitionKey": task_group_id,
                                                           "RowKey": task_id, "resolved": False})
        except EntityExists:
            pass

    async def resolve(self, task_group_id: str, task_id: str) -> None:
        with translate(f"resolving task {task_id} in group {task_group_id}"):
            await self._table.upsert_entity({"PartitionKey": task_group_id, "RowKey": task_id,
                                             "resolved": True}, mode=UpdateMode.MERGE)

    async def unresolved(self, task_group_id: str) -> list[tuple[str, datetime]]:
        """Unresolved members, with the time each row was written."""
        with translate(f"reading group {task_group_id}"):
            rows = self._table.query_entities("PartitionKey eq @pk and resolved eq false",
                                              parameters={"pk": task_group_id})
            return [(str(r["RowKey"]), r.metadata["timestamp"] or datetime.now(UTC))
                    async for r in rows]

    async def page(self, task_group_id: str, after: str | None,
                   limit: int) -> tuple[list[str], str | None]:
        """Up to ``limit`` member taskIds after ``after``; the taskId to continue after, if
        there may be more."""
        return await key_page(self._table, task_group_id, after, limit, f"listing group {task_group_id}", below=ANNOUNCED)

    async def drop(self, task_group_id: str, task_id: str) -> None:
        with translate(f"dropping task {task_id} from group {task_group_id}"):
            await self._table.delete_entity(task_group_id, task_id)

    async def claim_announcement(self, task_group_id: str, by_task_id: str) -> bool:
        """Whether the resolution of ``by_task_id`` is to announce the group resolved: true
        for the first to claim the current set of members, and again for that same task
        (its announcement may not have gone out), false for everyone else."""
        with translate(f"reading group {task_group_id}"):
            rows = [r async for r in self._table.query_entities(
                "PartitionKey eq @pk", parameters={"pk": task_group_id},
                select=["RowKey", "members", "by"])]
        members = sorted(str(r["RowKey"]) for r in rows if r["RowKey"] != ANNOUNCED)
        current = next((r for r in rows if r["RowKey"] == ANNOUNCED), None)
        digest = hashlib.sha256("\n".join(members).encode()).hexdigest()
        marker = {"PartitionKey": task_group_id, "RowKey": ANNOUNCED, "members": digest,
                  "by": by_task_id}
        try:
            with translate(f"announcing group {task_group_id}"):
                if current is None:
                    await self._table.create_entity(marker)
                elif current.get("members") == digest:
                    return bool(current.get("by") == by_task_id)
                else:
                    await self._table.update_entity(
                        marker, mode=UpdateMode.REPLACE, etag=current.metadata["etag"],
                        match_condition=MatchConditions.IfNotModified)
        except (EntityExists, ETagMismatch, EntityNotFound):
            return False  # another resolution announced this set just now
        return True
