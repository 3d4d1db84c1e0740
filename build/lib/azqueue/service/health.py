"""What the meta endpoints ask of storage: whether it answers (``__heartbeat__``), and how
many requests this process made to it, by kind (``__metrics__``)."""

from __future__ import annotations

from dataclasses import dataclass

from azqueue import errors
from azqueue.storage.account import StorageAccount
from azqueue.storage.tasks import TaskStore


@dataclass(frozen=True, slots=True)
class Health:
    """Storage's health and use, as this process sees them."""

    account: StorageAccount
    tasks: TaskStore

    async def check_storage(self) -> None:
        """Raise unless the Tasks table answers."""
        try:
            await self.tasks.get("heartbeat")
        except errors.NotFound:
            pass

    def storage_requests(self) -> dict[str, int]:
        return dict(self.account.requests)
