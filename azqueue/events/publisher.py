"""Publishing to RabbitMQ with aio-pika: persistent messages, publisher confirms.

The exchanges are declared when the server starts (``start``), so listeners that come up
before the first event can bind; with the broker away then, a background attempt
connects (and declares them) as soon as it is back. aio-pika's robust connection declares
them again after every reconnect."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import aio_pika
import aiormq
from aio_pika.abc import AbstractExchange, AbstractRobustChannel, AbstractRobustConnection
from aio_pika.connection import make_url
from aio_pika.exceptions import AMQPError, ChannelInvalidStateError
from aiormq import spec
from aiormq.abc import FieldValue

from azqueue import metrics
from azqueue.errors import BrokerError
from azqueue.internals.aiormq import unconfirmed
from azqueue.model.events import EXCHANGES, Event

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
RECONNECT_INTERVAL = 1.0
# After a failed first connection, requests leave their events to recovery this long
# before one of them tries again.
FIRST_CONNECT_RETRY = 10.0
PUBLISH_TIMEOUT = 10.0
# How often a start-up connection (``connect_or_retry``) is tried again while the broker
# is away.
START_RETRY = 2.0
# What aio-pika raises when the broker is away, refuses or does not confirm in time.
BROKER_ERRORS = (AMQPError, ChannelInvalidStateError, OSError, TimeoutError)
PERSISTENT = int(aio_pika.DeliveryMode.PERSISTENT)
# Events sent and not yet confirmed, at most, per process: about a megabyte.
MOST_UNCONFIRMED = 1000


async def connect(url: str) -> AbstractRobustConnection:
    """A robust connection to the broker at ``url`` (as aio_pika.connect_robust makes, but
    one that fails is closed here: left to the garbage collector, it schedules its own
    close on a loop that may be gone by then)."""
    connection = aio_pika.RobustConnection(make_url(url, reconnect_interval=RECONNECT_INTERVAL),
                                           reconnect_interval=RECONNECT_INTERVAL)
    try:
        await connection.connect(timeout=CONNECT_TIMEOUT)
    except BaseException:
        with contextlib.suppress(Exception):
            await connection.close()
        raise
    return connection


async def connect_or_retry(attempt: Callable[[], Awaitable[None]],
                           connected: Callable[[], bool], then: str,
                           name: str | None = None) -> asyncio.Task[None] | None:
    """Connect now with ``attempt`` (which connects and sets up what it needs); if the
    broker cannot be reached, say so (with ``then``: what happens once it is) and keep
    trying every ``START_RETRY`` seconds in the background until ``connected()``. Gives
    that background task (``name``), to cancel on closing; None if connected now."""
    try:
        await attempt()
        return None
    except BROKER_ERRORS as e:
        log.warning("RabbitMQ is not reachable at start-up (%s: %s); %s",
                    type(e).__name__, e, then)

    async def keep_trying() -> None:
        while not connected():
            await asyncio.sleep(START_RETRY)
            with contextlib.suppress(*BROKER_ERRORS):
                await attempt()

    return asyncio.create_task(keep_trying(), name=name)


async def declare_exchanges(channel: AbstractRobustChannel, prefix: str,
                            names: tuple[str, ...] = EXCHANGES) -> dict[str, AbstractExchange]:
    """The topic exchanges ``<prefix><name>``, declared durable (as Taskcluster's are)."""
    return {name: await channel.declare_exchange(f"{prefix}{name}", aio_pika.ExchangeType.TOPIC,
                                                 durable=True)
            for name in names}


class EventSink(Protocol):
    """Where the outbox sends the messages of a change: the broker (``Publisher``), or a
    test's recorder (``azqueue.testing.events.RecordedEvents``)."""

    @property
    def reachable(self) -> bool:
        """False while sending would only wait (then the outbox hands the change over)."""

    @property
    def connected(self) -> bool:
        """Whether the sink can take events now (the heartbeat asks)."""

    async def start(self) -> None: ...

    async def publish(self, event: Event) -> None:
        """Send ``event``; BrokerError if it is not confirmed."""

    async def close(self) -> None: ...


class Publisher:
    """Connects on first use and reconnects by itself (aio-pika's robust connection)."""

    def __init__(self, url: str, exchange_prefix: str) -> None:
        self._url = url
        self._prefix = exchange_prefix
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractRobustChannel | None = None
        self._exchanges: dict[str, AbstractExchange] = {}
        self._lock = asyncio.Lock()
        self._failed_at: float | None = None  # the last failed first connection attempt
        self._starting: asyncio.Task[None] | None = None
        self._underlay: aiormq.Channel | None = None  # the channel events went out on last

    async def start(self) -> None:
        """Connect and declare the exchanges now; if the broker cannot be reached, keep
        trying in the background (serving does not wait for it)."""
        self._starting = await connect_or_retry(
            self._ready, lambda: self._connection is not None,
            "declaring the exchanges once it is")

    @property
    def reachable(self) -> bool:
        """False while the broker is known to be away (connection lost and not yet back,
        or the first connection failed less than ``FIRST_CONNECT_RETRY`` ago), or takes
        nothing in (``_full``): publishing now would only wait for it."""
        if self._full(self._underlay):
            return False
        if self._connection is None:
            return (self._failed_at is None
                    or time.monotonic() - self._failed_at > FIRST_CONNECT_RETRY)
        connected = getattr(self._connection, "connected", None)
        return connected is None or connected.is_set()

    @property
    def connected(self) -> bool:
        """Whether a connection to the broker is up now (not merely worth a try)."""
        if self._connection is None:
            return False
        connected = getattr(self._connection, "connected", None)
        return connected is None or connected.is_set()

    async def _ready(self) -> None:
        """Connected, with the exchanges declared; raises if the broker cannot be reached.

        The first connection is retried on every call until it succeeds; after that
        aio-pika reconnects (and restores the channel and exchanges) by itself, and we
        only wait a little for it.
        """
        async with self._lock:
            if self._channel is None:
                try:
                    connection = await connect(self._url)
                except BaseException:
                    self._failed_at = time.monotonic()
                    raise
                try:
                    channel = await connection.channel(publisher_confirms=True)
                    assert isinstance(channel, AbstractRobustChannel)
                    self._exchanges = await declare_exchanges(channel, self._prefix)
                except BaseException:
                    await connection.close()
                    raise
                self._connection, self._channel = connection, channel
                log.info("publishing events to %s*", self._prefix)
        assert self._connection is not None
        connected = getattr(self._connection, "connected", None)
        if connected is not None and not connected.is_set():
            await asyncio.wait_for(connected.wait(), CONNECT_TIMEOUT)

    @staticmethod
    def _full(channel: aiormq.Channel | None) -> bool:
        """Whether ``MOST_UNCONFIRMED`` events sent on ``channel`` still await the broker's
        confirm. Events are sent without waiting for the socket to take them
        (``wait=False``): while the broker takes nothing in (a memory or disk alarm blocks
        publishers; a network that holds everything until the heartbeat gives up), they
        would pile up in this process's memory. aiormq keeps an event's confirmation
        until the broker answers it, also when its publish gave up waiting, so this
        bounds what is held (``azqueue.internals.aiormq``); a channel opened again after
        a reconnect starts empty."""
        return (channel is not None and not channel.is_closed
                and unconfirmed(channel) >= MOST_UNCONFIRMED)

    async def publish(self, event: Event) -> None:
        """Publish and wait for the broker's confirm; BrokerError if it is not confirmed
        (a Basic.Nack is raised as aiormq's DeliveryError), or at once, unsent, while
        ``MOST_UNCONFIRMED`` events already await theirs (``_full``)."""
        # As aio_pika.Message sets them: a headers table always (consumers read CC from
        # it), priority 0.
        headers: dict[str, FieldValue] = {"CC": list(event.cc)} if event.cc else {}
        properties = spec.Basic.Properties(content_type="application/json",
                                           delivery_mode=PERSISTENT, headers=headers,
                                           priority=0)
        try:
            await self._ready()
            assert self._channel is not None
            exchange = self._exchanges[event.exchange].name  # declared, again after reconnects
            channel = await self._channel.get_underlay_channel()
            assert isinstance(channel, aiormq.Channel)  # whose basic_publish takes ``wait``
            self._underlay = channel
            if self._full(channel):
                raise BrokerError(f"{event.exchange} {event.routing_key} not sent: "
                                  f"{unconfirmed(channel)} events sent before it "
                                  "still await the broker's confirm")
            # Through the channel under aio-pika's exchange, for ``wait=False``: the publish
            # does not hold the channel's lock until its frames are on the socket, so the
            # publishes of concurrent requests go out together and are confirmed together
            # (half the CPU per event at 16 at once; scripts/measure_publish.py). The
            # confirm is still awaited: a message that never left is not confirmed.
            # Not mandatory: a message that no queue is bound for is dropped by the broker,
            # as in Taskcluster, rather than sent back to us in full.
            await channel.basic_publish(json.dumps(event.payload).encode(), exchange=exchange,
                                        routing_key=event.routing_key, properties=properties,
                                        mandatory=False, timeout=PUBLISH_TIMEOUT, wait=False)
        except BROKER_ERRORS as e:
            raise BrokerError(f"{event.exchange} {event.routing_key} not confirmed: "
                              f"{type(e).__name__}: {e}") from e
        except asyncio.CancelledError as e:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this publish was cancelled (its caller's timeout, a shutdown)
            # aiormq closes a connection whose heartbeats stopped with the CancelledError
            # of its reader, and rejects the confirms still awaited with it.
            raise BrokerError(f"{event.exchange} {event.routing_key} not confirmed: the "
                              "connection to the broker stopped answering") from e
        metrics.count_event(event.exchange)

    async def close(self) -> None:
        if self._starting is not None:
            self._starting.cancel()
        if self._connection is not None:
            await self._connection.close()
