"""What the meta endpoints ask of this process's collaborators: whether storage answers
and, with events on, whether the broker is reachable (``__heartbeat__``), and how many
requests this process made to storage, by kind (``__metrics__``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from azqueue import errors
from azqueue.storage.account import StorageAccount
from azqueue.storage.tasks import TaskStore

log = logging.getLogger(__name__)

# A heartbeat answers within a probe's usual time-out, storage's retries or not.
STORAGE_CHECK_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class Health:
    """Storage's and the broker's health and storage's use, as this process sees them;
    ``broker`` says whether the broker is reachable, None with events off;
    ``private_metrics``: whether the deployment keeps its metrics from anonymous callers
    (it set ``AZQUEUE_METRICS_TOKEN``)."""

    account: StorageAccount
    tasks: TaskStore
    broker: Callable[[], bool] | None = None
    private_metrics: bool = False

    async def check_storage(self) -> None:
        """Raise unless the Tasks table answers."""
        try:
            await self.tasks.get("heartbeat")
        except errors.NotFound:
            pass

    async def checks(self) -> dict[str, str]:
        """Each dependency's state: ``ok``, ``off`` (events off) or what is wrong."""
        try:
            await asyncio.wait_for(self.check_storage(), STORAGE_CHECK_TIMEOUT)
            storage = "ok"
        except (errors.StorageError, TimeoutError) as e:
            storage = f"storage does not answer: {e or type(e).__name__}"
            log.warning("heartbeat: %s", storage)
        if self.broker is None:
            broker = "off"
        elif self.broker():
            broker = "ok"
        else:
            broker = "no connection to the broker (AZQUEUE_AMQP_URL)"
        return {"storage": storage, "broker": broker}

    def storage_requests(self) -> dict[str, int]:
        return dict(self.account.requests)
