"""The queue's operations: create, claim, reclaim, report, and the resolvers' steps.

Azure queue invariants (what must exist for which state, and why extra is harmless):

* A **pending** run ``r`` has at least one tip ``{taskId, r}`` in its pending queue,
  visible now or within a bounded time (a poll's visibility timeout). createTask
  queues it after inserting the task; a repeated createTask queues it again, because
  the first attempt may have died in between.
* A **running** run ``r`` claimed with a tip owns that message, rewritten to
  ``{taskId, r + 1}`` and invisible until ``takenUntil``; its Claims row holds the
  messageId and the current pop receipt. reclaimTask pushes the invisibility out; if
  nobody reclaims, the message reappears exactly when the claim expires and whoever
  claims ``r + 1`` first resolves ``r`` as claim-expired. Every running run has a
  Claims row, so the claim resolver also expires claims whose message was lost.
* When run ``r`` is resolved, ``settle`` fixes its message: made visible at once when
  the retry ``r + 1`` is pending (its text already says ``r + 1``), deleted otherwise;
  a fresh tip is queued when the old one cannot be used. Then the Claims row goes.
* Duplicate and stale tips are harmless: a claim is decided by the Task entity alone
  (conditional on its ETag), and a tip for a run that cannot be claimed answers 4xx,
  upon which the worker deletes it.
* Every message put with a tip is recorded (row ``tip:<messageId>`` in the task's
  partition, read with the task in one request), and a worker's claim must name such a
  message: a worker that pairs a tip with another message it holds is refused before
  that message is touched. A rewrite keeps the messageId, so the record holds for
  ``r + 1`` too.
* An **unscheduled** task (waiting for dependencies, see ``dependencies``) has no tip;
  it gets one when it is scheduled.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from azqueue import errors
from azqueue.config import Settings
from azqueue.events.outbox import Outbox
from azqueue.model import credentials, events
from azqueue.model import definition as definitions
from azqueue.model import task as model
from azqueue.model import timeutil
from azqueue.model.task import ReasonResolved, RunState, Task
from azqueue.model.priority import ORDER, Priority
from azqueue.model.tip import Tip, TipSigner
from azqueue.storage.account import StorageAccount
from azqueue.storage.claims import ClaimRecord, ClaimStore
from azqueue.storage.errors import MessageGone
from azqueue.storage.queues import Message, PendingQueues, Queues, decode_json, encode_json
from azqueue.storage.tasks import MAX_DEFINITION_CHARS, TaskStore, definition_size
from azqueue.storage.dependents import DependentStore
from azqueue.storage.groups import GroupStore
from azqueue.storage.workers import WorkerStore
from azqueue.service import paging
from azqueue.service.dependencies import Dependencies, gather_limited
from azqueue.service.signals import WorkSignals

log = logging.getLogger(__name__)

# A tip that reappears this close before takenUntil still expires the claim: the
# message's visibility is Azure's clock, takenUntil ours.
EXPIRY_TOLERANCE = timedelta(seconds=5)
# How long before the SAS URLs' reported expiry they actually stop working.
SAS_SLACK = timedelta(minutes=5)
RECLAIM_RECEIPT_ATTEMPTS = 3
# How long claimWork holds a received tip before it claims or releases it (a crash
# mid-claim leaves it invisible no longer than this).
CLAIM_WORK_HOLD = timedelta(seconds=30)
# How long a claim waits for the record of a tip that was put a moment ago.
TIP_RECORD_WAIT = timedelta(seconds=1)
# Claim credentials stay valid this long past takenUntil (the run's state still decides).
CREDENTIALS_AFTER_TAKEN_UNTIL = timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class TipClaim:
    """The message a worker polled, presented with claimTask."""

    message_id: str
    receipt: str
    signature: str


class QueueService:
    def __init__(self, settings: Settings, account: StorageAccount,
                 outbox: Outbox | None = None) -> None:
        self.settings = settings
        self.outbox = outbox
        self.account = account
        self.tasks = TaskStore(account)
        self.claims = ClaimStore(account)
        self.queues = Queues(account)
        self.pending = PendingQueues(account, self.queues)
        self.signer = TipSigner(settings.tip_secrets)
        self.workers = WorkerStore(account)
        self.groups = GroupStore(account)
        self.signals = WorkSignals()
        self.dependencies = Dependencies(
            self.tasks, DependentStore(account), self.queues, account.queue_name("dependencies"),
            timedelta(seconds=settings.dependencies_recovery_delay), self._schedule)
        self._bookkeeping: set[asyncio.Task[None]] = set()
        self.deadline_queue = account.queue_name("deadline")
        self.claim_timeout = timedelta(seconds=settings.claim_timeout)
        root = settings.root
        self.issuer = credentials.Principal(root.client_id, root.access_token, root.scopes)

    async def setup(self) -> None:
        """Create the tables and internal queues (idempotent)."""
        await self.tasks.ensure()
        await self.claims.ensure()
        await self.workers.ensure()
        await self.groups.ensure()
        await self.queues.ensure(self.deadline_queue)
        await self.dependencies.setup()

    # -- tasks -----------------------------------------------------------------------

    async def create_task(self, task_id: str, body: dict[str, Any],
                          authorize: Callable[[dict[str, Any]], None] = lambda d: None
                          ) -> dict[str, Any]:
        """Define and schedule a task; ``authorize`` sees the normalized definition first."""
        now = timeutil.utcnow()
        definition = definitions.normalize(task_id, body, now)
        if definition_size(definition) > MAX_DEFINITION_CHARS:
            raise errors.TooLarge(f"the task definition is larger than {MAX_DEFINITION_CHARS} "
                                  "characters as JSON; keep large data in artifacts")
        authorize(definition)
        new = None
        if definition["dependencies"]:
            existing = await self.tasks.find(task_id)
            if existing is not None:  # nothing of a repeated or refused definition is written
                return await self._defined_before(existing, definition)
            new = await self.dependencies.check_new(task_id, definition)
        waiting = new is not None and bool(new.waiting)
        task = model.new_task(task_id, definition, now, scheduled=not waiting)
        # The deadline trigger goes first: if we die after it, the resolver finds no
        # task at the deadline and drops it; if we died after the insert without it,
        # nothing would ever resolve the task.
        await self.queues.put(self.deadline_queue, encode_json({"taskId": task_id}),
                              visible_in=task.deadline - now, forever=True)
        defining = None
        if new is not None:
            if waiting:
                defining = await self.dependencies.begin_definition(task_id)
            await self.dependencies.track(task_id, definition, new)
        await self.groups.add(task.definition["taskGroupId"], task_id)
        trigger = await self.outbox.begin(task_id) if self.outbox is not None else None
        inserted = await self.tasks.insert(task, events.for_change if trigger else None)
        if inserted:
            self._fault_point()
        if self.outbox is not None and trigger is not None:
            # Published before the tip is queued, so task-defined and task-pending precede
            # any task-running of a worker that finds it.
            await self.outbox.finish(task_id, trigger)
        if not inserted:
            existing = await self.tasks.get(task_id)
            if existing.definition["taskGroupId"] != definition["taskGroupId"]:
                # The group row just written belongs to a definition that is refused.
                await self.groups.drop(definition["taskGroupId"], task_id)
            return await self._defined_before(existing, definition)
        if defining is not None:
            await self.dependencies.recheck(task)
            await self.dependencies.drop(defining)
            return (await self.tasks.get(task_id)).status()
        await self._queue_tip(task, 0)
        return task.status()

    async def _defined_before(self, existing: Task, definition: dict[str, Any]) -> dict[str, Any]:
        """The answer to a createTask for a task that exists: its status if the definition
        is the same (finishing what a failed first attempt may have left undone), else 409."""
        if dict(existing.definition) != definition:
            raise errors.Conflict(
                f"task {existing.task_id} already exists with a different definition; "
                "createTask is idempotent only for an identical definition: use a new taskId")
        last = existing.last_run
        if last is not None and last.state is RunState.PENDING:
            await self._queue_tip(existing, last.run_id)
        elif last is None and existing.dependencies:
            await self.dependencies.recheck(existing)
            existing = await self.tasks.get(existing.task_id)
        return existing.status()

    async def schedule_task(self, task_id: str,
                            authorize: Callable[[Task], None] = lambda t: None) -> dict[str, Any]:
        """Schedule an unscheduled task whatever its dependencies say (scheduleTask)."""
        loaded = await self.tasks.load(task_id)
        authorize(loaded[0])
        if not loaded[0].runs and timeutil.utcnow() >= loaded[0].deadline:
            raise errors.Conflict(f"task {task_id} passed its deadline "
                                  f"{loaded[0].definition['deadline']} and cannot be scheduled")
        return (await self._schedule(task_id, loaded, True)).status()

    async def _schedule(self, task_id: str, loaded: tuple[Task, str] | None,
                        requeue: bool) -> Task:
        """Give an unscheduled task its pending run 0 and queue its tip. With ``requeue``,
        a task that was pending already gets a tip again (the first may have been lost)."""
        now = timeutil.utcnow()
        before, after = await self._change(task_id, lambda t: model.schedule(t, now), loaded)
        last = after.last_run
        if last is not None and last.state is RunState.PENDING and (after is not before or requeue):
            await self._queue_tip(after, last.run_id)
        return after

    async def list_task_group(self, task_group_id: str, continuation: str | None,
                              limit: int) -> dict[str, Any]:
        """listTaskGroup: the tasks of a task group, a page at a time."""
        after = paging.after(continuation)
        page, last = await self.groups.page(task_group_id, after, limit)
        if not page and after is None:
            raise errors.NotFound(f"task group {task_group_id} has no tasks (or does not exist)")
        return {"taskGroupId": task_group_id,
                "tasks": await self._definitions_and_statuses(
                    page, lambda t: t.definition["taskGroupId"] == task_group_id),
                **({"continuationToken": paging.token(last)} if last is not None else {})}

    async def _definitions_and_statuses(self, task_ids: list[str], belongs: Callable[[Task], bool]
                                        ) -> list[dict[str, Any]]:
        """``{status, task}`` of each task that exists and ``belongs`` (a row may outlive a
        createTask that died, or be left by a refused one)."""
        found = await gather_limited(self.tasks.find(t) for t in task_ids)
        return [{"status": t.status(), "task": dict(t.definition)}
                for t in found if t is not None and belongs(t)]

    async def list_dependents(self, task_id: str, continuation: str | None,
                              limit: int) -> dict[str, Any]:
        """listDependentTasks: the tasks that depend on ``task_id``, a page at a time."""
        await self.tasks.get(task_id)
        page, last = await self.dependencies.dependents.page(task_id, paging.after(continuation),
                                                              limit)
        return {"taskId": task_id,
                "tasks": await self._definitions_and_statuses(
                    page, lambda t: task_id in t.dependencies),
                **({"continuationToken": paging.token(last)} if last is not None else {})}

    async def definition(self, task_id: str) -> dict[str, Any]:
        return dict((await self.tasks.get(task_id)).definition)

    async def status(self, task_id: str) -> dict[str, Any]:
        return (await self.tasks.get(task_id)).status()

    async def _queue_tip(self, task: Task, run_id: int) -> None:
        """Put a tip for run ``run_id`` and record its messageId, so that a claim can tell
        the task's own messages from others."""
        name = await self.pending.ensure(task.task_queue_id, task.priority)
        message = await self.queues.put(name, self.signer.tip(task.task_id, run_id).encode())
        # claimWork in this process reads the tip from the queue itself and needs no
        # record, so it may start on it while the record is written.
        self.signals.notify(task.task_queue_id, task.priority)
        await self.tasks.record_tip(task.task_id, message.message_id)

    async def _load_for_tip(self, task_id: str, tip: TipClaim) -> tuple[Task, str]:
        """The task, once ``tip.message_id`` is known to be one of its tips; InputError
        (and a fresh tip for a pending run) when it is not."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + TIP_RECORD_WAIT.total_seconds()
        while True:
            task, etag, known = await self.tasks.load_with_tip(task_id, tip.message_id)
            if known:
                return task, etag
            if loop.time() >= give_up:
                break
            await asyncio.sleep(0.1)  # a tip just put may not be recorded yet
        last = task.last_run
        if last is not None and last.state is RunState.PENDING:
            # In case the presented message is this task's tip whose record was lost.
            await self._queue_tip(task, last.run_id)
        raise errors.InputError(
            f"`messageId` {tip.message_id} does not carry a tip of task {task_id}: give the "
            "MessageId and PopReceipt of the message this tip came from, as received")

    async def _change(self, task_id: str, fn: Callable[[Task], Task],
                      loaded: tuple[Task, str] | None = None) -> tuple[Task, Task]:
        """``tasks.modify`` with the change's events written to the outbox and published,
        and a resolution passed on to the tasks that depend on this one."""
        watch = self.dependencies.watch(task_id)
        if self.outbox is None:
            before, after = await self.tasks.modify(task_id, fn, loaded,
                                                    before_write=watch.before_write)
            if after is not before:
                self._fault_point()
        else:
            trigger = await self.outbox.begin(task_id)
            try:
                before, after = await self.tasks.modify(task_id, fn, loaded, events.for_change,
                                                        watch.before_write)
            except errors.QueueError as e:
                # A decision refused the change and nothing was written. A storage failure
                # may have come after the write, though: then the trigger stays for recovery.
                if not isinstance(e, errors.StorageError):
                    await self.outbox.discard(trigger)
                raise
            if after is not before:
                self._fault_point()
            # With no change, this publishes what an earlier change may have left behind
            # (one whose answer was lost after it was stored).
            await self.outbox.finish(task_id, trigger)
        await watch.after(before, after)
        return before, after

    def _fault_point(self) -> None:
        if self.settings.crash_after_commit:
            log.critical("AZQUEUE_TEST_CRASH_AFTER_COMMIT: exiting after a stored change")
            os._exit(70)

    # -- polling and claims ----------------------------------------------------------

    async def poll_task_urls(self, provisioner_id: str, worker_type: str) -> dict[str, Any]:
        now = timeutil.utcnow()
        expires = now + timedelta(seconds=self.settings.sas_lifetime)
        urls = await self.pending.signed_urls(f"{provisioner_id}/{worker_type}",
                                              start=now - SAS_SLACK, expiry=expires + SAS_SLACK)
        return {"expires": timeutil.fmt(expires),
                "queues": [{"signedPollUrl": u.signed_poll_url,
                            "signedDeleteUrl": u.signed_delete_url} for u in urls]}

    async def claim_task(self, task_id: str, run_id: int, worker_group: str, worker_id: str,
                         tip: TipClaim | None = None,
                         authorize: Callable[[Task], None] = lambda t: None,
                         tip_read_here: bool = False) -> dict[str, Any]:
        """Claim a run; ``authorize`` sees the task before anything changes.

        A ``tip`` presented by a worker must name a message recorded as one of the task's
        tips, so that a worker mixing up messages cannot rewrite another task's tip;
        ``tip_read_here`` (claimWork, which read the message itself) skips that check."""
        now = timeutil.utcnow()
        tolerance = EXPIRY_TOLERANCE if tip else timedelta(0)

        def decide(task: Task) -> Task:
            return model.claim(task, run_id, worker_group, worker_id, now, self.claim_timeout,
                               tolerance)

        if tip and not self.signer.verify(task_id, run_id, tip.signature):
            raise errors.InputError(
                f"`signature` does not match task {task_id} run {run_id}: the message was altered "
                "or not issued by this queue; delete it and poll again")
        if tip and not tip_read_here:
            loaded = await self._load_for_tip(task_id, tip)
        else:
            loaded = await self.tasks.load(task_id)
        current = loaded[0]
        authorize(current)
        if model.is_claimed_by(current, run_id, worker_group, worker_id):
            return await self._repeated_claim(current, run_id, tip)
        try:
            decide(current)  # refuse early, before touching the message
        except errors.Conflict:
            if tip:
                await self._repair_orphaned_tip(current, run_id)
            raise

        receipt = ""
        queue_name = ""
        if tip:
            queue_name = self.pending.name(current.task_queue_id, current.priority)
            try:
                receipt = await self.queues.update(
                    queue_name, tip.message_id, tip.receipt, visible_in=self.claim_timeout,
                    text=self.signer.tip(task_id, run_id + 1).encode())
            except MessageGone:
                raise errors.InputError(
                    f"`messageId` and `receipt` do not name a message you hold in the queue of "
                    f"task {task_id} ({current.task_queue_id}, {current.priority}): give the "
                    "MessageId and PopReceipt of the message this tip came from, as received") from None
        try:
            before, after = await self._change(task_id, decide, loaded)
        except errors.Conflict:
            if tip:
                await self._drop_message(queue_name, tip.message_id, receipt)
            raise
        except BaseException:
            if tip:  # nothing is claimed: give run run_id its tip back, visible now
                await self._restore_tip(queue_name, tip.message_id, receipt, task_id, run_id)
            raise
        if not model.is_claimed_by(after, run_id, worker_group, worker_id):
            # The claim expired run run_id - 1 and no retries were left: the task is resolved.
            if tip:
                await self._drop_message(queue_name, tip.message_id, receipt)
            await self.settle(after, run_id - 1)
            raise errors.Conflict(f"run {run_id - 1} of task {task_id} expired and no retries "
                                  "are left: the task is resolved exception")
        taken_until = after.runs[run_id].taken_until
        assert taken_until is not None
        await self.claims.put(ClaimRecord(task_id, run_id, taken_until, queue_name,
                                          tip.message_id if tip else "", receipt))
        if run_id > 0 and before.runs[run_id - 1].state is RunState.RUNNING:
            # This claim expired the previous run, whose message it now holds.
            await self.claims.delete(task_id, run_id - 1)
        return self._claim_answer(after, run_id)

    async def _repeated_claim(self, task: Task, run_id: int,
                              tip: TipClaim | None) -> dict[str, Any]:
        """The caller already holds this run: answer as before, unless it presents another
        message than the one its claim took (a duplicate tip, which it should delete)."""
        record = await self.claims.get(task.task_id, run_id)
        if tip and record is not None and record.message_id != tip.message_id:
            raise errors.Conflict(
                f"run {run_id} of task {task.task_id} is already claimed by you through "
                "another message; this message is a duplicate tip: delete it")
        if record is None:
            # The first claim died before recording itself. With its tip, we know the
            # message but not its new receipt: the claim resolver will expire the claim
            # if nobody reclaims it, and the message itself is deleted when it reappears.
            run = task.runs[run_id]
            assert run.taken_until is not None
            queue_name = self.pending.name(task.task_queue_id, task.priority) if tip else ""
            await self.claims.put(ClaimRecord(task.task_id, run_id, run.taken_until, queue_name,
                                              tip.message_id if tip else ""))
        return self._claim_answer(task, run_id)

    async def _restore_tip(self, queue_name: str, message_id: str, receipt: str,
                           task_id: str, run_id: int) -> None:
        try:
            await self.queues.update(queue_name, message_id, receipt, timedelta(0),
                                     text=self.signer.tip(task_id, run_id).encode())
        except Exception as e:  # best effort: the tip reappears at takenUntil regardless
            log.warning("could not give task %s run %d its tip back: %s", task_id, run_id, e)

    async def _repair_orphaned_tip(self, task: Task, run_id: int) -> None:
        """A tip for ``r + 1`` while run ``r`` is still pending was rewritten by a claim that
        died before it was recorded; the worker will delete it, so queue a fresh tip for ``r``."""
        last = task.last_run
        if last is not None and last.state is RunState.PENDING and run_id == last.run_id + 1:
            log.warning("task %s: re-queuing run %d, whose claim was never completed",
                        task.task_id, last.run_id)
            await self._queue_tip(task, last.run_id)

    async def _drop_message(self, queue_name: str, message_id: str, receipt: str) -> None:
        try:
            await self.queues.delete(queue_name, message_id, receipt)
        except MessageGone:
            pass

    def _claim_answer(self, task: Task, run_id: int) -> dict[str, Any]:
        return {**self._run_answer(task, run_id), "task": dict(task.definition)}

    def _run_answer(self, task: Task, run_id: int) -> dict[str, Any]:
        """Status, the claim, and temporary credentials for working on the run until shortly
        after ``takenUntil`` (claimTask and reclaimTask answers)."""
        run = task.runs[run_id]
        assert run.taken_until is not None and run.worker_group and run.worker_id
        name = (f"task-client/{task.task_id}/{run_id}/on/{run.worker_group}/{run.worker_id}"
                f"/until/{int(run.taken_until.timestamp())}")
        granted = [f"queue:reclaim-task:{task.task_id}/{run_id}",
                   f"queue:resolve-task:{task.task_id}/{run_id}",
                   f"queue:create-artifact:{task.task_id}/{run_id}",
                   *task.definition["scopes"]]
        creds = credentials.issue(self.issuer, granted, timeutil.utcnow(),
                                  run.taken_until + CREDENTIALS_AFTER_TAKEN_UNTIL, name)
        return {"status": task.status(), "runId": run_id, "workerGroup": run.worker_group,
                "workerId": run.worker_id, "takenUntil": timeutil.fmt(run.taken_until),
                "credentials": creds}

    async def reclaim_task(self, task_id: str, run_id: int) -> dict[str, Any]:
        now = timeutil.utcnow()

        def decide(task: Task) -> Task:
            return model.reclaim(task, run_id, now, self.claim_timeout)

        loaded = await self.tasks.load(task_id)
        decide(loaded[0])  # refuse early
        record = await self.claims.get(task_id, run_id)
        receipt = ""
        if record is not None and record.has_message:
            for _ in range(RECLAIM_RECEIPT_ATTEMPTS):
                try:
                    receipt = await self.queues.update(record.queue_name, record.message_id,
                                                       record.pop_receipt, self.claim_timeout)
                    break
                except MessageGone:
                    # A concurrent reclaim may have moved the receipt on; else the claim lapsed.
                    fresh = await self.claims.get(task_id, run_id)
                    if fresh is None or fresh.pop_receipt == record.pop_receipt:
                        raise errors.ClaimLost(
                            f"the claim on run {run_id} of task {task_id} expired: its message "
                            "became visible again and the run will be retried; stop working on "
                            "it") from None
                    record = fresh
            else:
                raise errors.ClaimLost(f"run {run_id} of task {task_id} is being reclaimed "
                                       "concurrently; try again")
        try:
            _, after = await self.tasks.modify(task_id, decide, loaded)
        except errors.Conflict:
            if record is not None and receipt:
                await self._release(record.queue_name, record.message_id, receipt)
            raise
        taken_until = after.runs[run_id].taken_until
        assert taken_until is not None
        if record is None:
            record = ClaimRecord(task_id, run_id, taken_until)
        await self.claims.put(replace(record, taken_until=taken_until,
                                      pop_receipt=receipt or record.pop_receipt))
        return self._run_answer(after, run_id)

    async def _release(self, queue_name: str, message_id: str, receipt: str) -> None:
        """Make a message visible again at once (best effort)."""
        try:
            await self.queues.update(queue_name, message_id, receipt, timedelta(0))
        except MessageGone:
            pass
        except Exception as e:  # it becomes visible by itself when its hold ends
            log.warning("could not release message %s of %s: %s", message_id, queue_name, e)

    async def claim_work(self, task_queue_id: str, worker_group: str, worker_id: str,
                         count: int, connected: Callable[[], bool]) -> list[dict[str, Any]]:
        """Claim up to ``count`` tasks, waiting up to ``claim_work_wait`` seconds for some.

        Polls the task queue's pending queues in priority order and claims each tip
        through ``claim_task``, exactly like a SAS worker, so these claims expire, reclaim
        and retry like any other. Tips that cannot be claimed are deleted (the worker
        rule of document 000); tips not needed or not handled are released at once.
        """
        loop = asyncio.get_running_loop()
        end = loop.time() + self.settings.claim_work_wait
        for priority in ORDER:
            await self.pending.ensure(task_queue_id, priority)
        claims: list[dict[str, Any]] = []
        priorities = ORDER
        while True:
            try:
                await self._claim_from_queues(task_queue_id, worker_group, worker_id, count,
                                              claims, connected, priorities)
            except Exception:
                if not claims:
                    raise
                # Answer with the claims already made rather than strand them.
                log.exception("claimWork on %s stopped early", task_queue_id)
                break
            remaining = end - loop.time()
            if claims or remaining <= 0 or not connected():
                break
            woken = await self.signals.wait(task_queue_id,
                                            min(self.settings.claim_work_poll_interval, remaining))
            if woken is not None and not connected():
                self.signals.notify(task_queue_id, woken)  # pass it on to a live caller
            # Woken for a tip of priority p: the queues above p were empty a moment ago and
            # a tip put there in this process would have woken us for it, so start at p.
            # A regular poll (timeout) looks at every queue again.
            priorities = ORDER[woken.rank:] if woken is not None else ORDER
        # Recording the worker is bookkeeping: it must not delay the answer.
        record = asyncio.create_task(self.workers.seen(
            task_queue_id, worker_group, worker_id, timeutil.utcnow(),
            [(c["status"]["taskId"], c["runId"]) for c in claims]))
        self._bookkeeping.add(record)
        record.add_done_callback(self._bookkeeping_done)
        return claims

    async def close(self) -> None:
        """Let in-flight bookkeeping finish (briefly) before the storage clients close."""
        if self._bookkeeping:
            await asyncio.wait(self._bookkeeping, timeout=5)
        await self.dependencies.close()

    def _bookkeeping_done(self, task: asyncio.Task[None]) -> None:
        self._bookkeeping.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("could not record a worker: %s", task.exception())

    async def _claim_from_queues(self, task_queue_id: str, worker_group: str, worker_id: str,
                                 count: int, claims: list[dict[str, Any]],
                                 connected: Callable[[], bool],
                                 priorities: tuple[Priority, ...] = ORDER) -> None:
        for priority in priorities:
            wanted = count - len(claims)
            if wanted <= 0 or not connected():
                return
            name = self.pending.name(task_queue_id, priority)
            messages = await self.queues.receive(name, CLAIM_WORK_HOLD, limit=min(wanted, 32))
            for i, message in enumerate(messages):
                if len(claims) >= count or not connected():
                    for rest in messages[i:]:
                        await self._release(name, rest.message_id, rest.pop_receipt)
                    return
                try:
                    tip = Tip.decode(message.text)
                except ValueError:
                    log.warning("deleting message %s from %s: not a tip", message.message_id, name)
                    await self._drop_message(name, message.message_id, message.pop_receipt)
                    continue
                try:
                    claims.append(await self.claim_task(
                        tip.task_id, tip.run_id, worker_group, worker_id,
                        TipClaim(message.message_id, message.pop_receipt, tip.signature),
                        tip_read_here=True))
                except (errors.Conflict, errors.InputError, errors.NotFound):
                    await self._drop_message(name, message.message_id, message.pop_receipt)
                except Exception as e:
                    # Not this caller's fault, and the claims already made are its own:
                    # give this tip back and go on with the others.
                    log.warning("claimWork could not claim %s/%d: %s", tip.task_id, tip.run_id, e)
                    await self._release(name, message.message_id, message.pop_receipt)

    # -- resolution ------------------------------------------------------------------

    async def report(self, task_id: str, run_id: int, state: RunState,
                     reason: ReasonResolved) -> dict[str, Any]:
        now = timeutil.utcnow()
        _, after = await self._change(
            task_id, lambda t: model.resolve(t, run_id, state, reason, now))
        await self.settle(after, run_id)
        return after.status()

    async def cancel_task(self, task_id: str,
                          authorize: Callable[[Task], None] = lambda t: None) -> dict[str, Any]:
        """Resolve the task's unresolved run exception ``canceled``; ``authorize`` sees the
        task first. A resolved task answers its status unchanged."""
        now = timeutil.utcnow()
        loaded = await self.tasks.load(task_id)
        authorize(loaded[0])
        _, after = await self._change(task_id, lambda t: model.cancel(t, now), loaded)
        last = after.last_run
        if last is not None:
            # A running run's tip is deleted with its receipt; a pending run's tip stays
            # until a worker finds it, is refused (409) and deletes it.
            await self.settle(after, last.run_id)
        return after.status()

    async def settle(self, task: Task, run_id: int) -> None:
        """Bring run ``run_id``'s message and Claims row in line with its resolution.

        Idempotent, and a no-op while the run is unresolved, so every path that resolved
        a run (or found it resolved) may call it.
        """
        if run_id < 0 or run_id >= len(task.runs) or not task.runs[run_id].state.resolved:
            return
        record = await self.claims.get(task.task_id, run_id)
        if record is None:
            return  # settled already
        retry = task.runs[run_id + 1] if run_id + 1 < len(task.runs) else None
        retry_pending = retry is not None and retry.state is RunState.PENDING
        tip_ready = False
        if record.has_message:
            try:
                if retry_pending:
                    await self.queues.update(record.queue_name, record.message_id,
                                             record.pop_receipt, timedelta(0))
                    self.signals.notify(task.task_queue_id, task.priority)
                    tip_ready = True
                else:
                    await self.queues.delete(record.queue_name, record.message_id,
                                             record.pop_receipt)
            except MessageGone:
                pass
        if retry_pending and not tip_ready:
            await self._queue_tip(task, run_id + 1)
        await self.claims.delete(task.task_id, run_id)

    # -- resolver steps --------------------------------------------------------------

    async def expire_claim(self, record: ClaimRecord) -> bool:
        """Resolve the claim of ``record`` if it expired; True if this call resolved it."""
        now = timeutil.utcnow()
        try:
            before, after = await self._change(
                record.task_id, lambda t: model.expire_claim(t, record.run_id, now))
        except errors.NotFound:
            await self.claims.delete(record.task_id, record.run_id)
            return False
        run = after.runs[record.run_id] if record.run_id < len(after.runs) else None
        if run is not None and run.state is RunState.RUNNING and run.taken_until is not None:
            if run.taken_until != record.taken_until:  # a reclaim whose row write was lost
                await self.claims.extend(record.task_id, record.run_id, run.taken_until)
            return False
        await self.settle(after, record.run_id)
        return after is not before

    async def expired_claims(self) -> list[ClaimRecord]:
        now = timeutil.utcnow()
        return [r async for r in self.claims.expired(now)]

    async def resolve_deadlines(self, invisible_for: timedelta) -> int:
        """Handle the deadline messages that are due; the number of messages handled."""
        messages = await self.queues.receive(self.deadline_queue, invisible_for)
        for message in messages:
            now = timeutil.utcnow()
            try:
                task_id = str(decode_json(message.text)["taskId"])
            except (ValueError, KeyError):
                log.error("dropping malformed message %s from %s", message.message_id,
                          self.deadline_queue)
                await self._drop_message(self.deadline_queue, message.message_id,
                                         message.pop_receipt)
                continue
            try:
                before, after = await self._change(
                    task_id, lambda t: model.resolve_deadline(t, now))
            except errors.NotFound:
                pass  # the task was never written, or has expired
            else:
                if after.deadline > now:
                    await self._postpone(message, after.deadline - now)
                    continue
                if after is not before:
                    log.info("task %s passed its deadline: resolved deadline-exceeded", task_id)
                await self.settle(after, len(after.runs) - 1)
            await self._drop_message(self.deadline_queue, message.message_id, message.pop_receipt)
        return len(messages)

    async def _postpone(self, message: Message, delay: timedelta) -> None:
        try:
            await self.queues.update(message.queue_name, message.message_id, message.pop_receipt,
                                     delay)
        except MessageGone:
            pass

    async def check_storage(self) -> None:
        """Raise unless the Tasks table answers."""
        try:
            await self.tasks.get("heartbeat")
        except errors.NotFound:
            pass

    def storage_requests(self) -> dict[str, int]:
        return dict(self.account.requests)
