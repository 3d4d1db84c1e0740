"""changeTaskPriority (and each task of changeTaskGroupPriority): a task's priority.

The definition's ``priority`` changes through ``model.task.change_priority``, written
conditionally and publishing ``task-priority-changed``; then a pending run gets a tip in
the new priority's queue. Its old tip stays where it was and is stale: a claim rewrites
the message in the queue of the task's current priority, finds no such message there and
answers 400, upon which the worker deletes it. A running run keeps its claim and its
message; its retry, if any, is queued at the new priority (``Changes.settle``).

A repeated call with the priority the task has already queues a pending run's tip again,
so that a change whose process died before the tip was put is finished by the client's
retry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from azqueue.model import task as model
from azqueue.model import timeutil
from azqueue.model.priority import Priority
from azqueue.model.task import RunState, Task
from azqueue.service.dispatch.tips import Tips
from azqueue.service.runs.changes import Changes
from azqueue.storage.tasks import Change, TaskStore


@dataclass(frozen=True, slots=True)
class TaskPriority:
    """changeTaskPriority, and each task of changeTaskGroupPriority."""

    tasks: TaskStore
    changes: Changes
    tips: Tips

    async def change(self, task_id: str, priority: Priority,
                     authorize: Callable[[Task], None] = lambda t: None,
                     decide: Callable[[Task], Task] | None = None) -> Change:
        """Change the task's priority and queue its pending run's tip at the new one;
        ``authorize`` sees the task first. ``decide`` replaces the model's transition (the
        group method skips what it may not change instead of refusing it)."""
        loaded = await self.tasks.load(task_id)
        authorize(loaded.task)
        now = timeutil.utcnow()
        change = await self.changes.change(
            task_id, decide or (lambda t: model.change_priority(t, priority, now)), loaded)
        last = change.after.last_run
        if last is not None and last.state is RunState.PENDING and \
                (change.changed or decide is None):
            await self.tips.queue(change.stored, last.run_id)
        return change
