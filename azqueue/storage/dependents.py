"""Who depends on whom, in Azure Tables: one row per (dependency, dependent task).

PartitionKey = the taskId depended on, RowKey = the dependent taskId. A resolving task
finds its dependents in its own partition; what they require is in their definitions.
The other half, what a task still waits for, is the ``wait:`` rows of its own partition
in the tasks table (``TaskStore``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from azqueue.storage.account import StorageAccount
from azqueue.storage.tables import TableStore
from azqueue.storage.errors import EntityNotFound, translate
from azqueue.storage.rows import delete_rows, key_page


class DependentStore(TableStore):
    """The dependents table."""

    def __init__(self, account: StorageAccount) -> None:
        super().__init__(account, "dependents")

    async def add(self, required: str, dependent: str) -> None:
        with translate(f"recording that {dependent} depends on {required}"):
            await self._table.upsert_entity({"PartitionKey": required, "RowKey": dependent})

    async def remove(self, required: str, dependent: str) -> None:
        """Delete the row; nothing if it is gone already."""
        try:
            with translate(f"forgetting that {dependent} depends on {required}"):
                await self._table.delete_entity(required, dependent)
        except EntityNotFound:
            pass

    async def delete_all(self, required: str) -> None:
        """Forget who depended on ``required``."""
        await delete_rows(self._table, required, [d async for d in self.all(required)],
                          f"forgetting the tasks that depended on {required}")

    async def all(self, required: str) -> AsyncIterator[str]:
        with translate(f"listing the tasks that depend on {required}"):
            async for row in self._table.query_entities(
                    "PartitionKey eq @pk", parameters={"pk": required}, select=["RowKey"]):
                yield str(row["RowKey"])

    async def page(self, required: str, after: str | None,
                   limit: int) -> tuple[list[str], str | None]:
        """Up to ``limit`` dependents with taskIds after ``after``; the taskId to continue
        after, if there may be more."""
        return await key_page(self._table, required, after, limit, f"listing the tasks that depend on {required}")
