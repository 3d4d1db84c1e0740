"""The work claimer: claimWork, served from one poller per task queue (Taskcluster's
``workclaimer``).

A claimWork call registers as a waiter (``waiting``) for up to ``tasks`` tips and claims
each tip it is handed through ``Claims.claim``, exactly as a SAS worker would, so these
claims expire, reclaim and retry like any other. Tips reach waiters two ways:

* **Handed over**: a createTask (or anything queuing a tip) in this process gives the
  message it just put, with its pop receipt, to the longest-waiting caller of that task
  queue; no poll at all.
* **Polled**: while callers of a task queue wait, one poller per process receives as many
  tips as they want in total (at most 32 a request), highest priority first, and shares
  them out in the order the callers came. With a backlog it polls again at once. It
  starts at the priority where it last found tips for ``RECHECK`` seconds, rechecking the
  higher queues after that: tips put by other replicas at a higher priority wait at most
  that long behind a backlog below (tips put in this process are handed over). With
  nothing found it polls every ``claim_work_poll_interval`` seconds, whatever the number
  of callers: waiting costs seven receives per interval per task queue and process.
  A receive whose answer was lost hides the tips it took for ``CLAIM_WORK_HOLD``; the
  poller looks again as soon as they reappear.

Tips a caller cannot claim are deleted (the worker rule of docs/workers/sas.md); tips it was handed
but no longer needs (it answered, or went away) are handed to another caller or released.
Which workers called, and what they claimed, is recorded by ``workers.WorkerInfo``; a
quarantined worker waits as long as a call finding no work and gets no tasks, as in
Taskcluster.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from azqueue import errors
from azqueue.model.priority import ORDER
from azqueue.model.tip import Tip
from azqueue.service.claims import Claims, TipClaim
from azqueue.service.waiting import Waiter, Waiting, WaitingQueue
from azqueue.service.workers import WorkerInfo
from azqueue.storage.queues import Message, PendingQueues, Queues

log = logging.getLogger(__name__)

# How long a received tip stays hidden: only from the receive until its claim rewrites
# the message (invisible until takenUntil then) or gives it back, a fraction of a second.
# It is also how long a receive whose answer was lost hides the tips it took, and a
# caller waiting for them waits that long. A claim that outlives it still holds: the
# receipt stays valid until another poll receives the tip; if one does, the two claims
# are decided on the task as any two claims of one run (see ``Claims.claim``).
CLAIM_WORK_HOLD = timedelta(seconds=2)
# After a receive whose answer may have been lost, look again this long after its tips
# should have reappeared (Azure's clock and ours differ by a little).
HIDDEN_MARGIN = 0.25
# How long the poller starts below queues it found empty before looking at them again.
RECHECK = 1.0
# How often a waiting caller checks that its client is still connected.
CONNECTED_CHECK = 1.0


@dataclass(frozen=True, slots=True)
class WorkClaimer:
    """claimWork for this process: waiting callers, one poller per task queue, hand-over.

    ``wait``: how long a call waits for work (``claim_work_wait``);
    ``poll_interval``: how often a task queue's poller looks while nothing is found
    (``claim_work_poll_interval``)."""

    queues: Queues
    pending: PendingQueues
    claims: Claims
    workerinfo: WorkerInfo
    waiting: Waiting
    wait: float
    poll_interval: float

    async def claim_work(self, task_queue_id: str, worker_group: str, worker_id: str,
                         count: int, connected: Callable[[], bool]) -> list[dict[str, Any]]:
        """Claim up to ``count`` tasks, waiting up to ``claim_work_wait`` seconds for some."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.wait
        info = self.workerinfo
        if await info.quarantined_until(task_queue_id, worker_group, worker_id) is not None:
            info.worker_active(task_queue_id, worker_group, worker_id)
            while connected() and loop.time() < end:
                await asyncio.sleep(min(CONNECTED_CHECK, end - loop.time()))
            return []
        for priority in ORDER:
            await self.pending.ensure(task_queue_id, priority)
        tq = self.waiting.entry(task_queue_id)
        waiter = Waiter(count, connected)
        tq.waiters.append(waiter)
        self._poll(task_queue_id, tq)
        claims: list[dict[str, Any]] = []
        try:
            while not claims and connected():
                remaining = end - loop.time()
                if remaining <= 0:
                    break
                handed = await waiter.take(min(remaining, CONNECTED_CHECK))
                if not handed:
                    continue
                waiter.busy = True
                got = await asyncio.gather(*(self._claim(task_queue_id, worker_group,
                                                         worker_id, m) for m in handed))
                claims += [c for c in got if c is not None]
                waiter.wanted = count - len(claims)
                waiter.busy = False
                if not claims:
                    tq.wake.set()  # still wanting: the poller may look again at once
        finally:
            tq.waiters.remove(waiter)
            for message in waiter.inbox:
                await self._pass_on(tq, message)
        info.worker_active(task_queue_id, worker_group, worker_id,
                           [(c["status"]["taskId"], c["runId"]) for c in claims])
        return claims

    async def _pass_on(self, tq: WaitingQueue, message: Message) -> None:
        """A tip handed to a caller that no longer needs it: to another caller, or back."""
        if not tq.hand(message):
            await self._release(message)

    async def _release(self, message: Message) -> None:
        try:
            await self.queues.release(message.queue_name, message.message_id,
                                      message.pop_receipt)
        except errors.StorageError as e:  # it becomes visible by itself when its hold ends
            log.warning("could not release message %s of %s: %s", message.message_id,
                        message.queue_name, e)

    # -- polling ---------------------------------------------------------------------

    def _poll(self, task_queue_id: str, tq: WaitingQueue) -> None:
        """A caller came: start the poller, and have it look now unless it found nothing
        less than a poll interval ago (tips put in this process since were handed over;
        others wait for the next round, as they would for a caller already waiting). So
        callers that come and go cost no more polls than one that stays."""
        if tq.poller is None:
            tq.poller = asyncio.create_task(self._poller(task_queue_id, tq),
                                            name=f"claimWork poller {task_queue_id}")
        now = asyncio.get_running_loop().time()
        if now - tq.found_nothing_at >= self.poll_interval:
            tq.wake.set()

    async def _poller(self, task_queue_id: str, tq: WaitingQueue) -> None:
        interval = self.poll_interval
        try:
            while tq.waiters:
                demand = tq.demand()
                found = 0
                if demand > 0:
                    tq.wake.clear()
                    try:
                        found = await self._receive(task_queue_id, tq, demand)
                    except errors.StorageError as e:
                        log.warning("claimWork could not poll %s: %s", task_queue_id, e)
                if found:
                    continue
                wait = interval
                hidden = tq.hidden_until - asyncio.get_running_loop().time()
                if hidden > 0:  # look again as soon as they reappear
                    wait = min(wait, hidden)
                try:
                    await asyncio.wait_for(tq.wake.wait(), wait)
                except TimeoutError:
                    pass
        except Exception:
            log.exception("the claimWork poller of %s failed", task_queue_id)
        finally:
            tq.poller = None
            if tq.waiters:  # a caller came just as it ended
                self._poll(task_queue_id, tq)

    async def _receive(self, task_queue_id: str, tq: WaitingQueue, demand: int) -> int:
        """Receive up to ``demand`` tips, highest priority first, and share them out (all
        at once, so that a caller gets what one round found)."""
        now = asyncio.get_running_loop().time()
        start = tq.start_rank if now < tq.recheck_at else 0
        found: list[Message] = []
        try:
            for priority in ORDER[start:]:
                name = self.pending.name(task_queue_id, priority)
                sent = asyncio.get_running_loop().time()
                got = await self.queues.receive_batch(name, CLAIM_WORK_HOLD,
                                                      limit=min(demand - len(found), 32))
                if got.others_hidden:
                    tq.hidden_until = max(tq.hidden_until, sent + HIDDEN_MARGIN +
                                          CLAIM_WORK_HOLD.total_seconds())
                messages = got.messages
                if messages and not found:
                    # The queues above were empty just now (or at the last recheck).
                    if start == 0:
                        tq.recheck_at = now + RECHECK
                    tq.start_rank = priority.rank
                found += messages
                if len(found) >= demand:
                    break
            if not found:
                if start == 0:
                    tq.found_nothing_at = now
                tq.start_rank = 0
        finally:  # what was received is claimed or given back, whatever failed after it
            for message in found:
                await self._pass_on(tq, message)
        return len(found)

    async def _claim(self, task_queue_id: str, worker_group: str, worker_id: str,
                     message: Message) -> dict[str, Any] | None:
        """Claim the tip ``message`` carries, received from ``task_queue_id``'s pending
        queues: only a task of that task queue (the caller is authorized for it, no other);
        None (and the tip deleted or released) if not."""
        queues = self.queues
        try:
            tip = Tip.decode(message.text)
        except ValueError:
            log.warning("deleting message %s from %s: not a tip", message.message_id,
                        message.queue_name)
            await queues.drop(message.queue_name, message.message_id, message.pop_receipt)
            return None
        try:
            return await self.claims.claim(
                tip.task_id, tip.run_id, worker_group, worker_id,
                TipClaim(message.message_id, message.pop_receipt, tip.signature),
                polled_from=task_queue_id)
        except (errors.Conflict, errors.InputError, errors.NotFound):
            await queues.drop(message.queue_name, message.message_id, message.pop_receipt)
        except errors.StorageError as e:
            # Not this caller's fault, and the claims already made are its own: give this
            # tip back and go on with the others.
            log.warning("claimWork could not claim %s/%d: %s", tip.task_id, tip.run_id, e)
            await self._release(message)
        except Exception:
            log.exception("claimWork could not claim %s/%d", tip.task_id, tip.run_id)
            await self._release(message)
        return None
