"""Task definitions: createTask and scheduleTask, and what reads definitions and statuses
(task, status, listTaskGroup's page of tasks, listDependentTasks).

createTask writes the task's deadline trigger (``triggers``, which also triggers the tip
repair, ``repair``), its task group's member row (a task whose schedulerId is not its
group's, or new to a sealed group, is refused with 409 before: ``groupowner``,
``groups``), the dependents rows of its dependencies (``dependencies``) and run 0's tip
(``tips``, where the Azure queue invariants are written), in as few round trips as what
must precede what allows:

* a task that is its own group and names no dependencies (Taskcluster's default): its
  trigger, its tip and the task at once, in one round trip, the tip recorded after the
  answer;
* a member of a group: the group's records, read; then its trigger, member row and tip;
  then the task, whose insert records the tip (three round trips). The member row is
  written only once the records allowed it: a member row of no task could hold back
  the group's resolution (``outbox``) while it is young;
* a task that names dependencies: its trigger and dependents rows while it reads its
  dependencies (and whether it is stored already, and its group's records); then, if
  what it depends on is resolved, its tip and the task at once (two round trips; a
  member of a group writes its member row and tip first, three), else its definition
  trigger, wait rows, marks and member row (``Dependencies.track``), then the task with
  no tip while its dependencies are read again (three; read once more after the answer,
  ``Dependencies`` says why; waiting for more than ``READ_BESIDE``, read once, after the
  insert, before the answer).

The rows come before the task, so that a listing of its group or of a dependency's
dependents misses no stored task. A definition its reads refuse takes back its trigger,
and its dependents rows under dependencies that do not exist (those under dependencies
that exist may be another createTask's of the same taskId; they go with their
dependency, and listings show only the tasks that are stored and belong). A claimWork
caller waiting in this process is handed the tip as soon as its put is answered, and
rewrites it while the task is inserted (``Claims.claim``). A repeated createTask with
the same definition finishes what a first attempt that failed may have left undone and
answers the same; a different definition is 409, and leaves nothing that works later
(its deadline trigger is withdrawn, its group row and tip deleted). scheduleTask, and a
dependency resolved, give an unscheduled task its pending run 0 and its tip
(``schedule``, the callback ``Dependencies`` calls).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from azqueue import errors
from azqueue.events.outbox import EventOutbox
from azqueue.model import definition as definitions
from azqueue.model import events
from azqueue.model import task as model
from azqueue.model import timeutil
from azqueue.model.task import RunState, Task
from azqueue.service.common import paging
from azqueue.service.common.gathering import MAX_PARALLEL, gather_limited
from azqueue.service.dispatch.tips import Prewritten, Tips, live
from azqueue.service.runs.changes import Changes
from azqueue.service.runs.claims import PREWRITTEN_FRESH, TIP_WAIT
from azqueue.service.runs.dependencies import Dependencies, NewTask
from azqueue.service.runs.triggers import DeadlineTriggers, Trigger
from azqueue.service.tasks.groupowner import GroupOwners
from azqueue.service.workers.workers import WorkerInfo
from azqueue.storage.groups import GroupStore
from azqueue.storage.queues import Message
from azqueue.storage.taskrows import MAX_DEFINITION_CHARS, MAX_TIPS, Stored, definition_size
from azqueue.storage.tasks import TaskStore

log = logging.getLogger(__name__)

# A task naming at most this many dependencies writes their dependents rows while it reads
# them (``_write_early``); one naming more, once they were all found to exist, so that a
# definition refused for a dependency that does not exist costs at most this many writes
# (and as many deletes) beside its reads.
EARLY_ROWS = MAX_PARALLEL

_T = TypeVar("_T")

# A task waiting for at most this many dependencies reads them beside its insert
# (``_create_waiting``): a round trip's worth (``MAX_PARALLEL``).
READ_BESIDE = MAX_PARALLEL

# How long closing waits for what createTask finishes in the background (``close``).
CLOSE_WAIT = 10.0


@dataclass(frozen=True, slots=True)
class _Written:
    """What createTask wrote: the task (None if a task of that id was there), when it was
    stored and when run 0's tip became visible (on the event loop's clock), the tip (None
    if the task waits for dependencies), its deadline trigger, and whether a claimWork
    caller here took the tip."""

    stored: Stored | None
    stored_at: float
    tip: Message | None
    tip_visible: float
    deadline: Trigger | None
    handed: bool


@dataclass(frozen=True, slots=True)
class _Early:
    """What createTask wrote before the task (``Definitions._write_early``): the deadline
    trigger (None if it wrote none), the dependencies it wrote a dependents row for, and
    run 0's tip as ``_put_tip`` gives it (None if it put none)."""

    deadline: Trigger | None
    linked: tuple[str, ...]
    tip: Message | None
    tip_visible: float
    handed: bool

    def written(self, stored: Stored | None, stored_at: float) -> _Written:
        return _Written(stored, stored_at, self.tip, self.tip_visible, self.deadline,
                        self.handed)


async def _done(value: _T) -> _T:
    return value


@dataclass(frozen=True, slots=True)
class Definitions:
    """Defining and scheduling tasks, and reading their definitions and statuses.

    ``triggers`` stores the tasks' deadline triggers, each to surface first
    ``repair_delay`` after createTask (the tip repair's look) or at the deadline."""

    tasks: TaskStore
    groups: GroupStore
    owners: GroupOwners
    triggers: DeadlineTriggers
    repair_delay: timedelta
    dependencies: Dependencies
    tips: Tips
    changes: Changes
    outbox: EventOutbox
    workerinfo: WorkerInfo
    claim_timeout: timedelta
    # What createTask finishes after its task was stored, in the background: a tip whose
    # queue was being deleted, a deadline trigger that failed, a waiting task's last read
    # of its dependencies and its definition trigger's delete (``_queue_soon``,
    # ``_trigger_soon``, ``_recheck_soon``, ``_drop_soon``).
    _finishing: set[asyncio.Task[None]] = field(default_factory=set)

    async def setup(self) -> None:
        """Create the tasks and groups tables (idempotent)."""
        await self.tasks.ensure()
        await self.groups.ensure()

    def _finish_later(self, job: Coroutine[Any, Any, None]) -> None:
        """Run ``job`` in the background, outside the request's context and time, for
        ``close`` to wait for."""
        task = asyncio.get_running_loop().create_task(job, context=contextvars.Context())
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def close(self) -> None:
        """Wait for what createTask finishes in the background (at most ``CLOSE_WAIT``):
        what is left then is repaired (the tip repair, the dependency resolver) or, for a
        deadline trigger, put again by the client's repeat of its failed createTask."""
        if self._finishing:
            await asyncio.wait(self._finishing, timeout=CLOSE_WAIT)

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
        own = definition["taskGroupId"] == task_id
        if own and not definition["dependencies"]:
            return await self._create_alone(model.new_task(task_id, definition, now),
                                            definition, now)
        if definition["dependencies"]:
            return await self._create_with_dependencies(task_id, definition, now)
        # A member of a group: its records decide before anything is written.
        await self._check_group_open(task_id, definition)
        task = model.new_task(task_id, definition, now)
        inserting = self.changes.cache.insert_begins(task)
        stored = None
        try:
            early = await self._write_early(task, now, trigger=True, member=True, tip=True,
                                            inserting=inserting)
            stored, stored_at = await self._insert(task, definition, early.tip,
                                                   self._taking_back(early))
        finally:
            self.changes.cache.insert_ends(task_id, inserting, stored)
        return await self._answer(task, definition, early.written(stored, stored_at), False)

    async def _create_alone(self, task: Task, definition: dict[str, Any], now: datetime
                            ) -> dict[str, Any]:
        """A task that is its own group and names no dependencies (Taskcluster's default):
        its deadline trigger, its tip and the task at once (``_write_at_once``)."""
        # Its resolution will know from the task alone whether it resolves its group, and
        # its insert whether a task joined the group first (``_store``).
        task = replace(task, group_members=await self._check_group_open(task.task_id,
                                                                        definition))
        inserting = self.changes.cache.insert_begins(task)
        stored = None
        try:
            w = await self._write_at_once(task, definition, now, inserting)
            stored = w.stored
        finally:
            self.changes.cache.insert_ends(task.task_id, inserting, stored)
        return await self._answer(task, definition, w, True)

    async def _create_with_dependencies(self, task_id: str, definition: dict[str, Any],
                                        now: datetime) -> dict[str, Any]:
        """A task that names dependencies: while they are read, with whether the task is
        stored already and its group's records, its deadline trigger and dependents rows
        are written (``_checked_with_rows``); then, if what it depends on is resolved, its
        tip and the task at once (``_write_at_once``; a member of a group: its member row
        and tip, then the task), else what it waits for and the task
        (``_create_waiting``)."""
        unscheduled = model.new_task(task_id, definition, now, scheduled=False)
        found, joined, early = await self._checked_with_rows(unscheduled, definition, now)
        if isinstance(found, Stored):  # a repeated or refused definition: what it wrote goes
            await self._take_back_rows(task_id, early, found.task.dependencies)
            return await self._defined_before(found, definition, None)
        if not early.linked:  # too many to write before they were found to exist
            await self.dependencies.link(task_id, definition)
        task = model.new_task(task_id, definition, now, scheduled=not found.waiting)
        if joined is not None:
            task = replace(task, group_members=joined)
        if found.waiting:
            return await self._create_waiting(task, definition, found, early)
        inserting = self.changes.cache.insert_begins(task)
        stored = None
        try:
            if definition["taskGroupId"] == task_id:
                w = await self._write_at_once(task, definition, now, inserting, early.deadline)
            else:  # its member row before the task, its tip with it, recorded by the insert
                member = await self._write_early(task, now, member=True, tip=True,
                                                 inserting=inserting)
                early = replace(member, deadline=early.deadline)
                stored, stored_at = await self._insert(task, definition, early.tip,
                                                       self._taking_back(early))
                w = early.written(stored, stored_at)
            stored = w.stored
        finally:
            self.changes.cache.insert_ends(task_id, inserting, stored)
        return await self._answer(task, definition, w, definition["taskGroupId"] == task_id)

    async def _checked_with_rows(self, task: Task, definition: dict[str, Any], now: datetime
                                 ) -> tuple[Stored | NewTask, bool | None, _Early]:
        """Whether the task is stored already, what it waits for (``_stored_or_new``) and
        its group's records (``_check_group_open``), read while its deadline trigger and
        dependents rows are written (``_write_early``). A refusal takes back the trigger,
        and the rows under dependencies that do not exist: rows under those that do may be
        another createTask's of the same taskId, and go with their dependency."""
        got = await asyncio.gather(
            self._stored_or_new(task.task_id, definition),
            self._check_group_open(task.task_id, definition),
            self._write_early(task, now, trigger=True, link=True), return_exceptions=True)
        found, joined, early = got
        failed = next((g for g in got if isinstance(g, BaseException)), None)
        if failed is None:
            assert isinstance(found, (Stored, NewTask)) and isinstance(early, _Early)
            return found, joined if isinstance(joined, bool) else None, early
        if isinstance(early, _Early):
            missing = found.missing if isinstance(found, errors.MissingDependencies) else ()
            await self._take_back_rows(task.task_id, early, tuple(
                d for d in early.linked if d not in missing))
        raise failed

    async def _create_waiting(self, task: Task, definition: dict[str, Any], new: NewTask,
                              early: _Early) -> dict[str, Any]:
        """A task that waits for dependencies: its definition trigger, wait rows, marks on
        what it waits for (``Dependencies.track``) and member row, then the task with no
        tip while its dependencies are read again (``Dependencies.resolved_meanwhile``).
        If one of them resolved meanwhile, they are read again once the task is stored,
        passing that on (``Dependencies.recheck``), before the answer; else after it
        (``_recheck_soon``), for what resolved while the task was inserted. A task
        waiting for more than ``READ_BESIDE`` reads them only once the task is stored,
        before the answer."""
        defining, tracked, joined = await asyncio.gather(
            self.dependencies.begin_definition(task.task_id),
            self.dependencies.track(task.task_id, definition, new), self._add_to_group(task),
            return_exceptions=True)
        for got in (defining, tracked, joined):
            if isinstance(got, BaseException):
                raise got
        assert isinstance(defining, Message)
        # Read beside the insert (and again once the task is stored), only as many as one
        # round trip reads: more are read once, after the insert, before the answer.
        reading = asyncio.ensure_future(
            self.dependencies.resolved_meanwhile(task, new.waiting)
            if len(new.waiting) <= READ_BESIDE else _done(True))
        try:
            stored, stored_at = await self._insert(task, definition, None,
                                                   self._taking_back(early))
        except BaseException:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            raise
        try:
            meanwhile = await reading
        except (errors.QueueError, errors.StorageError):
            meanwhile = True  # not known: read again now that the task is stored
        if stored is None:
            return await self._answer(task, definition, early.written(None, stored_at), False)
        if not meanwhile:
            self._recheck_soon(task, defining)
            return task.status()
        passed = await self.dependencies.recheck(task)
        self._drop_soon(defining)
        # A dependency resolved meanwhile may have changed it: read again.
        return (await self.tasks.get(task.task_id)).status() if passed else task.status()

    async def _answer(self, task: Task, definition: dict[str, Any], w: _Written,
                      at_once: bool) -> dict[str, Any]:
        """createTask's answer once the task's insert was tried (``w``): a task of that id
        stored before decides it (``_defined_before``); else the new task's tip, put
        before its insert and recorded by it, is handed over (``at_once``: done already);
        one whose queue was being deleted is queued after."""
        stored = w.stored
        if stored is None:
            existing = await self.tasks.load(task.task_id)
            if dict(existing.task.definition) != definition and w.deadline is not None:
                # Refused: what this attempt wrote for it must not work later. Its
                # deadline trigger would surface at the refused definition's deadline
                # (the caller's choice) and make the resolvers read the existing task.
                await self.triggers.withdraw(w.deadline)
            if existing.task.definition["taskGroupId"] != definition["taskGroupId"]:
                # The group row just written belongs to a definition that is refused.
                await self.groups.drop(definition["taskGroupId"], task.task_id)
            return await self._defined_before(existing, definition, w.tip, w.handed)
        if w.tip is not None and not w.handed and not at_once:
            await self._another_if_late(stored, w)
            self.tips.hand_over(task, w.tip)
        elif w.tip is None:
            self._queue_soon(stored, 0)
        return task.status()

    async def _write_early(self, task: Task, now: datetime, trigger: bool = False,
                           member: bool = False, link: bool = False, tip: bool = False,
                           inserting: asyncio.Future[Stored | None] | None = None) -> _Early:
        """What must be stored before the task, all at once: its deadline trigger (if we
        died after the insert without it, nothing would ever resolve the task; without
        the task, the resolver drops it), its group's member row (once its group's records
        allowed it), its dependents rows (for listDependentTasks; up to ``EARLY_ROWS`` of
        them, written while the dependencies are read) and run 0's tip, whose record the
        insert then writes (``_put_tip``: offered to a claimWork caller here as soon as it
        is put). What fails takes back the trigger and tip and raises; the rows are left,
        as listings show only the tasks that are stored and belong."""
        d = task.definition
        linked = tuple(d["dependencies"]) if link and len(d["dependencies"]) <= EARLY_ROWS \
            else ()
        got = await asyncio.gather(
            self.triggers.add(task.task_id, task.deadline, now + self.repair_delay)
            if trigger else self._nothing(),
            self._add_to_group(task) if member else self._nothing(),
            self.dependencies.link(task.task_id, d) if linked else self._nothing(),
            self._put_tip(task, inserting) if tip else self._no_tip_put(),
            return_exceptions=True)
        deadline, put = got[0], got[3]
        tip_put = put if isinstance(put, tuple) else (None, 0.0, False)
        early = _Early(deadline if isinstance(deadline, Trigger) else None, linked, *tip_put)
        failed = next((g for g in got if isinstance(g, BaseException)), None)
        if failed is not None:
            try:
                await self._taking_back(early)()
            except (errors.QueueError, errors.StorageError) as e:
                log.warning("task %s: could not take back its deadline trigger or tip (%s)",
                            task.task_id, e)
            raise failed
        return early

    def _taking_back(self, early: _Early) -> Callable[[], Awaitable[None]]:
        """What a task its group refuses at its insert takes back (``_store``)."""
        async def take_back() -> None:
            await self._take_back(early.deadline, None if early.handed else early.tip)
        return take_back

    async def _take_back_rows(self, task_id: str, early: _Early,
                              kept: tuple[str, ...] | frozenset[str]) -> None:
        """A refused definition's deadline trigger, and the dependents rows it wrote for
        dependencies that ``kept`` (the stored task's) does not name."""
        try:
            await self._take_back(early.deadline, None)
            await gather_limited(self.dependencies.dependents.remove(d, task_id)
                                 for d in early.linked if d not in kept)
        except (errors.QueueError, errors.StorageError) as e:
            log.warning("task %s: could not take back all that a refused createTask wrote "
                        "(%s)", task_id, e)

    def _drop_soon(self, defining: Message) -> None:
        """Delete a waiting task's definition trigger in the background, once its
        dependencies were read again (``_drop_definition``)."""
        self._finish_later(self._drop_definition(defining))

    async def _drop_definition(self, defining: Message) -> None:
        """Delete a waiting task's definition trigger: should that fail, the dependency
        resolver reads its dependencies once more when the trigger surfaces, and drops
        it."""
        try:
            await self.dependencies.drop(defining)
        except (errors.QueueError, errors.StorageError) as e:
            log.info("could not delete a definition trigger (%s); the dependency "
                     "resolver will", e)

    def _recheck_soon(self, task: Task, defining: Message) -> None:
        """In the background, once a waiting task's createTask answered: its dependencies
        read again, now that it is stored, passing on what resolved while it was inserted
        (``Dependencies.recheck``), then its definition trigger deleted; the replica's
        close waits for it (``close``). Should the read fail, or this process stop first,
        the dependency resolver reads them when the trigger surfaces (and queues a tip
        again if the task was scheduled meanwhile)."""

        async def recheck() -> None:
            try:
                await self.dependencies.recheck(task)
            except (errors.QueueError, errors.StorageError) as e:
                log.info("task %s: could not read its dependencies again (%s); the "
                         "dependency resolver will", task.task_id, e)
                return
            except Exception:
                log.exception("task %s: reading its dependencies again failed; the "
                              "dependency resolver will", task.task_id)
                return
            await self._drop_definition(defining)

        self._finish_later(recheck())

    async def _write_at_once(self, task: Task, definition: dict[str, Any], now: datetime,
                             inserting: asyncio.Future[Stored | None] | None,
                             deadline: Trigger | None = None) -> _Written:
        """Its deadline trigger (unless stored already: ``deadline``), its tip and the task
        all at once, in one round trip. Once the task and its tip are stored, the tip is
        handed over, or rung and recorded (``Tips.hand_over_unrecorded``), whatever the
        trigger still takes. A trigger that failed after the task was stored is put again
        in the background (``_trigger_soon``), and createTask fails: its client's repeat
        finishes what is missing, as for any createTask not answered."""
        trigger = asyncio.ensure_future(
            _done(deadline) if deadline is not None else
            self.triggers.add(task.task_id, task.deadline, now + self.repair_delay))
        tipping = asyncio.ensure_future(self._put_tip(task, inserting))

        async def take_back() -> None:
            got = await asyncio.gather(trigger, tipping, return_exceptions=True)
            await self._take_back(got[0] if isinstance(got[0], Trigger) else None,
                                  got[1][0] if isinstance(got[1], tuple) else None)

        try:
            stored, stored_at = await self._insert(task, definition, None, take_back)
            tip, tip_visible, handed = await tipping
        except BaseException:
            await asyncio.gather(trigger, tipping, return_exceptions=True)
            raise
        w = _Written(stored, stored_at, tip, tip_visible, None, handed)
        if stored is not None and tip is not None and not handed:
            await self._another_if_late(stored, w)
            await self.tips.hand_over_unrecorded(stored, tip, 0, self.changes.cache.recorded)
        try:
            return replace(w, deadline=await trigger)
        except (errors.QueueError, errors.StorageError):
            if stored is not None:
                self._trigger_soon(task, now)
            raise

    async def _another_if_late(self, stored: Stored, w: _Written) -> None:
        """Another tip if the task was stored long after its tip became visible: a claim
        of the tip waits only so long for the task, and one that gave up had its worker
        delete the tip."""
        late = w.stored_at - w.tip_visible
        if late > TIP_WAIT.total_seconds() / 2:
            log.warning("task %s was stored %.1fs after its tip: queuing another",
                        stored.task.task_id, late)
            await self.tips.queue(stored, 0)

    async def _take_back(self, deadline: Trigger | None, tip: Message | None) -> None:
        """What a refused createTask wrote, so that nothing of it works later."""
        if deadline is not None:
            await self.triggers.withdraw(deadline)
        if tip is not None:
            await self.tips.drop(tip)

    async def _put_tip(self, task: Task, inserting: asyncio.Future[Stored | None] | None
                       ) -> tuple[Message | None, float, bool]:
        """Run 0's tip; when it became visible (on the event loop's clock); whether a
        claimWork caller here took it: with ``inserting`` (the insert's future from the
        cache), it is offered to one as soon as its put is answered."""
        loop = asyncio.get_running_loop()
        # A claimWork caller waiting here for the task's queue: the tip is put as its claim
        # will hold it, so that the claim needs no rewrite (``tips.Prewritten``).
        claimed = inserting is not None and self.tips.reserve(task)
        try:
            message = await self.tips.put(
                task, 0, self.claim_timeout + PREWRITTEN_FRESH if claimed else None)
        except errors.QueueBeingDeleted as e:
            # Its task queue was idle and its queue deleted moments ago, longer than this
            # request can wait: the task is stored without a tip, which is queued once the
            # queue can be made again (``_queue_soon``).
            log.warning("task %s: %s; storing the task, its tip queued after", task.task_id, e)
            return None, loop.time(), False
        finally:
            if claimed:
                self.tips.unreserve(task)
        handed = False
        if inserting is not None:
            self.changes.cache.tip_put(task.task_id, inserting, message.message_id)
            handed = self.tips.offer(task, message)
        if isinstance(message, Prewritten) and not handed:
            message = await self.tips.reveal(task, message, 0)  # its caller went away
        visible = loop.time()  # a worker may poll it from now on
        return message, visible, handed

    async def _no_tip_put(self) -> tuple[Message | None, float, bool]:
        return None, asyncio.get_running_loop().time(), False

    def _trigger_soon(self, task: Task, now: datetime) -> None:
        """Put again, in the background, the deadline trigger of a task stored while its
        trigger failed (its createTask fails, and its client's repeat puts another: a
        duplicate is harmless). Should this fail too, or this process stop first, the
        task has no trigger until its client repeats the createTask."""

        async def put() -> None:
            try:
                await self.triggers.add(task.task_id, task.deadline, now + self.repair_delay)
            except (errors.QueueError, errors.StorageError) as e:
                log.warning("task %s: stored without its deadline trigger, which could not be "
                            "put again (%s): its createTask must be repeated", task.task_id, e)

        self._finish_later(put())

    def _queue_soon(self, stored: Stored, run_id: int) -> None:
        """Queue the tip of ``stored``'s pending run ``run_id``, whose queue Azure was still
        deleting when the request that stored it could wait no longer, in the background,
        outside that request's time: the put waits until the queue can be made again
        (``PendingQueues.put``, up to a minute). Should that fail too, or this process
        stop first, the tip repair queues it (``repair``: at most ``repair_delay`` after
        the run became pending, and it looks at every pending run that long)."""

        async def queue() -> None:
            try:
                await self.tips.queue(stored, run_id)
            except (errors.QueueError, errors.StorageError) as e:
                log.warning("task %s: could not queue the tip of run %d (%s); the tip repair "
                            "will", stored.task.task_id, run_id, e)

        self._finish_later(queue())

    async def _stored_or_new(self, task_id: str, definition: dict[str, Any]
                             ) -> Stored | NewTask:
        """The task, if a createTask stored it before (its definition then decides the
        answer, whatever its dependencies say now), else what it must wait for
        (``Dependencies.check_new``, which refuses a dependency that does not exist):
        both read at once."""
        checking = asyncio.ensure_future(self.dependencies.check_new(task_id, definition))
        try:
            existing = await self.tasks.load(task_id)
        except errors.NotFound:
            return await checking
        except BaseException:
            checking.cancel()
            await asyncio.gather(checking, return_exceptions=True)
            raise
        checking.cancel()
        await asyncio.gather(checking, return_exceptions=True)
        return existing

    async def _insert(self, task: Task, definition: dict[str, Any], tip: Message | None,
                      take_back: Callable[[], Awaitable[None]]) -> tuple[Stored | None, float]:
        """Insert the task with its events (published from here), and the record of
        ``tip``; None if a task of that id is stored already; and when it was stored (on
        the event loop's clock, before the events are published)."""
        async with self.outbox.writing(task.task_id) as out:
            # The events of the new task: written with it, published from here.
            written = out.events(lambda: events.for_change(None, task))
            stored = await self._store(task, definition, written, tip, take_back)
            stored_at = asyncio.get_running_loop().time()
            out.wrote(written if stored is not None else [])
            if stored is not None:
                self.changes.inserted(stored)
                self.workerinfo.task_queue_active(task.task_queue_id)
            # Published on leaving, before a worker can claim the task (a claim waits for
            # the task to be stored), so task-defined and task-pending precede its
            # task-running.
        return stored, stored_at

    async def _defined_before(self, stored: Stored, definition: dict[str, Any],
                              tip: Message | None, handed: bool = False) -> dict[str, Any]:
        """The answer to a createTask for a task that exists: its status if the definition
        is the same (finishing what a failed first attempt may have left undone), else 409.
        ``tip`` is the run-0 tip this attempt put already; ``handed``, whether a claimWork
        caller here took it: that caller rewrote it and decides its claim on the stored
        task, so the tip is the caller's to keep or drop, neither recorded nor handed to
        another caller (who would claim the same run again), and a pending run 0 has the
        tip its first attempt recorded."""
        existing = stored.task
        last = existing.last_run
        if handed:
            tip = None
        if dict(existing.definition) != definition:
            if tip is not None:
                await self.tips.drop(tip)
            raise errors.Conflict(
                f"task {existing.task_id} already exists with a different definition; "
                "createTask is idempotent only for an identical definition: use a new taskId")
        pending = last is not None and last.state is RunState.PENDING
        if handed and pending and last is not None and last.run_id == 0:
            return existing.status()
        if tip is not None and pending and last is not None and last.run_id == 0 and \
                len(stored.tips) < MAX_TIPS:
            await self.tips.record(existing, tip, 0)
            return existing.status()
        if tip is not None:
            await self.tips.drop(tip)
        if pending and last is not None:
            try:
                await self.tips.queue(stored, last.run_id)
            except errors.QueueBeingDeleted as e:
                log.warning("task %s: %s; its tip queued after", existing.task_id, e)
                self._queue_soon(stored, last.run_id)
        elif last is None and existing.dependencies:
            await self.dependencies.recheck(existing)
            existing = await self.tasks.get(existing.task_id)
        return existing.status()

    async def schedule_task(self, task_id: str,
                            authorize: Callable[[Task], None] = lambda t: None) -> dict[str, Any]:
        """Schedule an unscheduled task whatever its dependencies say (scheduleTask)."""
        loaded = await self.tasks.load(task_id)
        authorize(loaded.task)
        if not loaded.task.runs and timeutil.utcnow() >= loaded.task.deadline:
            raise errors.Conflict(f"task {task_id} passed its deadline "
                                  f"{loaded.task.definition['deadline']} and cannot be scheduled")
        return (await self.schedule(task_id, loaded, True)).status()

    async def schedule(self, task_id: str, loaded: Stored | None, requeue: bool) -> Task:
        """Give an unscheduled task its pending run 0 and queue its tip. With ``requeue``,
        a task that was pending already gets a tip again (the first may have been lost)."""
        now = timeutil.utcnow()
        change = await self.changes.change(task_id, lambda t: model.schedule(t, now), loaded)
        last = change.after.last_run
        if last is not None and last.state is RunState.PENDING and (change.changed or requeue):
            await self.tips.queue(change.stored, last.run_id)
        return change.after

    async def list_task_group(self, task_group_id: str, continuation: str | None,
                              limit: int) -> dict[str, Any]:
        """listTaskGroup: the tasks of a task group, a page at a time."""
        after = paging.after(continuation)
        rows, last = await self.groups.page(task_group_id, after, limit)
        page = rows
        # The group's own task has no member row: it takes its place in taskId order.
        if (after is None or task_group_id > after) and \
                (last is None or task_group_id <= last) and task_group_id not in rows:
            page = sorted([*rows, task_group_id])
            if len(page) > limit:
                page = page[:limit]
                last = page[-1]
        tasks, read = await self._definitions_and_statuses(
            page, lambda t: t.definition["taskGroupId"] == task_group_id)
        if read < len(page):
            last = page[read - 1]
        if not rows and not tasks and after is None:
            raise errors.NotFound(f"task group {task_group_id} has no tasks (or does not exist)")
        return {"taskGroupId": task_group_id, "tasks": tasks,
                **({"continuationToken": paging.token(last)} if last is not None else {})}

    async def _definitions_and_statuses(self, task_ids: list[str], belongs: Callable[[Task], bool]
                                        ) -> tuple[list[dict[str, Any]], int]:
        """``{status, task}`` of each task that exists and ``belongs`` (a row may outlive a
        createTask that died, or be left by a refused one), for as many of ``task_ids`` as
        a page holds (``paging.read_fitting``); and how many those are."""
        async def read(task_id: str) -> dict[str, Any] | None:
            t = await self.tasks.find(task_id)
            if t is None or not belongs(t):
                return None
            return {"status": t.status(), "task": dict(t.definition)}

        return await paging.read_fitting(task_ids, read)

    async def list_dependents(self, task_id: str, continuation: str | None,
                              limit: int) -> dict[str, Any]:
        """listDependentTasks: the tasks that depend on ``task_id``, a page at a time."""
        await self.tasks.get(task_id)
        page, last = await self.dependencies.dependents.page(task_id, paging.after(continuation),
                                                              limit)
        tasks, read = await self._definitions_and_statuses(
            page, lambda t: task_id in t.dependencies)
        if read < len(page):
            last = page[read - 1]
        return {"taskId": task_id, "tasks": tasks,
                **({"continuationToken": paging.token(last)} if last is not None else {})}

    async def definition(self, task_id: str) -> dict[str, Any]:
        return dict((await self.tasks.get(task_id)).definition)

    async def status(self, task_id: str) -> dict[str, Any]:
        return (await self.tasks.get(task_id)).status()

    # -- task groups -----------------------------------------------------------------

    async def _store(self, task: Task, definition: dict[str, Any], written: list[events.Event],
                     tip: Message | None, take_back: Callable[[], Awaitable[None]]
                     ) -> Stored | None:
        """Store the new task (``tasks.insert``), with the record of ``tip``. A group's
        own task is inserted assuming that no other task joined its group first, which
        its insert tells (``GroupJoined``): then the group's records decide, as for any
        other member, and a task they refuse leaves nothing that works later
        (``take_back`` deletes its deadline trigger and tip)."""
        # A tip put claimed for a caller here (``Prewritten``) is one of the task's tips
        # but not its live one: it says the next run, and the tip repair's look would
        # make it visible as it is.
        tips = (tip.message_id,) if tip else ()
        live_tip = live(tip, 0) if tip and not isinstance(tip, Prewritten) else None
        try:
            return await self.tasks.insert(task, written, tips=tips, live_tip=live_tip)
        except errors.GroupJoined:
            pass
        try:
            await self._check_group_open(task.task_id, definition, own_first=False)
        except errors.Conflict:
            await take_back()
            raise
        return await self.tasks.insert(replace(task, group_members=True), written, tips=tips,
                                       live_tip=live_tip)

    async def _add_to_group(self, task: Task) -> None:
        """A member row for the task's group; the group's own task (taskGroupId = its
        taskId, Taskcluster's default) needs none: listings and group checks read it."""
        d = task.definition
        if d["taskGroupId"] != task.task_id:
            await self.groups.add(d["taskGroupId"], task.task_id, d["expires"], d["schedulerId"])

    async def _check_group_open(self, task_id: str, definition: dict[str, Any],
                                own_first: bool = True) -> bool | None:
        """Conflict if the task's schedulerId is not its group's, or if the group is sealed
        and the task is not in it already (a repeated createTask answers as before). For
        the task the group is named after: whether another task has joined the group, as
        its record says (None if it does not: a record of an earlier version); None for
        any other task.

        The group's own task checks nothing here at first (``own_first``): its insert
        creates the ``members`` row of its partition, which a task that joined the group
        before it was stored has created already, and only then (``GroupJoined``) is the
        group's record asked. So a group of one, Taskcluster's default, costs no request
        here. Any other task reads the group's records (one request, as the sealed check
        needs anyway); the first of them records the group's schedulerId
        (``groups.record_owner``, a conditional insert), from the group's own task if it
        is stored, else its own. Nothing of a refused task is written: this runs before
        its writes (but for the race below).

        A task other than the group's own is noted as a member before its member row is
        written, once per group (the record read says whether it was): on the group's own
        task (``tasks.note_group_member``, or its ``members`` row if it is not stored yet),
        then in the record, so that the own task's resolution knows from the task alone
        whether it resolves its group. The record says so only after the own task does
        (the first member records the group's schedulerId noting no member yet): a member
        that reads it so notes nothing, and one whose createTask failed between the two
        would otherwise leave the own task stored unaware of its members. If the group's
        own task was stored between the first member's read of it and that note, its
        schedulerId decides: the record is corrected and the member refused."""
        group, scheduler = definition["taskGroupId"], definition["schedulerId"]
        own = group == task_id
        if own and own_first:
            return False  # its insert tells whether a task joined first (``_insert``)
        if own and await self.groups.record_owner(
                group, scheduler, definition["expires"], verified=False, members=False):
            return False  # the group's first task
        records = await self.groups.records(group)
        noted = records.owner is not None and records.owner.members is True
        joined = records.owner.members if records.owner is not None else None
        owner = await self.owners.scheduler(group, records.owner)
        first = False
        if owner is None and await self.groups.record_owner(
                group, scheduler, definition["expires"], verified=True, members=False):
            owner, noted, joined, first = scheduler, own, False, not own
        elif owner is None:  # another first task of the group recorded it just now
            owner = await self.owners.scheduler(group, await self.groups.owner(group))
            joined = None
        if owner != scheduler:
            raise errors.Conflict(
                f"task group {group} belongs to schedulerId {owner!r}, this task has "
                f"schedulerId {scheduler!r}: all tasks of a task group must have the same "
                f"schedulerId; create the task with schedulerId {owner!r} or in another "
                "taskGroupId")
        if records.sealed is not None and await self.tasks.find(task_id) is None:
            raise errors.Conflict(f"task group {group} is sealed (sealTaskGroup) and accepts "
                                  "no new tasks; create the task in another taskGroupId")
        if not own and not noted:
            stored = await self.tasks.note_group_member(group)
            if first and stored:
                await self._own_task_decides(group, scheduler)
            await self.groups.note_members(group)
        return joined if own else None

    async def _own_task_decides(self, group: str, scheduler: str) -> None:
        """The group's own task was stored after this first member found none: if its
        schedulerId is another, the group's record (written by this member) is corrected
        and this member refused."""
        own_task = await self.tasks.find(group)
        if own_task is None or own_task.definition["schedulerId"] == scheduler:
            return
        actual = own_task.definition["schedulerId"]
        record = await self.groups.owner(group)
        if record is not None:
            await self.groups.settle_owner(group, record, actual)
        raise errors.Conflict(
            f"task group {group} belongs to schedulerId {actual!r}, this task has schedulerId "
            f"{scheduler!r}: all tasks of a task group must have the same schedulerId; create "
            f"the task with schedulerId {actual!r} or in another taskGroupId")

    async def _nothing(self) -> None:
        return None
