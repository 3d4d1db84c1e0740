"""Tasks in Azure Tables: one entity per task, written only through ``modify``.

Entity: PartitionKey = taskId, RowKey = ``task``. The normalized definition and the
runs are JSON, split into properties of at most ``CHUNK`` characters (Azure's limit on
one string property is 32K characters, on an entity 1 MiB). ``state``, ``taskQueueId``,
``deadline`` and ``retriesLeft`` are plain properties so they can be read and queried;
``hasDependents`` is set (merged in) by the first task defined depending on this one.

Other rows in a task's partition: ``tip:<messageId>`` (messages put carrying its tips),
``wait:<tag>:<taskId>`` (dependencies it still waits for), ``outbox:…`` (unpublished events),
``artifact:…``.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.data.tables import EntityProperty, EdmType, UpdateMode

from azqueue.errors import NotFound, StorageError
from azqueue.model.events import Event
from azqueue.model.task import Run, Task
from azqueue.storage.account import StorageAccount
from azqueue.storage.rows import delete_rows
from azqueue.storage.errors import (
    EntityExists,
    EntityNotFound,
    ETagMismatch,
    TransactionConflict,
    translate,
)

CHUNK = 30_000
OUTBOX = "outbox:"  # Azure refuses "/" in keys; ";" follows ":"
_sequence = itertools.count()

EventsFor = Callable[[Task | None, Task], list[Event]]
BeforeWrite = Callable[[Task, Task], Awaitable[None]]
MAX_DEFINITION_CHARS = 400_000
MAX_MODIFY_ATTEMPTS = 50
ROW = "task"
# Rows "tip:<messageId>": the Azure messages that were put carrying this task's tips.
TIP = "tip:"
# Rows "wait:<tag>:<taskId>": a dependency this task still waits for, as written by a
# createTask of the definition that ``tag`` names.
WAIT = "wait:"


def _put_chunks(entity: dict[str, Any], name: str, text: str) -> None:
    parts = [text[i:i + CHUNK] for i in range(0, len(text), CHUNK)] or [""]
    entity[f"{name}Chunks"] = len(parts)
    for i, part in enumerate(parts):
        entity[f"{name}{i}"] = part


def _get_chunks(entity: Mapping[str, Any], name: str) -> str:
    return "".join(entity[f"{name}{i}"] for i in range(int(entity[f"{name}Chunks"])))


def definition_size(definition: Mapping[str, Any]) -> int:
    return len(json.dumps(definition, separators=(",", ":")))


def to_entity(task: Task) -> dict[str, Any]:
    entity: dict[str, Any] = {
        "PartitionKey": task.task_id,
        "RowKey": ROW,
        "state": str(task.state),
        "taskQueueId": task.task_queue_id,
        "deadline": task.deadline,
        "expires": task.expires,
        "retriesLeft": EntityProperty(task.retries_left, EdmType.INT32),
        "hasDependents": task.has_dependents,
    }
    _put_chunks(entity, "definition", json.dumps(task.definition, separators=(",", ":")))
    _put_chunks(entity, "runs", json.dumps([r.to_json() for r in task.runs], separators=(",", ":")))
    return entity


def from_entity(entity: Mapping[str, Any]) -> Task:
    return Task(
        task_id=str(entity["PartitionKey"]),
        definition=json.loads(_get_chunks(entity, "definition")),
        runs=tuple(Run.from_json(r) for r in json.loads(_get_chunks(entity, "runs"))),
        retries_left=int(entity["retriesLeft"]),
        has_dependents=bool(entity.get("hasDependents", False)),
    )


def outbox_row(task_id: str, event: Event) -> dict[str, Any]:
    """An outbox entity in the task's partition; RowKeys sort in the order of writing
    within this process (nanoseconds, then a counter)."""
    entity: dict[str, Any] = {"PartitionKey": task_id,
                              "RowKey": f"{OUTBOX}{time.time_ns():020d}-{next(_sequence):09d}"}
    _put_chunks(entity, "event", json.dumps(event.to_json(), separators=(",", ":")))
    return entity


def event_from_row(entity: Mapping[str, Any]) -> Event:
    return Event.from_json(json.loads(_get_chunks(entity, "event")))


class TaskStore:
    def __init__(self, account: StorageAccount) -> None:
        self.name = account.table_name("tasks")
        self._service = account.tables
        self._table = account.tables.get_table_client(self.name)

    async def ensure(self) -> None:
        with translate(f"creating table {self.name}"):
            await self._service.create_table_if_not_exists(self.name)

    async def insert(self, task: Task, events: EventsFor | None = None) -> bool:
        """Store a new task (and the outbox rows of its events, atomically); False if a
        task with this taskId already exists."""
        outbox = [outbox_row(task.task_id, e) for e in events(None, task)] if events else []
        try:
            with translate(f"inserting task {task.task_id}"):
                if outbox:
                    await self._table.submit_transaction(
                        [("create", to_entity(task)), *(("create", row) for row in outbox)])
                else:
                    await self._table.create_entity(to_entity(task))
        except (EntityExists, TransactionConflict):
            return False
        return True

    async def load(self, task_id: str) -> tuple[Task, str]:
        """The task and the ETag it was read at (for ``modify(..., loaded=...)``)."""
        try:
            with translate(f"reading task {task_id}"):
                entity = await self._table.get_entity(task_id, ROW)
        except EntityNotFound:
            raise NotFound(f"task {task_id} does not exist (or has expired)") from None
        return from_entity(entity), str(entity.metadata["etag"])

    async def load_with_tip(self, task_id: str, message_id: str) -> tuple[Task, str, bool]:
        """``load``, and whether ``message_id`` is recorded as one of the task's tips (in
        the same request)."""
        tip_key = TIP + message_id
        with translate(f"reading task {task_id}"):
            rows = [row async for row in self._table.query_entities(
                "PartitionKey eq @pk and ( RowKey eq @task or RowKey eq @tip )",
                parameters={"pk": task_id, "task": ROW, "tip": tip_key})]
        entity = next((r for r in rows if r["RowKey"] == ROW), None)
        if entity is None:
            raise NotFound(f"task {task_id} does not exist (or has expired)")
        known = any(r["RowKey"] == tip_key for r in rows)
        return from_entity(entity), str(entity.metadata["etag"]), known

    async def expired(self, now: datetime) -> list[Task]:
        """Tasks whose ``expires`` is before ``now`` (a scan of the whole table)."""
        with translate("looking for expired tasks"):
            return [from_entity(e) async for e in self._table.query_entities(
                "RowKey eq @task and expires lt @now", parameters={"task": ROW, "now": now})]

    async def delete_partition(self, task_id: str) -> bool:
        """Delete every row of the task's partition, the task itself last; False (and
        nothing deleted) while it holds unpublished events."""
        with translate(f"listing the rows of task {task_id}"):
            keys = [str(e["RowKey"]) async for e in self._table.query_entities(
                "PartitionKey eq @pk", parameters={"pk": task_id}, select=["RowKey"])]
        if any(k.startswith(OUTBOX) for k in keys):
            return False
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
            with translate(f"marking task {task_id} as a dependency"):
                await self._table.update_entity({"PartitionKey": task_id, "RowKey": ROW,
                                                 "hasDependents": True}, mode=UpdateMode.MERGE)
        except EntityNotFound:
            raise NotFound(f"task {task_id} does not exist (or has expired)") from None

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
                              ) -> tuple[Task, str, frozenset[tuple[str, str]]] | None:
        """The task, its ETag and the (tag, taskId) of the dependencies it still waits
        for, in one request; None if there is no such task."""
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
        return from_entity(entity), str(entity.metadata["etag"]), waits

    async def record_tip(self, task_id: str, message_id: str) -> None:
        """Remember that the message ``message_id`` was put carrying a tip of this task."""
        try:
            with translate(f"recording a tip of task {task_id}"):
                await self._table.create_entity({"PartitionKey": task_id,
                                                 "RowKey": TIP + message_id})
        except EntityExists:
            pass

    async def outbox(self, task_id: str) -> list[tuple[str, Event]]:
        """The task's unpublished events, oldest first, with their RowKeys."""
        with translate(f"reading the outbox of task {task_id}"):
            rows = self._table.query_entities(
                "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
                parameters={"pk": task_id, "low": OUTBOX, "high": OUTBOX[:-1] + ";"})
            return [(str(row["RowKey"]), event_from_row(row)) async for row in rows]

    async def delete_outbox(self, task_id: str, row_keys: list[str]) -> None:
        """Delete outbox rows; rows another process deleted already are no error."""
        await delete_rows(self._table, task_id, row_keys, f"clearing the outbox of task {task_id}")

    async def get(self, task_id: str) -> Task:
        task, _ = await self.load(task_id)
        return task

    async def modify(self, task_id: str, fn: Callable[[Task], Task],
                     loaded: tuple[Task, str] | None = None,
                     events: EventsFor | None = None,
                     before_write: BeforeWrite | None = None) -> tuple[Task, Task]:
        """Apply the pure ``fn`` to the stored task and write its result conditionally.

        Loads with the ETag, writes ``IfNotModified``, and on a lost race (412) loads again
        and lets ``fn`` decide again. Errors ``fn`` raises propagate and nothing is written.
        Returns the task ``fn`` saw and the task as now stored (the same object when ``fn``
        changed nothing, in which case nothing was written). ``loaded``, from ``load``,
        saves the first read. ``events`` gives the messages the change publishes: they are
        written as outbox rows in the same transaction. ``before_write(before, after)`` is
        awaited before each attempt to write.
        """
        for _ in range(MAX_MODIFY_ATTEMPTS):
            before, etag = loaded or await self.load(task_id)
            loaded = None
            after = fn(before)
            if after is before:
                return before, after
            outbox = [outbox_row(task_id, e) for e in events(before, after)] if events else []
            if before_write is not None:
                await before_write(before, after)
            try:
                with translate(f"updating task {task_id}"):
                    if outbox:
                        await self._table.submit_transaction([
                            ("update", to_entity(after),
                             {"mode": UpdateMode.REPLACE, "etag": etag,
                              "match_condition": MatchConditions.IfNotModified}),
                            *(("create", row) for row in outbox)])
                    else:
                        await self._table.update_entity(
                            to_entity(after), mode=UpdateMode.REPLACE, etag=etag,
                            match_condition=MatchConditions.IfNotModified)
            except (ETagMismatch, TransactionConflict):
                continue
            return before, after
        raise StorageError(f"task {task_id} changed {MAX_MODIFY_ATTEMPTS} times while being "
                           "updated; try again")
