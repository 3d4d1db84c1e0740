"""pollTaskUrls: the SAS URLs a worker polls its task queue's pending queues with.

The URLs (a poll URL and a delete URL per priority, highest first) are reported to
expire ``sas_lifetime`` from now, and are signed to work from ``SAS_SLACK`` before now
until ``SAS_SLACK`` after that. With ``pending``, the answer also says which of the
queues hold visible tips as far as this process knows (``hints``); with ``wait``, a
worker that would hear "none" waits up to that many seconds for one to become visible
(``MAX_WAIT`` at most), so that an idle SAS worker is woken within moments of a tip, by
any replica, at no storage request; a wait ends as soon as its caller is gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from azqueue.model import timeutil
from azqueue.service.dispatch.doorbell import Doorbell
from azqueue.service.dispatch.hints import PendingHints, Sample
from azqueue.storage.queues import PendingQueues

# How long before the SAS URLs' reported expiry they actually stop working.
SAS_SLACK = timedelta(minutes=5)
# The longest ``wait`` of pollTaskUrls (seconds), as long as claimWork waits at most.
MAX_WAIT = 20.0
# How often a waiting caller's connection is looked at (as claimWork's are).
CONNECTED_CHECK = 1.0


@dataclass(frozen=True, slots=True)
class TaskUrls:
    """The answers of pollTaskUrls."""

    pending: PendingQueues
    hints: PendingHints
    doorbell: Doorbell
    sas_lifetime: timedelta

    async def poll_task_urls(self, provisioner_id: str, worker_type: str,
                             pending: bool = False, wait: float = 0.0,
                             connected: Callable[[], bool] = lambda: True) -> dict[str, Any]:
        """The SAS URLs; with ``pending``, also which queues hold visible tips (``hints``),
        waiting up to ``wait`` seconds for one if none does, while ``connected()`` (its
        caller is still there to read the answer)."""
        now = timeutil.utcnow()
        expires = now + self.sas_lifetime
        task_queue_id = f"{provisioner_id}/{worker_type}"
        urls = self.pending.signed_urls(task_queue_id, start=now - SAS_SLACK,
                                        expiry=expires + SAS_SLACK)
        answer: dict[str, Any] = {
            "expires": timeutil.fmt(expires),
            "queues": [{"signedPollUrl": u.signed_poll_url,
                        "signedDeleteUrl": u.signed_delete_url} for u in urls]}
        if pending:
            sample = await self._sample(task_queue_id)
            if sample is not None and not any(sample.visible) and wait > 0 and \
                    await self._wait_visible(task_queue_id, min(wait, MAX_WAIT), connected):
                sample = await self._sample(task_queue_id)
            if sample is not None:
                answer["pending"] = sample.answer(asyncio.get_running_loop().time())
        return answer

    async def _wait_visible(self, task_queue_id: str, wait: float,
                            connected: Callable[[], bool]) -> bool:
        """``hints.wait_visible``, looking every ``CONNECTED_CHECK`` seconds whether the
        caller is still there: False at once when it went away."""
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        while connected():
            left = end - loop.time()
            if left <= 0:
                return False
            if await self.hints.wait_visible(task_queue_id, min(CONNECTED_CHECK, left)):
                return True
        return False

    async def _sample(self, task_queue_id: str) -> Sample | None:
        return await self.hints.sample(task_queue_id, self.doorbell.covers(task_queue_id))
