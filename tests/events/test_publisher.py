"""The publisher against a real RabbitMQ: an event counts as published only once the
broker has confirmed it, also when many requests publish at once."""

from __future__ import annotations

import asyncio
import json
import uuid
import contextlib
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel

from azqueue.errors import BrokerError
from azqueue.events import publisher as publishing
from azqueue.events.publisher import Publisher
from azqueue.model.events import Event
from tests.events.test_durability import Proxy
from tests.waiting import eventually


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


@contextlib.asynccontextmanager
async def _behind_proxy(amqp_url: str, prefix: str, query: str = ""
                        ) -> AsyncIterator[tuple[Proxy, Publisher]]:
    """A started publisher whose connection to the broker goes through a ``Proxy``."""
    proxy = Proxy()
    await proxy.start()
    user = amqp_url.split("//", 1)[1].split("@", 1)[0]
    publisher = Publisher(f"amqp://{user}@127.0.0.1:{proxy.port}/{query}", prefix)
    try:
        await publisher.start()
        yield proxy, publisher
    finally:
        proxy.cut()
        await publisher.close()
        await proxy.close()


def _event(task_id: str, run_id: int = 0, cc: tuple[str, ...] = ("route.index.example",)
           ) -> Event:
    return Event("task-running", f"primary.{task_id}.{run_id}.g.w.prov.type._._._",
                 {"status": {"taskId": task_id}, "runId": run_id, "version": 1}, cc=cc)


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


async def test_a_message_without_routes_still_carries_a_headers_table(
        publisher: Publisher, channel: AbstractChannel, prefix: str) -> None:
    queue = await channel.declare_queue(exclusive=True, auto_delete=True)
    await queue.bind(f"{prefix}task-running", routing_key="#")
    await publisher.publish(_event("no-routes", cc=()))
    # Read as it came, without aio-pika's defaults (its consumers see {} either way; a
    # pika consumer reading ``properties.headers.get("CC")`` would meet None).
    raw = await channel.get_underlay_channel()
    got = await raw.basic_get(queue.name, no_ack=True)
    assert json.loads(got.body)["status"]["taskId"] == "no-routes"
    assert got.header.properties.headers == {}
    assert got.header.properties.delivery_mode == aio_pika.DeliveryMode.PERSISTENT


async def test_a_connection_that_stops_answering_is_a_broker_error(
        amqp_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker unreachable without the connection closing (a partition): aiormq gives
    up on the connection once its heartbeats stop, and the publish waiting for its
    confirm fails as any unconfirmed publish does, long before its own time-out."""
    monkeypatch.setattr(publishing, "PUBLISH_TIMEOUT", 300.0)
    async with _behind_proxy(amqp_url, prefix, "?heartbeat=1") as (proxy, publisher):
        await publisher.publish(_event("before"))
        proxy.freeze()
        with pytest.raises(BrokerError, match="stopped answering"):
            await asyncio.wait_for(publisher.publish(_event("frozen")), 120)


async def test_while_the_broker_confirms_nothing_events_stop_piling_up_unsent(
        amqp_url: str, prefix: str, channel: AbstractChannel,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Events are sent without waiting for the socket to take them. While the broker
    takes nothing in (a memory alarm blocks publishers; a network that holds everything),
    they would pile up in the server's memory: once ``MOST_UNCONFIRMED`` sent events
    await their confirm, also those whose publish gave up, the next ones are refused at
    once, unsent (the outbox leaves them to recovery), until the broker answers."""
    monkeypatch.setattr(publishing, "MOST_UNCONFIRMED", 2)
    async with _behind_proxy(amqp_url, prefix) as (proxy, publisher):
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(f"{prefix}task-running", routing_key="#")
        await publisher.publish(_event("before"))
        proxy.freeze()
        for task_id in ("first", "second"):
            with pytest.raises(TimeoutError):  # as the outbox's time-out ends them
                await asyncio.wait_for(publisher.publish(_event(task_id)), 1.0)
        assert not publisher.reachable
        with pytest.raises(BrokerError, match="not sent: 2 events sent before it"):
            await publisher.publish(_event("held"))

        proxy.thaw()
        await eventually(lambda: publisher.reachable, what="the broker's late confirms")
        await publisher.publish(_event("after"))
        arrived = []
        for _ in range(4):
            message = await queue.get(timeout=10, fail=True)
            assert message is not None
            await message.ack()
            arrived.append(json.loads(message.body)["status"]["taskId"])
        assert arrived == ["before", "first", "second", "after"]
        assert await queue.get(fail=False) is None  # "held" was never sent
