"""Deadline triggers: every task's durable promise of a look at its deadline, written in
batches.

createTask must not answer before the task's deadline trigger is stored (``definitions``):
without it, a task nobody resolves would stay unresolved forever, and a tip lost later
would never be repaired (``repair``). The trigger is a message in the internal queue
``<prefix>-deadline-batches``, invisible until the first look is due (the tip repair
delay after createTask, or the deadline if that comes first). One message holds the
triggers of several tasks: at most ``PUTS`` puts are in flight per process, and the
createTasks that arrive while they all are wait for the next one together. A createTask
alone puts its own message, as soon as it asks; under load, one message stands for tens
of tasks, which saves a storage request (and a queued message, which Azurite looks at on
each request) per task.

The message holds ``{"tasks": [[taskId, deadline], ...]}``; it is visible when the
first of its tasks' looks is due. The deadline resolver (``resolution``) looks at each
task, and updates the message to hold the tasks still to be looked at, visible at the
next look, or deletes it once none is left. A trigger whose deadline is not its task's
(a createTask refused because another definition holds that taskId) is dropped at its
first look; and a refused createTask withdraws its own trigger at once (``withdraw``),
so that nothing it wrote works later.

Releases before this one put a message per task, ``{"taskId": ...}``, in
``<prefix>-deadline``; the resolver reads that queue too (``parse`` reads both forms),
and never rewrites such a message in the new form, which those releases would not read.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from azqueue.model import timeutil
from azqueue.storage.errors import MessageGone
from azqueue.storage.queues import Message, Queues, decode_json, encode_json

# Puts of trigger messages in flight at once per process; what arrives meanwhile waits
# for the next, all together.
PUTS = 2
# Tasks per message at most: about 70 characters each, far under Azure's 64 KiB.
MOST = 200


@dataclass(frozen=True, slots=True)
class Entry:
    """One task's trigger: its taskId, the deadline it was created with (None in a
    message of an earlier release, which names the taskId alone), and when it is due."""

    task_id: str
    deadline: datetime | None
    due: datetime


def encode(entries: list[Entry]) -> str:
    return encode_json({"tasks": [[e.task_id, timeutil.fmt(e.deadline) if e.deadline else None]
                                  for e in entries]})


def parse(text: str) -> list[tuple[str, datetime | None]]:
    """The (taskId, deadline) pairs of a trigger message, of either form; ValueError if
    it is neither."""
    try:
        data = decode_json(text)
        if "taskId" in data:
            return [(str(data["taskId"]), None)]
        return [(str(task_id), timeutil.parse(deadline) if deadline else None)
                for task_id, deadline in data["tasks"]]
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"not a deadline trigger: {e}") from e


@dataclass(slots=True)
class _Batch:
    entries: list[Entry] = field(default_factory=list)
    stored: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    message: Message | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(frozen=True, slots=True)
class Trigger:
    """A stored trigger, as ``add`` returns it for ``withdraw``."""

    batch: _Batch
    entry: Entry


class DeadlineTriggers:
    """Puts the deadline triggers of this process's createTasks, several to a message."""

    def __init__(self, queues: Queues, queue_name: str, puts: int = PUTS,
                 most: int = MOST) -> None:
        self.queues = queues
        self.queue_name = queue_name
        self._most = most
        self._slots = asyncio.Semaphore(puts)
        self._filling: _Batch | None = None
        self._putting: set[asyncio.Task[None]] = set()

    async def add(self, task_id: str, deadline: datetime, due: datetime) -> Trigger:
        """Store the trigger of ``task_id``, first due at ``due`` (at the latest its
        ``deadline``). A caller cancelled meanwhile leaves its trigger to the others'
        message: the resolver drops a trigger whose task was never stored."""
        entry = Entry(task_id, deadline, min(due, deadline))
        batch = self._filling
        if batch is None or len(batch.entries) >= self._most:
            batch = self._filling = _Batch()
            put = asyncio.create_task(self._put(batch))
            self._putting.add(put)
            put.add_done_callback(self._putting.discard)
        batch.entries.append(entry)
        await asyncio.shield(batch.stored)
        return Trigger(batch, entry)

    async def _put(self, batch: _Batch) -> None:
        try:
            async with self._slots:
                if self._filling is batch:
                    self._filling = None  # whoever comes now waits for the next put
                batch.message = await self.queues.put(
                    self.queue_name, encode(batch.entries), visible_in(batch.entries), forever=True)
        except asyncio.CancelledError:
            batch.stored.cancel()
            raise
        except Exception as e:
            batch.stored.set_exception(e)
            batch.stored.exception()  # raised to the callers; none may be left to ask
        else:
            batch.stored.set_result(None)
        finally:
            if self._filling is batch:
                self._filling = None

    async def withdraw(self, trigger: Trigger) -> None:
        """Take a refused createTask's trigger back: its message is deleted if it held
        that trigger alone, else rewritten without it (unless the resolver has it now:
        then its first look drops it, as its deadline is not its task's)."""
        batch = trigger.batch
        async with batch.lock:
            message = batch.message
            if message is None or trigger.entry not in batch.entries:
                return
            batch.entries.remove(trigger.entry)
            if not batch.entries:
                await self.queues.drop(message.queue_name, message.message_id,
                                       message.pop_receipt)
                return
            try:
                receipt = await self.queues.update(
                    message.queue_name, message.message_id, message.pop_receipt,
                    visible_in(batch.entries), text=encode(batch.entries))
            except MessageGone:
                return
            batch.message = Message(message.queue_name, message.message_id, receipt,
                                    message.text, message.dequeue_count)

    async def close(self) -> None:
        """Wait for the puts under way."""
        if self._putting:
            await asyncio.gather(*self._putting, return_exceptions=True)


def visible_in(entries: list[Entry]) -> timedelta:
    """How long until the first of ``entries`` is due."""
    return max(timedelta(0), min(e.due for e in entries) - timeutil.utcnow())
