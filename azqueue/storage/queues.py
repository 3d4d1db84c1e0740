"""Azure queues: the pending queues that carry tips, and internal trigger queues.

Pending queues: one per (taskQueueId, priority), named
``<prefix>-<sha256(taskQueueId)[:40]>-<rank>`` (rank 0 = highest), so any
taskQueueId maps to a valid, practically collision-free name; the queue's metadata
records the real provisionerId, workerType and priority. Workers poll them directly
through SAS URLs that carry only the ``process`` permission (get and delete).

A task queue's seven queues are made when its first tip is put, all at once, and never
before: pollTaskUrls and claimWork only name them. So a caller whose scopes cover many
task queue names (``queue:poll-task-urls:wild/*``) makes no queue by asking. Until then
a worker's poll of a SAS URL is answered 404 ``QueueNotFound``, which means what an
empty queue means (docs/workers/sas.md says so); claimWork's poller and the samples
take it so too.

The empty queues of a task queue nobody used for its expiry period are deleted again
(``service.upkeep.idlequeues``), by any replica. So a process may believe a queue exists that
another deleted: a put answered 404 ``QueueNotFound`` forgets it, makes it again and
puts again, and a queue deleted moments ago, which Azure refuses to make again for a
while (409 ``QueueBeingDeleted``, about 40 s), is waited for (``PendingQueues.put``).

Internal queues (e.g. ``<prefix>-deadline-batches``) hold messages invisible until the moment
they stand for; a resolver acts when one becomes visible. They are durable triggers,
never the truth: the Task entity decides.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.storage.queue import QueueSasPermissions, generate_queue_sas
from azure.storage.queue.aio import QueueClient

from azqueue.errors import NotConfigured
from azqueue.model.priority import ORDER, Priority
from azqueue.storage.account import StorageAccount
from azqueue.storage.errors import (EntityExists, EntityNotFound, MessageGone,
                                    QueueBeingDeleted, translate, translate_message)
from azqueue.storage.retry import time_left

log = logging.getLogger(__name__)

MAX_VISIBILITY = timedelta(days=7) - timedelta(minutes=1)
# How many queues' SDK clients (about 4 kB each), and names of queues known to exist, a
# process keeps (those used last).
MAX_CLIENTS = 200
MAX_KNOWN = 10_000
# How long a put waits for a pending queue deleted moments ago to be made again (Azure
# answers 409 QueueBeingDeleted for about 40 s after a delete), within the time the
# request it serves has left; the pauses between tries, doubling.
BEING_DELETED_WAIT = 60.0
FIRST_PAUSE, MAX_PAUSE = 0.5, 5.0
# What a put needs of the request's time once the queue could be made.
PUT_MARGIN = 1.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Message:
    """A message as received, with what is needed to update or delete it."""

    queue_name: str
    message_id: str
    pop_receipt: str
    text: str
    dequeue_count: int


@dataclass(frozen=True, slots=True)
class Received:
    """What one receive got, and whether an attempt of it whose answer was lost may have
    received other messages: those are hidden, receipts unknown, until its visibility
    timeout ends."""

    messages: list[Message]
    others_hidden: bool


@dataclass(frozen=True, slots=True)
class Peeked:
    """A message as peeked: visible now, left as it is."""

    message_id: str
    text: str
    inserted: datetime


@dataclass(frozen=True, slots=True)
class SignedQueueUrls:
    """SAS URLs: credentials, kept out of reprs."""

    signed_poll_url: str = field(repr=False)
    signed_delete_url: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class PendingQueue:
    """A pending queue as listed: its name, the digest of its taskQueueId
    (``PendingQueues.digest``) and when it was made (None if its metadata does not say:
    made by an earlier release)."""

    name: str
    digest: str
    made: datetime | None


def _seconds(delta: timedelta) -> int:
    return max(0, min(int(delta.total_seconds() + 0.999), int(MAX_VISIBILITY.total_seconds())))


class Queues:
    """Operations on any queue of the account, by name. The SDK's clients are kept for
    the ``MAX_CLIENTS`` queues used last, and the names of the queues this process knows
    to exist for the ``MAX_KNOWN`` used last."""

    def __init__(self, account: StorageAccount) -> None:
        self._account = account
        self._rest = account.rest
        self._clients: OrderedDict[str, QueueClient] = OrderedDict()
        self._ensured: OrderedDict[str, None] = OrderedDict()
        self._creating: dict[str, asyncio.Future[None]] = {}

    def client(self, name: str) -> QueueClient:
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = self._account.queues.get_queue_client(name)
        _keep(self._clients, name, MAX_CLIENTS)
        return client

    def url(self, name: str) -> str:
        """The queue's URL (as this process reaches it), with no client made for it."""
        return f"{self._account.queues.url.rstrip('/')}/{name}"

    def known(self, name: str) -> bool:
        """Whether this process knows that the queue exists."""
        if name not in self._ensured:
            return False
        _keep(self._ensured, name, MAX_KNOWN)
        return True

    async def ensure(self, name: str, metadata: Mapping[str, str] | None = None) -> None:
        """Create the queue unless this process already knows it exists (callers asking
        at the same time share one request)."""
        if self.known(name):
            return
        creating = self._creating.get(name)
        if creating is None:
            creating = self._creating[name] = asyncio.ensure_future(self._create(name, metadata))
            creating.add_done_callback(lambda _: self._creating.pop(name, None))
        await asyncio.shield(creating)

    def forget(self, name: str) -> None:
        """The queue was deleted, or may have been: the next ``ensure`` makes it again."""
        self._ensured.pop(name, None)

    async def remove(self, name: str) -> bool:
        """Delete the queue (its messages with it); False if it did not exist. This
        process forgets it; the others learn it from a put answered 404 (``PendingQueues.put``)."""
        try:
            with translate(f"deleting queue {name}"):
                await self.client(name).delete_queue()
        except EntityNotFound:
            return False
        finally:
            self.forget(name)
            self._clients.pop(name, None)
        return True

    async def _create(self, name: str, metadata: Mapping[str, str] | None) -> None:
        try:
            with translate(f"creating queue {name}"):
                await self.client(name).create_queue(metadata=dict(metadata or {}))
        except EntityExists:
            pass  # exists already, with other metadata: fine
        self._ensured[name] = None
        _keep(self._ensured, name, MAX_KNOWN)

    async def put(self, name: str, text: str, visible_in: timedelta = timedelta(0),
                  forever: bool = False) -> Message:
        with translate(f"adding a message to {name}"):
            msg = await self._rest.put_message(name, text, _seconds(visible_in) or None,
                                               -1 if forever else None)
        return Message(name, msg.message_id, msg.pop_receipt, text, 0)

    async def update(self, name: str, message_id: str, pop_receipt: str, visible_in: timedelta,
                     text: str | None = None) -> str:
        """Change a message's visibility (and text); the new pop receipt. MessageGone if stale."""
        with translate_message(f"updating message {message_id} in {name}"):
            return await self._rest.update_message(name, message_id, pop_receipt,
                                                   _seconds(visible_in), text)

    async def delete(self, name: str, message_id: str, pop_receipt: str) -> None:
        """Delete a message. MessageGone if it is gone or the receipt is stale."""
        with translate_message(f"deleting message {message_id} from {name}"):
            await self._rest.delete_message(name, message_id, pop_receipt)

    async def drop(self, name: str, message_id: str, pop_receipt: str) -> bool:
        """Delete a message if it is still ours; False if it was gone or not ours any more."""
        try:
            await self.delete(name, message_id, pop_receipt)
        except MessageGone:
            return False
        return True

    async def release(self, name: str, message_id: str, pop_receipt: str,
                      text: str | None = None) -> bool:
        """Make a message visible again at once (with ``text``, rewritten); False if it was
        gone or not ours any more."""
        return await self.postpone(name, message_id, pop_receipt, timedelta(0), text)

    async def postpone(self, name: str, message_id: str, pop_receipt: str, delay: timedelta,
                       text: str | None = None) -> bool:
        """Make a message visible again in ``delay``; False if it was gone or not ours any
        more."""
        try:
            await self.update(name, message_id, pop_receipt, delay, text=text)
        except MessageGone:
            return False
        return True

    async def receive(self, name: str, invisible_for: timedelta, limit: int = 32) -> list[Message]:
        """Up to ``limit`` (at most 32) visible messages, hidden for ``invisible_for``."""
        return (await self.receive_batch(name, invisible_for, limit)).messages

    async def receive_batch(self, name: str, invisible_for: timedelta,
                            limit: int = 32) -> Received:
        """``receive``, saying whether other messages may have been hidden by an attempt
        whose answer was lost."""
        with translate(f"receiving messages from {name}"):
            got, lost = await self._rest.receive_messages(name, min(limit, 32),
                                                          _seconds(invisible_for))
        return Received([Message(name, m.message_id, m.pop_receipt, m.text, m.dequeue_count)
                         for m in got], lost)

    async def peek(self, name: str, limit: int = 32) -> list[Peeked]:
        """Up to ``limit`` (at most 32, Azure's limit) of the messages visible now, oldest
        first, without changing them; none if the queue does not exist."""
        try:
            with translate(f"peeking at {name}"):
                got = await self.client(name).peek_messages(max_messages=min(limit, 32))
        except EntityNotFound:
            return []
        return [Peeked(m.id, str(m.content), m.inserted_on or _EPOCH) for m in got]

    async def approximate_count(self, name: str) -> int:
        """Azure's approximate number of messages in queue ``name``, invisible ones
        included (0 if the queue does not exist): one request."""
        try:
            with translate(f"reading the properties of queue {name}"):
                properties = await self.client(name).get_queue_properties()
        except EntityNotFound:
            return 0
        return int(properties.approximate_message_count or 0)

    def signed_urls(self, name: str, start: datetime, expiry: datetime) -> SignedQueueUrls:
        key = self._account.account_key
        if not key:
            raise NotConfigured(
                "pollTaskUrls needs the storage account key to sign queue SAS URLs, and this "
                "deployment has none (it signs in with azure-identity, or a SAS token): Azure has "
                "no user-delegation SAS for queues. Have workers use claimWork, or configure a "
                "connection string with AccountKey")
        sas = generate_queue_sas(self._account.account_name, name, key,
                                 permission=QueueSasPermissions(process=True),
                                 start=start, expiry=expiry)
        base = self._account.public_url("queue", f"{self.url(name)}/messages")
        return SignedQueueUrls(
            signed_poll_url=f"{base}?{sas}",
            signed_delete_url=f"{base}/{{{{messageId}}}}?popreceipt={{{{popReceipt}}}}&{sas}",
        )


class PendingQueues:
    """The seven pending queues of every task queue."""

    def __init__(self, account: StorageAccount, queues: Queues) -> None:
        self._account = account
        self.queues = queues

    def name(self, task_queue_id: str, priority: Priority) -> str:
        return self._account.queue_name(f"{self.digest(task_queue_id)}-{priority.rank}")

    async def ensure(self, task_queue_id: str, priority: Priority) -> str:
        """The name of the task queue's queue at ``priority``, once the seven exist (made
        at once if this process does not know them)."""
        names = [self.name(task_queue_id, p) for p in ORDER]
        missing = [p for p, name in zip(ORDER, names) if not self.queues.known(name)]
        if missing:
            provisioner_id, worker_type = task_queue_id.split("/", 1)
            made = datetime.now(UTC).strftime(_MADE_FORMAT)
            await asyncio.gather(*(self.queues.ensure(
                names[p.rank],
                {"provisionerid": provisioner_id, "workertype": worker_type, "priority": str(p),
                 "made": made})
                for p in missing))
        return names[priority.rank]

    async def put(self, task_queue_id: str, priority: Priority, text: str,
                  visible_in: timedelta = timedelta(0)) -> Message:
        """Put ``text`` in the task queue's queue at ``priority`` (hidden for
        ``visible_in``), made first if this process does not know it exists. A queue
        deleted since this process made it or learned it exists (an idle task queue's, by
        any replica: ``service.upkeep.idlequeues``) answers 404: it is made again and the
        put tried again. One deleted moments ago cannot be made yet (409
        ``QueueBeingDeleted``): tried again, pausing, for up to ``BEING_DELETED_WAIT``
        seconds or the time the request served has left, then QueueBeingDeleted (a
        ``StorageUnavailable``) is raised and nothing was put."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + BEING_DELETED_WAIT
        pause = FIRST_PAUSE
        found_deleted = False
        while True:
            name = self.name(task_queue_id, priority)
            try:
                await self.ensure(task_queue_id, priority)
                return await self.queues.put(name, text, visible_in)
            except EntityNotFound:
                self.queues.forget(name)
                if not found_deleted:  # made again and tried again at once, the first time
                    found_deleted = True
                    log.info("queue %s of %s was deleted (idle): making it again", name,
                             task_queue_id)
                    continue
                error: Exception = QueueBeingDeleted(
                    f"queue {name} of {task_queue_id} was deleted again as it was made")
            except QueueBeingDeleted as e:
                self.queues.forget(name)
                error = e
            left = give_up - loop.time()
            budget = time_left()
            if budget is not None:
                left = min(left, budget - PUT_MARGIN)
            if left <= 0:
                raise error
            log.info("queue %s of %s is still being deleted: trying again in %.1fs", name,
                     task_queue_id, min(pause, left))
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, MAX_PAUSE)

    async def existing(self) -> list[PendingQueue]:
        """The pending queues of every task queue, as they are now: one request per 5,000
        queues. (Azurite's listing of more queues than one page holds repeats some and
        leaves others out: those are listed once fewer are left.)"""
        start = self._account.queue_name("")
        found: dict[str, PendingQueue] = {}
        with translate("listing the pending queues"):
            async for queue in self._account.queues.list_queues(
                    name_starts_with=start, include_metadata=True, results_per_page=5000):
                name = str(queue.name)
                match = _PENDING.match(name[len(start):])
                if match:
                    found[name] = PendingQueue(name, match.group(1),
                                               _made((queue.metadata or {}).get("made")))
        return list(found.values())

    @staticmethod
    def digest(task_queue_id: str) -> str:
        """What a pending queue's name says of its task queue."""
        return hashlib.sha256(task_queue_id.encode()).hexdigest()[:40]

    def signed_urls(self, task_queue_id: str, start: datetime,
                    expiry: datetime) -> list[SignedQueueUrls]:
        """SAS URLs of all seven queues, highest priority first, whether they exist yet
        or not (see the module's docstring)."""
        return [self.queues.signed_urls(self.name(task_queue_id, p), start, expiry)
                for p in ORDER]


_PENDING = re.compile(r"^([0-9a-f]{40})-[0-9]$")
_MADE_FORMAT = "%Y%m%dT%H%M%SZ"  # metadata values are plain ASCII


def _made(value: str | None) -> datetime | None:
    try:
        return datetime.strptime(value or "", _MADE_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


def _keep(cache: OrderedDict[str, Any], name: str, bound: int) -> None:
    """``name`` was just used: keep it, and forget the names used longest ago beyond
    ``bound``."""
    cache.move_to_end(name)
    while len(cache) > bound:
        cache.popitem(last=False)


def encode_json(data: Mapping[str, Any]) -> str:
    return base64.b64encode(json.dumps(dict(data), separators=(",", ":")).encode()).decode()


def decode_json(text: str) -> dict[str, Any]:
    return dict(json.loads(base64.b64decode(text)))
