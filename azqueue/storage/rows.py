"""Deleting many rows of one partition."""

from __future__ import annotations

from azure.data.tables.aio import TableClient

from azqueue.errors import StorageError
from azqueue.storage.errors import translate


async def delete_rows(table: TableClient, partition: str, row_keys: list[str],
                      what: str) -> None:
    """Delete the rows, a hundred per transaction; rows that someone else deleted already
    are no error (their transaction fails as a whole and is redone row by row)."""
    for i in range(0, len(row_keys), 100):
        chunk = row_keys[i:i + 100]
        try:
            with translate(what):
                await table.submit_transaction(
                    [("delete", {"PartitionKey": partition, "RowKey": k}) for k in chunk])
        except StorageError:
            for k in chunk:
                with translate(what):
                    await table.delete_entity(partition, k)
