"""The Table, Queue and Blob clients of a storage account send on one aiohttp session,
which the account closes, not a client: closing one client leaves the others working."""

from __future__ import annotations

from azqueue.config import StorageSettings
from azqueue.devstorage import Azurite
from azqueue.storage.account import StorageAccount


async def test_closing_one_client_leaves_the_shared_session_to_the_others(
        azurite: Azurite, storage_prefix: str) -> None:
    settings = StorageSettings(azurite.connection_string, storage_prefix)
    account = StorageAccount(settings)
    try:
        await account.queues.create_queue(account.queue_name("shared"))
        assert [t async for t in account.tables.list_tables()] is not None
        await account.tables.close()
        names = [q.name async for q in account.queues.list_queues(
            name_starts_with=account.queue_name("shared"))]
        assert names == [account.queue_name("shared")]
    finally:
        await account.close()
        cleaner = StorageAccount(settings)
        await cleaner.delete_all()
        await cleaner.close()
