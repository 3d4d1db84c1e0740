"""Which of a task queue's seven queues hold visible tips: one sample per process, shared
by every SAS worker that asks, instead of each worker polling the seven queues itself.

A SAS worker at a backlog in ``lowest`` (the default priority) must look at the six
queues above it now and then, or a higher-priority task would wait for the backlog; an
idle worker must look at all seven. Every such look is a billed receive, and they grow
with the number of workers. pollTaskUrls with ``?pending=true`` answers, beside the
URLs, which queues hold visible tips as far as this process knows: the worker then
polls only those. What it knows comes from peeks of the queues and from the doorbell
(``doorbell``): a tip this process puts or makes visible, or another replica rings, is
added to the sample at once, and ``wait_visible`` lets an idle worker wait for one
(``?pending=true&wait=<seconds>``) instead of asking again and again.

What it costs. While the doorbell covers the task queue, a queue flagged visible is
peeked again every ``SAMPLE_TTL`` seconds while workers ask (to see it emptied), and
every queue once per fallback interval: an idle task queue costs a sweep of peeks per
fallback interval and process, whatever the number of its workers. While it does not,
every queue is peeked every ``SAMPLE_TTL`` seconds while workers ask, and nothing when
nobody asks.

A sample is dropped once it is older than the idle expiry (the doorbell's sweeper calls
``drop_older``; the next asker samples again, as after a fallback interval), and at most
``MAX_SAMPLES`` are kept: task queues named once cost no memory for long.

A sample is a hint, never a decision: a claim is decided by the task, as always. It can
be stale both ways: a queue emptied since (the worker's poll finds nothing: one empty
poll), or a tip that became visible without a ring (a process that died between its
put and its ring; seen at the next full sweep).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from azqueue import errors
from azqueue.model import timeutil
from azqueue.model.priority import ORDER, Priority
from azqueue.storage.queues import PendingQueues, Queues

log = logging.getLogger(__name__)

SAMPLE_TTL = 2.0
MAX_SAMPLES = 10_000


@dataclass(slots=True)
class Sample:
    """The queues of one task queue with visible tips, by rank (highest priority first)."""

    taken: float  # the event loop's clock when the peeks started
    sampled: datetime
    visible: list[bool]
    known: list[float]  # per queue, the event loop's clock when ``visible`` was last true
    checked: list[float]  # per queue, the event loop's clock when it was last peeked

    def answer(self, now: float) -> dict[str, object]:
        """pollTaskUrls' ``pending``: when the peeks were made, each queue's flag, and
        how many seconds old each flag is by this process's clock (a tip put since the
        peeks makes its queue's flag younger; a worker's clock need not agree)."""
        return {"sampled": timeutil.fmt(self.sampled), "queues": list(self.visible),
                "ages": [round(max(now - t, 0.0), 3) for t in self.known]}

    def mark(self, rank: int, now: float) -> None:
        self.visible[rank] = True
        self.known[rank] = now


class PendingHints:
    """This process's samples, refreshed on demand: every ``SAMPLE_TTL`` seconds while
    the doorbell does not cover the task queue; while it does, only the queues flagged
    visible are looked at again (every ``SAMPLE_TTL``, to see them emptied), and every
    queue once per ``fallback`` seconds: an idle task queue's sample costs nothing."""

    def __init__(self, queues: Queues, pending: PendingQueues, fallback: float) -> None:
        self.queues = queues
        self.pending = pending
        self.fallback = fallback
        self._samples: OrderedDict[str, Sample] = OrderedDict()
        self._refreshing: dict[str, asyncio.Future[Sample | None]] = {}
        self._marks: dict[str, set[int]] = {}  # tips made visible during a refresh
        self._visible: dict[str, asyncio.Event] = {}  # set when a tip is marked visible
        self._waiters: dict[str, int] = {}  # how many wait on each of ``_visible``
        self._too_early: set[str] = set()  # refreshes under way when told to look again

    async def sample(self, task_queue_id: str, covered: bool = False) -> Sample | None:
        """A sample whose flags are current (see the class); None if storage could not
        say. ``covered``: whether the doorbell covers the task queue."""
        now = asyncio.get_running_loop().time()
        known = self._samples.get(task_queue_id)
        ranks = self._stale(known, now, covered)
        if not ranks:
            assert known is not None
            return known
        refreshing = self._refreshing.get(task_queue_id)
        if refreshing is None:  # one refresh at a time per task queue, shared by askers
            refreshing = asyncio.ensure_future(self._refresh(task_queue_id, now, ranks))
            self._refreshing[task_queue_id] = refreshing
            refreshing.add_done_callback(lambda _: self._refreshing.pop(task_queue_id, None))
        return await asyncio.shield(refreshing)

    def _stale(self, known: Sample | None, now: float, covered: bool) -> list[int]:
        """The ranks whose flags must be looked at again."""
        every = [p.rank for p in ORDER]
        if known is None or now - known.taken >= (self.fallback if covered else SAMPLE_TTL):
            return every
        if not covered:
            return []
        return [rank for rank in every
                if known.visible[rank] and now - known.checked[rank] >= SAMPLE_TTL]

    async def wait_visible(self, task_queue_id: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a tip of the task queue to be marked visible
        here (put by this process or rung by another); whether one was."""
        event = self._visible.setdefault(task_queue_id, asyncio.Event())
        self._waiters[task_queue_id] = self._waiters.get(task_queue_id, 0) + 1
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            # Set on the tick the time ran out, before this waiter saw it (a ring heard on
            # the same second's tick as the caller's check): ``tip_visible`` took the event
            # away with it, so this is the one wake-up there is.
            return event.is_set()
        finally:
            left = self._waiters.pop(task_queue_id) - 1
            if left:
                self._waiters[task_queue_id] = left
            elif self._visible.get(task_queue_id) is event:
                del self._visible[task_queue_id]  # nobody waits: nothing kept
        return True

    def drop_older(self, seconds: float) -> None:
        """Forget the samples taken more than ``seconds`` ago (the next asker samples
        again): task queues nobody asks about cost no memory."""
        old = asyncio.get_running_loop().time() - seconds
        self._samples = OrderedDict((tq, s) for tq, s in self._samples.items() if s.taken >= old)

    def sampled(self) -> list[str]:
        """The task queues this process keeps a sample of."""
        return list(self._samples)

    def tip_visible(self, task_queue_id: str, priority: Priority) -> None:
        """This process put a tip, or made one visible, or was rung that another did: the
        sample shows it at once."""
        known = self._samples.get(task_queue_id)
        if known is not None:
            known.mark(priority.rank, asyncio.get_running_loop().time())
        marks = self._marks.get(task_queue_id)
        if marks is not None:  # the refresh under way may have peeked that queue already
            marks.add(priority.rank)
        event = self._visible.pop(task_queue_id, None)
        if event is not None:
            event.set()

    def look_again(self, task_queue_id: str) -> None:
        """Tips of the task queue may have become visible at any priority (or none): the
        next sample looks at every queue."""
        self._samples.pop(task_queue_id, None)
        if task_queue_id in self._marks:  # the refresh under way may be too early to see them
            self._too_early.add(task_queue_id)
        event = self._visible.pop(task_queue_id, None)
        if event is not None:
            event.set()

    async def _refresh(self, task_queue_id: str, now: float, ranks: list[int]) -> Sample | None:
        sampled = timeutil.utcnow()
        marks = self._marks[task_queue_id] = set()
        try:
            peeked = await asyncio.gather(*(self.queues.peek(
                self.pending.name(task_queue_id, ORDER[rank]), 1) for rank in ranks))
        except errors.StorageError as e:
            log.warning("could not sample the queues of %s: %s", task_queue_id, e)
            return None
        finally:
            del self._marks[task_queue_id]
            too_early = task_queue_id in self._too_early
            self._too_early.discard(task_queue_id)
        known = self._samples.get(task_queue_id)
        if known is None or len(ranks) == len(ORDER):
            sample = Sample(now, sampled, [False] * len(ORDER), [now] * len(ORDER),
                            [now] * len(ORDER))
        else:
            sample = known
        for rank, found in zip(ranks, peeked):
            sample.visible[rank] = bool(found)
            sample.known[rank] = now
            sample.checked[rank] = now
        later = asyncio.get_running_loop().time()
        for rank in marks:
            sample.mark(rank, later)
        if too_early:  # answered, not kept: the next asker looks again
            return sample
        self._samples[task_queue_id] = sample
        self._samples.move_to_end(task_queue_id)
        while len(self._samples) > MAX_SAMPLES:
            self._samples.popitem(last=False)
        return sample
