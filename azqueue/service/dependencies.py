"""Task dependencies: a task waits, unscheduled, until what it depends on is resolved.

What is stored: ``wait:<taskId>`` rows in the waiting task's partition (what it still
waits for), one row per (dependency, dependent) in the dependents table (whom to tell),
and a ``hasDependents`` mark on every task something depends on.

Azure Tables has no transaction across partitions, so the order of writes and reads
does the work:

* defining B: B's wait rows, then the dependents rows and marks on what it waits for,
  then B itself, then every dependency is read again;
* resolving A: A's resolution is written conditionally on an ETag that the mark moves,
  then A's dependents are read.

Whichever comes second sees the other. Passing A's resolution on to B removes B's
``wait:A`` row and reads B's remaining rows afterwards, so of several dependencies that
resolve at once, the last to remove its row sees none left; scheduling B is a
conditional change, so doing it twice does it once.

Durability: before the resolution of a task with dependents is written, a trigger
message goes into the internal queue ``<prefix>-dependencies``, invisible for the
recovery delay, and is deleted once the resolution was passed on. If the process dies in
between, the dependency resolver of any replica passes it on when the trigger reappears.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import Any, TypeVar

from azqueue import errors
from azqueue.model import task as model
from azqueue.model import timeutil
from azqueue.model.task import Task
from azqueue.storage.dependents import Dependent, DependentStore
from azqueue.storage.errors import MessageGone
from azqueue.storage.queues import Message, Queues, decode_json, encode_json
from azqueue.storage.tasks import TaskStore

log = logging.getLogger(__name__)

MAX_PARALLEL = 16
T = TypeVar("T")

# Schedules the task (given as loaded, with its ETag) and queues its tip; with ``requeue``
# also queues a tip if the task was pending already (a tip may have been lost).
Schedule = Callable[[str, tuple[Task, str], bool], Awaitable[Any]]


async def _gather(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Await ``calls`` with at most MAX_PARALLEL at a time; results in order."""
    limit = asyncio.Semaphore(MAX_PARALLEL)

    async def one(call: Awaitable[T]) -> T:
        async with limit:
            return await call

    return list(await asyncio.gather(*(one(c) for c in calls)))


def _resolves(before: Task, after: Task) -> bool:
    return after is not before and not before.state.resolved and after.state.resolved


class Dependencies:
    def __init__(self, tasks: TaskStore, dependents: DependentStore, queues: Queues,
                 queue_name: str, recovery_delay: timedelta, schedule: Schedule) -> None:
        self.tasks = tasks
        self.dependents = dependents
        self.queues = queues
        self.queue_name = queue_name
        self.recovery_delay = recovery_delay
        self._schedule = schedule

    async def setup(self) -> None:
        await self.dependents.ensure()
        await self.queues.ensure(self.queue_name)

    # -- defining a task -----------------------------------------------------------------

    async def check_new(self, task_id: str, definition: dict[str, Any]) -> list[str]:
        """What a new task must wait for. InputError, before anything is written, if a
        dependency does not exist or expires before the task's deadline."""
        others = [d for d in definition["dependencies"] if d != task_id]
        found = await _gather(self.tasks.find(d) for d in others)
        missing = [d for d, t in zip(others, found) if t is None]
        if missing:
            raise errors.InputError(
                "task definition: `dependencies` names tasks that do not exist: "
                f"{', '.join(missing)}; create every dependency before the tasks that depend "
                "on it")
        deadline = timeutil.parse(definition["deadline"])
        required = [t for t in found if t is not None]
        expiring = [t.task_id for t in required if t.expires < deadline]
        if expiring:
            raise errors.InputError(
                "task definition: `dependencies` names tasks that expire before this task's "
                f"`deadline` ({definition['deadline']}): {', '.join(expiring)}")
        waiting = [t.task_id for t in required if not model.satisfies(t, definition["requires"])]
        if task_id in definition["dependencies"]:
            waiting.append(task_id)  # waits for scheduleTask
        return waiting

    async def track(self, task_id: str, requires: str, waiting: list[str]) -> None:
        """Before a waiting task is stored: its wait rows, then the dependents rows and
        marks on the tasks it waits for."""
        await self.tasks.add_waits(task_id, waiting)
        await _gather(self._link(w, Dependent(task_id, requires))
                      for w in waiting if w != task_id)

    async def _link(self, required: str, dependent: Dependent) -> None:
        await self.dependents.add(required, dependent)
        await self.tasks.mark_has_dependents(required)

    async def recheck(self, task: Task) -> None:
        """After a waiting task is stored (or its createTask repeated): pass on what its
        dependencies resolved to in the meantime."""
        async def one(required: str) -> None:
            dependency = await self.tasks.find(required)
            if dependency is not None and dependency.state.resolved:
                await self._pass_to(dependency, task.task_id, recovering=False)

        await _gather(one(d) for d in task.dependencies if d != task.task_id)

    # -- resolving a task ------------------------------------------------------------------

    def watch(self, task_id: str) -> Watch:
        """Durability for one change of ``task_id``: ``before_write`` goes to
        ``TaskStore.modify``, ``after`` is awaited with its result."""
        return Watch(self, task_id)

    async def resolved(self, task: Task, recovering: bool = False) -> None:
        """Pass ``task``'s resolution on to the tasks that depend on it."""
        ready = [d.task_id async for d in self.dependents.all(task.task_id)
                 if model.satisfies(task, d.requires)]
        await _gather(self._pass_to(task, d, recovering) for d in ready)

    async def _pass_to(self, dependency: Task, dependent_id: str, recovering: bool) -> None:
        loaded = await self.tasks.load_with_waits(dependent_id)
        if loaded is None:
            return  # its createTask failed before storing it
        task, etag, waits = loaded
        if (dependency.task_id not in task.dependencies
                or not model.satisfies(dependency, task.definition["requires"])):
            return  # a row left by a refused redefinition of the dependent
        if dependency.task_id in waits:
            await self.tasks.remove_wait(dependent_id, dependency.task_id)
            # Read again after the delete, to see the deletes that came before it.
            loaded = await self.tasks.load_with_waits(dependent_id)
            if loaded is None:
                return
            task, etag, waits = loaded
        if not waits & task.dependencies:
            await self._schedule(dependent_id, (task, etag), recovering)

    # -- recovery --------------------------------------------------------------------------

    async def recover(self, invisible_for: timedelta) -> int:
        """Pass on the resolutions whose process died before it did; messages handled."""
        messages = await self.queues.receive(self.queue_name, invisible_for)
        for message in messages:
            try:
                task_id = str(decode_json(message.text)["taskId"])
            except (ValueError, KeyError, TypeError):
                log.warning("dropping a malformed dependency trigger: %r", message.text[:100])
            else:
                task = await self.tasks.find(task_id)
                if task is not None and task.state.resolved:
                    log.info("passing on the resolution of task %s (recovered)", task_id)
                    await self.resolved(task, recovering=True)
            await self._drop(message)
        return len(messages)

    async def _drop(self, message: Message) -> None:
        try:
            await self.queues.delete(self.queue_name, message.message_id, message.pop_receipt)
        except MessageGone:
            pass


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
        if after.has_dependents and _resolves(before, after):
            await self._deps.resolved(after)
        if self._trigger is not None:
            await self._deps._drop(self._trigger)
