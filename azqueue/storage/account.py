"""The storage account: clients built from one connection string, and request counts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from azure.core.pipeline.transport import AioHttpTransport
from azure.data.tables.aio import TableServiceClient
from azure.storage.blob.aio import BlobServiceClient
from azure.storage.queue.aio import QueueServiceClient

from azqueue.config import ConfigError, StorageSettings


class CountingTransport(AioHttpTransport):  # type: ignore[misc]
    """The SDK's aiohttp transport, counting every HTTP request it sends (retries too)."""

    def __init__(self, counter: Counter[str], service: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._counter = counter
        self._service = service

    async def send(self, request: Any, **kwargs: Any) -> Any:
        self._counter[f"{self._service} {request.method}"] += 1
        return await super().send(request, **kwargs)


@dataclass
class StorageAccount:
    """Clients for the account's Table, Queue and Blob services, opened and closed together."""

    settings: StorageSettings
    requests: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        conn = self.settings.connection_string
        self.tables = TableServiceClient.from_connection_string(
            conn, transport=CountingTransport(self.requests, "table"))
        self.queues = QueueServiceClient.from_connection_string(
            conn, transport=CountingTransport(self.requests, "queue"))
        self.blobs = BlobServiceClient.from_connection_string(
            conn, transport=CountingTransport(self.requests, "blob"))
        credential = self.queues.credential
        self.account_name: str = self.queues.account_name or ""
        self.account_key: str | None = getattr(credential, "account_key", None)
        if not self.account_name:
            raise ConfigError("AZQUEUE_STORAGE_CONNECTION_STRING names no AccountName")

    def table_name(self, kind: str) -> str:
        return f"{self.settings.prefix}{kind}"

    def queue_name(self, suffix: str) -> str:
        return f"{self.settings.prefix}-{suffix}"

    async def close(self) -> None:
        await self.tables.close()
        await self.queues.close()
        await self.blobs.close()
