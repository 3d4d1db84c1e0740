"""The task events of the last hour, kept by the broker: a RabbitMQ stream bound to the
task exchanges, which any process reads from an hour back on demand.

A stream is an append-only log with a retention by age: every message published to the
task exchanges from the moment it exists is kept for ``MAX_AGE`` (and at most
``MAX_BYTES``: under a load that fills it first, less than an hour), whoever published
it, and reading it deletes nothing. So a replica asked for its dashboard reads the last
hour of the whole deployment at once (``events.listener.Listener`` with ``history``),
where a queue of its own would hear only what came after it was bound. Every replica
declares the stream when it starts (``keep``), with the same arguments (the broker
refuses a second declaration that differs), so that it holds every task event from the
first replica's start on; keeping it costs the broker disk, no storage request.

The stream needs RabbitMQ 3.9 or later. A reader finds where the stream ended when it
started by a marker it appends there itself (to the stream alone, through the default
exchange: no exchange's consumer sees it).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import aio_pika
from aio_pika.abc import AbstractQueue, AbstractRobustChannel

from azqueue.events.publisher import BROKER_ERRORS, CONNECT_TIMEOUT, connect, declare_exchanges

log = logging.getLogger(__name__)

MAX_AGE = "1h"
MAX_BYTES = 500_000_000
# Retention drops whole segments: small ones keep it close to MAX_AGE.
SEGMENT_BYTES = 10_000_000
ARGUMENTS = {"x-queue-type": "stream", "x-max-age": MAX_AGE, "x-max-length-bytes": MAX_BYTES,
             "x-stream-max-segment-size-bytes": SEGMENT_BYTES}
# What a reader appends to find the end of what the stream held when it started.
MARKER = "x-azqueue-marker"


def stream_name(prefix: str) -> str:
    return f"{prefix}task-history"


async def declare(channel: AbstractRobustChannel, prefix: str,
                  exchanges: tuple[str, ...]) -> AbstractQueue:
    """The stream, bound to ``exchanges`` (declared too) with ``#``; idempotent."""
    declared = await declare_exchanges(channel, prefix, exchanges)
    stream = await channel.declare_queue(stream_name(prefix), durable=True,
                                         arguments=dict(ARGUMENTS))
    for exchange in declared.values():
        await stream.bind(exchange, routing_key="#")
    return stream


async def keep(url: str, prefix: str, exchanges: tuple[str, ...]) -> bool:
    """Declare the stream on a connection of its own (closed after), so that it keeps
    every task event from now on; whether it could (a failure is one warning line)."""
    try:
        connection = await asyncio.wait_for(connect(url), CONNECT_TIMEOUT)
    except BROKER_ERRORS as e:
        log.warning("RabbitMQ is not reachable (%s: %s): the last hour of task events is "
                    "kept from when a dashboard is first watched", type(e).__name__, e)
        return False
    try:
        channel = await connection.channel()
        assert isinstance(channel, AbstractRobustChannel)
        await declare(channel, prefix, exchanges)
        return True
    except BROKER_ERRORS as e:
        log.warning("cannot declare the stream %s for the last hour of task events "
                    "(RabbitMQ 3.9 or later has streams): %s: %s", stream_name(prefix),
                    type(e).__name__, e)
        return False
    finally:
        await connection.close()


async def append_marker(channel: AbstractRobustChannel, prefix: str) -> str:
    """Append a marker to the stream: its id, which a reader meets once it has read
    everything the stream held before."""
    marker = uuid.uuid4().hex
    await channel.default_exchange.publish(
        aio_pika.Message(b"", headers={MARKER: marker}), routing_key=stream_name(prefix))
    return marker
