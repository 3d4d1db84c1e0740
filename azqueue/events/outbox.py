"""The outbox: triggers before a change, delivery after it, recovery when that failed."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from azqueue import errors
from azqueue.events.publisher import Publisher
from azqueue.model import events, timeutil
from azqueue.storage.groups import ORPHAN_AGE, GroupStore
from azqueue.storage.queues import Message, Queues, decode_json, encode_json
from azqueue.storage.tasks import TaskStore

log = logging.getLogger(__name__)

# How long a request waits for its events to be confirmed before leaving them to recovery.
FAST_PATH_TIMEOUT = 3.0
# Why a request's events may not go out at once, besides a bug: left to recovery quietly.
_NOT_NOW: tuple[type[Exception], ...] = (*errors.TRANSIENT, TimeoutError)


class Outbox:
    """Publishes the outbox rows a change wrote, and recovers those a process left behind."""

    def __init__(self, tasks: TaskStore, groups: GroupStore, queues: Queues,
                 publisher: Publisher, trigger_queue: str, recovery_delay: timedelta) -> None:
        self.tasks = tasks
        self.groups = groups
        self.queues = queues
        self.publisher = publisher
        self.trigger_queue = trigger_queue
        self.recovery_delay = recovery_delay

    async def setup(self) -> None:
        await self.groups.ensure()
        await self.queues.ensure(self.trigger_queue)

    async def pending(self) -> int:
        """Azure's approximate count of triggers whose events are not yet published."""
        return await self.queues.approximate_count(self.trigger_queue)

    async def begin(self, task_id: str) -> Message:
        """The trigger that makes sure the change's events go out even if we die."""
        return await self.queues.put(self.trigger_queue, encode_json({"taskId": task_id}),
                                     visible_in=self.recovery_delay, forever=True)

    async def finish(self, task_id: str, trigger: Message) -> None:
        """Publish what the change wrote; on failure leave it to the recovery loop."""
        if not self.publisher.reachable:
            log.debug("broker away: events of task %s left to recovery", task_id)
            return
        retry = self.recovery_delay.total_seconds()
        try:
            await asyncio.wait_for(self.deliver(task_id), FAST_PATH_TIMEOUT)
        except _NOT_NOW as e:
            log.warning("events of task %s not published yet (%s: %s); they will be retried "
                        "within %ss", task_id, type(e).__name__, e, retry)
            return
        except Exception:
            # The change is stored: the request succeeds, recovery retries the events.
            log.exception("publishing the events of task %s failed unexpectedly; they will be "
                          "retried within %ss", task_id, retry)
            return
        await self.discard(trigger)

    async def discard(self, trigger: Message) -> None:
        await self.queues.drop(trigger.queue_name, trigger.message_id, trigger.pop_receipt)

    async def deliver(self, task_id: str) -> int:
        """Publish the task's outbox rows in order and delete them; how many went out."""
        rows = await self.tasks.outbox(task_id)
        done: list[str] = []
        try:
            for row_key, event in rows:
                await self.publisher.publish(event)
                if event.group is not None:
                    await self._check_group(task_id, *event.group)
                done.append(row_key)
        finally:
            if done:
                await self.tasks.delete_outbox(task_id, done)
        return len(done)

    async def _check_group(self, task_id: str, task_group_id: str, scheduler_id: str) -> None:
        await self.groups.resolve(task_group_id, task_id)
        now = timeutil.utcnow()
        for member, written in await self.groups.unresolved(task_group_id):
            try:
                task = await self.tasks.get(member)
            except errors.NotFound:
                if now - written > ORPHAN_AGE:
                    await self.groups.drop(task_group_id, member)
                    continue
                return  # about to be written
            if task.definition["taskGroupId"] != task_group_id:
                # Left by a createTask refused as a conflicting redefinition.
                await self.groups.drop(task_group_id, member)
                continue
            return  # a member is still unresolved
        # The group's own task (taskGroupId = its taskId) has no member row until it is
        # resolved.
        own = await self.tasks.find(task_group_id)
        if own is not None and own.definition["taskGroupId"] == task_group_id and \
                not own.state.resolved:
            return
        if await self.groups.claim_announcement(task_group_id, task_id):
            await self.publisher.publish(events.task_group_resolved(task_group_id, scheduler_id))

    async def recover(self) -> int:
        """Handle the triggers that became visible: their changes were not published."""
        handled = 0
        for trigger in await self.queues.receive(self.trigger_queue, self.recovery_delay):
            try:
                task_id = str(decode_json(trigger.text)["taskId"])
            except (ValueError, KeyError):
                await self.discard(trigger)
                continue
            try:
                sent = await self.deliver(task_id)
            except errors.TRANSIENT as e:
                log.warning("events of task %s still not published (%s: %s); retrying in %ss",
                            task_id, type(e).__name__, e, self.recovery_delay.total_seconds())
                continue
            except Exception:
                log.exception("publishing the recovered events of task %s failed unexpectedly; "
                              "retrying in %ss", task_id, self.recovery_delay.total_seconds())
                continue
            if sent:
                log.info("published %d recovered event(s) of task %s", sent, task_id)
            await self.discard(trigger)
            handled += 1
        return handled
