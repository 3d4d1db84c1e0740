"""Claims: claimTask and reclaimTask, by the rewrite of the tip (see docs/workers/sas.md).

claimTask verifies the tip's signature, decides the claim on the task (refusing early,
before the message is touched), rewrites the message to ``{taskId, runId + 1}``
invisible until ``takenUntil``, and then writes the claim and the message it now holds
(``HeldMessage``) to the task in one conditional write. reclaimTask pushes the message's
invisibility out with the held receipt and writes the new receipt with the new
``takenUntil``. With a copy of the task from this process (``cache``) a claim costs two
storage requests (the rewrite and the write), else three.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from azqueue import errors
from azqueue.model import task as model
from azqueue.model import credentials, taskcreds, timeutil
from azqueue.model.task import RunState, Task
from azqueue.model.tip import TipSigner
from azqueue.service.dispatch.tips import KEEP, Keep, Tips
from azqueue.service.runs.cache import TaskCache
from azqueue.service.runs.changes import Changes
from azqueue.service.runs.claimindex import ClaimIndex
from azqueue.service.workers.workers import WorkerInfo
from azqueue.storage.errors import MessageGone, ReceiptLost
from azqueue.storage.taskrows import HeldMessage, Stored
from azqueue.storage.tasks import Change, TaskStore

log = logging.getLogger(__name__)

# A tip that reappears this close before takenUntil still expires the claim: the
# message's visibility is Azure's clock, takenUntil ours.
EXPIRY_TOLERANCE = timedelta(seconds=5)
RECLAIM_RECEIPT_ATTEMPTS = 3
# How long a claim waits for the task (or the record of its tip) that a createTask put
# the tip of a moment ago.
TIP_WAIT = timedelta(seconds=2)
# How long a claim waits for the record of its tip when the task is stored already: the
# record comes right after the tip's put (``Tips.queue``). A tip put again after its
# answer was lost is never recorded: its claim should not wait long to be refused.
RECORD_WAIT = timedelta(seconds=0.5)
# A tip put claimed for a claimWork caller (``tips.Prewritten``) is hidden this much longer
# than a claim lasts, and held as put by a claim made within this time of its put, so that
# it reappears no earlier than the takenUntil that claim writes (and no more than this
# after it); a later claim rewrites it, as any tip.
PREWRITTEN_FRESH = timedelta(seconds=1)
# Set (True) on an error a claim raises once it has taken the message presented with it
# (rewritten or held it): what becomes of the message is decided (dropped, given back,
# or held by a claim that may be stored), and the caller must leave it alone.
MESSAGE_DECIDED = "azqueue_message_decided"


def message_decided(e: BaseException) -> bool:
    """Whether the claim that raised ``e`` decided what becomes of its message."""
    return bool(getattr(e, MESSAGE_DECIDED, False))


def _first_tip_unrecorded(stored: Stored) -> bool:
    """Whether ``stored`` is a task whose run 0 is pending with no tip recorded yet."""
    last = stored.task.last_run
    return last is not None and last.run_id == 0 and last.state is RunState.PENDING and \
        stored.live_tip is None and not stored.tips


@dataclass(frozen=True, slots=True)
class TipClaim:
    """The message a worker polled, presented with claimTask. For a tip put claimed for
    a claimWork caller here (``tips.Prewritten``): when its put was answered (the event
    loop's clock) and the queue it was put in."""

    message_id: str
    receipt: str
    signature: str
    put_at: float | None = None
    queue_name: str = ""


@dataclass(frozen=True, slots=True)
class _Request:
    """One claim asked for (see ``Claims.claim``)."""

    task_id: str
    run_id: int
    worker_group: str
    worker_id: str
    tip: TipClaim | None
    authorize: Callable[[Task], None]
    polled_from: str | None
    now: datetime

    @property
    def need_record(self) -> bool:
        """Whether the tip must be one recorded for the task (claimWork read it itself)."""
        return self.tip is not None and self.polled_from is None


class _Stale(Exception):
    """A decision made on this process's copy of the task must be made again on a fresh read."""


@dataclass(frozen=True, slots=True)
class Claims:
    """claimTask and reclaimTask: the claims of runs, and the messages they hold.

    ``issuer`` is the principal that signs the temporary credentials of a claim;
    ``claim_timeout`` how long a claim lasts before it must be reclaimed."""

    tasks: TaskStore
    signer: TipSigner
    cache: TaskCache
    changes: Changes
    tips: Tips
    index: ClaimIndex
    workerinfo: WorkerInfo
    issuer: credentials.Principal
    claim_timeout: timedelta

    async def claim_task(self, task_id: str, run_id: int, worker_group: str, worker_id: str,
                         tip: TipClaim | None = None,
                         authorize: Callable[[Task], None] = lambda t: None) -> dict[str, Any]:
        """claimTask: claim a run (see ``claim``) and note the worker active, with its claim."""
        claim = await self.claim(task_id, run_id, worker_group, worker_id, tip, authorize)
        self.workerinfo.worker_active(claim["status"]["taskQueueId"], worker_group, worker_id,
                                      [(task_id, run_id)])
        return claim

    async def claim(self, task_id: str, run_id: int, worker_group: str, worker_id: str,
                    tip: TipClaim | None = None,
                    authorize: Callable[[Task], None] = lambda t: None,
                    polled_from: str | None = None) -> dict[str, Any]:
        """Claim a run; ``authorize`` sees the task on its first read, before anything
        else is read or changed. The worker is not noted active: claimTask and claimWork
        do that.

        A ``tip`` presented by a worker must be signed for the task's own task queue and
        name a message recorded as one of the task's tips, so that a worker mixing up
        messages cannot rewrite another task's tip. ``polled_from`` is the task queue
        claimWork received the tip from (and authorized its caller for): the task must
        belong to it, and the record check is skipped (claimWork read the message itself)."""
        request = _Request(task_id, run_id, worker_group, worker_id, tip, authorize,
                           polled_from, timeutil.utcnow())
        if tip and polled_from is not None and \
                not self.signer.verify(polled_from, task_id, run_id, tip.signature):
            raise self._bad_signature(task_id, run_id)
        inserting = self.cache.inserting(task_id, tip.message_id) \
            if tip and polled_from is not None else None
        if inserting is not None:
            return await self._claim_while_inserted(request, *inserting)
        decided = await self._decide_first(request)
        if isinstance(decided, dict):
            return decided  # the caller holds the run already
        stored, guess = decided
        hold = await self._rewrite_tip(request, stored.task) if tip else None
        try:
            change = await self._write_claim(request, stored, hold, guess)
            return await self._answer_written(request, change, hold)
        except BaseException as e:
            if hold is not None:
                setattr(e, MESSAGE_DECIDED, True)
            raise

    async def _claim_while_inserted(self, request: _Request, task: Task,
                                    inserted: asyncio.Future[Stored | None]) -> dict[str, Any]:
        """A tip handed to claimWork as soon as its put was answered, its task still being
        inserted by this process: the tip is rewritten while the insert is under way, and
        the claim written once the insert has stored the task (decided on the task it
        stored, or, if it stored none, on a fresh read: a task of that id was there
        before). Until the claim is written the task is pending with its only tip
        rewritten: what a replica that dies then leaves is what a claim that dies
        between its rewrite and its write leaves (the tip repair gives the run another).
        A claim that fails there gives the tip back at once: before its write, as it was
        put (nothing of the claim is stored); after, as ``_write_claim`` does."""
        self._admit(request, task)
        self._decide(request, task)  # a new task's run 0: refused here only if it is not
        rewriting = asyncio.ensure_future(self._rewrite_tip(request, task))
        try:
            stored = await asyncio.shield(inserted)
        finally:
            hold = await rewriting
        try:
            return await self._claim_inserted(request, task, stored, hold)
        except BaseException as e:
            setattr(e, MESSAGE_DECIDED, True)
            raise

    async def _claim_inserted(self, request: _Request, task: Task, stored: Stored | None,
                              hold: HeldMessage) -> dict[str, Any]:
        """``_claim_while_inserted`` once the insert is done and the message held."""
        movable = hold if hold.pop_receipt else None
        try:
            if stored is None:  # the insert stored nothing: decided on what is stored
                stored = await self.tasks.load(request.task_id)
                self._admit(request, stored.task)
                self._decide(request, stored.task)
        except errors.QueueError:
            if movable:  # no such task, or not this caller's to claim: the tip goes
                await self.tips.drop(movable)
            raise
        except BaseException:
            # The task could not be read (an insert that failed may have been applied):
            # nothing of this claim is written, so the tip goes back as it was put, visible
            # at once, rather than hidden as rewritten until takenUntil. Whatever is stored,
            # that is safe: the run's tip if the task is there and pending, else a tip of
            # no task or a stale one, which a claim refuses and its worker deletes.
            if movable:
                await self.tips.restore(task, movable, self.cache)
            raise
        change = await self._write_claim(request, stored, hold, True)
        return await self._answer_written(request, change, hold)

    def _decide(self, request: _Request, task: Task) -> Task:
        return model.claim(task, request.run_id, request.worker_group, request.worker_id,
                           request.now, self.claim_timeout,
                           EXPIRY_TOLERANCE if request.tip else timedelta(0))

    def _admit(self, request: _Request, task: Task) -> None:
        """The checks made on the first read of the task, before any other request."""
        request.authorize(task)
        if request.polled_from is not None and task.task_queue_id != request.polled_from:
            # A tip in a pending queue of another task queue than its task's: left by a
            # refused createTask that named this taskId. Only the task's own task queue
            # may claim it.
            raise errors.InputError(
                f"task {task.task_id} belongs to task queue {task.task_queue_id}, not "
                f"{request.polled_from}, whose pending queue this message came from; delete it")
        if request.tip and not self.signer.verify(task.task_queue_id, task.task_id,
                                                  request.run_id, request.tip.signature):
            raise self._bad_signature(task.task_id, request.run_id)

    async def _decide_first(self, request: _Request) -> tuple[Stored, bool] | dict[str, Any]:
        """The task, with the claim decided on it before the message is touched (refusing
        early), and whether that was on this process's copy (a guess the write checks);
        or, if the caller holds the run already, the answer to its repeated claim."""
        task_id, run_id, tip = request.task_id, request.run_id, request.tip
        stored = self.cache.get(task_id)
        if stored is not None and request.need_record and tip is not None and \
                tip.message_id not in stored.tips:
            stored = None
        guess = stored is not None
        while True:
            if stored is None:
                stored = await (self._load_for_tip(task_id, tip, request.need_record,
                                                   partial(self._admit, request)) if tip
                                else self.tasks.load(task_id))
            current = stored.task
            self._admit(request, current)
            if request.polled_from is None:  # claimWork checked when it was called
                await self._refuse_quarantined(current, request.worker_group,
                                               request.worker_id, tip)
            try:
                if model.is_claimed_by(current, run_id, request.worker_group, request.worker_id):
                    if guess:
                        raise _Stale
                    return await self._repeated_claim(stored, run_id, tip)
                try:
                    self._decide(request, current)  # refuse early, before touching the message
                except errors.Conflict:
                    if guess:
                        raise _Stale from None
                    if tip:
                        await self._repair_orphaned_tip(stored, run_id)
                    raise
                return stored, guess
            except _Stale:
                stored, guess = None, False

    async def _rewrite_tip(self, request: _Request, task: Task) -> HeldMessage:
        """The presented tip rewritten for this claim (``Tips.rewrite``); one put as this
        rewrite would leave it a moment ago, in the queue of the task's priority, is held
        as it is: it is hidden until about the takenUntil this claim writes (within
        ``EXPIRY_TOLERANCE``)."""
        tip = request.tip
        assert tip is not None
        if tip.put_at is not None and \
                asyncio.get_running_loop().time() - tip.put_at < \
                PREWRITTEN_FRESH.total_seconds() and \
                tip.queue_name == self.tips.pending.name(task.task_queue_id, task.priority):
            return HeldMessage(request.run_id, tip.queue_name, tip.message_id, tip.receipt)
        return await self.tips.rewrite(task, request.run_id, tip.message_id, tip.receipt,
                                       self.claim_timeout)

    async def _write_claim(self, request: _Request, stored: Stored, hold: HeldMessage | None,
                           guess: bool) -> Change:
        """Write the claim and the message it holds in one conditional write; a message
        rewritten for a claim that is refused is dropped, or given back when the write
        failed."""
        movable = hold if hold is not None and hold.pop_receipt else None
        try:
            return await self.changes.change(request.task_id, partial(self._decide, request),
                                             stored, hold=hold, speculative=guess)
        except errors.Conflict:
            if movable:
                await self.tips.drop(movable)
            raise
        except BaseException as e:
            if movable:
                await self._after_failed_write(movable, stored.task, request.worker_group,
                                               request.worker_id, e, request.now)
            raise

    async def _answer_written(self, request: _Request, change: Change,
                              hold: HeldMessage | None) -> dict[str, Any]:
        """The claim's answer once its write is done, and the claim index told."""
        task_id, run_id = request.task_id, request.run_id
        movable = hold if hold is not None and hold.pop_receipt else None
        after = change.after
        if not change.changed:
            # A concurrent claim of this worker (a duplicate tip, a retried request) got
            # there first: answer as to a repeated claim.
            held = change.stored.held
            if movable and (held is None or held.message_id != movable.message_id):
                await self.tips.drop(movable)
            return await self._repeated_claim(change.stored, run_id, request.tip)
        if not model.is_claimed_by(after, run_id, request.worker_group, request.worker_id):
            # The claim expired run run_id - 1 and no retries were left: the task is resolved.
            if movable:
                await self.tips.drop(movable)
            await self.changes.settle(change, run_id - 1)
            raise errors.Conflict(f"run {run_id - 1} of task {task_id} expired and no retries "
                                  "are left: the task is resolved exception")
        run = after.runs[run_id]
        assert run.taken_until is not None
        self.index.claimed(task_id, run_id, run.taken_until, after.task_queue_id,
                           hold.queue_name if hold is not None else "")
        if run_id > 0 and change.before.runs[run_id - 1].state is RunState.RUNNING:
            # This claim expired the previous run, whose message it now holds.
            await self.index.ended(task_id, run_id - 1, change.before.runs[run_id - 1].started)
        return self.answer(after, run_id, with_task=True)

    async def _refuse_quarantined(self, task: Task, worker_group: str, worker_id: str,
                                  tip: TipClaim | None) -> None:
        """Quarantined (403) if the worker may not claim now; the task's tip it presented
        is made visible again at once, for other workers (a worker keeps a message after a
        403, and it would stay hidden for the rest of its poll's visibility timeout)."""
        try:
            await self.workerinfo.refuse_quarantined(task.task_queue_id, worker_group, worker_id)
        except errors.Quarantined:
            if tip is not None:
                await self.tips.return_presented(task, tip.message_id, tip.receipt)
            raise

    async def _load_for_tip(self, task_id: str, tip: TipClaim, need_record: bool,
                            admit: Callable[[Task], None]) -> Stored:
        """The task, once it is stored and (with ``need_record``) ``tip.message_id`` is
        known to be one of its tips; NotFound, or InputError (and a fresh tip for a pending
        run) when that does not happen within ``TIP_WAIT`` (``RECORD_WAIT`` once the task
        is stored). ``admit`` sees the task on its first read: a caller it refuses waits
        for nothing and costs nothing more."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + TIP_WAIT.total_seconds()
        record_give_up = loop.time() + RECORD_WAIT.total_seconds()
        recording = False
        admitted = False
        pause = 0.05  # doubling: a task stored a moment after its tip is found at once, and
        # a claim of a task that never comes costs a handful of reads, not one per 100 ms
        while True:
            try:
                stored: Stored | None = await self.tasks.load(
                    task_id, tip=tip.message_id if need_record else None)
            except errors.NotFound:
                stored = None  # a createTask puts the tip before or with the task
            if stored is not None and not admitted:
                admit(stored.task)
                admitted = True
                # A new task's first tip is recorded after its createTask answered
                # (``Tips.record_soon``): give the record the time given the task.
                recording = _first_tip_unrecorded(stored)
            if stored is not None and (not need_record or tip.message_id in stored.tips):
                return stored
            if loop.time() >= (give_up if stored is None or recording else record_give_up):
                break
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.4)
        if stored is None:
            raise errors.NotFound(f"task {task_id} does not exist (or has expired)")
        last = stored.task.last_run
        if last is not None and last.state is RunState.PENDING:
            # In case the presented message is this task's tip whose record was lost.
            await self._repair_tip(stored, last.run_id)
        raise errors.InputError(
            f"`messageId` {tip.message_id} does not carry a tip of task {task_id}: give the "
            "MessageId and PopReceipt of the message this tip came from, as received")

    @staticmethod
    def _bad_signature(task_id: str, run_id: int) -> errors.InputError:
        return errors.InputError(
            f"`signature` does not match task {task_id} run {run_id} in its task queue: the "
            "message was altered, came from another task queue's pending queue, or was not "
            "issued by this queue; delete it and poll again")

    async def _repeated_claim(self, stored: Stored, run_id: int,
                              tip: TipClaim | None) -> dict[str, Any]:
        """The caller already holds this run: answer as before, unless it presents another
        message than the one its claim took (a duplicate tip, which it should delete)."""
        held = stored.held
        if tip and held is not None and held.run_id == run_id and held.message_id != tip.message_id:
            raise errors.Conflict(
                f"run {run_id} of task {stored.task.task_id} is already claimed by you through "
                "another message; this message is a duplicate tip: delete it")
        run = stored.task.runs[run_id]
        assert run.taken_until is not None
        # The first claim's process may have died before indexing it.
        self.index.claimed(stored.task.task_id, run_id, run.taken_until,
                           stored.task.task_queue_id,
                           held.queue_name if held is not None and held.run_id == run_id else "")
        return self.answer(stored.task, run_id, with_task=True)

    async def _after_failed_write(self, hold: HeldMessage, task: Task, worker_group: str,
                                  worker_id: str, error: BaseException, now: datetime) -> None:
        """The claim's write failed after its message was rewritten. A failure of storage
        (or a cancellation) may have come after the write was stored: the run gets its tip
        back only once a fresh read shows it unclaimed. Otherwise the message stays as
        rewritten (it reappears at takenUntil) and the claim is noted for the index, so that
        a claim its worker never heard of still expires."""
        task_id = task.task_id
        if isinstance(error, errors.StorageError):
            try:
                fresh: Stored | None = await self.tasks.load(task_id)
            except (errors.QueueError, errors.StorageError):
                fresh = None
            if fresh is not None and not model.is_claimed_by(fresh.task, hold.run_id,
                                                             worker_group, worker_id):
                await self.tips.restore(task, hold, self.cache)
                return
        elif not isinstance(error, asyncio.CancelledError):
            await self.tips.restore(task, hold, self.cache)  # refused before anything was written
            return
        self.index.claimed(task_id, hold.run_id, now + self.claim_timeout, task.task_queue_id,
                           hold.queue_name)

    async def _repair_orphaned_tip(self, stored: Stored, run_id: int) -> None:
        """A tip for ``r + 1`` while run ``r`` is still pending was rewritten by a claim that
        died before it was recorded; the worker will delete it, so queue a fresh tip for ``r``."""
        task = stored.task
        last = task.last_run
        if last is not None and last.state is RunState.PENDING and run_id == last.run_id + 1:
            log.warning("task %s: re-queuing run %d, whose claim was never completed",
                        task.task_id, last.run_id)
            await self._repair_tip(stored, last.run_id)

    async def _repair_tip(self, stored: Stored, run_id: int) -> None:
        """Queue a tip for pending run ``run_id`` because a claim suggests its tip is lost,
        at most once per run in half a claim timeout, whichever replica is asked and
        however often: a worker presenting odd messages cannot multiply tips. (A lost tip
        comes back no sooner than a claim timeout after the repair put one: a claim that
        rewrote it and died leaves it invisible until then.)"""
        now = timeutil.utcnow()
        noted_run, _, noted_at = stored.tip_repair.partition(" ")
        if noted_run == str(run_id) and noted_at.isdigit() and \
                now.timestamp() - int(noted_at) < self.claim_timeout.total_seconds() / 2:
            return
        if await self.tasks.note_tip_repair(stored, run_id, now):
            await self.tips.queue(stored, run_id)

    async def reclaim_task(self, task_id: str, run_id: int) -> dict[str, Any]:
        """reclaimTask: push the claim's takenUntil out (and its message's invisibility),
        and note the worker active."""
        now = timeutil.utcnow()

        def decide(task: Task) -> Task:
            return model.reclaim(task, run_id, now, self.claim_timeout)

        stored = self.cache.get(task_id)
        guess = stored is not None
        if stored is not None:
            try:
                decide(stored.task)
            except errors.Conflict:
                stored, guess = None, False
        if stored is None:
            stored = await self.tasks.load(task_id)
            decide(stored.task)  # refuse early
        held = stored.held if stored.held is not None and stored.held.run_id == run_id \
            and stored.held.pop_receipt else None
        receipt = ""
        if held is not None:
            for _ in range(RECLAIM_RECEIPT_ATTEMPTS):
                try:
                    receipt = await self.tips.extend(held, self.claim_timeout)
                    break
                except ReceiptLost:
                    # Pushed out as asked, most likely, by an attempt whose answer was lost:
                    # the run holds the message no more. It reappears at this takenUntil and
                    # expires the run then, unless a later reclaim was made (then it is
                    # refused; the claim resolver expires the run when its time comes).
                    break
                except MessageGone:
                    # A concurrent reclaim may have moved the receipt on; else the claim lapsed.
                    stored, guess = await self.tasks.load(task_id), False
                    fresh = stored.held
                    if fresh is None or fresh.run_id != run_id or \
                            fresh.pop_receipt == held.pop_receipt:
                        raise errors.ClaimLost(
                            f"the claim on run {run_id} of task {task_id} expired: its message "
                            "became visible again and the run will be retried; stop working on "
                            "it") from None
                    held = fresh
            else:
                raise errors.ClaimLost(f"run {run_id} of task {task_id} is being reclaimed "
                                       "concurrently; try again")
        hold: HeldMessage | None | Keep = (KEEP if held is None else
                                            replace(held, pop_receipt=receipt) if receipt
                                            else None)
        try:
            change = await self.changes.change(task_id, decide, stored, hold=hold,
                                               speculative=guess)
        except errors.Conflict:
            if held is not None and receipt:
                await self.tips.release(stored.task, replace(held, pop_receipt=receipt))
            raise
        run = change.after.runs[run_id]
        assert run.taken_until is not None
        held_now = change.stored.held
        await self.index.extended(task_id, run_id, run.started, run.taken_until,
                                  change.after.task_queue_id,
                                  held_now.queue_name if held_now is not None else "")
        claim = self.answer(change.after, run_id)
        self.workerinfo.worker_active(claim["status"]["taskQueueId"], claim["workerGroup"],
                                      claim["workerId"])
        return claim

    def answer(self, task: Task, run_id: int, with_task: bool = False) -> dict[str, Any]:
        """Status, the claim, and temporary credentials for working on the run (claimTask
        and reclaimTask answers; claimTask's with the task definition)."""
        run = task.runs[run_id]
        assert run.taken_until is not None
        answer = {"status": task.status(), "runId": run_id, "workerGroup": run.worker_group,
                  "workerId": run.worker_id, "takenUntil": timeutil.fmt(run.taken_until),
                  "credentials": taskcreds.for_run(self.issuer, task, run_id,
                                                   timeutil.utcnow())}
        if with_task:
            answer["task"] = dict(task.definition)
        return answer
