"""The claim resolver: resolves expired claims that no worker's poll has picked up.

A claim normally expires through its tip: the message reappears at ``takenUntil`` and
whoever claims ``runId + 1`` resolves the old run. This loop covers the rest (nobody
polling, a claim made without a tip, a message lost to a crash), and it is what wakes
the workers waiting for the retry: resolving a run claim-expired makes its retry's tip
visible, which rings the doorbell (``service.dispatch.doorbell``).

It reads the claim index rows (``service.runs.claimindex``: runs still running a while after
their claim) in one scan, resolves each run whose ``takenUntil`` has passed through the
same transition, and sleeps until the earliest ``takenUntil`` it knows of: the rows it
read and the claims this process made and has not indexed yet (they are indexed before
their ``takenUntil``). A claim made here wakes it to reconsider. So expiries are
resolved within moments of ``takenUntil``, and with no claims the loop reads the index
once per ``interval`` seconds: a claim made by a replica that died before it came back
waits at most that long. Replicas may run it concurrently: the ETag-conditional write
lets one of them resolve a run, and the others then find nothing to do.
"""

from __future__ import annotations

import asyncio
import logging
import random

from azqueue import errors, metrics
from azqueue.background import one_pass
from azqueue.model import timeutil
from azqueue.service.runs.claimindex import ClaimIndex
from azqueue.service.runs.resolution import Resolution

log = logging.getLogger(__name__)

NAME = "claim resolver"
# After a pass, the next waits at least this long (rows of runs that ended early would
# otherwise each cost a scan at their old takenUntil).
MIN_PAUSE = 0.25
# A takenUntil is looked at this long after it passed (clocks of replicas differ a little).
LATE = 0.05


async def resolve_expired_claims(resolution: Resolution) -> tuple[int, float | None]:
    """Resolve the expired claims; how many, and the seconds until the next takenUntil."""
    resolved = 0
    expired, earliest = await resolution.expired_claims()
    for record in expired:
        try:
            if await resolution.expire_claim(record):
                resolved += 1
                log.info("resolved run %d of task %s: claim-expired", record.run_id, record.task_id)
        except errors.TRANSIENT as e:
            log.warning("could not expire the claim of %s/%d (%s: %s); trying again next round",
                        record.task_id, record.run_id, type(e).__name__, e)
        except Exception:
            log.exception("could not expire the claim of %s/%d", record.task_id, record.run_id)
    now = timeutil.utcnow()
    return resolved, None if earliest is None else (earliest - now).total_seconds()


def _next_local(index: ClaimIndex) -> float | None:
    """Seconds until the earliest takenUntil of this process's claims not indexed yet."""
    earliest = index.earliest()
    return None if earliest is None else (earliest - timeutil.utcnow()).total_seconds()


async def run(resolution: Resolution, index: ClaimIndex, interval: float,
              stop: asyncio.Event) -> None:
    metrics.resolver_started(NAME, interval)
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        index.changed.clear()
        started = loop.time()
        due = started + interval * random.uniform(0.8, 1.2)
        next_expiry: list[float] = []

        async def step() -> int:
            handled, until = await resolve_expired_claims(resolution)
            next_expiry.extend(() if until is None else (until,))
            return handled

        await one_pass(step, NAME, interval)
        if next_expiry:
            due = min(due, loop.time() + next_expiry[0] + LATE)
        while not stop.is_set():  # until the next pass is due; a claim made here may move it
            local = _next_local(index)
            wake = due if local is None else min(due, loop.time() + local + LATE)
            pause = max(wake - loop.time(), started + MIN_PAUSE - loop.time(), 0.0)
            changed = asyncio.ensure_future(index.changed.wait())
            stopped = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({changed, stopped}, timeout=pause,
                                         return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
            stopped.cancel()
            if changed not in done:
                break
            index.changed.clear()
            due = min(due, wake)
