"""Idle queues: the pending queues of task queues nobody uses any more are deleted.

A task queue's seven pending queues are made with its first tip (``storage.queues``).
Scopes may cover many task queue names (``queue:create-task:lowest:wild/*``), so queues made
and left would grow without bound, and every queue costs: Azure lists them all, and
Azurite slows down as they grow. The expiry pass (``service.upkeep.expiry``, every
``AZQUEUE_EXPIRY_INTERVAL`` on every replica) therefore deletes, after the task queue
records that expired (``workers``: a record expires ``TASK_QUEUE_EXPIRY`` after a task
was last created in the task queue or a worker last asked it for work), every pending
queue that is empty, was made more than ``MIN_AGE`` ago (its metadata says when; the
record of a task queue's first task is written just after its tip is put) and belongs
to no task queue with an unexpired record. It lists the pending queues (one request
per 5,000) and the live records (one per 1,000), and reads
each such queue's approximate message count (one request) before deleting it (one
more); a queue that still holds messages is kept and read again at the next pass.

Races, and why no task is lost:

* **Messages**: Azure's approximate message count counts invisible messages too (a
  claimed run's tip, invisible until ``takenUntil``; a tip a poll holds), and is never
  lower than the real count: a queue holding any message is never deleted. Stale tips
  nobody polls (a duplicate of a resolved task's tip) keep it until they reach Azure's
  seven-day message lifetime; the pass after that deletes it.
* **A put between the count and the delete** (a createTask, a retry, a rerun in a task
  queue idle for days, in the few milliseconds between them): the delete takes the tip
  with the queue. The run is pending with no tip, as after a request that died part-way,
  and the tip repair (``repair``) gives it another: its look at a pending run finds its
  live tip gone (the update with the put's receipt answers 404) and queues a new one,
  about ``AZQUEUE_TIP_REPAIR_DELAY`` after the run became pending.
* **A put after the delete**: the process that puts may believe the queue exists (it
  made it, or put in it before). The put is answered 404 ``QueueNotFound``; the queue is
  made again and the tip put again. For about 40 s after a delete Azure refuses to make
  it again (409 ``QueueBeingDeleted``): the put waits, pausing, within its request's
  time; createTask, if the wait would outlast it, stores the task and queues its tip in
  the background once the queue can be made (``Definitions._queue_soon``), the tip
  repair covering that too. No createTask fails for it.
* **Caches**: the deleting process forgets the queue; another learns it from its next
  put's 404 (above). Its poller's receive, a sample's peek and the counts' read take a
  missing queue as an empty one, as they do for a task queue with no task yet.
* **SAS workers** holding URLs of a deleted queue get 404 ``QueueNotFound`` from their
  polls, which the SAS protocol says means an empty queue (docs/workers/sas.md); the
  URLs work again once a tip makes the queue again.
* **Replicas**: any number may run the pass at once; a queue deleted twice answers 404
  the second time, which is not an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from azqueue.errors import QueueError, StorageError
from azqueue.storage.queues import PendingQueues
from azqueue.storage.workers import TaskQueueStore

log = logging.getLogger(__name__)

# Queues made this recently are left alone, whatever the records say.
MIN_AGE = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class IdleQueues:
    """Deleting the empty pending queues of task queues whose records expired."""

    pending: PendingQueues
    task_queues: TaskQueueStore

    async def delete(self, now: datetime) -> int:
        """Delete the empty pending queues of every task queue with no record unexpired
        at ``now``; the number deleted."""
        live = {self.pending.digest(t) for t in await self.task_queues.live_task_queues(now)}
        queues = self.pending.queues
        deleted = 0
        for queue in await self.pending.existing():
            if queue.digest in live or (queue.made is not None and queue.made > now - MIN_AGE):
                continue
            try:
                if await queues.approximate_count(queue.name) == 0 and \
                        await queues.remove(queue.name):
                    deleted += 1
            except (QueueError, StorageError) as e:
                log.warning("could not delete the idle queue %s: %s", queue.name, e)
        return deleted
