"""Many rows of one partition: deleting them, listing their keys a page at a time."""

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


async def key_page(table: TableClient, partition: str, after: str | None, limit: int,
                   what: str, below: str = "~") -> tuple[list[str], str | None]:
    """Up to ``limit`` RowKeys of the partition after ``after`` (and below ``below``); the
    key to continue after, if there may be more."""
    found: list[str] = []
    with translate(what):
        pages = table.query_entities(
            "PartitionKey eq @pk and RowKey gt @after and RowKey lt @below",
            parameters={"pk": partition, "after": after or "", "below": below},
            select=["RowKey"], results_per_page=limit).by_page()
        async for page in pages:
            async for row in page:
                found.append(str(row["RowKey"]))
                if len(found) >= limit:
                    return found, found[-1]
    return found, None
