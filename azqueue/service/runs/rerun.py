"""rerunTask: a resolved task runs again.

The new pending run (``model.task.rerun``: reason ``rerun``, retries reset, at most
``MAX_RUNS`` runs) is written conditionally like every change, so reruns racing on any
replicas add one run: the others decide again on the task as the winner left it, find it
pending, and answer its status. Its tip is queued after the write, which publishes
``task-pending``. A rerun of a task that is pending already queues its tip again, as a
repeated scheduleTask does: a rerun whose process died between the write and the tip is
finished by the client's retry (duplicate tips are harmless).

A resolved task's deadline trigger is dropped at its next look, so the rerun of a
resolved task stores a new one first (``triggers``), as createTask does: the new run is
resolved at the task's deadline, and its tip repaired, like the first. A rerun the task's
state refuses (its deadline passed, ``MAX_RUNS`` runs) writes nothing; one refused or lost
after its trigger leaves a trigger that finds the task resolved, and is dropped.

With events on, a rerun of a member of a task group (the group's own task too, if it has
a row there) marks its row in the group unresolved before the new run is stored
(``storage.groups``, ``events.outbox``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from azqueue.model import task as model
from azqueue.model import timeutil
from azqueue.model.task import RunState, Task
from azqueue.service.dispatch.tips import Tips
from azqueue.service.runs.changes import Changes
from azqueue.service.runs.triggers import DeadlineTriggers
from azqueue.storage.groups import GroupStore
from azqueue.storage.tasks import TaskStore


@dataclass(frozen=True, slots=True)
class Rerun:
    """rerunTask. ``events_on``: whether events are published (then a rerun of a group's
    member marks its member row unresolved, see ``storage.groups``)."""

    tasks: TaskStore
    groups: GroupStore
    changes: Changes
    tips: Tips
    triggers: DeadlineTriggers
    repair_delay: timedelta
    events_on: bool

    async def rerun_task(self, task_id: str,
                         authorize: Callable[[Task], None] = lambda t: None) -> dict[str, Any]:
        """rerunTask; ``authorize`` sees the task before anything changes."""
        loaded = await self.tasks.load(task_id)
        authorize(loaded.task)
        now = timeutil.utcnow()
        before = loaded.task
        group = before.definition["taskGroupId"]
        # With events on, a member's row says whether the group may be announced resolved:
        # marked unresolved before the new run is stored, so that no group check between
        # the two counts the task resolved (``events.outbox``); a rerun it refuses is
        # refused here first (``model.rerun``), and writes nothing.
        # The group's own task has a row only in a group other tasks joined (resolved
        # there): it is marked if it has one, and a group of one is left without.
        marked = self.events_on and before.state.resolved
        if marked:
            model.rerun(before, now)
            await self.groups.unresolve(group, task_id, len(before.runs) + 1,
                                        if_present=group == task_id)
        if before.state.resolved and before.deadline > now:
            await self.triggers.add(task_id, before.deadline, now + self.repair_delay)
        change = await self.changes.change(task_id, lambda t: model.rerun(t, now), loaded)
        task = change.after
        last = task.last_run
        if last is not None and last.state is RunState.PENDING:
            await self.tips.queue(change.stored, last.run_id)
        if change.changed and self.events_on and group != task_id and not marked:
            await self.groups.unresolve(group, task_id, len(task.runs))
        return task.status()
