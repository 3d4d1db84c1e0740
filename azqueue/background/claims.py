"""The claim resolver: resolves expired claims that no worker's poll has picked up.

A claim normally expires through its tip: the message reappears at ``takenUntil`` and
whoever claims ``runId + 1`` resolves the old run. This loop covers the rest (nobody
polling, a claim made without a tip, a message lost to a crash): every ``interval``
seconds it lists the claim index rows (``service.claimindex``: runs still running 30 s
after their claim) whose ``takenUntil`` has passed and resolves each run claim-expired
(scheduling its retry) through the same transition. The lag between
``takenUntil`` and resolution is therefore at most about ``interval`` seconds plus the
time to process the rows. Replicas may run it concurrently: the ETag-conditional write
lets one of them resolve a run, and the others then find nothing to do.
"""

from __future__ import annotations

import asyncio
import logging

from azqueue import errors
from azqueue.background import every
from azqueue.service.resolution import Resolution

log = logging.getLogger(__name__)


async def resolve_expired_claims(resolution: Resolution) -> int:
    resolved = 0
    for record in await resolution.expired_claims():
        try:
            if await resolution.expire_claim(record):
                resolved += 1
                log.info("resolved run %d of task %s: claim-expired", record.run_id, record.task_id)
        except errors.TRANSIENT as e:
            log.warning("could not expire the claim of %s/%d (%s: %s); trying again next round",
                        record.task_id, record.run_id, type(e).__name__, e)
        except Exception:
            log.exception("could not expire the claim of %s/%d", record.task_id, record.run_id)
    return resolved


async def run(resolution: Resolution, interval: float, stop: asyncio.Event) -> None:
    await every(interval, lambda: resolve_expired_claims(resolution), stop, "claim resolver")
