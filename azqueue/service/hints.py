"""Which of a task queue's seven queues hold visible tips: one sample per process, shared
by every SAS worker that asks, instead of each worker polling the seven queues itself.

A SAS worker at a backlog in ``lowest`` (the default priority) must look at the six
queues above it now and then, or a higher-priority task would wait for the backlog; an
idle worker must look at all seven. Every such look is a billed receive, and they grow
with the number of workers. pollTaskUrls with ``?pending=true`` answers, beside the
URLs, which queues had visible tips when this process last looked (a peek of each, at
most ``SAMPLE_TTL`` seconds ago): the worker then polls only those. The cost is seven
peeks per ``SAMPLE_TTL`` per task queue and process while workers ask, whatever their
number, and nothing when nobody asks.

A sample is a hint, never a decision: a claim is decided by the task, as always. It can
be stale both ways: a queue emptied since (the worker's poll finds nothing: one empty
poll), or a tip made visible since by another process or by a claim expiring (seen at
the next sample, at most ``SAMPLE_TTL`` later). Tips this process puts or makes visible
are added to its sample at once.
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
    """This process's samples, refreshed on demand at most every ``SAMPLE_TTL`` seconds."""

    def __init__(self, queues: Queues, pending: PendingQueues) -> None:
        self.queues = queues
        self.pending = pending
        self._samples: OrderedDict[str, Sample] = OrderedDict()
        self._refreshing: dict[str, asyncio.Future[Sample | None]] = {}
        self._marks: dict[str, set[int]] = {}  # tips made visible during a refresh

    async def sample(self, task_queue_id: str) -> Sample | None:
        """A sample at most ``SAMPLE_TTL`` seconds old; None if storage could not say."""
        now = asyncio.get_running_loop().time()
        known = self._samples.get(task_queue_id)
        if known is not None and now - known.taken < SAMPLE_TTL:
            return known
        refreshing = self._refreshing.get(task_queue_id)
        if refreshing is None:  # one refresh at a time per task queue, shared by askers
            refreshing = asyncio.ensure_future(self._refresh(task_queue_id, now))
            self._refreshing[task_queue_id] = refreshing
            refreshing.add_done_callback(lambda _: self._refreshing.pop(task_queue_id, None))
        return await asyncio.shield(refreshing)

    def tip_visible(self, task_queue_id: str, priority: Priority) -> None:
        """This process put a tip, or made one visible: the sample shows it at once."""
        known = self._samples.get(task_queue_id)
        if known is not None:
            known.mark(priority.rank, asyncio.get_running_loop().time())
        marks = self._marks.get(task_queue_id)
        if marks is not None:  # the refresh under way may have peeked that queue already
            marks.add(priority.rank)

    async def _refresh(self, task_queue_id: str, now: float) -> Sample | None:
        sampled = timeutil.utcnow()
        marks = self._marks[task_queue_id] = set()
        try:
            peeked = await asyncio.gather(*(self.queues.peek(
                self.pending.name(task_queue_id, p), 1) for p in ORDER))
        except errors.StorageError as e:
            log.warning("could not sample the queues of %s: %s", task_queue_id, e)
            return None
        finally:
            del self._marks[task_queue_id]
        sample = Sample(now, sampled, [bool(p) for p in peeked], [now] * len(peeked))
        later = asyncio.get_running_loop().time()
        for rank in marks:
            sample.mark(rank, later)
        self._samples[task_queue_id] = sample
        self._samples.move_to_end(task_queue_id)
        while len(self._samples) > MAX_SAMPLES:
            self._samples.popitem(last=False)
        return sample
