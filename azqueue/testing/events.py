"""A test server's events, recorded without a broker: what the ``azqueue_events`` fixture
hands out.

The server built with a ``RecordedEvents`` (``create_app(settings, events=...)``) runs
with events on as a deployment with a broker does, through the same outbox, and hands
each message to ``publish`` here instead of RabbitMQ. A test waits for one with
``wait_for(kind, task_id)``, which returns the message's body as Taskcluster's schema of
its exchange has it (``{"version": 1, "status": {...}, "runId": ..., ...}``)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any

from azqueue.model.events import EXCHANGES, Event

DEFAULT_PREFIX = "exchange/taskcluster-queue/v1/"


@dataclass(frozen=True, slots=True)
class Message:
    """One message as a broker would have delivered it: ``exchange`` (its short name,
    e.g. ``task-completed``), ``routing_key``, ``body`` and the ``cc`` routes."""

    exchange: str
    routing_key: str
    body: dict[str, Any]
    cc: tuple[str, ...] = ()

    @property
    def about(self) -> str | None:
        """The taskId of a task message, the taskGroupId of a task group message."""
        status = self.body.get("status")
        if isinstance(status, dict):
            return str(status.get("taskId"))
        group = self.body.get("taskGroupId")
        return None if group is None else str(group)


class RecordedEvents:
    """The messages a test server published, in order (``messages``); thread-safe, so a
    synchronous test waits while the server runs on its own loop."""

    def __init__(self, exchange_prefix: str = DEFAULT_PREFIX) -> None:
        self.exchange_prefix = exchange_prefix
        self._messages: list[Message] = []
        self._arrived = threading.Condition()

    # -- the server's side: an ``azqueue.events.publisher.EventSink`` ----------------

    @property
    def reachable(self) -> bool:
        return True

    @property
    def connected(self) -> bool:
        return True

    async def start(self) -> None:
        pass

    async def publish(self, event: Event) -> None:
        with self._arrived:
            self._messages.append(Message(event.exchange, event.routing_key, event.payload,
                                          event.cc))
            self._arrived.notify_all()

    async def close(self) -> None:
        pass

    # -- the test's side ---------------------------------------------------------------

    @property
    def messages(self) -> list[Message]:
        """Every message so far, in the order they were published."""
        with self._arrived:
            return list(self._messages)

    def of(self, kind: str | None = None, task_id: str | None = None) -> list[Message]:
        """The messages so far of the exchange ``kind`` (any if None) about ``task_id``."""
        exchange = self._exchange(kind) if kind is not None else None
        return [m for m in self.messages
                if (exchange is None or m.exchange == exchange)
                and (task_id is None or m.about == task_id)]

    def wait_for(self, kind: str, task_id: str | None = None, *,
                 timeout: float = 30.0) -> dict[str, Any]:
        """The body of the first message of the exchange ``kind`` (``task-completed``, or
        its full name ``exchange/taskcluster-queue/v1/task-completed``) about ``task_id``
        (a task's, or a task group's for the task group exchanges; any if None), waiting
        up to ``timeout`` seconds for it; AssertionError saying what came instead after
        that."""
        exchange = self._exchange(kind)
        end = time.monotonic() + timeout
        with self._arrived:
            while True:
                for message in self._messages:
                    if message.exchange == exchange and (task_id is None
                                                         or message.about == task_id):
                        return message.body
                remaining = end - time.monotonic()
                if remaining <= 0:
                    seen = ", ".join(f"{m.exchange} {m.about}" for m in self._messages)
                    raise AssertionError(
                        f"no {exchange} message about {task_id or 'any task'} within "
                        f"{timeout:g} s; published: {seen or 'nothing'}")
                self._arrived.wait(remaining)

    async def wait_for_async(self, kind: str, task_id: str | None = None, *,
                             timeout: float = 30.0) -> dict[str, Any]:
        """``wait_for()`` for a test on an event loop of its own, which keeps running."""
        return await asyncio.to_thread(self.wait_for, kind, task_id, timeout=timeout)

    def _exchange(self, kind: str) -> str:
        name = kind.removeprefix(self.exchange_prefix)
        if name not in EXCHANGES:
            raise ValueError(f"{kind!r} is no exchange of the queue; the exchanges: "
                             f"{', '.join(EXCHANGES)}")
        return name
