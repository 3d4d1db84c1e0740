"""What every store of one Azure table shares: its name, its client, creating it."""

from __future__ import annotations

from azqueue.storage.account import StorageAccount
from azqueue.storage.errors import translate


class TableStore:
    """A store of the table ``<prefix><kind>``."""

    def __init__(self, account: StorageAccount, kind: str) -> None:
        self.name = account.table_name(kind)
        self._service = account.tables
        self._table = account.tables.get_table_client(self.name)
        self._rest = account.rest  # for the requests of the hot path

    async def ensure(self) -> None:
        """Create the table (idempotent)."""
        with translate(f"creating table {self.name}"):
            await self._service.create_table_if_not_exists(self.name)
