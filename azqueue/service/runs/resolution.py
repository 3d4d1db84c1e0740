"""Resolution: reports, cancelTask, and the resolvers' steps (claim expiry, deadlines).

Every path resolves a run through a transition of ``model.task`` written by
``Changes.change`` (conditional on the ETag), then ``Changes.settle`` deletes or releases
the message the run held. A report from the worker that this process saw claim the run
starts from this process's copy of the task, so it costs two storage requests: the
write and the message's delete, which goes out once the report is answered.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from azqueue import errors
from azqueue.model import task as model
from azqueue.model import timeutil
from azqueue.model.task import ReasonResolved, RunState, Task
from azqueue.service.common.gathering import gather_limited
from azqueue.service.runs import triggers
from azqueue.service.runs.cache import TaskCache
from azqueue.service.runs.changes import Changes
from azqueue.service.runs.repair import Repair
from azqueue.storage.claims import ClaimRecord, ClaimStore
from azqueue.storage.queues import Message, Queues
from azqueue.storage.tasks import TaskStore

log = logging.getLogger(__name__)

# A trigger due this soon is looked at with those due now (its message surfaced for them).
DUE_SLACK = timedelta(seconds=1)


@dataclass(slots=True)
class _Surfaced:
    """A deadline trigger message received: its triggers due now, and those to be looked at
    later (the due ones that need another look are added)."""

    message: Message
    found: triggers.Triggers
    due: list[triggers.Entry]
    later: list[triggers.Entry] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Resolution:
    """Resolving runs: workers' reports, cancelTask, expired claims and deadlines.

    ``claim_store``: the claim index's rows (``claimindex``); ``deadline_queue``:
    the internal queue of deadline triggers (``triggers``; one that surfaces before the
    deadline is ``repair``'s look at the task), ``legacy_deadline_queue`` that of
    earlier releases."""

    tasks: TaskStore
    queues: Queues
    cache: TaskCache
    changes: Changes
    claim_store: ClaimStore
    deadline_queue: str
    legacy_deadline_queue: str
    repair: Repair

    async def setup(self) -> None:
        """Create the deadline queues (idempotent)."""
        await self.queues.ensure(self.deadline_queue)
        await self.queues.ensure(self.legacy_deadline_queue)

    async def report(self, task_id: str, run_id: int, state: RunState,
                     reason: ReasonResolved) -> dict[str, Any]:
        """reportCompleted, reportFailed, reportException."""
        now = timeutil.utcnow()
        cached = self.cache.get(task_id)
        change = await self.changes.change(
            task_id, lambda t: model.resolve(t, run_id, state, reason, now), cached,
            speculative=cached is not None)
        # The report is stored: its answer waits for nothing more (unless a burst of
        # reports has as many messages being settled as may be).
        await self.changes.settle_soon(change, run_id)
        return change.after.status()

    async def cancel_task(self, task_id: str,
                          authorize: Callable[[Task], None] = lambda t: None) -> dict[str, Any]:
        """Resolve the task's unresolved run exception ``canceled``; ``authorize`` sees the
        task first. A resolved task answers its status unchanged."""
        now = timeutil.utcnow()
        loaded = await self.tasks.load(task_id)
        authorize(loaded.task)
        change = await self.changes.change(task_id, lambda t: model.cancel(t, now), loaded)
        last = change.after.last_run
        if last is not None:
            # A running run's tip is deleted with its receipt; a pending run's tip stays
            # until a worker finds it, is refused (409) and deletes it.
            await self.changes.settle(change, last.run_id)
        return change.after.status()

    # -- resolver steps --------------------------------------------------------------

    async def expired_claims(self) -> tuple[list[ClaimRecord], datetime | None]:
        """The claim index rows whose ``takenUntil`` has passed, and the earliest
        ``takenUntil`` of the others (None if there are none): one scan."""
        now = timeutil.utcnow()
        expired: list[ClaimRecord] = []
        earliest: datetime | None = None
        async for record in self.claim_store.every():
            if record.taken_until < now:
                expired.append(record)
            elif earliest is None or record.taken_until < earliest:
                earliest = record.taken_until
        return expired, earliest

    async def expire_claim(self, record: ClaimRecord) -> bool:
        """Resolve the claim of ``record`` if it expired; True if this call resolved it."""
        store = self.claim_store
        now = timeutil.utcnow()
        try:
            change = await self.changes.change(
                record.task_id, lambda t: model.expire_claim(t, record.run_id, now))
        except errors.NotFound:
            await store.delete(record.task_id, record.run_id)
            return False
        after = change.after
        run = after.runs[record.run_id] if record.run_id < len(after.runs) else None
        if run is not None and run.state is RunState.RUNNING and run.taken_until is not None:
            if run.taken_until != record.taken_until:  # a reclaim whose row write was lost
                await store.put(ClaimRecord(record.task_id, record.run_id, run.taken_until,
                                            after.task_queue_id))
            return False
        if not change.changed:  # resolved by other means: the row is left over
            await store.delete(record.task_id, record.run_id)
            return False
        await self.changes.settle(change, record.run_id)
        return True

    async def resolve_deadlines(self, invisible_for: timedelta, legacy: bool = False) -> int:
        """Handle the deadline triggers that are due (``triggers``; with ``legacy``, those
        of earlier releases' queue); the number of tasks looked at. The due triggers of
        all the messages one receive returned are looked at together, ``MAX_PARALLEL`` at a
        time, taken in turn from each message, so that neither a message of many tasks
        nor many messages of one tenant's burst hold up the rest one after another. A task
        that fails is looked at again after ``invisible_for``; the others are handled
        meanwhile. Once half of ``invisible_for`` has passed, the triggers not yet looked
        at are left to their message, visible again at once (before it reappears by
        itself to be handled twice)."""
        name = self.legacy_deadline_queue if legacy else self.deadline_queue
        loop = asyncio.get_running_loop()
        stop = loop.time() + invisible_for.total_seconds() / 2
        now = timeutil.utcnow()
        surfaced = [s for m in await self.queues.receive(name, invisible_for)
                    if (s := await self._surfaced(m, now)) is not None]
        in_turn = [(s, e) for row in itertools.zip_longest(*(s.due for s in surfaced))
                   for s, e in zip(surfaced, row) if e is not None]
        late: list[triggers.Entry] = []

        async def look(trigger: _Surfaced, entry: triggers.Entry) -> datetime | None:
            if loop.time() > stop:
                late.append(entry)
                return entry.due  # still due: its message is visible again at once
            return await self._look(entry, trigger.found.put, now, invisible_for)

        looks = await gather_limited(look(s, e) for s, e in in_turn)
        for (trigger, entry), at in zip(in_turn, looks):
            if at is not None:
                trigger.later.append(replace(entry, due=at))
        if late:
            log.info("deadline triggers take long to handle: %d of this receive are left for "
                     "the next", len(late))
        await gather_limited(self._rewrite_or_drop(s) for s in surfaced)
        return len(in_turn) - len(late)

    async def _surfaced(self, message: Message, now: datetime) -> _Surfaced | None:
        """A trigger message that surfaced, its due triggers apart; None (and the message
        dropped) if it is not a trigger message."""
        try:
            found = triggers.parse(message.text)
        except ValueError:
            log.error("dropping malformed message %s from %s", message.message_id,
                      message.queue_name)
            try:
                await self.queues.drop(message.queue_name, message.message_id,
                                       message.pop_receipt)
            except errors.TRANSIENT as e:
                log.warning("could not drop malformed message %s: %s", message.message_id, e)
            return None
        return _Surfaced(message, found,
                         [e for e in found.entries if e.due <= now + DUE_SLACK],
                         [e for e in found.entries if e.due > now + DUE_SLACK])

    async def _rewrite_or_drop(self, surfaced: _Surfaced) -> None:
        """The message, once its due triggers were looked at: it then holds the triggers
        still to be looked at, visible at the first next look, or is deleted. If that
        fails, it comes back as it was once its invisibility ends (looking twice is
        harmless)."""
        message, found, left = surfaced.message, surfaced.found, surfaced.later
        try:
            if not left:
                await self.queues.drop(message.queue_name, message.message_id,
                                       message.pop_receipt)
                return
            # An earlier release's message (of one task, put None) keeps its form.
            text = None if found.put is None else triggers.encode(left, found.put)
            await self.queues.postpone(message.queue_name, message.message_id,
                                       message.pop_receipt, triggers.visible_in(left),
                                       text=text)
        except errors.TRANSIENT as e:
            log.warning("could not handle deadline message %s (%s); it comes back when its "
                        "invisibility ends", message.message_id, e)
        except Exception:
            log.exception("handling deadline message %s failed; it comes back when its "
                          "invisibility ends", message.message_id)

    async def _look(self, entry: triggers.Entry, put: datetime | None, now: datetime,
                    invisible_for: timedelta) -> datetime | None:
        """A task's trigger, due: before the task's deadline it is the task's tip repair
        check (``repair``), to be made again at the next look; at the deadline it
        resolves the task. When to look again; None once the trigger has done its work
        (or is not the task's: a refused createTask's, whose deadline is another; or its
        task was not stored, ``triggers.STORE_GRACE`` after the message was ``put``). A
        failure is logged, and the task looked at again after ``invisible_for``."""
        task_id, deadline = entry.task_id, entry.deadline
        try:
            try:
                stored = await self.tasks.load(task_id)
            except errors.NotFound:
                # Not stored yet (a createTask sharing the message still storing it), never
                # stored, or expired.
                stored_by = None if put is None else put + triggers.STORE_GRACE
                return stored_by if stored_by is not None and now < stored_by else None
            task_deadline = stored.task.deadline
            if deadline is not None and timeutil.fmt(deadline) != timeutil.fmt(task_deadline):
                log.info("dropping a deadline trigger of task %s for %s: the task's deadline "
                         "is %s", task_id, timeutil.fmt(deadline), timeutil.fmt(task_deadline))
                return None
            if task_deadline > now:
                check = await self.repair.look(stored, now)
                return None if check is None else min(check, task_deadline)
            change = await self.changes.change(
                task_id, lambda t: model.resolve_deadline(t, now), stored)
            if change.changed:
                log.info("task %s passed its deadline: resolved deadline-exceeded", task_id)
            await self.changes.settle(change, len(change.after.runs) - 1)
        except errors.TRANSIENT as e:
            log.warning("could not handle the deadline trigger of task %s (%s); again in %ds",
                        task_id, e, invisible_for.total_seconds())
            return now + invisible_for
        except Exception:
            log.exception("handling the deadline trigger of task %s failed; again in %ds",
                          task_id, invisible_for.total_seconds())
            return now + invisible_for
        return None
