"""Claim records in Azure Tables: one row per running run.

PartitionKey = taskId, RowKey = runId. A row says until when the run is claimed and,
when the claim came with a tip, which message (queue, messageId, current pop receipt)
now carries ``runId + 1`` invisibly until then. Rows exist only while a run is (or
was, until cleanup) running, so the claim resolver's query for expired rows reads
no more than the running runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from azure.data.tables import UpdateMode

from azqueue.storage.account import StorageAccount
from azqueue.storage.errors import EntityNotFound, translate
from azqueue.storage.rows import delete_rows


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    task_id: str
    run_id: int
    taken_until: datetime
    queue_name: str = ""
    message_id: str = ""
    pop_receipt: str = ""

    @property
    def has_message(self) -> bool:
        return bool(self.queue_name and self.message_id and self.pop_receipt)

    def to_entity(self) -> dict[str, Any]:
        return {
            "PartitionKey": self.task_id,
            "RowKey": str(self.run_id),
            "takenUntil": self.taken_until,
            "queueName": self.queue_name,
            "messageId": self.message_id,
            "popReceipt": self.pop_receipt,
        }

    @classmethod
    def from_entity(cls, e: Any) -> ClaimRecord:
        return cls(task_id=e["PartitionKey"], run_id=int(e["RowKey"]),
                   taken_until=e["takenUntil"], queue_name=e.get("queueName", ""),
                   message_id=e.get("messageId", ""), pop_receipt=e.get("popReceipt", ""))


class ClaimStore:
    def __init__(self, account: StorageAccount) -> None:
        self.name = account.table_name("claims")
        self._service = account.tables
        self._table = account.tables.get_table_client(self.name)

    async def ensure(self) -> None:
        with translate(f"creating table {self.name}"):
            await self._service.create_table_if_not_exists(self.name)

    async def put(self, record: ClaimRecord) -> None:
        with translate(f"storing the claim of {record.task_id}/{record.run_id}"):
            await self._table.upsert_entity(record.to_entity())

    async def extend(self, task_id: str, run_id: int, taken_until: datetime) -> None:
        """Set ``takenUntil`` alone, leaving the receipt a concurrent reclaim may have
        written; nothing if the row is gone."""
        try:
            with translate(f"extending the claim of {task_id}/{run_id}"):
                await self._table.update_entity(
                    {"PartitionKey": task_id, "RowKey": str(run_id), "takenUntil": taken_until},
                    mode=UpdateMode.MERGE)
        except EntityNotFound:
            pass

    async def get(self, task_id: str, run_id: int) -> ClaimRecord | None:
        try:
            with translate(f"reading the claim of {task_id}/{run_id}"):
                entity = await self._table.get_entity(task_id, str(run_id))
        except EntityNotFound:
            return None
        return ClaimRecord.from_entity(entity)

    async def delete(self, task_id: str, run_id: int) -> None:
        with translate(f"deleting the claim of {task_id}/{run_id}"):
            await self._table.delete_entity(task_id, str(run_id))

    async def delete_task(self, task_id: str) -> None:
        """Delete the rows of all of a task's runs."""
        with translate(f"listing the claims of task {task_id}"):
            runs = [str(e["RowKey"]) async for e in self._table.query_entities(
                "PartitionKey eq @pk", parameters={"pk": task_id}, select=["RowKey"])]
        await delete_rows(self._table, task_id, runs, f"deleting the claims of task {task_id}")

    async def expired(self, now: datetime) -> AsyncIterator[ClaimRecord]:
        with translate("listing expired claims"):
            pages = self._table.query_entities("takenUntil lt @now", parameters={"now": now},
                                               results_per_page=1000)
            async for entity in pages:
                yield ClaimRecord.from_entity(entity)
