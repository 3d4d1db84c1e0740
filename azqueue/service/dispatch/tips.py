"""Tips: the signed messages in a task queue's pending queues that say a run is pending.

``Tips`` is the one owner of tips: every transition of one goes through it. It signs a
tip for a task queue, taskId and runId, puts it in the pending queue of the task's
priority, records its messageId on the task and offers it to a claimWork caller waiting
in this process (``waiting``); a tip nobody here takes, or one made visible again, rings
the doorbell for the waiters of every replica (``doorbell``). It receives tips for
claimWork's poller, rewrites a claimed tip for its claim, pushes a held message's
invisibility out on reclaim, gives tips back, releases a resolved run's message for its
retry and deletes tips that serve nobody; and ``records_after`` decides what a task's
change keeps of its records of messages (the store writes what it is told). The others
decide *when*: createTask (``definitions``), a claim (``claims``, ``workclaimer``), a
resolution (``changes.settle``) and the tip repair (``repair``) call it. What must exist
for which task state, and why extra tips are harmless:

Azure queue invariants (what must exist for which state, and why extra is harmless):

* A **pending** run ``r`` has at least one tip ``{taskId, r}`` in its pending queue,
  visible now or within a bounded time (a poll's visibility timeout). createTask of a
  task that is its own group, or whose dependencies are resolved, puts run 0's tip
  *while* it inserts the task, at once, and records the tip's messageId after it
  answered (``record_soon``); a member of a task group with no dependencies puts the tip
  before the insert, which records it. In the window, a reader finds a tip of no task
  yet (a claim waits up to ``claims.TIP_WAIT`` for the task, then answers 404 and the
  worker deletes the tip), or a task whose tip is not recorded yet (a worker's claim
  waits as long for the record; a claimWork caller's needs none). A createTask that
  fails or dies before it answered may leave the task stored without its tip (or its
  trigger): its client sends it again, as for any createTask not answered, and the
  repeat puts them (the deadline trigger, once stored, also repairs a missing tip). A
  task stored later than half ``TIP_WAIT`` after its tip gets another tip. A repeated
  createTask of a pending run 0 adds a tip again.
  A claimWork caller waiting in the creating process with room for a task has run 0's
  tip put already as its claim holds it (``Prewritten``: saying ``r + 1``, invisible
  for the claim's time, its room held meanwhile, ``Waiting.reserve``) and is handed it
  as soon as its put is answered, while the task is inserted, writing its claim (with
  no rewrite) only once the insert stored the task: a process that dies in between
  leaves a pending run whose only tip says ``r + 1``, invisible until ``takenUntil``, as
  a claim that dies between its rewrite and its write does, and the tip repair gives the
  run a fresh tip (it has no live tip). A caller gone during the put leaves the tip to
  another caller here, or it is made run 0's tip, visible, before createTask answers
  (``reveal``; if that fails, createTask fails, and its client's repeat puts another).
  A tip a caller was handed and does not claim (it went away, is quarantined) is given
  back as run 0's, and recorded on the task once it is stored if it was not
  (``give_back``). A claim there that storage fails gives the tip back at once (before
  its write, as run 0's; after, once a fresh read shows the run unclaimed), as a claim
  whose write fails does, and records it if it was not (``restore``). A tip put before
  a caller came is handed over as put, and the caller's claim rewrites it (below).
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

import asyncio
import contextvars
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Protocol

from azqueue import errors
from azqueue.model import tip as signed
from azqueue.model.priority import ORDER, Priority
from azqueue.model.task import RunState, Task
from azqueue.model.tip import TipSigner
from azqueue.service.dispatch.doorbell import Doorbell
from azqueue.service.dispatch.waiting import Waiting
from azqueue.storage import retry
from azqueue.storage.errors import MessageGone, ReceiptLost
from azqueue.storage.queues import Message, PendingQueues, Queues, Received
from azqueue.storage.taskrows import MAX_TIPS, HeldMessage, LiveTip, MessageRecords, Stored
from azqueue.storage.tasks import TaskStore

log = logging.getLogger(__name__)

# Tips recorded after their createTask answered, at most, at once per process
# (``Tips.record_soon``); and the storage budget of each such record, in seconds.
MAX_RECORDING = 64
RECORD_BUDGET = 10.0
# Writes of such a record tried, each on a fresh read after the task changed.
RECORD_ATTEMPTS = 5
# How long a tip given back waits, at most, for the insert under way of its task.
INSERT_WAIT = 60.0


class Copies(Protocol):
    """What a tip given back asks of this process's copies of the tasks it wrote
    (``runs.cache.TaskCache``): the insert under way that put a tip, and the copy of a
    task a record changed."""

    def inserting(self, task_id: str, message_id: str
                  ) -> tuple[Task, asyncio.Future[Stored | None]] | None: ...

    def recorded(self, stored: Stored, was: str) -> None: ...


class Keep:
    """``records_after(hold=KEEP)``: the held message stays while its run is running."""


KEEP = Keep()


def records_after(stored: Stored, after: Task, hold: HeldMessage | None | Keep = KEEP
                  ) -> MessageRecords:
    """What a change of ``stored`` into ``after`` keeps of the task's records of its
    messages. ``hold`` is the message the run now holds (a claim or reclaim); by default
    the held message stays. A message is held only by a running run. Every recorded tip
    was put in the queue of the priority the task had: with a new priority they are all
    stale, and forgetting them makes a claim of one a claim of a message that is not the
    task's tip (refused, then deleted). A message a claim now holds is recorded as one of
    the task's tips (it was one: a tip handed to a claimWork caller before it was
    recorded, say), so that the retry's claim of it, once it reappears, is a claim of the
    task's own message. The live tip is kept only while it is the tip of the pending
    last run, in the queue of the task's priority."""
    before = stored.task
    held = stored.held if isinstance(hold, Keep) else hold
    if held is not None and (held.run_id >= len(after.runs) or
                             after.runs[held.run_id].state is not RunState.RUNNING):
        held = None
    same_priority = after.priority == before.priority
    tips = stored.tips if same_priority else frozenset[str]()
    if isinstance(hold, HeldMessage) and held is not None and same_priority and \
            held.message_id not in tips and len(tips) < MAX_TIPS:
        tips = tips | {held.message_id}
    live_tip = stored.live_tip
    last = after.last_run
    if live_tip is not None and (not same_priority or last is None or
                                 last.run_id != live_tip.run_id or
                                 last.state is not RunState.PENDING):
        live_tip = None
    return MessageRecords(held, tips, live_tip)


def live_record(stored: Stored, message: Message, run_id: int) -> LiveTip | None:
    """The live tip to record with ``message``, a tip of run ``run_id`` recorded after
    it was put: none unless that run is still the pending last run and no tip put since
    was recorded as live (the tip repair's, say)."""
    last = stored.task.last_run
    if last is None or last.run_id != run_id or last.state is not RunState.PENDING or \
            stored.live_tip is not None:
        return None
    return live(message, run_id)


@dataclass(frozen=True, slots=True)
class Prewritten(Message):
    """A tip put already as a claim rewrites it, for a claimWork caller waiting in this
    process (``Tips.put`` with ``claimed_for``): in its queue the message says
    ``{taskId, runId + 1}`` and is hidden for the claim's time; ``text`` is the tip it
    stands for, run ``runId``'s, which the caller's claim presents and ``give_back`` and
    ``reveal`` restore. It is hidden ``claims.PREWRITTEN_FRESH`` longer than a claim
    lasts; a claim made within that time of its put holds it as put, with no rewrite
    (``Claims._rewrite_tip``), so it reappears no earlier than that claim's takenUntil; a
    later claim rewrites it as any tip (its receipt still holds: nobody else received
    it). The insert records it as one of the task's tips, never as its live tip (given
    back unrecorded, it is recorded as any tip then, live if its receipt is known:
    ``give_back``, ``restore``). ``put_at``:
    when its put was answered, on the event loop's clock."""

    put_at: float = 0.0


class Tip(Protocol):
    """A message carrying a tip, as put, received or held: where it is and its receipt."""

    @property
    def queue_name(self) -> str: ...

    @property
    def message_id(self) -> str: ...

    @property
    def pop_receipt(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Tips:
    """Every transition of the tips of runs: put, recorded, handed over, received,
    rewritten for a claim, extended, given back, released for a retry, deleted."""

    signer: TipSigner
    queues: Queues
    pending: PendingQueues
    tasks: TaskStore
    waiting: Waiting
    doorbell: Doorbell
    _recording: set[asyncio.Task[None]] = field(default_factory=set)

    async def put(self, task: Task, run_id: int, claimed_for: timedelta | None = None
                  ) -> Message:
        """Put a tip for run ``run_id`` in the pending queue of the task's priority (made
        if need be); not recorded: the caller records it (``record``, or with the task's
        insert). With ``claimed_for`` (a claim's time), the tip is put as the claim of a
        claimWork caller waiting here would rewrite it, and nobody else sees it: a
        ``Prewritten``, to hand to that caller or, if none takes it, to ``reveal``."""
        text = self.signer.tip(task.task_queue_id, task.task_id, run_id).encode()
        if claimed_for is not None:
            put = await self.pending.put(
                task.task_queue_id, task.priority,
                self.signer.tip(task.task_queue_id, task.task_id, run_id + 1).encode(),
                visible_in=claimed_for)
            return Prewritten(put.queue_name, put.message_id, put.pop_receipt, text, 0,
                              asyncio.get_running_loop().time())
        message = await self.pending.put(task.task_queue_id, task.priority, text)
        self.doorbell.put(task.task_queue_id, task.priority)
        return message

    def reserve(self, task: Task) -> bool:
        """Whether a claimWork caller waiting here has room for a tip of ``task`` that
        nothing else holds: then it is held for the tip about to be put, claimed at its
        put (``put`` with ``claimed_for``), until ``unreserve``."""
        return self.waiting.reserve(task.task_queue_id)

    def unreserve(self, task: Task) -> None:
        self.waiting.unreserve(task.task_queue_id)

    async def reveal(self, task: Task, message: Prewritten, run_id: int) -> Message:
        """A tip of run ``run_id`` put claimed for a caller here that no caller took (it
        went away during the put): the run's tip, visible at once, and rung; the message
        as it now is. One whose receipt no longer holds (the update was applied and its
        answer lost, most likely) is replaced by a fresh tip: a tip whose receipt nobody
        knows cannot be looked after (``still_waiting``), and a duplicate is harmless.
        Raises if storage fails: the tip stays hidden until the claim's time is over, and
        the createTask that put it fails, so that its client's repeat puts another."""
        try:
            receipt = await self.queues.update(message.queue_name, message.message_id,
                                               message.pop_receipt, timedelta(0),
                                               text=message.text)
        except MessageGone:
            return await self.put(task, run_id)
        self.visible(task)
        return Message(message.queue_name, message.message_id, receipt, message.text, 0)

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

    async def hand_over_unrecorded(self, stored: Stored, message: Message, run_id: int,
                                   recorded: Callable[[Stored, str], None]) -> None:
        """Hand over a tip of run ``run_id`` put together with the insert that stored
        ``stored`` (createTask's, all at once), so not recorded yet: a claimWork caller
        here that takes it claims it as received (no record needed); else it is rung, and
        recorded after the caller's answer (``record_soon``)."""
        if self.waiting.offer(stored.task, message):
            return
        self.visible(stored.task)
        await self.record_soon(stored, message, run_id, recorded)

    async def record_soon(self, stored: Stored, message: Message, run_id: int,
                          recorded: Callable[[Stored, str], None]) -> None:
        """Record ``message`` as ``record`` does (but not hand it over), after the caller
        has answered: a claim that presents the tip before waits for the record
        (``claims``), and one presented after a process died before recording it is
        refused, and the run given a recorded tip (``Claims._repair_tip``). The record is
        written conditionally, on ``stored`` and on a fresh read each time the task
        changed meanwhile, by the rules of ``records_after``: none once the task's
        priority changed, the live tip only while its run is pending (``live_record``);
        ``recorded(task as now stored, ETag before)`` is told, so that this process's copy
        of the task stays good for the next change. At most
        ``MAX_RECORDING`` at once; beyond them the caller records before it answers, so
        a burst of createTasks is slowed down to what storage takes. ``close`` waits for
        them. Never raises: a failure is logged."""
        await self._soon(self._record_logged(stored, message, run_id, recorded),
                         f"{stored.task.task_id}/{run_id}")

    async def _soon(self, job: Coroutine[Any, Any, None], name: str) -> None:
        """Run a record in the background (at most ``MAX_RECORDING`` at once; beyond them,
        now), for ``close`` to wait for."""
        if len(self._recording) >= MAX_RECORDING:
            await job
            return
        task = asyncio.get_running_loop().create_task(job, name=name,
                                                      context=contextvars.Context())
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)

    async def _record_logged(self, stored: Stored, message: Message, run_id: int,
                             recorded: Callable[[Stored, str], None], as_live: bool = True
                             ) -> None:
        task_id = stored.task.task_id
        current = stored
        try:
            with retry.budget(RECORD_BUDGET):
                for _ in range(RECORD_ATTEMPTS):
                    if current.task.priority != stored.task.priority or \
                            message.message_id in current.tips or \
                            len(current.tips) >= MAX_TIPS:
                        return  # put in the queue of a priority the task has no more
                    now = await self.tasks.record_tip_at(
                        current, message.message_id,
                        live_record(current, message, run_id) if as_live else None)
                    if now is not None:
                        recorded(now, current.etag)
                        return
                    current = await self.tasks.load(task_id)  # changed meanwhile
                log.warning("task %s run %d: its tip %s was not recorded: the task changed "
                            "%d times meanwhile", task_id, run_id, message.message_id,
                            RECORD_ATTEMPTS)
        except (errors.StorageError, errors.QueueError) as e:
            log.warning("task %s run %d: its tip %s was not recorded (a claim presenting it "
                        "is refused, and the run given another): %s", task_id, run_id,
                        message.message_id, e)
        except Exception:
            log.exception("task %s run %d: recording its tip failed", task_id, run_id)

    async def close(self) -> None:
        """Wait for the tips still being recorded: at most ``RECORD_BUDGET`` each, and for
        a tip given back, ``INSERT_WAIT`` more for the insert of its task."""
        if self._recording:
            await asyncio.gather(*self._recording, return_exceptions=True)

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
        """Make the message a run held visible at once, as the tip it says (a resolved
        run's retry, or a reclaim refused after it pushed the message out); False if it
        was gone or not ours."""
        released = await self.queues.release(held.queue_name, held.message_id,
                                             held.pop_receipt)
        if released:
            self.visible(task)
        return released

    async def settle_resolved(self, task: Task, held: HeldMessage, retry_pending: bool) -> bool:
        """The message run ``held.run_id`` held, the run now resolved: released as the tip
        of its pending retry (its text says the retry's runId already), else deleted. A
        message in another priority's queue than the task's (changeTaskPriority) cannot
        serve the retry: it goes. Whether the retry has its tip now."""
        if retry_pending and self.in_own_queue(task, held):
            return await self.release(task, held)
        await self.drop(held)
        return False

    async def drop(self, message: Tip) -> None:
        """Delete a tip that serves nobody (its claim was refused, its createTask refused,
        its run resolved with no retry); one already gone is no error."""
        await self.queues.drop(message.queue_name, message.message_id, message.pop_receipt)

    # -- claimWork's poller ----------------------------------------------------------

    async def receive(self, task_queue_id: str, priority: Priority, hold: timedelta,
                      limit: int) -> Received:
        """Up to ``limit`` tips from a pending queue, hidden for ``hold`` (until their
        claims rewrite or give them back); none from a queue never made."""
        try:
            return await self.queues.receive_batch(self.pending.name(task_queue_id, priority),
                                                   hold, limit=limit)
        except errors.EntityNotFound:  # no task was ever put there: empty
            return Received([], False)

    async def give_back(self, task_queue_id: str, message: Message, copies: Copies) -> None:
        """A tip received for claimWork that nobody here claims: visible at once, and
        rung (a ``Prewritten`` as the tip it stands for). A failure is logged: it becomes
        visible by itself when its hold ends (a ``Prewritten``, when its claim's time is
        over: its run, pending, gets a tip from the tip repair, ``repair``).

        A tip handed over as this process put it (never received: ``dequeue_count`` 0)
        may not be recorded, as a claimWork caller's claim needs no record (createTask's,
        put with the task's insert): it is recorded now if it is not
        (``_record_given_back``), so that a worker that polls it with SAS can claim it."""
        try:
            receipt: str | None = await self.queues.update(
                message.queue_name, message.message_id, message.pop_receipt, timedelta(0),
                message.text if isinstance(message, Prewritten) else None)
        except ReceiptLost:
            receipt = None  # released, most likely: its new receipt is not known
        except MessageGone:
            return
        except errors.StorageError as e:
            log.warning("could not release message %s of %s: %s", message.message_id,
                        message.queue_name, e)
            return
        priority = next((p for p in ORDER
                         if self.pending.name(task_queue_id, p) == message.queue_name), None)
        self.doorbell.visible(task_queue_id, priority)
        if message.dequeue_count == 0:
            await self._soon(self._record_given_back(message, receipt, copies),
                             f"given back {message.message_id}")

    async def _record_given_back(self, message: Message, receipt: str | None,
                                 copies: Copies) -> None:
        """Record a tip given back (``give_back``: one this process put, handed over; or
        ``restore``: one a claim here failed to hold), after the caller's answer, on its
        task: the one its insert stored, once that insert is over if it is still under
        way; else (or if the insert's request failed) the task as read now, which may be
        another createTask's of the same taskId (the tip is signed for that taskId and
        task queue: a duplicate tip of that task, harmless). Only a tip in the queue of
        the task's priority, not recorded yet, while the task has room for records
        (``MAX_TIPS``). A worker presenting it before waits for the record (``claims``).
        A failure is logged: such a worker's claim is then refused, and the run given a
        recorded tip, as for a tip whose createTask died before recording it."""
        try:
            tip = signed.Tip.decode(message.text)  # signed by a replica: a tip
            inserting = copies.inserting(tip.task_id, message.message_id)
            stored = await asyncio.wait_for(asyncio.shield(inserting[1]), INSERT_WAIT) \
                if inserting is not None else None
            if stored is None:
                with retry.budget(RECORD_BUDGET):
                    stored = await self.tasks.load(tip.task_id)
            if message.message_id in stored.tips or \
                    len(stored.tips) >= MAX_TIPS or \
                    message.queue_name != self.pending.name(stored.task.task_queue_id,
                                                            stored.task.priority):
                return
            # With its receipt unknown, it is recorded as one of the task's tips only, not
            # as the live one (which the tip repair's look moves with its receipt).
            await self._record_logged(stored, replace(message, pop_receipt=receipt or ""),
                                      tip.run_id, copies.recorded, as_live=receipt is not None)
        except errors.NotFound:
            pass  # its task is not stored: a claim of it is refused, and the tip deleted
        except (errors.StorageError, TimeoutError) as e:
            log.warning("message %s: could not read its task to record it as given back "
                        "(%s)", message.message_id, str(e) or "its insert took too long")
        except Exception:
            log.exception("message %s: recording it as given back failed",
                          message.message_id)

    # -- claims ----------------------------------------------------------------------

    async def rewrite(self, task: Task, run_id: int, message_id: str, receipt: str,
                      claim_timeout: timedelta) -> HeldMessage:
        """Rewrite the tip of run ``run_id`` that a claim presents (in the pending queue of
        the task's priority) to ``{taskId, runId + 1}``, invisible for the claim's time:
        the message the claim will hold."""
        task_id = task.task_id
        queue_name = self.pending.name(task.task_queue_id, task.priority)
        try:
            receipt = await self.queues.update(
                queue_name, message_id, receipt, visible_in=claim_timeout,
                text=self.signer.tip(task.task_queue_id, task_id, run_id + 1).encode())
        except ReceiptLost:
            # Rewritten as asked, most likely, by an attempt whose answer was lost: the
            # claim holds no message (it reappears at takenUntil and is refused then).
            receipt = ""
        except MessageGone:
            # The receipt is stale: this claim was sent before and its first attempt
            # rewrote the message and died before storing the claim (the retry of an
            # in-flight claim), or the message's visibility from its poll ended (a
            # claimWork hold is seconds) and another poll took it. The task decides,
            # as for a claim without a tip: the run is claimed holding no message (and
            # the other poll's claim is refused and deletes it; the claim index expires
            # the run), or the other poll's claim was stored first and this one is
            # refused; the rewritten message, when it reappears, is a tip like any other.
            log.info("task %s run %d: claiming without the message, whose receipt is stale",
                     task_id, run_id)
            receipt = ""
        # Without its receipt the claim cannot move the message, but it records which
        # message it took: a second tip of the run presented by the same worker is then
        # told apart from a retry of this claim (``Claims._repeated_claim``).
        return HeldMessage(run_id, queue_name, message_id, receipt)

    async def restore(self, task: Task, hold: HeldMessage, copies: Copies) -> None:
        """Give a rewritten tip back as run ``hold.run_id``'s, visible at once: its claim
        wrote nothing. It is recorded on the task if it was not (``_record_given_back``:
        a tip createTask handed to a claimWork caller here, whose claim failed), so that
        a worker that polls it with SAS can claim it. A failure is logged: the tip
        reappears at takenUntil regardless."""
        text = self.signer.tip(task.task_queue_id, task.task_id, hold.run_id).encode()
        try:
            receipt: str | None = await self.queues.update(
                hold.queue_name, hold.message_id, hold.pop_receipt, timedelta(0), text)
        except ReceiptLost:
            receipt = None  # restored, most likely: its new receipt is not known
        except MessageGone:
            return
        except errors.StorageError as e:
            log.warning("could not give task %s run %d its tip back: %s", task.task_id,
                        hold.run_id, e)
            return
        except Exception:
            log.exception("could not give task %s run %d its tip back", task.task_id, hold.run_id)
            return
        self.visible(task)
        restored = Message(hold.queue_name, hold.message_id, receipt or "", text, 0)
        await self._soon(self._record_given_back(restored, receipt, copies),
                         f"restored {hold.message_id}")

    async def return_presented(self, task: Task, message_id: str, receipt: str) -> None:
        """Make a tip of ``task`` a worker presented and may not claim (quarantined)
        visible again at once, for other workers. A failure is logged: it reappears when
        its poll's hold ends."""
        try:
            await self.queues.release(self.pending.name(task.task_queue_id, task.priority),
                                      message_id, receipt)
        except errors.StorageError as e:
            log.warning("could not give back the tip of %s that a quarantined worker "
                        "presented: %s", task.task_id, e)
        else:
            self.visible(task)

    async def extend(self, held: HeldMessage, claim_timeout: timedelta) -> str:
        """Push a held message's invisibility out by ``claim_timeout`` (reclaimTask); its
        new receipt. ReceiptLost or MessageGone as the update raises them."""
        return await self.queues.update(held.queue_name, held.message_id, held.pop_receipt,
                                        claim_timeout)


def live(message: Message, run_id: int) -> LiveTip:
    """The live tip record of ``message``, a tip of run ``run_id`` just put."""
    return LiveTip(run_id, message.queue_name, message.message_id, message.pop_receipt)
