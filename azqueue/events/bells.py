"""The doorbell over RabbitMQ: with events on, replicas tell each other through the broker
that a task queue's tips became visible (``service.dispatch.doorbell``), at no storage request.

One direct exchange, ``<exchange prefix>doorbell``, routing key the deployment's storage
prefix (so deployments sharing a broker do not wake each other); each replica binds an
exclusive queue of its own and hears every ring of its deployment but its own. A ring is
a hint, never a decision: messages are transient, a lost one is caught by the pollers'
fallback, and ``listening`` is False while the broker is away, upon which the pollers
look at their queues as often as they did before there was a doorbell.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

import aio_pika
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage, AbstractRobustConnection

from azqueue.errors import BrokerError
from azqueue.events.publisher import BROKER_ERRORS, connect, connect_or_retry

log = logging.getLogger(__name__)

EXCHANGE = "doorbell"
RING_TIMEOUT = 5.0

Heard = Callable[[dict[str, set[int]]], None]


class BrokerBells:
    """Rings and hears the doorbell of one deployment (``routing_key``) through RabbitMQ."""

    def __init__(self, url: str, exchange_prefix: str, routing_key: str, replica: str) -> None:
        self._url = url
        self._exchange_name = f"{exchange_prefix}{EXCHANGE}"
        self._key = routing_key
        self._replica = replica
        self._connection: AbstractRobustConnection | None = None
        self._exchange: AbstractExchange | None = None
        self._starting: asyncio.Task[None] | None = None
        self._heard: Heard | None = None
        self._on_reconnect: list[Callable[[], None]] = []

    async def start(self, heard: Heard) -> None:
        """Connect and listen, now or (the broker away) as soon as it is back."""
        self._heard = heard
        self._starting = await connect_or_retry(
            self._connect, lambda: self._connection is not None,
            "the doorbell's pollers look at their queues as often as without it until it is",
            name="doorbell connect")

    async def _connect(self) -> None:
        connection = await connect(self._url)
        try:
            channel = await connection.channel(publisher_confirms=False)
            exchange = await channel.declare_exchange(
                self._exchange_name, aio_pika.ExchangeType.DIRECT, durable=True)
            queue = await channel.declare_queue(exclusive=True, auto_delete=True)
            await queue.bind(exchange, routing_key=self._key)
            await queue.consume(self._on_message, no_ack=True)
        except BaseException:
            with contextlib.suppress(Exception):
                await connection.close()
            raise
        connection.reconnect_callbacks.add(lambda *_: self._reconnected())
        self._connection, self._exchange = connection, exchange
        self._reconnected()

    def on_reconnect(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever the doorbell (re)connects: rings sent meanwhile
        were lost."""
        self._on_reconnect.append(callback)

    def _reconnected(self) -> None:
        for callback in self._on_reconnect:
            callback()

    @property
    def listening(self) -> bool:
        """Whether rings of the other replicas reach this one now."""
        if self._connection is None:
            return False
        connected = getattr(self._connection, "connected", None)
        return connected is None or connected.is_set()

    async def ring(self, rings: dict[str, set[int]]) -> None:
        """Ring the priorities (ranks) of each task queue for the other replicas."""
        if self._exchange is None or not self.listening:
            raise BrokerError("the doorbell is not connected")
        body = json.dumps({"from": self._replica,
                           "rings": {tq: sorted(ranks) for tq, ranks in rings.items()}})
        try:
            await self._exchange.publish(
                aio_pika.Message(body.encode(), content_type="application/json",
                                 delivery_mode=aio_pika.DeliveryMode.NOT_PERSISTENT),
                routing_key=self._key, timeout=RING_TIMEOUT)
        except BROKER_ERRORS as e:
            raise BrokerError(f"ringing the doorbell: {type(e).__name__}: {e}") from e

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        try:
            body = json.loads(message.body)
            if body.get("from") == self._replica:
                return
            rings = {str(tq): {int(r) for r in ranks} for tq, ranks in body["rings"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("doorbell: ignoring a message that is not a ring")
            return
        if self._heard is not None:
            self._heard(rings)

    async def close(self) -> None:
        if self._starting is not None:
            self._starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._starting
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
            self._connection = self._exchange = None
