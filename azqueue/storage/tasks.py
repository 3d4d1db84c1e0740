"""Tasks in Azure Tables, written only through ``modify``: the tasks table's reads and
conditional writes. What its rows hold is ``azqueue.storage.taskrows``.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from azure.data.tables import UpdateMode

from azqueue.errors import NotFound, StorageError
from azqueue.model.events import Event
from azqueue.model.task import Task
from azqueue.storage.account import StorageAccount
from azqueue.storage.errors import (
    EntityExists,
    EntityNotFound,
    ETagMismatch,
    GroupJoined,
    TransactionConflict,
    translate,
)
from azqueue.storage.rows import delete_rows
from azqueue.storage.tables import TableStore
from azqueue.storage.taskrows import (LIVE_TIP, MEMBERS, OUTBOX, ROW, TIP, WAIT, HeldMessage,
                                      LiveTip, MessageRecords, Stored, event_from_row, from_entity, outbox_row,
                                      stored_from_entity, tip_property, to_entity)

EventsFor = Callable[[Task | None, Task], list[Event]]
BeforeWrite = Callable[[Task, Task], Awaitable[None]]
MAX_MODIFY_ATTEMPTS = 50


@dataclass(frozen=True, slots=True)
class Change:
    """What ``modify`` did: the task ``fn`` saw, the task as now stored (the same object
    when nothing was written), the message held before the change (what a resolution
    must now delete or release), and the stored record to decide the next change on."""

    before: Task
    after: Task
    held_before: HeldMessage | None
    stored: Stored
    events: tuple[Event, ...] = ()  # what it wrote to the outbox

    @property
    def changed(self) -> bool:
        return self.after is not self.before


# What a change keeps of the task's records of its messages, given the task as stored
# and as changed (``modify``): decided by the owner of tips, not here.
RecordsAfter = Callable[[Stored, Task], MessageRecords]


class TaskStore(TableStore):
    """The tasks table: task entities and the rows of their partitions."""

    def __init__(self, account: StorageAccount) -> None:
        super().__init__(account, "tasks")

    async def insert(self, task: Task, events: Sequence[Event] = (),
                     tips: tuple[str, ...] = (), live_tip: LiveTip | None = None
                     ) -> Stored | None:
        """Store a new task with the records of the tip messages already put for it (and
        ``events`` as outbox rows, in one transaction); None if a task with this taskId
        already exists (then nothing was written), unless that task is this very insert,
        applied by an attempt whose answer was lost.

        A task that says no other task has joined the group named after it
        (``group_members`` false) creates its ``members`` row in the same transaction: if
        a task joined while this one was not stored yet, that row is there already, and
        ``GroupJoined`` is raised (nothing written): the caller checks the group's records,
        then inserts the task saying it has members."""
        rows = [outbox_row(task.task_id, e) for e in events]
        guarded = task.group_members is False
        if guarded:
            rows.append({"PartitionKey": task.task_id, "RowKey": MEMBERS})
        write_id = secrets.token_hex(8)
        entity = to_entity(task, None, frozenset(tips), write_id, live_tip)
        try:
            with translate(f"inserting task {task.task_id}"):
                if rows:
                    etag = await self._rest.transaction(
                        self.name, [("create", entity, ""), *(("create", row, "")
                                                                for row in rows)])
                else:
                    etag = (await self._rest.create_entity(self.name, entity))["etag"]
        except (EntityExists, TransactionConflict):
            # Perhaps our own insert, sent again after its answer was lost (the write
            # names itself, as in ``modify``): then it is stored as we wrote it.
            try:
                existing = await self.load(task.task_id)
            except NotFound:
                if guarded:  # no task: the conflict was the members row
                    raise GroupJoined(f"a task joined group {task.task_id} before it was "
                                      "stored") from None
                return None
            return existing if existing.write_id == write_id else None
        return Stored(task, str(etag), None, frozenset(tips), write_id, live_tip=live_tip)

    async def load(self, task_id: str, tip: str | None = None) -> Stored:
        """The task as stored; with ``tip``, a messageId not recorded on the task, also
        looks for a record of it as an earlier version wrote them (``tip in stored.tips``)."""
        try:
            with translate(f"reading task {task_id}"):
                entity = await self._rest.get_entity(self.name, task_id, ROW)
        except EntityNotFound:
            raise NotFound(f"task {task_id} does not exist (or has expired)") from None
        stored = stored_from_entity(entity)
        if tip is None or tip in stored.tips:
            return stored
        try:
            with translate(f"reading task {task_id}"):
                await self._rest.get_entity(self.name, task_id, TIP + tip)
        except EntityNotFound:
            return stored
        return replace(stored, tips=stored.tips | {tip})

    async def expired(self, now: datetime) -> list[Task]:
        """Tasks whose ``expires`` is before ``now`` (a scan of the whole table)."""
        with translate("looking for expired tasks"):
            return [from_entity(e) async for e in self._table.query_entities(
                "RowKey eq @task and expires lt @now", parameters={"task": ROW, "now": now})]

    async def delete_partition(self, task_id: str) -> bool:
        """Delete every row of the task's partition (its outbox rows too: an event not
        published by the time its task expires is not any more), the task itself last."""
        with translate(f"listing the rows of task {task_id}"):
            keys = [str(e["RowKey"]) async for e in self._table.query_entities(
                "PartitionKey eq @pk", parameters={"pk": task_id}, select=["RowKey"])]
        await delete_rows(self._table, task_id, [k for k in keys if k != ROW],
                          f"deleting the rows of task {task_id}")
        with translate(f"deleting task {task_id}"):
            await self._table.delete_entity(task_id, ROW)
        return True

    async def find(self, task_id: str) -> Task | None:
        """The task, or None if there is none."""
        try:
            return await self.get(task_id)
        except NotFound:
            return None

    async def mark_has_dependents(self, task_id: str) -> None:
        """Note on the task that another task depends on it (a merge: it moves the ETag,
        so a concurrent ``modify`` of the task decides again and sees it)."""
        try:
            await self._merge_flag(task_id, "hasDependents", f"marking task {task_id} as a "
                                   "dependency")
        except EntityNotFound:
            raise NotFound(f"task {task_id} does not exist (or has expired)") from None

    async def _merge_flag(self, task_id: str, name: str, what: str) -> None:
        """Merge property ``name`` = true into the task entity (EntityNotFound if there is
        none): it moves the ETag, so a concurrent ``modify`` decides again and sees it."""
        with translate(what):
            await self._table.update_entity({"PartitionKey": task_id, "RowKey": ROW, name: True},
                                            mode=UpdateMode.MERGE)

    async def note_group_member(self, task_group_id: str) -> bool:
        """Note on the task the group is named after that another task joins the group
        (before that task's member row is written). If that task is not stored (yet), its
        partition's ``members`` row says it, for an insert under way to find. Whether the
        task was there (noted on it) rather than not yet (the row written)."""
        for _ in range(2):
            try:
                await self._merge_flag(task_group_id, "groupMembers",
                                       f"noting a member of task group {task_group_id}")
                return True
            except EntityNotFound:
                pass
            try:
                with translate(f"noting a member of task group {task_group_id}"):
                    await self._rest.create_entity(
                        self.name, {"PartitionKey": task_group_id, "RowKey": MEMBERS})
                return False
            except EntityExists:
                continue  # perhaps that task's insert, which writes it too: merge again
        return True

    async def drop_group_note(self, task_group_id: str) -> None:
        """Delete the ``members`` row of a group whose own task was never stored (or is
        gone): its group's records went."""
        with contextlib.suppress(EntityNotFound), \
                translate(f"deleting the member note of task group {task_group_id}"):
            await self._table.delete_entity(task_group_id, MEMBERS)

    async def add_waits(self, task_id: str, tag: str, required: list[str]) -> None:
        """Rows saying that ``task_id`` (as defined by ``tag``) waits for each of
        ``required`` (idempotent)."""
        for i in range(0, len(required), 100):
            with translate(f"recording the dependencies of task {task_id}"):
                await self._table.submit_transaction(
                    [("upsert", {"PartitionKey": task_id, "RowKey": f"{WAIT}{tag}:{r}"})
                     for r in required[i:i + 100]])

    async def remove_wait(self, task_id: str, tag: str, required: str) -> None:
        with translate(f"clearing a dependency of task {task_id}"):
            await self._table.delete_entity(task_id, f"{WAIT}{tag}:{required}")

    async def load_with_waits(self, task_id: str
                              ) -> tuple[Stored, frozenset[tuple[str, str]]] | None:
        """The task and the (tag, taskId) of the dependencies it still waits for, in one
        request; None if there is no such task."""
        with translate(f"reading task {task_id}"):
            rows = [row async for row in self._table.query_entities(
                "PartitionKey eq @pk and ( RowKey eq @task or "
                "( RowKey ge @low and RowKey lt @high ) )",
                parameters={"pk": task_id, "task": ROW, "low": WAIT, "high": WAIT[:-1] + ";"})]
        entity = next((r for r in rows if r["RowKey"] == ROW), None)
        if entity is None:
            return None
        waits = frozenset((tag, required) for tag, _, required in (
            str(r["RowKey"])[len(WAIT):].partition(":") for r in rows if r["RowKey"] != ROW))
        return stored_from_entity(entity), waits

    async def record_tip(self, task_id: str, message_id: str,
                         live_tip: LiveTip | None = None) -> None:
        """Remember that the message ``message_id`` was put carrying a tip of this task (a
        merge: it moves the ETag, so a concurrent ``modify`` keeps the record), and, with
        ``live_tip``, that it is the pending run's tip to look at (``LiveTip``)."""
        try:
            await self._merge_tip(task_id, message_id, live_tip, "*")
        except EntityNotFound:
            raise NotFound(f"task {task_id} does not exist (or has expired)") from None

    async def record_tip_at(self, stored: Stored, message_id: str, live_tip: LiveTip | None
                            ) -> Stored | None:
        """``record_tip`` (with ``live_tip``, if any), if the task is still as ``stored``:
        the task as it is now stored (with its new ETag), or None if it changed or is gone
        (nothing written then)."""
        try:
            etag = await self._merge_tip(stored.task.task_id, message_id, live_tip, stored.etag)
        except (ETagMismatch, EntityNotFound):
            return None
        return replace(stored, etag=etag, tips=stored.tips | {message_id},
                       live_tip=live_tip or stored.live_tip)

    async def _merge_tip(self, task_id: str, message_id: str, live_tip: LiveTip | None,
                         etag: str) -> str:
        """Merge the record of a tip (and ``live_tip``) into the task at ``etag``; the new
        ETag."""
        live = {LIVE_TIP: live_tip.to_json()} if live_tip is not None else {}
        with translate(f"recording a tip of task {task_id}"):
            answer = await self._rest.update_entity(
                self.name, {"PartitionKey": task_id, "RowKey": ROW,
                            tip_property(message_id): message_id, **live}, etag, merge=True)
        return str(answer["etag"])

    async def renew_live_tip(self, task_id: str, live_tip: LiveTip) -> None:
        """The live tip's new pop receipt, after a look at it changed it (a merge)."""
        try:
            with translate(f"recording the tip of task {task_id}"):
                await self._rest.update_entity(
                    self.name, {"PartitionKey": task_id, "RowKey": ROW,
                                LIVE_TIP: live_tip.to_json()}, "*", merge=True)
        except EntityNotFound:
            pass

    async def note_tip_repair(self, stored: Stored, run_id: int, now: datetime) -> bool:
        """Note on the task, if it is still as ``stored``, that a tip for ``run_id`` is
        being queued to repair a lost one: False if the task changed (another repair, or
        a claim, got there first), so of racing repairs one wins."""
        try:
            with translate(f"noting a tip repair of task {stored.task.task_id}"):
                await self._rest.update_entity(
                    self.name, {"PartitionKey": stored.task.task_id, "RowKey": ROW,
                                "tipRepair": f"{run_id} {int(now.timestamp())}"},
                    stored.etag, merge=True)
        except (ETagMismatch, EntityNotFound):
            return False
        return True

    async def outbox(self, task_id: str, after: str = OUTBOX) -> list[tuple[str, Event]]:
        """The task's outbox rows from RowKey ``after`` on, oldest first, with their
        RowKeys (published or not: published rows stay until the task expires)."""
        with translate(f"reading the outbox of task {task_id}"):
            rows = self._table.query_entities(
                "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
                parameters={"pk": task_id, "low": max(after, OUTBOX), "high": OUTBOX[:-1] + ";"})
            return [(str(row["RowKey"]), event_from_row(row)) async for row in rows]

    async def outbox_of(self, writer: str, after: str) -> list[tuple[str, str, Event]]:
        """The outbox rows that the process ``writer`` wrote, from RowKey ``after`` on, in
        every partition: (partition, RowKey, event). A scan of the table (for recovering
        what a process that died left, which is rare)."""
        with translate(f"reading the outbox rows of {writer}"):
            rows = self._table.query_entities(
                "RowKey ge @low and RowKey lt @high",
                parameters={"low": max(after, OUTBOX), "high": OUTBOX[:-1] + ";"})
            return [(str(row["PartitionKey"]), str(row["RowKey"]), event_from_row(row))
                    async for row in rows if str(row["RowKey"]).endswith(f"-{writer}")]

    async def add_outbox(self, partition: str, events: list[Event]) -> None:
        """Outbox rows for events that are no task's change (a task group's), in the
        partition named after what they concern; the outbox publishes them as a task's."""
        if not events:
            return  # nothing to write: no request
        with translate(f"writing the outbox of {partition}"):
            await self._table.submit_transaction(
                [("create", outbox_row(partition, e)) for e in events])

    async def delete_outbox(self, task_id: str, row_keys: list[str]) -> None:
        """Delete outbox rows; rows another process deleted already are no error."""
        await delete_rows(self._table, task_id, row_keys, f"clearing the outbox of task {task_id}")

    async def get(self, task_id: str) -> Task:
        return (await self.load(task_id)).task

    async def modify(self, task_id: str, fn: Callable[[Task], Task],
                     loaded: Stored | None = None,
                     events: EventsFor | None = None,
                     before_write: BeforeWrite | None = None,
                     speculative: bool = False, *,
                     records: RecordsAfter) -> Change:
        """Apply the pure ``fn`` to the stored task and write its result conditionally.

        Loads with the ETag, writes ``IfNotModified``, and on a lost race (412) loads again
        and lets ``fn`` decide again. Errors ``fn`` raises propagate and nothing is written;
        when ``fn`` changes nothing, nothing is written either. ``loaded`` saves the first
        read; with ``speculative`` it may be out of date (a cached copy), so only a write
        that succeeds is trusted: an error or a no-change decision is made again on a fresh
        read. ``events`` gives the messages the change publishes, written as outbox rows in
        the same transaction. ``before_write(before, after)`` is awaited before each
        attempt to write. ``records(stored, after)`` says what the written entity records
        of the task's messages (the held message, the tips, the live tip) each attempt.
        """
        # An attempt refused with 412 may have been our own write, stored by an earlier
        # attempt of the same request whose answer was lost: each write names itself.
        lost: tuple[Task, HeldMessage | None, str, tuple[Event, ...]] | None = None
        for _ in range(MAX_MODIFY_ATTEMPTS):
            stored = loaded or await self.load(task_id)
            guess, loaded = speculative and loaded is not None, None
            before = stored.task
            if lost is not None and stored.write_id == lost[2]:
                # It was: report it as the change it was (before ``fn`` decides again: a
                # transition may refuse to be applied twice).
                return Change(lost[0], before, lost[1], stored, lost[3])
            try:
                after = fn(before)
            except Exception:
                if guess:
                    continue
                raise
            if after is before:
                if guess:
                    continue
                return Change(before, after, stored.held, stored)
            kept = records(stored, after)
            held, tips, live = kept.held, kept.tips, kept.live_tip
            written = tuple(events(before, after)) if events else ()
            outbox = [outbox_row(task_id, e) for e in written]
            write_id = secrets.token_hex(8)
            entity = to_entity(after, held, tips, write_id, live)
            if before_write is not None:
                await before_write(before, after)
            try:
                with translate(f"updating task {task_id}"):
                    if outbox:
                        etag = await self._rest.transaction(
                            self.name, [("replace", entity, stored.etag),
                                        *(("create", row, "") for row in outbox)])
                    else:
                        etag = (await self._rest.update_entity(
                            self.name, entity, stored.etag))["etag"]
            except (ETagMismatch, TransactionConflict):
                lost = (before, stored.held, write_id, written)
                continue
            return Change(before, after, stored.held,
                          Stored(after, str(etag), held, tips, write_id, live_tip=live),
                          written)
        raise StorageError(f"task {task_id} changed {MAX_MODIFY_ATTEMPTS} times while being "
                           "updated; try again")
