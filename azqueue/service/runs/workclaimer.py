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
  them out in the order the callers came. It looks only at the queues that may hold
  visible tips (``WaitingQueue.dirty``): every queue when the first caller comes, then
  a queue when the doorbell rings it (a tip put or made visible by any replica, see
  ``doorbell``), and a queue stays on the list while it gives all that was asked of it.
  With a backlog it polls again at once. While the doorbell covers the task queue, the
  poller looks at every queue only once per ``claim_work_fallback_interval``, whatever
  the number of callers: waiting costs almost nothing. While it does not (no broker and
  no doorbell table, the broker away), it looks at every queue every
  ``claim_work_poll_interval`` seconds, as if there were no doorbell.
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
from azqueue.service.dispatch.doorbell import Doorbell
from azqueue.service.dispatch.tips import Prewritten, Tips
from azqueue.service.dispatch.waiting import Waiter, Waiting, WaitingQueue
from azqueue.service.runs.claims import Claims, TipClaim, message_decided
from azqueue.service.workers.workers import WorkerInfo
from azqueue.storage.queues import Message

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
# How often a waiting caller checks that its client is still connected.
CONNECTED_CHECK = 1.0


@dataclass(frozen=True, slots=True)
class WorkClaimer:
    """claimWork for this process: waiting callers, one poller per task queue, hand-over.

    ``wait``: how long a call waits for work (``claim_work_wait``);
    ``poll_interval``: how often a task queue's poller looks at every queue while the
    doorbell does not cover it (``claim_work_poll_interval``); ``fallback_interval``:
    how often while it does (``claim_work_fallback_interval``)."""

    tips: Tips
    claims: Claims
    workerinfo: WorkerInfo
    waiting: Waiting
    doorbell: Doorbell
    wait: float
    poll_interval: float
    fallback_interval: float

    async def claim_work(self, task_queue_id: str, worker_group: str, worker_id: str,
                         count: int, connected: Callable[[], bool]) -> list[dict[str, Any]]:
        """Claim up to ``count`` tasks, waiting up to ``claim_work_wait`` seconds for some."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.wait
        info = self.workerinfo
        # Known from its first call on, not once that call ends (up to ``wait`` later): the
        # first sight is written at once, a later one costs nothing (workers.py).
        info.worker_active(task_queue_id, worker_group, worker_id)
        tq = self.waiting.entry(task_queue_id)
        waiter = Waiter(count, connected)
        tq.waiters.append(waiter)
        self._poll(task_queue_id, tq)
        claims: list[dict[str, Any]] = []
        quarantined = checked = False
        try:
            while not claims and connected():
                remaining = end - loop.time()
                if remaining <= 0:
                    break
                handed = await waiter.take(min(remaining, CONNECTED_CHECK))
                if not handed:
                    continue
                if not checked:  # asked once there is work: a caller that waits asks nothing
                    checked = True
                    if await info.quarantined_until(task_queue_id, worker_group,
                                                    worker_id) is not None:
                        quarantined = True
                        waiter.inbox = handed + waiter.inbox  # for the other callers
                        break
                waiter.busy = True
                got = await asyncio.gather(*(self._claim(task_queue_id, worker_group,
                                                         worker_id, m) for m in handed))
                for c in got:  # the same tip handed and polled is one claim, answered twice
                    if c is not None and (c["status"]["taskId"], c["runId"]) not in {
                            (k["status"]["taskId"], k["runId"]) for k in claims}:
                        claims.append(c)
                waiter.wanted = count - len(claims)
                waiter.busy = False
                if not claims:
                    tq.wake.set()  # still wanting: the poller may look again at once
        finally:
            tq.waiters.remove(waiter)
            for message in waiter.inbox:
                await self._pass_on(task_queue_id, tq, message)
        if quarantined:  # waits as long as a call finding no work, and gets none
            info.worker_active(task_queue_id, worker_group, worker_id)
            while connected() and loop.time() < end:
                await asyncio.sleep(min(CONNECTED_CHECK, end - loop.time()))
            return []
        info.worker_active(task_queue_id, worker_group, worker_id,
                           [(c["status"]["taskId"], c["runId"]) for c in claims])
        return claims

    async def _pass_on(self, task_queue_id: str, tq: WaitingQueue, message: Message) -> None:
        """A tip handed to a caller that no longer needs it: to another caller, or back."""
        if not tq.hand(message):
            await self.tips.give_back(task_queue_id, message, self.claims.cache)

    # -- polling ---------------------------------------------------------------------

    def _interval(self, task_queue_id: str) -> float:
        """How long the poller may go without looking at every queue: the fallback while
        the doorbell covers the task queue, else the poll interval."""
        if self.doorbell.covers(task_queue_id):
            return self.fallback_interval
        return self.poll_interval

    def _poll(self, task_queue_id: str, tq: WaitingQueue) -> None:
        """A caller came: start the poller. It looks at once where tips may be (every
        queue, unless the last look found them empty and the doorbell has covered the
        task queue since), so callers that come and go cost no more polls than one that
        stays."""
        now = asyncio.get_running_loop().time()
        if not self.doorbell.covers(task_queue_id) and \
                now - tq.all_looked_at >= self.poll_interval:
            tq.look_everywhere(now)
        if tq.poller is None:
            tq.poller = asyncio.create_task(self._poller(task_queue_id, tq),
                                            name=f"claimWork poller {task_queue_id}")
        tq.wake.set()

    async def _poller(self, task_queue_id: str, tq: WaitingQueue) -> None:
        loop = asyncio.get_running_loop()
        try:
            while tq.waiters:
                now = loop.time()
                if now - tq.all_looked_at >= self._interval(task_queue_id):
                    tq.look_everywhere(now)
                if now >= tq.hidden_until > float("-inf"):
                    tq.hidden_until = float("-inf")  # what a lost answer hid is back
                    tq.look_everywhere(now)
                tq.wake.clear()
                demand = tq.demand()
                found = 0
                if demand > 0 and tq.dirty:
                    try:
                        found = await self._receive(task_queue_id, tq, demand)
                    except errors.StorageError as e:
                        log.warning("claimWork could not poll %s: %s", task_queue_id, e)
                if found:
                    continue
                wait = tq.all_looked_at + self._interval(task_queue_id) - loop.time()
                if tq.hidden_until > float("-inf"):
                    wait = min(wait, tq.hidden_until - loop.time())
                try:
                    await asyncio.wait_for(tq.wake.wait(), max(wait, 0.0))
                except TimeoutError:
                    pass
        except Exception:
            log.exception("the claimWork poller of %s failed", task_queue_id)
        finally:
            tq.poller = None
            if tq.waiters:  # a caller came just as it ended
                self._poll(task_queue_id, tq)

    async def _receive(self, task_queue_id: str, tq: WaitingQueue, demand: int) -> int:
        """Receive up to ``demand`` tips from the queues that may hold some, highest
        priority first, and share them out (all at once, so that a caller gets what one
        round found). A queue that gave fewer than asked for is empty now, unless a ring
        came meanwhile."""
        found: list[Message] = []
        try:
            for rank in sorted(tq.dirty):
                rings = tq.rings
                sent = asyncio.get_running_loop().time()
                wanted = min(demand - len(found), 32)
                got = await self.tips.receive(task_queue_id, ORDER[rank], CLAIM_WORK_HOLD,
                                              wanted)
                if got.others_hidden:
                    tq.hidden_until = max(tq.hidden_until, sent + HIDDEN_MARGIN +
                                          CLAIM_WORK_HOLD.total_seconds())
                if len(got.messages) < wanted and tq.rings == rings:
                    tq.dirty.discard(rank)
                found += got.messages
                if len(found) >= demand:
                    break
        finally:  # what was received is claimed or given back, whatever failed after it
            for message in found:
                await self._pass_on(task_queue_id, tq, message)
        return len(found)

    async def _claim(self, task_queue_id: str, worker_group: str, worker_id: str,
                     message: Message) -> dict[str, Any] | None:
        """Claim the tip ``message`` carries, received from ``task_queue_id``'s pending
        queues: only a task of that task queue (the caller is authorized for it, no other);
        None (and the tip deleted or released) if not."""
        try:
            tip = Tip.decode(message.text)
        except ValueError:
            log.warning("deleting message %s from %s: not a tip", message.message_id,
                        message.queue_name)
            await self.tips.drop(message)
            return None
        try:
            return await self.claims.claim(
                tip.task_id, tip.run_id, worker_group, worker_id,
                TipClaim(message.message_id, message.pop_receipt, tip.signature,
                         *((message.put_at, message.queue_name)
                           if isinstance(message, Prewritten) else ())),
                polled_from=task_queue_id)
        except (errors.Conflict, errors.InputError, errors.NotFound) as e:
            if not message_decided(e):
                await self.tips.drop(message)
        except errors.StorageError as e:
            # Not this caller's fault, and the claims already made are its own: give this
            # tip back (unless the claim decided what becomes of it) and go on.
            log.warning("claimWork could not claim %s/%d: %s", tip.task_id, tip.run_id, e)
            if not message_decided(e):
                await self.tips.give_back(task_queue_id, message, self.claims.cache)
        except Exception as e:
            log.exception("claimWork could not claim %s/%d", tip.task_id, tip.run_id)
            if not message_decided(e):
                await self.tips.give_back(task_queue_id, message, self.claims.cache)
        return None
