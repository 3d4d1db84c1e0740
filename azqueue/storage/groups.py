"""Task group membership in Azure Tables, for listTaskGroup and task-group-resolved.

PartitionKey = taskGroupId, RowKey = taskId, ``resolved``. The group's own task (the
one whose taskId is the taskGroupId, Taskcluster's default group) has no row until it is
resolved: listings and group checks read that task itself. Any other member is added
before its task is written and (with events on) marked resolved when the task's final
resolution is published (and unresolved by a rerun, before its new run is stored),
so "no member unresolved" means the group is resolved. A member whose task never got
written (its createTask died in between) is dropped once it is older than ``ORPHAN_AGE``;
a group check it held back looks again then (``events.outbox``).

The row ``~announced`` (``~`` is not a taskId character) says which set of members was
last announced resolved (a member resolved after more than one run counted with its
number of runs, so that the same tasks resolved again after a rerun are a new set), and
by which task's resolution: resolutions racing to announce
the same set write it conditionally, and only the winner publishes. It carries the latest
``expires`` of that set's members, and expires with them (``expired_announcements``): by
then the tasks of that set are gone, so it can announce nothing again.

A member row also carries its task's ``expires`` and ``schedulerId`` (written with the
row, no extra request), so the group's metadata can be read from its partition alone.
The row ``~group`` exists once the group is sealed (``GroupMeta``): when, and the
group's schedulerId, expires and size as they were then (a sealed group takes no more
members).

The row ``~scheduler`` (``Owner``) names the schedulerId the group belongs to: written
once, by a conditional insert, by the first task other than the group's own to join it
(from the group's own task if that is stored, else its own), or by the first reader of a
group that has only its own task, so of two racing first tasks only one establishes it.
The group's own task writes none (a group of one, Taskcluster's default, has no record):
its insert creates the ``members`` row of its partition, which a task joining the group
before it was stored creates instead, so that its insert fails and asks this record
(``definitions``). A record that an earlier release's own task wrote is ``verified``
false until a reader has checked it against the group's tasks (a group of an earlier
version may have tasks and no record yet); its ``expires`` is renewed by the expiry
resolver while the group has tasks. It also says whether a task other than the
group's own has joined (``members``, noted before that task's member row is written, after
the note on the group's own task that its resolution reads), so that a resolution that
does not know from the task (a task of an earlier version, or recovery publishing the
events of a process that died) reads one row, not a range of the partition.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core import MatchConditions
from azure.data.tables import TableEntity, UpdateMode

from azqueue.model import timeutil
from azqueue.storage.account import StorageAccount
from azqueue.storage.tables import TableStore
from azqueue.storage.errors import EntityExists, EntityNotFound, ETagMismatch, translate
from azqueue.storage.rest import odata_string
from azqueue.storage.rows import key_page

ORPHAN_AGE = timedelta(minutes=5)
ANNOUNCED = "~announced"
META = "~group"
OWNER = "~scheduler"
# Rows whose RowKey starts with this are the group's own records, not members.
RECORD = "~"


@dataclass(frozen=True, slots=True)
class Unresolved:
    """A member's row a group check must look at: one unresolved, or one a rerun marked
    (``rerun``: how many runs that rerun was to give the task), which a resolution
    checked late may have marked resolved again while the rerun's run is under way. With
    when it was last written."""

    task_id: str
    written: datetime
    resolved: bool
    rerun: int | None
    etag: str


@dataclass(frozen=True, slots=True)
class Member:
    """A member row: its task's ``expires`` and ``schedulerId`` as written with it
    (None in rows of earlier versions)."""

    task_id: str
    expires: str | None
    scheduler_id: str | None


@dataclass(frozen=True, slots=True)
class GroupMeta:
    """The record of a sealed group (times in the API's ISO form)."""

    scheduler_id: str
    expires: str
    sealed: str
    size: int


@dataclass(frozen=True, slots=True)
class Owner:
    """The record of the schedulerId the group belongs to, with its ETag."""

    scheduler_id: str
    verified: bool
    etag: str
    # Whether a task other than the group's own has joined: noted before its member row
    # is written; None in records of earlier versions, which did not note it.
    members: bool | None = None


@dataclass(frozen=True, slots=True)
class Records:
    """The group's own records, read in one request."""

    sealed: GroupMeta | None
    owner: Owner | None


def _owner(row: Mapping[str, Any], etag: str) -> Owner:
    return Owner(str(row["schedulerId"]), bool(row.get("verified")), etag,
                 bool(row["members"]) if "members" in row else None)


class GroupStore(TableStore):
    """The task groups table."""

    def __init__(self, account: StorageAccount) -> None:
        super().__init__(account, "groups")

    async def add(self, task_group_id: str, task_id: str, expires: str | None = None,
                  scheduler_id: str | None = None) -> None:
        """Add an unresolved member (an existing member is left as it is)."""
        row = {"PartitionKey": task_group_id, "RowKey": task_id, "resolved": False,
               **({"expires": expires} if expires is not None else {}),
               **({"schedulerId": scheduler_id} if scheduler_id is not None else {})}
        try:
            with translate(f"adding task {task_id} to group {task_group_id}"):
                await self._rest.create_entity(self.name, row)
        except EntityExists:
            pass

    async def unresolve(self, task_group_id: str, task_id: str, rerun: int,
                        if_present: bool = False) -> None:
        """Mark a member unresolved again: it is being rerun, to have ``rerun`` runs (the
        row says so until it is resolved again: a rerun that never stored its run is told
        apart from a run under way, ``Unresolved``). With ``if_present``, only a row that
        exists: the group's own task has one once it resolved in a group that other tasks
        joined, and none in a group of one, which must stay without."""
        row = {"PartitionKey": task_group_id, "RowKey": task_id, "resolved": False,
               "rerun": rerun}
        try:
            with translate(f"marking task {task_id} unresolved in group {task_group_id}"):
                if if_present:  # an update: only a row that exists
                    await self._table.update_entity(row, mode=UpdateMode.MERGE)
                else:
                    await self._table.upsert_entity(row, mode=UpdateMode.MERGE)
        except EntityNotFound:
            if not if_present:
                raise

    async def members(self, task_group_id: str) -> list[Member]:
        """Every member row of the group (one request per 1000 rows)."""
        with translate(f"reading group {task_group_id}"):
            rows = self._table.query_entities(
                "PartitionKey eq @pk and RowKey lt @below",
                parameters={"pk": task_group_id, "below": RECORD},
                select=["RowKey", "expires", "schedulerId"])
            return [Member(str(r["RowKey"]),
                           str(r["expires"]) if r.get("expires") else None,
                           str(r["schedulerId"]) if r.get("schedulerId") else None)
                    async for r in rows]

    async def meta(self, task_group_id: str) -> GroupMeta | None:
        """The group's record if it is sealed, else None."""
        try:
            with translate(f"reading group {task_group_id}"):
                row = await self._rest.get_entity(self.name, task_group_id, META)
        except EntityNotFound:
            return None
        return GroupMeta(str(row["schedulerId"]), str(row["expires"]), str(row["sealed"]),
                         int(row["size"]))

    async def records(self, task_group_id: str) -> Records:
        """The group's sealed record and the record of its schedulerId (one request)."""
        with translate(f"reading group {task_group_id}"):
            rows = [r async for r in self._table.query_entities(
                "PartitionKey eq @pk and RowKey ge @records",
                parameters={"pk": task_group_id, "records": RECORD})]
        sealed = next((r for r in rows if r["RowKey"] == META), None)
        owner = next((r for r in rows if r["RowKey"] == OWNER), None)
        return Records(
            GroupMeta(str(sealed["schedulerId"]), str(sealed["expires"]), str(sealed["sealed"]),
                      int(sealed["size"])) if sealed is not None else None,
            _owner(owner, str(owner.metadata["etag"])) if owner is not None else None)

    async def owner(self, task_group_id: str) -> Owner | None:
        try:
            with translate(f"reading group {task_group_id}"):
                row = await self._table.get_entity(task_group_id, OWNER)
        except EntityNotFound:
            return None
        return _owner(row, str(row.metadata["etag"]))

    async def record_owner(self, task_group_id: str, scheduler_id: str, expires: str,
                           verified: bool, members: bool) -> bool:
        """Record the group's schedulerId if it has none yet (a conditional insert), and
        whether a task other than its own has joined: whether this call recorded it."""
        try:
            with translate(f"recording the schedulerId of group {task_group_id}"):
                await self._rest.create_entity(self.name, {
                    "PartitionKey": task_group_id, "RowKey": OWNER,
                    "schedulerId": scheduler_id, "expires": expires, "verified": verified,
                    "members": members})
        except EntityExists:
            return False
        return True

    async def note_members(self, task_group_id: str) -> None:
        """Note in the group's record that a task other than its own joins it (before its
        member row is written): read there (``joined``) by a resolution of the own task
        that does not know it from the task."""
        try:
            with translate(f"noting a member of group {task_group_id}"):
                await self._table.update_entity({"PartitionKey": task_group_id, "RowKey": OWNER,
                                                 "members": True}, mode=UpdateMode.MERGE)
        except EntityNotFound:
            pass  # the record went (its group expired): without one, the rows are asked

    async def joined(self, task_group_id: str) -> bool | None:
        """Whether a task other than the group's own has joined it, as its record notes:
        one read of one row. None if the record does not say (none, or one of an earlier
        version)."""
        try:
            with translate(f"reading group {task_group_id}"):
                row = await self._rest.get_entity(self.name, task_group_id, OWNER)
        except EntityNotFound:
            return None
        return _owner(row, "").members

    async def settle_owner(self, task_group_id: str, owner: Owner, scheduler_id: str) -> bool:
        """Mark the record verified, naming ``scheduler_id``, if it is still ``owner``:
        whether it was."""
        try:
            with translate(f"recording the schedulerId of group {task_group_id}"):
                await self._table.update_entity(
                    {"PartitionKey": task_group_id, "RowKey": OWNER, "schedulerId": scheduler_id,
                     "verified": True},
                    mode=UpdateMode.MERGE, etag=owner.etag,
                    match_condition=MatchConditions.IfNotModified)
        except (ETagMismatch, EntityNotFound):
            return False
        return True

    async def renew_owner(self, task_group_id: str, expires: str) -> None:
        """Set the record's ``expires`` (if it is still there)."""
        try:
            with translate(f"renewing the record of group {task_group_id}"):
                await self._table.update_entity({"PartitionKey": task_group_id, "RowKey": OWNER,
                                                 "expires": expires}, mode=UpdateMode.MERGE)
        except EntityNotFound:
            pass

    async def drop_owner(self, task_group_id: str) -> None:
        try:
            with translate(f"deleting the record of group {task_group_id}"):
                await self._table.delete_entity(task_group_id, OWNER)
        except EntityNotFound:
            pass

    async def _expired(self, record: str, before: str, select: list[str]
                       ) -> list[TableEntity]:
        """The rows ``record`` of every group whose ``expires`` is before ``before`` (an ISO
        time in the API's form, which sorts as it compares): a scan of the whole table."""
        with translate("looking for expired group records"):
            return [r async for r in self._table.query_entities(
                "RowKey eq @record and expires lt @before",
                parameters={"record": record, "before": before}, select=select)]

    async def expired_records(self, before: str) -> list[str]:
        """The groups whose sealed record has an ``expires`` before ``before``."""
        return [str(r["PartitionKey"]) for r in await self._expired(META, before,
                                                                    ["PartitionKey"])]

    async def expired_owners(self, before: str) -> list[tuple[str, bool]]:
        """The groups whose schedulerId record has an ``expires`` before ``before``, each
        with whether the record notes a member."""
        return [(str(r["PartitionKey"]), r.get("members") is True)
                for r in await self._expired(OWNER, before, ["PartitionKey", "members"])]

    async def expired_announcements(self, before: str) -> list[tuple[str, str]]:
        """The groups whose ``~announced`` row records an ``expires`` before ``before``,
        each with the row's ETag."""
        return [(str(r["PartitionKey"]), str(r.metadata["etag"]))
                for r in await self._expired(ANNOUNCED, before, ["PartitionKey"])]

    async def drop_announcement(self, task_group_id: str, etag: str) -> None:
        """Delete the group's ``~announced`` row unless it changed since it was read (a
        newer announcement, of members that expire later)."""
        try:
            with translate(f"deleting the announcement of group {task_group_id}"):
                await self._table.delete_entity(task_group_id, ANNOUNCED, etag=etag,
                                                match_condition=MatchConditions.IfNotModified)
        except (EntityNotFound, ETagMismatch):
            pass

    async def drop_record(self, task_group_id: str) -> None:
        with translate(f"deleting the record of group {task_group_id}"):
            await self._table.delete_entity(task_group_id, META)

    async def seal(self, task_group_id: str, meta: GroupMeta) -> GroupMeta:
        """Write the record of the sealed group; if it was sealed already, the record as
        it was (a group is sealed once)."""
        try:
            with translate(f"sealing group {task_group_id}"):
                await self._rest.create_entity(self.name, {
                    "PartitionKey": task_group_id, "RowKey": META,
                    "schedulerId": meta.scheduler_id, "expires": meta.expires,
                    "sealed": meta.sealed, "size": meta.size})
        except EntityExists:
            earlier = await self.meta(task_group_id)
            assert earlier is not None
            return earlier
        return meta

    async def resolve(self, task_group_id: str, task_id: str, runs: int = 1) -> None:
        """Mark a member resolved, by the resolution of its ``runs``-th run: a task
        resolved again after a rerun has more runs, which makes its group's members a set
        not announced yet (``claim_announcement``)."""
        row: dict[str, Any] = {"PartitionKey": task_group_id, "RowKey": task_id,
                               "resolved": True}
        if runs > 1:
            row["runs"] = runs
        with translate(f"resolving task {task_id} in group {task_group_id}"):
            await self._table.upsert_entity(row, mode=UpdateMode.MERGE)

    async def unresolved(self, task_group_id: str) -> list[Unresolved]:
        """The rows a group check looks at: unresolved members, and members a rerun
        marked (``Unresolved``)."""
        with translate(f"reading group {task_group_id}"):
            rows = self._table.query_entities(
                "PartitionKey eq @pk and (resolved eq false or rerun ge 1)",
                parameters={"pk": task_group_id})
            return [Unresolved(str(r["RowKey"]), r.metadata["timestamp"] or datetime.now(UTC),
                               bool(r.get("resolved")),
                               int(r["rerun"]) if r.get("rerun") else None,
                               str(r.metadata["etag"]))
                    async for r in rows]

    async def rerun_over(self, task_group_id: str, row: Unresolved) -> None:
        """Take a rerun's mark off a member's row that is resolved with that rerun's run
        (unless the row changed since it was read: a new rerun's mark stays), so that
        group checks no longer look at it."""
        try:
            with translate(f"clearing the rerun of {row.task_id} in group {task_group_id}"):
                await self._table.update_entity(
                    {"PartitionKey": task_group_id, "RowKey": row.task_id, "rerun": 0},
                    mode=UpdateMode.MERGE, etag=row.etag,
                    match_condition=MatchConditions.IfNotModified)
        except (ETagMismatch, EntityNotFound):
            pass

    async def page(self, task_group_id: str, after: str | None,
                   limit: int) -> tuple[list[str], str | None]:
        """Up to ``limit`` member taskIds after ``after``; the taskId to continue after, if
        there may be more."""
        return await key_page(self._table, task_group_id, after, limit, f"listing group {task_group_id}", below=ANNOUNCED)

    async def drop(self, task_group_id: str, task_id: str) -> None:
        with translate(f"dropping task {task_id} from group {task_group_id}"):
            await self._table.delete_entity(task_group_id, task_id)

    async def is_empty(self, task_group_id: str) -> bool:
        """Whether the group has no member rows (its own task has none while it is
        unresolved, or, with a group of one, ever): one request, asked at every
        resolution of a group's own task."""
        with translate(f"reading group {task_group_id}"):
            first = await self._rest.query_first(
                self.name, f"PartitionKey eq {odata_string(task_group_id)} and "
                           f"RowKey lt {odata_string(RECORD)}", ["RowKey"], 1)
        return not first

    async def claim_announcement(self, task_group_id: str,
                                 by_task_id: str) -> tuple[bool, str | None]:
        """Whether the resolution of ``by_task_id`` is to announce the group resolved: true
        for the first to claim the current set of members, and again for that same task
        (its announcement may not have gone out, or the answer to its claim was lost),
        false for everyone else; with the latest ``expires`` of the member rows that
        carry one (None if none does)."""
        with translate(f"reading group {task_group_id}"):
            rows = [r async for r in self._table.query_entities(
                "PartitionKey eq @pk", parameters={"pk": task_group_id},
                select=["RowKey", "members", "by", "expires", "runs"])]
        member_rows = [r for r in rows if not str(r["RowKey"]).startswith(RECORD)]
        # A member resolved after more than one run is named with its runs: resolved
        # again after a rerun, the same tasks are a set to announce again.
        members = sorted(f"{r['RowKey']} {r['runs']}" if r.get("runs") else str(r["RowKey"])
                         for r in member_rows)
        current = next((r for r in rows if r["RowKey"] == ANNOUNCED), None)
        digest = hashlib.sha256("\n".join(members).encode()).hexdigest()
        marker = {"PartitionKey": task_group_id, "RowKey": ANNOUNCED, "members": digest,
                  "by": by_task_id}
        # Rows of earlier versions carry no expires; then neither does the marker.
        expires = [str(r["expires"]) for r in member_rows if r.get("expires")]
        latest = timeutil.fmt(max(map(timeutil.parse, expires))) if expires else None
        if latest is not None and len(expires) == len(member_rows):
            marker["expires"] = latest
        try:
            with translate(f"announcing group {task_group_id}"):
                if current is None:
                    await self._table.create_entity(marker)
                elif current.get("members") == digest:
                    return bool(current.get("by") == by_task_id), latest
                else:
                    await self._table.update_entity(
                        marker, mode=UpdateMode.REPLACE, etag=current.metadata["etag"],
                        match_condition=MatchConditions.IfNotModified)
        except (EntityExists, ETagMismatch, EntityNotFound):
            # Another resolution announced this set just now, or ours did, in an attempt
            # whose answer was lost (the write sent again found its own marker): the
            # marker says which.
            return await self._announced_by(task_group_id, digest, by_task_id), latest
        return True, latest

    async def _announced_by(self, task_group_id: str, digest: str, by_task_id: str) -> bool:
        """Whether the group's ``~announced`` row names the set ``digest`` as announced by
        the resolution of ``by_task_id``."""
        try:
            with translate(f"reading group {task_group_id}"):
                row = await self._rest.get_entity(self.name, task_group_id, ANNOUNCED)
        except EntityNotFound:
            return False
        return row.get("members") == digest and row.get("by") == by_task_id
