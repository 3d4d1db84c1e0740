"""Tasks in Azure Tables: one entity per task, written only through ``modify``.

Entity: PartitionKey = taskId, RowKey = ``task``. The normalized definition and the
runs are JSON, split into properties of at most ``CHUNK`` characters (Azure's limit on
one string property is 32K characters, on an entity 1 MiB). ``state``, ``taskQueueId``,
``deadline`` and ``retriesLeft`` are plain properties so they can be read and queried.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from azure.core import MatchConditions
from azure.data.tables import EntityProperty, EdmType, UpdateMode

from azqueue.errors import NotFound, StorageError
from azqueue.model.task import Run, Task
from azqueue.storage.account import StorageAccount
from azqueue.storage.errors import EntityExists, EntityNotFound, ETagMismatch, translate

CHUNK = 30_000
MAX_DEFINITION_CHARS = 400_000
MAX_MODIFY_ATTEMPTS = 50
ROW = "task"


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
        "retriesLeft": EntityProperty(task.retries_left, EdmType.INT32),
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
    )


class TaskStore:
    def __init__(self, account: StorageAccount) -> None:
        self.name = account.table_name("tasks")
        self._service = account.tables
        self._table = account.tables.get_table_client(self.name)

    async def ensure(self) -> None:
        with translate(f"creating table {self.name}"):
            await self._service.create_table_if_not_exists(self.name)

    async def insert(self, task: Task) -> bool:
        """Store a new task; False if a task with this taskId already exists."""
        try:
            with translate(f"inserting task {task.task_id}"):
                await self._table.create_entity(to_entity(task))
        except EntityExists:
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

    async def get(self, task_id: str) -> Task:
        task, _ = await self.load(task_id)
        return task

    async def modify(self, task_id: str, fn: Callable[[Task], Task],
                     loaded: tuple[Task, str] | None = None) -> tuple[Task, Task]:
        """Apply the pure ``fn`` to the stored task and write its result conditionally.

        Loads with the ETag, writes ``IfNotModified``, and on a lost race (412) loads again
        and lets ``fn`` decide again. Errors ``fn`` raises propagate and nothing is written.
        Returns the task ``fn`` saw and the task as now stored (the same object when ``fn``
        changed nothing, in which case nothing was written). ``loaded``, from ``load``,
        saves the first read.
        """
        for _ in range(MAX_MODIFY_ATTEMPTS):
            before, etag = loaded or await self.load(task_id)
            loaded = None
            after = fn(before)
            if after is before:
                return before, after
            try:
                with translate(f"updating task {task_id}"):
                    await self._table.update_entity(
                        to_entity(after), mode=UpdateMode.REPLACE, etag=etag,
                        match_condition=MatchConditions.IfNotModified)
            except ETagMismatch:
                continue
            return before, after
        raise StorageError(f"task {task_id} changed {MAX_MODIFY_ATTEMPTS} times while being "
                           "updated; try again")
