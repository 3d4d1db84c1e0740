"""pollTaskUrls: the SAS URLs a worker polls its task queue's pending queues with.

The URLs (a poll URL and a delete URL per priority, highest first) are reported to
expire ``sas_lifetime`` from now, and are signed to work from ``SAS_SLACK`` before now
until ``SAS_SLACK`` after that. With ``pending``, the answer also says which of the
queues held visible tips when this process last looked (``hints``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from azqueue.model import timeutil
from azqueue.service.hints import PendingHints
from azqueue.storage.queues import PendingQueues

# How long before the SAS URLs' reported expiry they actually stop working.
SAS_SLACK = timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class TaskUrls:
    """The answers of pollTaskUrls."""

    pending: PendingQueues
    hints: PendingHints
    sas_lifetime: timedelta

    async def poll_task_urls(self, provisioner_id: str, worker_type: str,
                             pending: bool = False) -> dict[str, Any]:
        """The SAS URLs; with ``pending``, also which queues hold visible tips (``hints``)."""
        now = timeutil.utcnow()
        expires = now + self.sas_lifetime
        task_queue_id = f"{provisioner_id}/{worker_type}"
        urls = await self.pending.signed_urls(task_queue_id, start=now - SAS_SLACK,
                                              expiry=expires + SAS_SLACK)
        answer: dict[str, Any] = {
            "expires": timeutil.fmt(expires),
            "queues": [{"signedPollUrl": u.signed_poll_url,
                        "signedDeleteUrl": u.signed_delete_url} for u in urls]}
        if pending and (sample := await self.hints.sample(task_queue_id)) is not None:
            answer["pending"] = sample.answer(asyncio.get_running_loop().time())
        return answer
