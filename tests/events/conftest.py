"""A real RabbitMQ for event tests: required under CI, skipped (with how to start one)
on a machine without it."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest

from azqueue.model.events import EXCHANGES
from tests.events.consumers import AMQP_URL, PREFIX, Consumer, ConsumerFactory, Received
from tests.servers import IN_CI


@pytest.fixture(scope="session")
async def amqp_url() -> str:
    try:
        connection = await aio_pika.connect(AMQP_URL, timeout=5)
    except Exception as e:  # noqa: BLE001 - any failure means "no broker here"
        message = (f"RabbitMQ is not reachable at {AMQP_URL} ({e}); start it with "
                   "`rabbitmq-server -detached` (or set AZQUEUE_TEST_AMQP_URL)")
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    await connection.close()
    return AMQP_URL


@pytest.fixture
async def consume(amqp_url: str) -> AsyncIterator[ConsumerFactory]:
    """``consume(*binding patterns, exchanges=...)``: a Consumer of those exchanges. Each
    one's messages are checked against their schemas once more after the test, for
    those it never read."""
    connection = await aio_pika.connect_robust(amqp_url)
    channel = await connection.channel()
    made: list[Consumer] = []

    async def make(*patterns: str, exchanges: tuple[str, ...] = EXCHANGES) -> Consumer:
        consumer = Consumer()
        made.append(consumer)
        queue = await channel.declare_queue(f"azqueue-test-{uuid.uuid4().hex}", exclusive=True,
                                            auto_delete=True)
        for name in exchanges:
            exchange = await channel.declare_exchange(f"{PREFIX}{name}",
                                                      aio_pika.ExchangeType.TOPIC, durable=True)
            for pattern in patterns:
                await queue.bind(exchange, routing_key=pattern)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            async with message.process():
                cc = message.headers.get("CC") or []
                consumer.receive(Received(
                    message.exchange.removeprefix(PREFIX), message.routing_key or "",
                    json.loads(message.body), [str(c) for c in cc]))  # type: ignore[union-attr]

        await queue.consume(on_message)
        return consumer

    yield make
    await channel.close()
    await connection.close()
    for consumer in made:
        consumer.check()
