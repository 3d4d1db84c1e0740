"""The publisher against a real RabbitMQ: an event counts as published only once the
broker has confirmed it, also when many requests publish at once."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel

from azqueue.errors import BrokerError
from azqueue.events.publisher import Publisher
from azqueue.model.events import Event


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:12]}/"


@pytest.fixture
async def publisher(amqp_url: str, prefix: str) -> AsyncIterator[Publisher]:
    """A publisher to the exchanges ``prefix``*."""
    publisher = Publisher(amqp_url, prefix)
    await publisher.start()
    yield publisher
    await publisher.close()


@pytest.fixture
async def channel(amqp_url: str) -> AsyncIterator[AbstractChannel]:
    connection = await aio_pika.connect(amqp_url)
    yield await connection.channel()
    await connection.close()


def _event(task_id: str, run_id: int = 0) -> Event:
    return Event("task-running", f"primary.{task_id}.{run_id}.g.w.prov.type._._._",
                 {"status": {"taskId": task_id}, "runId": run_id, "version": 1},
                 cc=("route.index.example",))


async def test_a_message_the_broker_refuses_is_a_broker_error_not_a_publish(
        publisher: Publisher, channel: AbstractChannel, prefix: str) -> None:
    exchange = f"{prefix}task-running"
    # A consumer's queue that is full and refuses what would go over its length: the
    # broker answers the publish with a Basic.Nack.
    full = await channel.declare_queue(
        exclusive=True, auto_delete=True,
        arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    await full.bind(exchange, routing_key="#")
    with pytest.raises(BrokerError, match="task-running primary.refused.0"):
        await publisher.publish(_event("refused"))

    await full.unbind(exchange, routing_key="#")
    await publisher.publish(_event("accepted"))  # the same publisher goes on


async def test_publishes_of_concurrent_requests_all_arrive_each_callers_in_order(
        publisher: Publisher, channel: AbstractChannel, prefix: str) -> None:
    queue = await channel.declare_queue(exclusive=True, auto_delete=True)
    await queue.bind(f"{prefix}task-running", routing_key="#")
    callers, each = 16, 25

    async def caller(n: int) -> None:
        for run_id in range(each):  # one after another, as a task's changes are
            await publisher.publish(_event(f"caller{n}", run_id))

    await asyncio.gather(*(caller(n) for n in range(callers)))
    received: dict[str, list[int]] = {}
    for _ in range(callers * each):
        message = await queue.get(timeout=10, fail=True)
        assert message is not None
        await message.ack()
        body = json.loads(message.body)
        received.setdefault(body["status"]["taskId"], []).append(body["runId"])
        assert message.headers["CC"] == ["route.index.example"]
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert message.content_type == "application/json"
    assert received == {f"caller{n}": list(range(each)) for n in range(callers)}
    assert await queue.get(fail=False) is None  # nothing twice
