"""Expiry: what is past its ``expires`` is deleted, as Taskcluster's queue does.

An artifact goes (its row and its blob) once its own ``expires`` has passed; a task once
the task's has, with everything kept under its taskId: the rows of its partition
(artifacts, tips, waits), its blobs, its claim rows, the record of who depended on it and
its task group membership. A task that is somehow still unresolved is left alone (its
deadline, which comes first, resolves it). Both are scans of the whole tasks table, so
they run seldom: every ``AZQUEUE_EXPIRY_INTERVAL`` seconds. Deleting twice is harmless,
so any number of replicas may run it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from azqueue.service.artifacts import ArtifactService
from azqueue.service.queue import QueueService

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Expired:
    tasks: int
    artifacts: int


async def expire(queue: QueueService, artifacts: ArtifactService, now: datetime) -> Expired:
    """Delete the artifacts and the tasks that expired before ``now``."""
    gone_artifacts = 0
    for artifact in await artifacts.records.expired(now):
        if artifact.storage_type == "blob":
            await artifacts.blobs.delete(artifact.blob_name)
        await artifacts.records.delete(artifact)
        gone_artifacts += 1
    gone_tasks = 0
    for task in await queue.tasks.expired(now):
        if not task.state.resolved:
            continue
        await artifacts.blobs.delete_all(f"{task.task_id}/")
        await queue.claims.delete_task(task.task_id)
        await queue.dependencies.dependents.delete_all(task.task_id)
        await queue.groups.drop(task.definition["taskGroupId"], task.task_id)
        await queue.tasks.delete_partition(task.task_id)  # the task row last
        gone_tasks += 1
    if gone_tasks or gone_artifacts:
        log.info("expired %d task(s) and %d artifact(s)", gone_tasks, gone_artifacts)
    return Expired(gone_tasks, gone_artifacts)
