"""Task dependencies: a task waits, unscheduled, until what it depends on is resolved.

What is stored: ``wait:<tag>:<taskId>`` rows in the waiting task's partition (what it
still waits for; ``tag`` names the definition that wrote them, so rows a refused
redefinition of the same taskId writes are not counted), one row per (dependency,
dependent) in the dependents table (whom to tell), and a ``hasDependents`` mark on every
task something waits for.

Azure Tables has no transaction across partitions, so the order of writes and reads
does the work:

* defining B: the dependents rows (while B's dependencies are read), then B's wait rows
  and marks on what it waits for, then B itself, then every dependency it waits for is
  read again;
* resolving A: A's resolution is written conditionally on an ETag that the mark moves,
  then A's dependents are read.

Whichever comes second sees the other. A resolution passed on before B is stored
finds no B to tell, and B's second read sees it. createTask sends that second read once
it has answered, so that B waits on its answer's path only for a read of its
dependencies sent with its insert, after its marks (``resolved_meanwhile``; a B that
waits for more than 16, a round trip's reads, reads them once, after its insert, before
its answer): a resolution that satisfies B and was written before that read is seen by
it, and B reads its dependencies again, passing it on, before the answer; one written
later is passed on by its own resolution if B is stored by then, else seen by the
second read. Until that read is done, B's definition trigger stays (see Durability).

Passing A's resolution on to B removes B's ``wait:…:A`` row and reads B's remaining rows
afterwards, so of several dependencies that resolve at once, the last to remove its row
sees none left; scheduling B is a conditional change, so doing it twice does it once.

Durability: before the resolution of a task with dependents is written, a trigger
message goes into the internal queue ``<prefix>-dependencies``, invisible for the
recovery delay, and is deleted once the resolution was passed on. If the process dies in
between, the dependency resolver of any replica passes it on when the trigger reappears
(and queues a tip again for a dependent this resolution scheduled, in case that was lost
too). Defining a task that waits puts a trigger of its own before the task, removed after
its dependencies were read again: if the createTask dies in between (or that read fails),
the resolver reads them, or, if that read had scheduled the task, queues its tip again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from azqueue import errors
from azqueue.model import task as model
from azqueue.model import timeutil
from azqueue.model.task import Task
from azqueue.service.common.gathering import MAX_PARALLEL, gather_limited
from azqueue.storage.dependents import DependentStore
from azqueue.storage.queues import Message, Queues, decode_json, encode_json
from azqueue.storage.taskrows import Stored
from azqueue.storage.tasks import TaskStore

log = logging.getLogger(__name__)

# A resolution with so many dependents that telling them takes longer than this is told
# in the background after the request is answered (the trigger keeps it durable).
INLINE_BUDGET = 5.0
# How often a definition trigger whose task is not stored is looked at before it is
# dropped (its createTask died before storing the task).
MAX_DEFINITION_CHECKS = 5

# Schedules the task (given as loaded, with its ETag) and queues its tip; with ``requeue``
# also queues a tip if the task was pending already (a tip may have been lost).
Schedule = Callable[[str, Stored, bool], Awaitable[Any]]


def _resolves(before: Task, after: Task) -> bool:
    return after is not before and not before.state.resolved and after.state.resolved


def definition_tag(definition: Any) -> str:
    """Names a task definition in its wait rows."""
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _scheduled_by(task: Task, dependency: Task) -> bool:
    """Whether ``task``'s pending run 0 came no earlier than ``dependency``'s resolution
    (so passing that resolution on may have scheduled it, and may have lost its tip)."""
    first, resolved = task.runs[0] if task.runs else None, dependency.last_run
    return (first is not None and resolved is not None and resolved.resolved is not None
            and first.scheduled >= resolved.resolved)


@dataclass(frozen=True, slots=True)
class NewTask:
    """What a new task waits for, and which of those are marked as depended on already."""

    waiting: list[str]
    marked: frozenset[str]


class Dependencies:
    """Defining tasks that wait, passing resolutions on to them, and recovering both."""

    def __init__(self, tasks: TaskStore, dependents: DependentStore, queues: Queues,
                 queue_name: str, recovery_delay: timedelta,
                 schedule: Schedule | None = None) -> None:
        self.tasks = tasks
        self.dependents = dependents
        self.queues = queues
        self.queue_name = queue_name
        self.recovery_delay = recovery_delay
        self._schedule = schedule
        self._background: set[asyncio.Task[None]] = set()

    def schedules_with(self, schedule: Schedule) -> None:
        """How a dependent whose dependencies are all resolved is scheduled: defining's part,
        which changes tasks, each change watched here (``watch``); so it is given once both
        exist."""
        self._schedule = schedule

    async def setup(self) -> None:
        await self.dependents.ensure()
        await self.queues.ensure(self.queue_name)

    # -- defining a task -----------------------------------------------------------------

    async def check_new(self, task_id: str, definition: dict[str, Any]) -> NewTask:
        """What a new task must wait for. InputError, before anything is written, if a
        dependency does not exist or expires before the task's deadline."""
        required = await self._find_all([d for d in definition["dependencies"] if d != task_id])
        deadline = timeutil.parse(definition["deadline"])
        expiring = [t.task_id for t in required if t.expires < deadline]
        if expiring:
            raise errors.InputError(
                "task definition: `dependencies` names tasks that expire before this task's "
                f"`deadline` ({definition['deadline']}): {', '.join(expiring)}")
        waiting = [t.task_id for t in required if not model.satisfies(t, definition["requires"])]
        if task_id in definition["dependencies"]:
            waiting.append(task_id)  # waits for scheduleTask
        return NewTask(waiting, frozenset(t.task_id for t in required if t.has_dependents))

    async def _find_all(self, task_ids: list[str]) -> list[Task]:
        """The tasks, read in order MAX_PARALLEL at a time; InputError once one does not
        exist, with no read started after that: a refused definition costs at most as
        many reads as the dependencies before its first missing one, plus MAX_PARALLEL."""
        found: dict[str, Task] = {}
        missing: list[str] = []
        pending = iter(task_ids)

        async def reader() -> None:
            for required in pending:
                if missing:
                    return
                task = await self.tasks.find(required)
                if task is None:
                    missing.append(required)
                else:
                    found[required] = task

        await asyncio.gather(*(reader() for _ in range(min(MAX_PARALLEL, len(task_ids)))))
        if missing:
            raise errors.MissingDependencies(
                "task definition: `dependencies` names tasks that do not exist: "
                f"{', '.join(missing)}; create every dependency before the tasks that depend "
                "on it", tuple(missing))
        return [found[d] for d in task_ids]

    async def link(self, task_id: str, definition: Mapping[str, Any]) -> None:
        """Before a task with dependencies is stored: a dependents row for every
        dependency (for listDependentTasks, and for a resolution to find it)."""
        await gather_limited(self.dependents.add(d, task_id) for d in definition["dependencies"])

    async def track(self, task_id: str, definition: dict[str, Any], new: NewTask) -> None:
        """Before a task that waits is stored, once its dependents rows are (``link``): its
        wait rows, and a mark on each task it waits for, at once."""
        waiting = set(new.waiting)
        await gather_limited([
            self.tasks.add_waits(task_id, definition_tag(definition), new.waiting),
            *(self.tasks.mark_has_dependents(d) for d in definition["dependencies"]
              if d in waiting and d not in new.marked and d != task_id)])

    async def resolved_meanwhile(self, task: Task, waiting: list[str]) -> bool:
        """Whether any of ``waiting`` (what the new task was found to wait for) satisfies
        it now: read once its marks are written, while it is inserted. Passes nothing on,
        as the task may not be stored yet: ``recheck`` does, once it is."""
        requires = task.definition["requires"]

        async def one(required: str) -> bool:
            dependency = await self.tasks.find(required)
            return dependency is not None and model.satisfies(dependency, requires)

        return any(await gather_limited(one(d) for d in waiting if d != task.task_id))

    async def recheck(self, task: Task) -> bool:
        """After a waiting task is stored (or its createTask repeated): pass on what its
        dependencies resolved to in the meantime; whether any had resolved."""
        async def one(required: str) -> bool:
            dependency = await self.tasks.find(required)
            if dependency is not None and dependency.state.resolved:
                await self._pass_to(dependency, task.task_id, recovering=False)
                return True
            return False

        return any(await gather_limited(one(d) for d in task.dependencies
                                        if d != task.task_id))

    # -- resolving a task ------------------------------------------------------------------

    def watch(self, task_id: str) -> Watch:
        """Durability for one change of ``task_id``: ``before_write`` goes to
        ``TaskStore.modify``, ``after`` is awaited with its result."""
        return Watch(self, task_id)

    async def resolved(self, task: Task, recovering: bool = False) -> None:
        """Pass ``task``'s resolution on to the tasks that depend on it."""
        dependents = [d async for d in self.dependents.all(task.task_id) if d != task.task_id]
        await gather_limited(self._pass_to(task, d, recovering) for d in dependents)

    async def _pass_to(self, dependency: Task, dependent_id: str, recovering: bool) -> None:
        loaded = await self.tasks.load_with_waits(dependent_id)
        if loaded is None:
            return  # its createTask failed before storing it
        stored, waits = loaded
        task = stored.task
        if (dependency.task_id not in task.dependencies
                or not model.satisfies(dependency, task.definition["requires"])):
            return  # not what it waits for, or a row of a refused redefinition
        tag = definition_tag(task.definition)
        if (tag, dependency.task_id) in waits:
            await self.tasks.remove_wait(dependent_id, tag, dependency.task_id)
            # Read again after the delete, to see the deletes that came before it.
            loaded = await self.tasks.load_with_waits(dependent_id)
            if loaded is None:
                return
            stored, waits = loaded
            task = stored.task
        if not any(t == tag and d in task.dependencies for t, d in waits):
            if self._schedule is None:
                raise RuntimeError("dependencies: nothing schedules the dependents "
                                   "(``schedules_with`` was not called)")
            await self._schedule(dependent_id, stored,
                                 recovering and _scheduled_by(task, dependency))

    # -- recovery --------------------------------------------------------------------------

    async def begin_definition(self, task_id: str) -> Message:
        """Before a waiting task is defined: a trigger that has the dependency resolver
        read its dependencies again if this createTask dies before it does."""
        return await self.queues.put(self.queue_name,
                                     encode_json({"taskId": task_id, "defined": True}),
                                     visible_in=self.recovery_delay)

    async def recover(self, invisible_for: timedelta) -> int:
        """Finish what processes that died left undone; messages handled."""
        messages = await self.queues.receive(self.queue_name, invisible_for, limit=1)
        for message in messages:
            try:
                data = decode_json(message.text)
                task_id = str(data["taskId"])
            except (ValueError, KeyError, TypeError):
                log.warning("dropping a malformed dependency trigger: %r", message.text[:100])
                await self.drop(message)
                continue
            task = await self.tasks.find(task_id)
            if data.get("defined"):
                await self._recover_definition(message, task)
                continue
            if task is not None and not task.state.resolved and timeutil.utcnow() < task.deadline:
                # Its resolution may still be on its way (a slow writer): look again later.
                await self._postpone(message)
                continue
            if task is not None and task.state.resolved:
                log.info("passing on the resolution of task %s (recovered)", task_id)
                async with self.held(message) as current:
                    await self.resolved(task, recovering=True)
                message = current()
            await self.drop(message)
        return len(messages)

    async def _recover_definition(self, message: Message, task: Task | None) -> None:
        if task is None and message.dequeue_count <= MAX_DEFINITION_CHECKS:
            await self._postpone(message)  # not stored yet, or never will be
            return
        if task is not None and not task.runs:
            log.info("reading the dependencies of task %s again (recovered)", task.task_id)
            await self.recheck(task)
        elif task is not None and len(task.runs) == 1 and \
                task.runs[0].state is model.RunState.PENDING and self._schedule is not None:
            # Scheduled by a read of its dependencies that may have stopped before its tip
            # was queued (createTask's, after its answer): another tip, harmless if not.
            await self._schedule(task.task_id, await self.tasks.load(task.task_id), True)
        await self.drop(message)

    @asynccontextmanager
    async def held(self, message: Message) -> AsyncIterator[Callable[[], Message]]:
        """Keep a trigger invisible while the body passes its resolution on (however long
        that takes); gives the message as it is now (its pop receipt changes)."""
        current = message

        async def extend() -> None:
            nonlocal current
            while True:
                await asyncio.sleep(self.recovery_delay.total_seconds() / 2)
                receipt = await self.queues.update(self.queue_name, current.message_id,
                                                   current.pop_receipt, self.recovery_delay)
                current = replace(current, pop_receipt=receipt)

        keeper = asyncio.create_task(extend())
        try:
            yield lambda: current
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)

    async def _postpone(self, message: Message) -> None:
        await self.queues.postpone(self.queue_name, message.message_id, message.pop_receipt,
                                   self.recovery_delay)

    def keep(self, job: asyncio.Task[None]) -> None:
        """Let ``job`` finish in the background; ``close`` waits for it briefly."""
        self._background.add(job)
        job.add_done_callback(self._background.discard)

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(self._background, timeout=10)

    async def drop(self, message: Message) -> None:
        await self.queues.drop(self.queue_name, message.message_id, message.pop_receipt)


class Watch:
    """One change of a task: a trigger goes out before a write that resolves a task with
    dependents, and is removed once the resolution was passed on."""

    def __init__(self, dependencies: Dependencies, task_id: str) -> None:
        self._deps = dependencies
        self._task_id = task_id
        self._trigger: Message | None = None

    async def before_write(self, before: Task, after: Task) -> None:
        if self._trigger is None and after.has_dependents and _resolves(before, after):
            self._trigger = await self._deps.queues.put(
                self._deps.queue_name, encode_json({"taskId": self._task_id}),
                visible_in=self._deps.recovery_delay)

    async def after(self, before: Task, after: Task) -> None:
        """Tell the dependents, within ``INLINE_BUDGET`` or else in the background. A
        failure is logged, not raised: the change is stored, and the trigger stays for the
        dependency resolver."""
        if not (after.has_dependents and _resolves(before, after)):
            if self._trigger is not None:
                await self._deps.drop(self._trigger)
            return
        job = asyncio.ensure_future(self._pass_on(after))
        self._deps.keep(job)  # so that shutdown waits for it, however this call ends
        try:
            await asyncio.wait_for(asyncio.shield(job), INLINE_BUDGET)
        except TimeoutError:
            log.info("task %s has many dependents: telling them in the background",
                     self._task_id)

    async def _pass_on(self, task: Task) -> None:
        try:
            if self._trigger is None:
                await self._deps.resolved(task)
                return
            async with self._deps.held(self._trigger) as current:
                await self._deps.resolved(task)
            await self._deps.drop(current())
        except errors.TRANSIENT as e:
            log.warning("could not pass the resolution of task %s on to its dependents (%s); "
                        "the dependency resolver will", self._task_id, e)
        except Exception:
            log.exception("passing the resolution of task %s on to its dependents failed "
                          "unexpectedly; the dependency resolver will try again", self._task_id)
