"""Tips: the signed messages in a task queue's pending queues that say a run is pending.

``Tips`` signs a tip for a task queue, taskId and runId, puts it in the pending queue of
the task's priority, records its messageId on the task and offers it to a claimWork
caller waiting in this process (``waiting``); a tip nobody here takes, or one made
visible again, rings the doorbell for the waiters of every replica (``doorbell``). What must exist for which task state, and
why extra tips are harmless, is kept by this module together with ``changes`` (the
writes and ``settle``), ``claims`` and ``repair``:

Azure queue invariants (what must exist for which state, and why extra is harmless):

* A **pending** run ``r`` has at least one tip ``{taskId, r}`` in its pending queue,
  visible now or within a bounded time (a poll's visibility timeout). createTask puts
  run 0's tip *before* inserting the task, and records its messageId in the same
  transaction as the task: a createTask that dies in between leaves a tip of no task
  (a claim answers 404 and the worker deletes it), never a task without a tip. A claim
  waits up to ``claims.TIP_WAIT`` for the task; a task stored later than half that after
  its tip gets another tip. A repeated createTask of a pending run 0 adds a tip again.
  A claimWork caller waiting in the creating process is handed run 0's tip as soon as
  its put is answered and rewrites it (below) while the task is inserted, writing its
  claim only once the insert stored the task: a process that dies in between leaves a
  pending run whose only tip says ``r + 1``, invisible until ``takenUntil``, as a claim
  that dies between its rewrite and its write does, and the tip repair gives the run a
  fresh tip (its live tip's receipt no longer holds). A claim there that storage fails
  gives the tip back at once (before its write, as put; after, once a fresh read shows
  the run unclaimed), as a claim whose write fails does.
  What a request that dies part-way leaves without a tip, the task's deadline trigger
  (``triggers``, first visible ``tip_repair_delay`` after createTask) repairs: see ``repair``.
* A **running** run ``r`` claimed with a tip owns that message, rewritten to
  ``{taskId, r + 1}`` and invisible until ``takenUntil``; the task entity itself holds
  the messageId and the current pop receipt (``held``), written with the claim.
  reclaimTask pushes the invisibility out; if nobody reclaims, the message reappears
  exactly when the claim expires and whoever claims ``r + 1`` first resolves ``r`` as
  claim-expired. The claim resolver expires the claims nobody polls for, from the claim
  index (``claimindex``).
* When run ``r`` is resolved, the write that resolves it clears ``held`` and
  ``changes.settle`` fixes its message (for a worker's report, after the report is
  answered): made visible at once when the retry ``r + 1`` is
  pending (its text already says ``r + 1``), deleted otherwise; a fresh tip is queued
  when the old one cannot be used, unless the retry is claimed meanwhile (a worker's
  poll took the message, which says ``r + 1``: ``changes.RETRY_TIP_WAIT``). If the
  process dies before ``settle``, the message reappears at ``takenUntil`` and serves the
  retry then (or answers 409 and is deleted).
* Duplicate and stale tips are harmless: a claim is decided by the Task entity alone
  (conditional on its ETag), and a tip for a run that cannot be claimed answers 4xx,
  upon which the worker deletes it.
* Every message put with a tip is recorded (row ``tip:<messageId>`` in the task's
  partition, read with the task in one request), and a worker's claim must name such a
  message: a worker that pairs a tip with another message it holds is refused before
  that message is touched. A rewrite keeps the messageId, so the record holds for
  ``r + 1`` too.
* A tip is claimable only in its task's own task queue: its signature covers the task
  queue it was put for (unless the signer's form is ``TipForm.RUN``, for replicas of
  earlier releases serving beside this one), claimWork claims only tasks of the task
  queue it polled, and claimTask checks the caller's scopes for the task's queue on the
  task's first read (these two whatever the form). So
  the tip a refused createTask put in the queue it named (it is dropped, but a poll may
  take it first) serves nobody there, and the poller's refused claim deletes it.
* A pending run's tip is counted once, however long it waits: the tip last put for it
  is kept on the task with the pop receipt its put returned (``LiveTip``), and the tip
  repair's look updates the message with that receipt first (``still_waiting``): that
  succeeds only while nobody has received the tip since, and then the tip is alive and
  gets no duplicate. Only a tip a worker received (and may have lost), or one put
  without that record (a retry's released message, an earlier release's tip), is
  duplicated.
* An **unscheduled** task (waiting for dependencies, see ``dependencies``) has no tip;
  it gets one when it is scheduled.
* A task's tips live in the queue of its current priority. changeTaskPriority queues a
  pending run's tip in the new priority's queue; the old tip is stale and harmless (a
  claim rewrites the message in the task's current queue, finds none there and answers
  400). A running run keeps its message where it is; ``settle`` gives its retry a fresh
  tip rather than releasing a message from another priority's queue.
* A decision may start from this process's copy of the task (``cache``), but only a
  conditional write that succeeds makes it count; refusals are decided on a fresh read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import timedelta

from azqueue.model.task import Task
from azqueue.model.tip import TipSigner
from azqueue.service.dispatch.doorbell import Doorbell
from azqueue.service.dispatch.waiting import Waiting
from azqueue.storage.errors import MessageGone, ReceiptLost
from azqueue.storage.queues import Message, PendingQueues, Queues
from azqueue.storage.taskrows import MAX_TIPS, HeldMessage, LiveTip, Stored
from azqueue.storage.tasks import TaskStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Tips:
    """Putting, recording and handing over the tips of pending runs."""

    signer: TipSigner
    queues: Queues
    pending: PendingQueues
    tasks: TaskStore
    waiting: Waiting
    doorbell: Doorbell

    async def put(self, task: Task, run_id: int) -> Message:
        """Put a tip for run ``run_id`` in the pending queue of the task's priority (made
        if need be); not recorded: the caller records it (``record``, or with the task's
        insert)."""
        message = await self.pending.put(
            task.task_queue_id, task.priority,
            self.signer.tip(task.task_queue_id, task.task_id, run_id).encode())
        self.doorbell.put(task.task_queue_id, task.priority)
        return message

    async def record(self, task: Task, message: Message, run_id: int) -> None:
        """Record ``message``, a tip of run ``run_id`` just put, as one of the task's tips
        and as the run's live tip, and hand it over."""
        await self.tasks.record_tip(task.task_id, message.message_id, live(message, run_id))
        self.hand_over(task, message)

    async def still_waiting(self, stored: Stored) -> bool:
        """Whether the pending run's live tip is in its queue, untouched since it was put
        (or last looked at): one request, and a second to keep the new receipt. False if
        there is no such record or a worker received the tip since (it may be lost)."""
        task = stored.task
        last, tip = task.last_run, stored.live_tip
        if last is None or tip is None or tip.run_id != last.run_id or \
                tip.queue_name != self.pending.name(task.task_queue_id, task.priority):
            return False
        try:
            receipt = await self.queues.update(tip.queue_name, tip.message_id, tip.pop_receipt,
                                               visible_in=timedelta(0))
        except ReceiptLost:
            return True  # applied, its answer lost: alive, and the next look will not know
        except MessageGone:
            return False
        await self.tasks.renew_live_tip(task.task_id, replace(tip, pop_receipt=receipt))
        return True

    def offer(self, task: Task, message: Message) -> bool:
        """Offer a tip of ``task`` just put, the task still being inserted by this process
        (``TaskCache.inserting``), to a claimWork caller waiting here; whether one took it.
        Nothing is rung if none did: ``hand_over`` does, once the task is stored."""
        return self.waiting.offer(task, message)

    def hand_over(self, task: Task, message: Message) -> None:
        """Offer a tip of ``task`` just put (and recorded) to a claimWork caller waiting
        in this process, if any; if none takes it, ring the doorbell."""
        if not self.waiting.offer(task, message):
            self.visible(task)

    def visible(self, task: Task) -> None:
        """A tip of ``task`` became visible in its queue: wake whoever waits for it, here
        and in the other replicas (``doorbell``)."""
        self.doorbell.visible(task.task_queue_id, task.priority)

    async def queue(self, stored: Stored, run_id: int) -> None:
        """Put a tip for run ``run_id`` of a stored task and record its messageId, so that
        a claim can tell the task's own messages from others. A task with ``MAX_TIPS``
        records gets no more (its entity would outgrow Azure's 252 properties)."""
        task = stored.task
        if len(stored.tips) >= MAX_TIPS:
            log.warning("task %s has %d tips recorded: not queuing another for run %d",
                        task.task_id, len(stored.tips), run_id)
            return
        await self.record(task, await self.put(task, run_id), run_id)

    def in_own_queue(self, task: Task, held: HeldMessage) -> bool:
        """Whether ``held`` is in the pending queue of the task's current priority."""
        return held.queue_name == self.pending.name(task.task_queue_id, task.priority)

    async def release(self, task: Task, held: HeldMessage) -> bool:
        """Make the message a resolved run held visible at once, as the tip of the retry
        (its text says the retry's runId already); False if it was gone or not ours."""
        released = await self.queues.release(held.queue_name, held.message_id,
                                             held.pop_receipt)
        if released:
            self.visible(task)
        return released


def live(message: Message, run_id: int) -> LiveTip:
    """The live tip record of ``message``, a tip of run ``run_id`` just put."""
    return LiveTip(run_id, message.queue_name, message.message_id, message.pop_receipt)
