"""Workers seen by claimWork, in Azure Tables (for worker listings).

PartitionKey = taskQueueId, RowKey = ``<workerGroup>/<workerId>`` (both key-encoded:
Azure refuses ``/ \\ # ?`` in keys). ``firstClaim`` is when the worker first got a task,
``lastDateActive`` when it last called, ``recentTasks`` its last 20 claims.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from azure.data.tables import UpdateMode

from azqueue.storage.account import StorageAccount
from azqueue.storage.tables import TableStore
from azqueue.storage.errors import EntityNotFound, translate
from azqueue.storage.keys import encode as key

RECENT_TASKS = 20


class WorkerStore(TableStore):
    """The workers table."""

    def __init__(self, account: StorageAccount) -> None:
        super().__init__(account, "workers")

    async def seen(self, task_queue_id: str, worker_group: str, worker_id: str, now: datetime,
                   claimed: list[tuple[str, int]]) -> None:
        pk, rk = key(task_queue_id), key(f"{worker_group}/{worker_id}")
        entity: dict[str, Any] = {"PartitionKey": pk, "RowKey": rk, "lastDateActive": now,
                                  "taskQueueId": task_queue_id, "workerGroup": worker_group,
                                  "workerId": worker_id}
        if claimed:
            old: Mapping[str, Any]
            try:
                with translate(f"reading worker {worker_group}/{worker_id}"):
                    old = await self._table.get_entity(pk, rk)
            except EntityNotFound:
                old = {}
            recent = json.loads(old.get("recentTasks", "[]"))
            recent += [{"taskId": t, "runId": r} for t, r in claimed]
            entity["recentTasks"] = json.dumps(recent[-RECENT_TASKS:])
            entity["firstClaim"] = old.get("firstClaim", now)
        with translate(f"recording worker {worker_group}/{worker_id}"):
            await self._table.upsert_entity(entity, mode=UpdateMode.MERGE)

    async def get(self, task_queue_id: str, worker_group: str, worker_id: str) -> dict[str, Any] | None:
        try:
            with translate(f"reading worker {worker_group}/{worker_id}"):
                entity = await self._table.get_entity(key(task_queue_id),
                                                      key(f"{worker_group}/{worker_id}"))
        except EntityNotFound:
            return None
        return dict(entity)
