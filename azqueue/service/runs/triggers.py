"""Deadline triggers: every task's durable promise of a look at its deadline, written in
batches.

createTask must not answer before the task's deadline trigger is stored (``definitions``):
without it, a task nobody resolves would stay unresolved forever, and a tip lost later
would never be repaired (``repair``). The trigger is a message in the internal queue
``<prefix>-deadline-batches``, invisible until the first look is due (the tip repair
delay after createTask, or the deadline if that comes first). One message holds the
triggers of several tasks: at most ``PUTS`` puts are in flight per process (a put slower
than ``SLOW_PUT`` no longer counts), and the createTasks that arrive while they all are
wait for the next one together. A createTask alone puts its own message, as soon as it
asks; under load, one message stands for tens of tasks, which saves a storage request
(and a queued message, which Azurite looks at on each request) per task.

The message holds ``{"put": time, "tasks": [[taskId, deadline, due], ...]}``, each
task's next look ``due``; it is visible when the first of them is. The deadline resolver
(``resolution``) looks at the tasks that are due, each at its own time, and updates the
message to hold the tasks still to be looked at, visible at the next look, or deletes it
once none is left. A task not found is looked for again until ``STORE_GRACE`` after the
message was put (the createTasks that share it may still be storing theirs: a task with
a deadline a moment away makes its message visible at once). A trigger whose deadline is
not its task's (a createTask refused because another definition holds that taskId) is
dropped at its first look; and a refused createTask withdraws its own trigger at once
(``withdraw``), so that nothing it wrote works later.

Releases before this one put a message per task, ``{"taskId": ...}``, in
``<prefix>-deadline``; the resolver reads that queue too (``parse`` reads both forms),
and never rewrites such a message in the new form, which those releases would not read.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from azqueue.model import timeutil
from azqueue.storage import retry
from azqueue.storage.errors import MessageGone
from azqueue.storage.queues import Message, Queues, decode_json, encode_json

log = logging.getLogger(__name__)

# Puts of trigger messages in flight at once per process; what arrives meanwhile waits
# for the next, all together.
PUTS = 2
# A put still unanswered after this long (seconds) no longer counts among them: one whose
# answer was lost waits out its attempt's time-out (5 s), and the createTasks after it
# should not wait with it. (So when storage is slow in general, about PUTS x its latency /
# SLOW_PUT puts are in flight, each for the createTasks that came while they waited.)
SLOW_PUT = 1.0
# Tasks per message at most: about 100 characters each, far under Azure's 64 KiB.
MOST = 200
# A createTask stores its task within its request's storage budget after its trigger is
# stored (or never: then its client's retry stores another trigger). A trigger whose task
# is not found yet is kept this long after its message was put.
STORE_GRACE = timedelta(minutes=1)
_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Entry:
    """One task's trigger: its taskId, the deadline it was created with (None in a
    message of an earlier release, which names the taskId alone), and when its next look
    is due (at once, for an earlier release's message)."""

    task_id: str
    deadline: datetime | None
    due: datetime


@dataclass(frozen=True, slots=True)
class Triggers:
    """A trigger message's contents: when it was first put (None: an earlier release's
    message) and its entries."""

    put: datetime | None
    entries: list[Entry]


def encode(entries: list[Entry], put: datetime) -> str:
    return encode_json({"put": timeutil.fmt(put), "tasks": [
        [e.task_id, timeutil.fmt(e.deadline) if e.deadline else None, timeutil.fmt(e.due)]
        for e in entries]})


def parse(text: str) -> Triggers:
    """A trigger message of either form; ValueError if it is neither. An entry that
    cannot be read is left out (and logged); fields after the due time are ignored."""
    try:
        data = decode_json(text)
        if "taskId" in data:
            return Triggers(None, [Entry(str(data["taskId"]), None, _EARLIEST)])
        put = timeutil.parse(str(data["put"]))
        items = list(data["tasks"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"not a deadline trigger: {e}") from e
    entries = []
    for item in items:
        try:
            task_id, deadline, due, *_ = item
            entries.append(Entry(str(task_id), timeutil.parse(deadline) if deadline else None,
                                 timeutil.parse(due)))
        except (TypeError, ValueError) as e:
            log.error("leaving out an unreadable deadline trigger %r: %s", item, e)
    return Triggers(put, entries)


@dataclass(slots=True)
class _Batch:
    entries: list[Entry] = field(default_factory=list)
    put: datetime = _EARLIEST
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

    def __init__(self, queues: Queues, queue_name: str, budget: float, puts: int = PUTS,
                 most: int = MOST) -> None:
        self.queues = queues
        self.queue_name = queue_name
        self._budget = budget
        self._most = most
        self._slots = asyncio.Semaphore(puts)
        self._filling: _Batch | None = None
        self._putting: set[asyncio.Task[None]] = set()

    async def add(self, task_id: str, deadline: datetime, due: datetime) -> Trigger:
        """Store the trigger of ``task_id``, first due at ``due`` (at the latest its
        ``deadline``). A caller cancelled meanwhile leaves its trigger to the others'
        message: the resolver drops a trigger whose task is not stored ``STORE_GRACE``
        after its message was put."""
        entry = Entry(task_id, deadline, min(due, deadline))
        batch = self._filling
        if batch is None or len(batch.entries) >= self._most:
            batch = self._filling = _Batch()
            # For all its callers: outside the request that opened it, with a budget of
            # its own.
            put = asyncio.create_task(self._put(batch), context=contextvars.Context())
            self._putting.add(put)
            put.add_done_callback(self._putting.discard)
        batch.entries.append(entry)
        await asyncio.shield(batch.stored)
        return Trigger(batch, entry)

    async def _put(self, batch: _Batch) -> None:
        freed = False

        def free() -> None:
            nonlocal freed
            if not freed:
                freed = True
                self._slots.release()

        try:
            await self._slots.acquire()
            slow = asyncio.get_running_loop().call_later(SLOW_PUT, free)
            try:
                if self._filling is batch:
                    self._filling = None  # whoever comes now waits for the next put
                batch.put = timeutil.utcnow()
                with retry.budget(self._budget):
                    batch.message = await self.queues.put(
                        self.queue_name, encode(batch.entries, batch.put),
                        visible_in(batch.entries), forever=True)
            finally:
                slow.cancel()
                free()
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
                    visible_in(batch.entries), text=encode(batch.entries, batch.put))
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
