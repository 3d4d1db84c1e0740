"""Hearing the task events of every replica: a queue of this process's own, bound to the
task exchanges.

Every replica publishes each change of a task to the exchanges (``publisher``); a
``Listener`` binds a queue of its own (exclusive: it goes with the connection, and
aio-pika's robust connection declares and binds it again after a reconnect) to the
exchanges it is given with the pattern ``#``, and hands each message to
``on_event(exchange, payload)``. A process learns so of every replica's changes with no
storage request.

With ``history``, it reads the broker's stream of the task events instead
(``events.history``): the last hour first, then each message as it comes, so that it
starts with what every replica published before it was bound; ``caught_up`` says when it
has read what the stream held when it started. A reconnect reads the hour again.

Messages are acknowledged as they are delivered: one that arrives while the connection
is down (without ``history``), or that ``on_event`` cannot use, is lost to this listener.
It serves views that may miss a change (the dashboard's recent changes), never the
queue's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from aio_pika.abc import AbstractIncomingMessage, AbstractRobustChannel, AbstractRobustConnection

from azqueue.events import history as streams
from azqueue.events.publisher import connect, connect_or_retry, declare_exchanges

log = logging.getLogger(__name__)

EventHandler = Callable[[str, dict[str, Any]], None]
# Messages of the stream delivered before their acknowledgements (a stream needs a bound).
PREFETCH = 1000


class Listener:
    """Calls ``on_event(exchange, payload)`` (the exchange's name without ``prefix``) for
    every message published to ``<prefix><name>`` for each of ``exchanges``."""

    def __init__(self, url: str, prefix: str, exchanges: tuple[str, ...],
                 on_event: EventHandler, *, history: bool = False) -> None:
        self._url = url
        self._history = history
        self._marker = ""
        self._caught_up = asyncio.Event()
        self._prefix = prefix
        self._exchanges = exchanges
        self._on_event = on_event
        self._connection: AbstractRobustConnection | None = None
        self._starting: asyncio.Task[None] | None = None

    @property
    def bound(self) -> bool:
        """Whether the queue is bound and consumed (it may be waiting for a reconnect)."""
        return self._connection is not None

    async def start(self) -> None:
        """Bind and consume now; if the broker cannot be reached, keep trying in the
        background."""
        self._starting = await connect_or_retry(
            self._bind, lambda: self._connection is not None,
            "listening to the task exchanges once it is")

    async def _bind(self) -> None:
        connection = await connect(self._url)
        try:
            channel = await connection.channel()
            assert isinstance(channel, AbstractRobustChannel)
            if self._history:
                await self._read_history(channel)
            else:
                exchanges = await declare_exchanges(channel, self._prefix, self._exchanges)
                queue = await channel.declare_queue(f"azqueue-listener-{uuid.uuid4().hex}",
                                                    exclusive=True, auto_delete=True)
                for exchange in exchanges.values():
                    await queue.bind(exchange, routing_key="#")
                await queue.consume(self._deliver, no_ack=True)
        except BaseException:
            await connection.close()
            raise
        self._connection = connection

    async def _read_history(self, channel: AbstractRobustChannel) -> None:
        stream = await streams.declare(channel, self._prefix, self._exchanges)
        await channel.set_qos(prefetch_count=PREFETCH)
        self._marker = await streams.append_marker(channel, self._prefix)
        await stream.consume(self._deliver, no_ack=False,
                             arguments={"x-stream-offset": streams.MAX_AGE})

    async def caught_up(self, timeout: float) -> bool:
        """Whether the history the stream held at the start has been read, waiting up to
        ``timeout`` seconds for it (at once without ``history``)."""
        if not self._history:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._caught_up.wait(), timeout)
        return self._caught_up.is_set()

    async def _deliver(self, message: AbstractIncomingMessage) -> None:
        if self._history:
            await message.ack()
            marker = (message.headers or {}).get(streams.MARKER)
            if marker is not None:
                if marker == self._marker:
                    self._caught_up.set()
                return
        exchange = (message.exchange or "").removeprefix(self._prefix)
        try:
            payload = json.loads(message.body)
            self._on_event(exchange, payload)
        except Exception:  # a message we cannot use must not stop the others
            log.warning("cannot use a message of %s (routing key %s)", exchange,
                        message.routing_key, exc_info=True)

    async def close(self) -> None:
        if self._starting is not None:
            self._starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._starting
        if self._connection is not None:
            await self._connection.close()
