"""The work claimer: claimWork, served from one poller per task queue (Taskcluster's
``workclaimer``).

A claimWork call registers as a waiter for up to ``tasks`` tips and claims each tip it
is handed through ``Claims.claim_task``, exactly as a SAS worker would, so these claims
expire, reclaim and retry like any other. Tips reach waiters two ways:

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
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from azqueue import errors
from azqueue.model.priority import ORDER
from azqueue.model.task import Task
from azqueue.model.tip import Tip
from azqueue.service.claims import TipClaim
from azqueue.storage.queues import Message

if TYPE_CHECKING:
    from azqueue.service.queue import QueueService

log = logging.getLogger(__name__)

# How long a received tip stays hidden: only from the receive until its claim rewrites
# the message (invisible until takenUntil then) or gives it back, a fraction of a second.
# It is also how long a receive whose answer was lost hides the tips it took, and a
# caller waiting for them waits that long. A claim that outlives it still holds: the
# receipt stays valid until another poll receives the tip; if one does, the two claims
# are decided on the task as any two claims of one run (see ``claims.claim_task``).
CLAIM_WORK_HOLD = timedelta(seconds=2)
# After a receive whose answer may have been lost, look again this long after its tips
# should have reappeared (Azure's clock and ours differ by a little).
HIDDEN_MARGIN = 0.25
# How long the poller starts below queues it found empty before looking at them again.
RECHECK = 1.0
# How often a waiting caller checks that its client is still connected.
CONNECTED_CHECK = 1.0
MAX_TASK_QUEUES = 10_000


class _Waiter:
    """One claimWork call waiting for tips."""

    def __init__(self, wanted: int, connected: Callable[[], bool]) -> None:
        self.wanted = wanted
        self.connected = connected
        self.busy = False  # claiming what it was handed: wants nothing more meanwhile
        self.inbox: list[Message] = []
        self.arrived = asyncio.Event()

    @property
    def room(self) -> int:
        if self.busy or not self.connected():
            return 0
        return max(0, self.wanted - len(self.inbox))

    def give(self, message: Message) -> None:
        self.inbox.append(message)
        self.arrived.set()

    async def take(self, timeout: float) -> list[Message]:
        try:
            await asyncio.wait_for(self.arrived.wait(), timeout)
        except TimeoutError:
            pass
        taken, self.inbox = self.inbox, []
        self.arrived.clear()
        return taken


class _TaskQueue:
    """The waiters of one task queue in this process, and its poller."""

    def __init__(self) -> None:
        self.waiters: deque[_Waiter] = deque()
        self.poller: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()
        self.start_rank = 0
        self.recheck_at = 0.0
        self.found_nothing_at = float("-inf")  # when a round from the top last found nothing
        # When tips hidden by a receive whose answer was lost should be visible again.
        self.hidden_until = float("-inf")

    def demand(self) -> int:
        return sum(w.room for w in self.waiters)

    def hand(self, message: Message) -> bool:
        """Give ``message`` to the longest-waiting caller with room for it."""
        for waiter in self.waiters:
            if waiter.room > 0:
                waiter.give(message)
                return True
        return False


class WorkClaimer:
    """claimWork for this process: waiting callers, one poller per task queue, hand-over."""

    def __init__(self, core: QueueService) -> None:
        self.core = core
        self._queues: dict[str, _TaskQueue] = {}

    async def claim_work(self, task_queue_id: str, worker_group: str, worker_id: str,
                         count: int, connected: Callable[[], bool]) -> list[dict[str, Any]]:
        """Claim up to ``count`` tasks, waiting up to ``claim_work_wait`` seconds for some."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.core.settings.claim_work_wait
        info = self.core.workerinfo
        if await info.quarantined_until(task_queue_id, worker_group, worker_id) is not None:
            info.worker_active(task_queue_id, worker_group, worker_id)
            while connected() and loop.time() < end:
                await asyncio.sleep(min(CONNECTED_CHECK, end - loop.time()))
            return []
        for priority in ORDER:
            await self.core.pending.ensure(task_queue_id, priority)
        tq = self._queues.get(task_queue_id) or self._task_queue(task_queue_id)
        waiter = _Waiter(count, connected)
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

    def _task_queue(self, task_queue_id: str) -> _TaskQueue:
        """A new entry; kept when its callers leave (it remembers when its queues were
        found empty), but at most ``MAX_TASK_QUEUES`` idle ones."""
        if len(self._queues) >= MAX_TASK_QUEUES:
            for name in [n for n, q in self._queues.items() if not q.waiters and q.poller is None]:
                del self._queues[name]
        tq = self._queues[task_queue_id] = _TaskQueue()
        return tq

    def offer(self, task: Task, message: Message) -> None:
        """A tip was just put for ``task``: hand it to a caller waiting here, if any."""
        tq = self._queues.get(task.task_queue_id)
        if tq is not None:
            tq.hand(message)

    def wake(self, task: Task) -> None:
        """A tip of ``task`` became visible again: have the poller look now."""
        tq = self._queues.get(task.task_queue_id)
        if tq is not None:
            tq.wake.set()

    async def _pass_on(self, tq: _TaskQueue, message: Message) -> None:
        """A tip handed to a caller that no longer needs it: to another caller, or back."""
        if not tq.hand(message):
            await self._release(message)

    async def _release(self, message: Message) -> None:
        try:
            await self.core.queues.release(message.queue_name, message.message_id,
                                           message.pop_receipt)
        except errors.StorageError as e:  # it becomes visible by itself when its hold ends
            log.warning("could not release message %s of %s: %s", message.message_id,
                        message.queue_name, e)

    # -- polling ---------------------------------------------------------------------

    def _poll(self, task_queue_id: str, tq: _TaskQueue) -> None:
        """A caller came: start the poller, and have it look now unless it found nothing
        less than a poll interval ago (tips put in this process since were handed over;
        others wait for the next round, as they would for a caller already waiting). So
        callers that come and go cost no more polls than one that stays."""
        if tq.poller is None:
            tq.poller = asyncio.create_task(self._poller(task_queue_id, tq),
                                            name=f"claimWork poller {task_queue_id}")
        now = asyncio.get_running_loop().time()
        if now - tq.found_nothing_at >= self.core.settings.claim_work_poll_interval:
            tq.wake.set()

    async def _poller(self, task_queue_id: str, tq: _TaskQueue) -> None:
        interval = self.core.settings.claim_work_poll_interval
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

    async def _receive(self, task_queue_id: str, tq: _TaskQueue, demand: int) -> int:
        """Receive up to ``demand`` tips, highest priority first, and share them out (all
        at once, so that a caller gets what one round found)."""
        now = asyncio.get_running_loop().time()
        start = tq.start_rank if now < tq.recheck_at else 0
        found: list[Message] = []
        try:
            for priority in ORDER[start:]:
                name = self.core.pending.name(task_queue_id, priority)
                sent = asyncio.get_running_loop().time()
                got = await self.core.queues.receive_batch(name, CLAIM_WORK_HOLD,
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
        queues = self.core.queues
        try:
            tip = Tip.decode(message.text)
        except ValueError:
            log.warning("deleting message %s from %s: not a tip", message.message_id,
                        message.queue_name)
            await queues.drop(message.queue_name, message.message_id, message.pop_receipt)
            return None
        try:
            return await self.core.claims.claim_task(
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
