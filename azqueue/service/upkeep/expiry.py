"""Expiry: what is past its ``expires`` is deleted, as Taskcluster's queue does.

An artifact goes (its row and its blob, snapshots included) once its own ``expires`` has
passed; a task once the task's has, with everything kept under its taskId: the rows of
its partition (artifacts, tips, waits), its blobs, its claim rows, the record of who
depended on it and its task group membership; a sealed task group's record, and the
record of which of a group's members were announced resolved, once the ``expires`` it
recorded has passed, and the record of its schedulerId once it has no task left;
workers, task queues and provisioners once theirs
has (``workers``), and then the empty pending queues of the task queues whose records
are gone (``idlequeues``). All wait ``GRACE`` longer (but the workers), so that no
upload URL handed out before is still usable, and a task is left alone while it is
unresolved (its deadline, which comes first, resolves it) or holds unpublished events.
Both are scans of the whole tasks table, so they run seldom: every
``AZQUEUE_EXPIRY_INTERVAL`` seconds. Deleting twice is harmless, so any number of
replicas may run it; one item that cannot be deleted is logged and skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from azqueue.errors import QueueError, StorageError
from azqueue.model import timeutil
from azqueue.service.artifacts.artifacts import ArtifactService
from azqueue.service.upkeep.idlequeues import IdleQueues
from azqueue.service.workers.workers import WorkerInfo
from azqueue.storage.claims import ClaimStore
from azqueue.storage.dependents import DependentStore
from azqueue.storage.groups import GroupStore
from azqueue.storage.tasks import TaskStore

log = logging.getLogger(__name__)

# Longer than an upload URL lives plus the 20 minutes artifacts may still be created
# after an exception.
GRACE = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Expired:
    tasks: int
    artifacts: int
    workers: int = 0  # workers, task queues and provisioners
    queues: int = 0  # pending queues of idle task queues


@dataclass(frozen=True, slots=True)
class Expiry:
    """The expiry resolver's pass. ``claim_store``: the claim index's rows."""

    tasks: TaskStore
    claim_store: ClaimStore
    dependents: DependentStore
    groups: GroupStore
    workerinfo: WorkerInfo
    artifacts: ArtifactService
    idle_queues: IdleQueues

    async def expire(self, now: datetime) -> Expired:
        """Delete the artifacts and the tasks that expired before ``now - GRACE``."""
        before = now - GRACE
        gone_artifacts = 0
        for artifact in await self.artifacts.records.expired(before):
            try:
                if artifact.has_content:
                    await self.artifacts.blobs.delete(artifact.blob_name)
                await self.artifacts.records.delete(artifact)
                gone_artifacts += 1
            except (QueueError, StorageError) as e:
                log.warning("could not expire artifact %r of %s/%d: %s", artifact.name,
                            artifact.task_id, artifact.run_id, e)
        gone_tasks = 0
        for task in await self.tasks.expired(before):
            if not task.state.resolved:
                continue
            try:
                await self.artifacts.blobs.delete_all(f"{task.task_id}/")
                await self.claim_store.delete_task(task.task_id)
                await self.dependents.delete_all(task.task_id)
                await self.groups.drop(task.definition["taskGroupId"], task.task_id)
                if await self.tasks.delete_partition(task.task_id):  # the task row last
                    gone_tasks += 1
            except (QueueError, StorageError) as e:
                log.warning("could not expire task %s: %s", task.task_id, e)
        for group in await self.groups.expired_records(timeutil.fmt(before)):
            try:  # a sealed group's record, once every task it had then has expired
                await self.groups.drop_record(group)
            except (QueueError, StorageError) as e:
                log.warning("could not expire the record of task group %s: %s", group, e)
        for group, etag in await self.groups.expired_announcements(timeutil.fmt(before)):
            try:  # which members were announced resolved, once they all have expired
                await self.groups.drop_announcement(group, etag)
            except (QueueError, StorageError) as e:
                log.warning("could not expire the announcement of task group %s: %s", group,
                            e)
        for group, noted in await self.groups.expired_owners(timeutil.fmt(before)):
            try:
                await self._expire_owner(group, noted, now)
            except (QueueError, StorageError) as e:
                log.warning("could not expire the schedulerId record of task group %s: %s",
                            group, e)
        try:
            gone_workers = await self.workerinfo.expire(now)
        except (QueueError, StorageError) as e:
            gone_workers = 0
            log.warning("could not expire workers and task queues: %s", e)
        try:
            gone_queues = await self.idle_queues.delete(now)
        except (QueueError, StorageError) as e:
            gone_queues = 0
            log.warning("could not delete the queues of idle task queues: %s", e)
        if gone_tasks or gone_artifacts or gone_workers or gone_queues:
            log.info("expired %d task(s), %d artifact(s), %d worker(s), task queue(s) and "
                     "provisioner(s), and %d queue(s) of idle task queues", gone_tasks,
                     gone_artifacts, gone_workers, gone_queues)
        return Expired(gone_tasks, gone_artifacts, gone_workers, gone_queues)

    async def _expire_owner(self, group: str, noted: bool, now: datetime) -> None:
        """The record of a group's schedulerId goes once the group has no task left (with
        the note a member left for a task of the group's name that was never stored, if
        the record says one may have); while it has, its ``expires`` becomes its tasks'
        latest."""
        own = await self.tasks.find(group)
        members = [m for m in await self.groups.members(group) if m.task_id != group]
        if (own is None or own.definition["taskGroupId"] != group) and not members:
            if own is None and noted:
                await self.tasks.drop_group_note(group)
            await self.groups.drop_owner(group)
            return
        expires = [m.expires for m in members if m.expires is not None]
        if own is not None and own.definition["taskGroupId"] == group:
            expires.append(own.definition["expires"])
        # Rows of earlier versions carry no expires: looked at again in a while.
        latest = max(expires, key=timeutil.parse, default=timeutil.fmt(now + GRACE))
        await self.groups.renew_owner(group, max(latest, timeutil.fmt(now + GRACE),
                                                 key=timeutil.parse))
