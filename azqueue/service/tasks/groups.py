"""Task groups: getTaskGroup, sealTaskGroup, cancelTaskGroup, changeTaskGroupPriority,
and the group metadata of listTaskGroup.

A group exists while it has a task: its own (taskId = taskGroupId) or a member row
(``storage.groups``). Its metadata is read from them: ``schedulerId`` is the one its first
task recorded (``groupowner``: createTask refuses a task of another),
``expires`` the latest of its tasks' (member rows carry it). Reading it
costs one request per 1000 member rows (plus the own task), so a sealed group, which can
take no more members, keeps what sealing read in its record (``~group``) and is read in
one request.

Sealing writes that record once; createTask of a new task into a sealed group is 409
(``Definitions.create_task`` reads the group's records first, in the request that also
checks its schedulerId). As Taskcluster says,
this is not atomic with createTask: a createTask racing the seal may still get in.

cancelTaskGroup and changeTaskGroupPriority go through the members in taskId order,
``GROUP_BATCH`` at a time: the call itself handles the first batch (the group's own
task first) and answers what it changed; if there are more, it queues a durable trigger
``{taskGroupId, op, after, …}`` in ``<prefix>-group-passes``, and the group-passes
resolver of any replica handles the next batch, rewrites the trigger to continue after
it, and so on until the last, so no call costs more than one batch and a process that
dies mid-way leaves the trigger to reappear for another. Each member is changed through
the model's transitions like any single call (``cancel``, ``change_priority``), so
repeating a batch is harmless. changeTaskGroupPriority publishes its summary event
``task-group-priority-changed`` when the last batch is done.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from azqueue import errors
from azqueue.events.outbox import EventOutbox
from azqueue.model import events
from azqueue.model import task as model
from azqueue.model import timeutil
from azqueue.model.events import Event
from azqueue.model.priority import Priority
from azqueue.model.task import Task
from azqueue.service.common import paging
from azqueue.service.common.gathering import gather_limited
from azqueue.service.runs.changes import Changes
from azqueue.service.runs.priority import TaskPriority
from azqueue.service.tasks.definitions import Definitions
from azqueue.service.tasks.groupowner import GroupOwners
from azqueue.storage.groups import GroupMeta, GroupStore
from azqueue.storage.queues import Message, Queues, decode_json, encode_json
from azqueue.storage.tasks import TaskStore

log = logging.getLogger(__name__)

# Members one call, or one step of the group-passes resolver, goes through.
GROUP_BATCH = 100
# How long a step holds its trigger before another replica may take it over.
PASS_HOLD = timedelta(minutes=2)
CANCEL = "cancel"
PRIORITY = "priority"


@dataclass(frozen=True, slots=True)
class TaskGroups:
    """The task-group methods; ``passes`` is the internal queue of the group-passes
    triggers (``<prefix>-group-passes``)."""

    tasks: TaskStore
    groups: GroupStore
    owners: GroupOwners
    queues: Queues
    passes: str
    outbox: EventOutbox
    changes: Changes
    definitions: Definitions
    priority: TaskPriority

    async def setup(self) -> None:
        await self.queues.ensure(self.passes)

    # -- metadata --------------------------------------------------------------------

    async def _own(self, task_group_id: str) -> Task | None:
        own = await self.tasks.find(task_group_id)
        return own if own is not None and own.definition["taskGroupId"] == task_group_id else None

    async def _read(self, task_group_id: str) -> GroupMeta:
        """The group's metadata as its tasks say (``sealed`` empty); NotFound if it has none."""
        own = await self._own(task_group_id)
        members = [m for m in await self.groups.members(task_group_id)
                   if m.task_id != task_group_id]
        if own is None and not members:
            raise errors.NotFound(f"task group {task_group_id} has no tasks (or does not exist)")
        # Rows of earlier versions carry nothing: their tasks say it.
        legacy = await gather_limited(self.tasks.find(m.task_id) for m in members
                                      if m.expires is None)
        known = [(m.expires, m.scheduler_id) for m in members if m.expires is not None]
        known += [(t.definition["expires"], t.definition["schedulerId"]) for t in legacy
                  if t is not None and t.definition["taskGroupId"] == task_group_id]
        if own is not None:
            known.insert(0, (own.definition["expires"], own.definition["schedulerId"]))
        if not known:
            raise errors.NotFound(f"task group {task_group_id} has no tasks (or does not exist)")
        expires = max((timeutil.parse(e) for e, _ in known if e is not None))
        # The group's record says whose it is (a task of another schedulerId sorting first
        # says nothing).
        scheduler = await self.owners.scheduler(
            task_group_id, await self.groups.owner(task_group_id)) or \
            next((s for _, s in known if s is not None), "-")
        return GroupMeta(scheduler, timeutil.fmt(expires), "",
                         len(members) + (1 if own is not None else 0))

    async def _meta(self, task_group_id: str) -> GroupMeta:
        return await self.groups.meta(task_group_id) or await self._read(task_group_id)

    @staticmethod
    def _answer(task_group_id: str, meta: GroupMeta) -> dict[str, Any]:
        return {"taskGroupId": task_group_id, "schedulerId": meta.scheduler_id,
                "expires": meta.expires, **({"sealed": meta.sealed} if meta.sealed else {})}

    async def get(self, task_group_id: str) -> dict[str, Any]:
        """getTaskGroup."""
        return self._answer(task_group_id, await self._meta(task_group_id))

    async def list_tasks(self, task_group_id: str, continuation: str | None,
                         limit: int) -> dict[str, Any]:
        """listTaskGroup: a page of the group's tasks, with the group's metadata. The
        metadata is read for the first page and carried in the continuation token, so a
        listing reads the group's rows once, not once a page."""
        inner, meta = _unwrap(continuation)
        page = await self.definitions.list_task_group(task_group_id, inner, limit)
        if meta is None:
            try:
                meta = await self._meta(task_group_id)
            except errors.NotFound:
                # Its last tasks expired since the page was read: an empty page then.
                meta = GroupMeta("-", timeutil.fmt(timeutil.utcnow()), "", 0)
        if "continuationToken" in page:
            page["continuationToken"] = _wrap(page["continuationToken"], meta)
        return {**self._answer(task_group_id, meta), **page}

    async def seal(self, task_group_id: str,
                   authorize: Callable[[str], None]) -> dict[str, Any]:
        """sealTaskGroup; ``authorize`` gets the group's schedulerId first. Sealing again
        answers the record of the first seal (and announces it again, as Taskcluster does)."""
        meta = await self._meta(task_group_id)
        authorize(meta.scheduler_id)
        if not meta.sealed:
            meta = await self.groups.seal(task_group_id, GroupMeta(
                meta.scheduler_id, meta.expires, timeutil.fmt(timeutil.utcnow()), meta.size))
        answer = self._answer(task_group_id, meta)
        await self._publish(task_group_id, events.task_group_sealed(answer))
        return answer

    async def _publish(self, task_group_id: str, event: Event) -> None:
        """Publish a group's event through the outbox, in the tasks table's partition
        named after the group: published at least once the call has answered."""
        async with self.outbox.writing(task_group_id) as out:
            written = out.events(lambda: [event])
            await self.tasks.add_outbox(task_group_id, written)
            out.wrote(written)

    # -- going through the members ---------------------------------------------------

    async def cancel(self, task_group_id: str,
                     authorize: Callable[[str], None]) -> dict[str, Any]:
        """cancelTaskGroup: the first batch now, the rest by the group-passes resolver."""
        meta = await self.groups.meta(task_group_id)
        if meta is None:
            await self._read(task_group_id)  # NotFound for no group at all
            raise errors.Conflict(
                f"task group {task_group_id} is not sealed; seal it with sealTaskGroup first, "
                "so that no task joins it while it is being canceled")
        authorize(meta.scheduler_id)
        job = {"taskGroupId": task_group_id, "op": CANCEL}
        changed, after = await self._batch(job, None)
        if after is not None:
            await self._continue(job, after)
        return {"taskGroupId": task_group_id, "taskGroupSize": meta.size,
                "cancelledCount": len(changed), "taskIds": changed}

    async def change_priority(self, task_group_id: str, priority: Priority,
                              authorize: Callable[[str], None]) -> dict[str, Any]:
        """changeTaskGroupPriority: the first batch now, the rest by the group-passes
        resolver; the summary event once the last batch is done."""
        meta = await self._meta(task_group_id)
        authorize(meta.scheduler_id)
        job: dict[str, Any] = {"taskGroupId": task_group_id, "op": PRIORITY,
                               "priority": str(priority), "schedulerId": meta.scheduler_id}
        changed, after = await self._batch(job, None)
        if after is None:
            await self._priority_done(job, len(changed))
        else:
            await self._continue({**job, "affected": len(changed)}, after)
        return {"taskGroupId": task_group_id, "schedulerId": meta.scheduler_id,
                "newPriority": str(priority), "tasksAffected": len(changed),
                "taskIds": changed}

    async def _priority_done(self, job: dict[str, Any], affected: int) -> None:
        await self._publish(job["taskGroupId"], events.task_group_priority_changed(
            job["taskGroupId"], job["schedulerId"], job["priority"], affected))

    async def _batch(self, job: dict[str, Any], after: str | None
                     ) -> tuple[list[str], str | None]:
        """Apply ``job`` to the members after ``after`` (the group's own task first, in
        the first batch): the taskIds it changed, and where the next batch starts."""
        group = job["taskGroupId"]
        # The group's own task takes a place of the first batch.
        limit = GROUP_BATCH if after is not None else max(1, GROUP_BATCH - 1)
        keys, last = await self.groups.page(group, after, limit)
        ids = [k for k in keys if k != group]
        if after is None:
            ids.insert(0, group)
        if job["op"] == CANCEL:
            done = await gather_limited(self._cancel_one(group, t) for t in ids)
        else:
            priority = Priority(job["priority"])
            done = await gather_limited(self._reprioritize_one(group, t, priority) for t in ids)
        return [t for t, ok in zip(ids, done) if ok], last

    async def _cancel_one(self, group: str, task_id: str) -> bool:
        now = timeutil.utcnow()

        def decide(task: Task) -> Task:
            if task.definition["taskGroupId"] != group:
                return task  # a row left by a refused createTask
            return model.cancel(task, now)

        try:
            change = await self.changes.change(task_id, decide)
        except (errors.NotFound, errors.Conflict):
            return False  # not written (yet), or left to its deadline
        last = change.after.last_run
        if change.changed and last is not None:
            await self.changes.settle(change, last.run_id)
        return change.changed

    async def _reprioritize_one(self, group: str, task_id: str, priority: Priority) -> bool:
        now = timeutil.utcnow()

        def decide(task: Task) -> Task:
            if task.definition["taskGroupId"] != group or task.state.resolved or \
                    now >= task.deadline:
                return task  # Taskcluster changes only unresolved tasks of the group
            return model.change_priority(task, priority, now)

        try:
            change = await self.priority.change(task_id, priority, decide=decide)
        except errors.NotFound:
            return False
        return change.changed

    async def _continue(self, job: dict[str, Any], after: str) -> None:
        await self.queues.put(self.passes, encode_json({**job, "after": after}), forever=True)

    async def resume(self) -> int:
        """One step of the group-passes resolver: the next batch of each trigger that is
        due; how many triggers it handled."""
        queues = self.queues
        messages = await queues.receive(self.passes, PASS_HOLD)
        for message in messages:
            try:
                await self._step(message)
            except errors.TRANSIENT as e:
                log.warning("group pass %s: %s; retried in %s", message.text, e, PASS_HOLD)
            except Exception:
                log.exception("group pass %s failed; retried in %s", message.text, PASS_HOLD)
        return len(messages)

    async def _step(self, message: Message) -> None:
        queues = self.queues
        try:
            job = decode_json(message.text)
            after = str(job["after"])
            op = job["op"]
            if op not in (CANCEL, PRIORITY):
                raise ValueError(op)
        except (ValueError, KeyError, TypeError):
            log.error("dropping malformed group pass %r", message.text)
            await queues.drop(self.passes, message.message_id, message.pop_receipt)
            return
        changed, last = await self._batch(job, after)
        if op == PRIORITY:
            job["affected"] = int(job.get("affected", 0)) + len(changed)
        if last is None:
            if op == PRIORITY:
                await self._priority_done(job, job["affected"])
            await queues.drop(self.passes, message.message_id, message.pop_receipt)
            log.info("group pass %s of task group %s finished", op, job["taskGroupId"])
        else:
            await queues.release(self.passes, message.message_id, message.pop_receipt,
                                 text=encode_json({**job, "after": last}))


def _wrap(token: str, meta: GroupMeta) -> str:
    return paging.token(json.dumps({"page": token, "schedulerId": meta.scheduler_id,
                                    "expires": meta.expires, "sealed": meta.sealed}))


def _unwrap(continuation: str | None) -> tuple[str | None, GroupMeta | None]:
    """The token of ``Definitions.list_task_group`` and the metadata carried with it."""
    text = paging.after(continuation)
    if text is None:
        return None, None
    try:
        data = json.loads(text)
        return str(data["page"]), GroupMeta(str(data["schedulerId"]), str(data["expires"]),
                                            str(data["sealed"]), 0)
    except (ValueError, KeyError, TypeError):
        raise errors.InputError("`continuationToken` is not one this API returned") from None
