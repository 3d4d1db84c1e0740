"""What a server keeps in Azure Storage, read from outside it: a test checks what the
server stored (a task's runs, the rows a task left, the messages of a task queue's
pending queues) through this rather than through the server's own components.

The inspector has its own storage account clients, built from the connection string and
the storage prefix the server was given (``StorageSettings``); it reads, never writes,
and its requests are not counted by the server. Table and queue names, and the task
rows' encoding, are the storage layer's own (``azqueue.storage``): one place knows them.

    inspector = StorageInspector(server_settings.storage)
    task = await inspector.task(task_id)          # azqueue.model.task.Task
    assert await inspector.pending_count("prov/wt") == 0
    await inspector.close()
"""

from __future__ import annotations

from typing import Any

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables.aio import TableClient
from azure.storage.queue.aio import QueueClient

from azqueue.config import StorageSettings
from azqueue.model.priority import ORDER, Priority
from azqueue.model.task import Task
from azqueue.storage.account import StorageAccount
from azqueue.storage.claims import ClaimRecord, ClaimStore
from azqueue.storage.queues import Peeked, PendingQueues, Queues
from azqueue.storage.taskrows import Stored
from azqueue.storage.tasks import TaskStore


class StorageInspector:
    """Reads the tables and queues of one server's storage prefix.

    :param storage: the server's storage settings (its connection string and prefix).

    Tables are named by their kind (``"tasks"``, ``"groups"``, ``"dependents"``,
    ``"claims"``, ``"claimnotes"``, ``"workers"``, ``"taskqueues"``): ``table_name``
    says the full name.
    """

    def __init__(self, storage: StorageSettings) -> None:
        self.prefix = storage.prefix
        self._account = StorageAccount(storage)
        self._tasks = TaskStore(self._account)
        self._claims = ClaimStore(self._account)
        self._queues = Queues(self._account)
        self._pending = PendingQueues(self._account, self._queues)

    async def close(self) -> None:
        await self._account.close()

    async def __aenter__(self) -> StorageInspector:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- tables ------------------------------------------------------------------------

    def table_name(self, kind: str) -> str:
        """The full name of the table of ``kind``, e.g. ``<prefix>tasks``."""
        return self._account.table_name(kind)

    def table(self, kind: str) -> TableClient:
        """The SDK's client of the table of ``kind``, for a query of one's own."""
        return self._account.tables.get_table_client(self.table_name(kind))

    async def rows(self, kind: str, partition: str) -> list[dict[str, Any]]:
        """Every entity of ``partition`` in the table of ``kind`` (none if the table does
        not exist), in RowKey order."""
        try:
            return [dict(e) async for e in self.table(kind).query_entities(
                "PartitionKey eq @pk", parameters={"pk": partition})]
        except ResourceNotFoundError:
            return []

    async def row_keys(self, kind: str, partition: str) -> list[str]:
        """The RowKeys of ``rows(kind, partition)``."""
        return [str(e["RowKey"]) for e in await self.rows(kind, partition)]

    async def stored(self, task_id: str) -> Stored:
        """The task's row as the server reads it: the task, its ETag, the message its
        running run holds, the tips recorded with it; ``azqueue.errors.NotFound`` if
        there is none."""
        return await self._tasks.load(task_id)

    async def task(self, task_id: str) -> Task:
        """The stored task: its definition and runs, as the server last wrote them."""
        return (await self.stored(task_id)).task

    async def claim(self, task_id: str, run_id: int) -> ClaimRecord | None:
        """The run's row in the claim index (written for a claim still running some
        seconds after it was made, deleted when the run is resolved); None if none."""
        return await self._claims.get(task_id, run_id)

    # -- queues ------------------------------------------------------------------------

    def queue_name(self, suffix: str) -> str:
        """The full name of an internal queue, e.g. ``queue_name("deadline")``."""
        return self._account.queue_name(suffix)

    def pending_queue(self, task_queue_id: str, priority: Priority = Priority.LOWEST) -> str:
        """The name of ``task_queue_id``'s pending queue of ``priority`` (the one its
        pollTaskUrls hands out a URL of)."""
        return self._pending.name(task_queue_id, priority)

    async def queue_names(self) -> list[str]:
        """The names of every queue of the prefix, internal and pending, sorted."""
        return sorted({q.name async for q in self._account.queues.list_queues(
            name_starts_with=self._account.queue_name(""))})

    def queue(self, name: str) -> QueueClient:
        """The SDK's client of queue ``name``."""
        return self._queues.client(name)

    async def message_count(self, name: str) -> int:
        """Azure's approximate number of messages in queue ``name``, invisible ones
        included; 0 if it does not exist."""
        return await self._queues.approximate_count(name)

    async def pending_count(self, task_queue_id: str,
                            priority: Priority | None = None) -> int:
        """The messages of ``task_queue_id``'s pending queue of ``priority`` (visible or
        not); of all seven with ``priority`` None."""
        priorities = ORDER if priority is None else (priority,)
        return sum([await self.message_count(self.pending_queue(task_queue_id, p))
                    for p in priorities])

    async def peek(self, name: str, limit: int = 32) -> list[Peeked]:
        """Up to ``limit`` (at most 32) of the messages visible in queue ``name`` now,
        left as they are."""
        return await self._queues.peek(name, limit)
