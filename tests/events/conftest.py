"""A real RabbitMQ for event tests: required under CI, skipped (with how to start one)
on a machine without it."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import pytest
from jsonschema import Draft202012Validator

from azqueue.api import validation
from azqueue.model.events import EXCHANGES
from tests.conftest import IN_CI

AMQP_URL = os.environ.get("AZQUEUE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
PREFIX = "exchange/taskcluster-queue/v1/"


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


@dataclass
class Received:
    exchange: str
    routing_key: str
    body: dict[str, Any]
    cc: list[str] = field(default_factory=list)


@dataclass
class Consumer:
    """An exclusive queue bound to the queue's exchanges; collects what it receives."""

    messages: list[Received] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def about(self, task_id: str) -> list[Received]:
        return [m for m in self.messages if m.body.get("status", {}).get("taskId") == task_id]

    async def wait_for(self, predicate: Callable[[list[Received]], bool],
                       timeout: float = 30.0) -> list[Received]:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not predicate(self.messages):
            remaining = end - loop.time()
            if remaining <= 0:
                raise AssertionError("expected messages never arrived; got: "
                                     + ", ".join(f"{m.exchange} {m.routing_key}"
                                                 for m in self.messages))
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), remaining)
            except TimeoutError:
                pass
        return self.messages


ConsumerFactory = Callable[..., Awaitable[Consumer]]


@pytest.fixture
async def consume(amqp_url: str) -> AsyncIterator[ConsumerFactory]:
    connection = await aio_pika.connect_robust(amqp_url)
    channel = await connection.channel()

    async def make(*patterns: str, exchanges: tuple[str, ...] = EXCHANGES) -> Consumer:
        consumer = Consumer()
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
                consumer.messages.append(Received(
                    message.exchange.removeprefix(PREFIX), message.routing_key or "",
                    json.loads(message.body), [str(c) for c in cc]))  # type: ignore[union-attr]
                consumer.arrived.set()

        await queue.consume(on_message)
        return consumer

    yield make
    await channel.close()
    await connection.close()


_SCHEMA = validation.schema("task-messages.json")


def assert_valid(message: Received) -> None:
    """The payload matches our schema for its exchange."""
    schema = {"$ref": f"#/$defs/{message.exchange}", "$defs": _SCHEMA["$defs"]}
    errors = list(Draft202012Validator(schema).iter_errors(message.body))
    assert not errors, f"{message.exchange}: {[e.message for e in errors]}"
