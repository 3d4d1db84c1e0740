"""rerunTask: a resolved task runs again.

The new pending run (``model.task.rerun``: reason ``rerun``, retries reset, at most
``MAX_RUNS`` runs) is written conditionally like every change, so reruns racing on any
replicas add one run: the others decide again on the task as the winner left it, find it
pending, and answer its status. Its tip is queued after the write, which publishes
``task-pending``. A rerun of a task that is pending already queues its tip again, as a
repeated scheduleTask does: a rerun whose process died between the write and the tip is
finished by the client's retry (duplicate tips are harmless).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from azqueue.model import task as model
from azqueue.model import timeutil
from azqueue.model.task import RunState, Task

if TYPE_CHECKING:
    from azqueue.service.queue import QueueService


async def rerun_task(core: QueueService, task_id: str,
                     authorize: Callable[[Task], None] = lambda t: None) -> dict[str, Any]:
    """rerunTask; ``authorize`` sees the task before anything changes."""
    loaded = await core.tasks.load(task_id)
    authorize(loaded.task)
    now = timeutil.utcnow()
    change = await core.change(task_id, lambda t: model.rerun(t, now), loaded)
    task = change.after
    last = task.last_run
    if last is not None and last.state is RunState.PENDING:
        await core.queue_tip(change.stored, last.run_id)
    group = task.definition["taskGroupId"]
    if change.changed and core.outbox is not None and group != task_id:
        # With events on, the member row says whether the group may be announced resolved.
        await core.groups.unresolve(group, task_id)
    return task.status()
