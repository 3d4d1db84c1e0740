"""The exchanges exist as soon as a server with events on has started, so listeners
that come up before any work arrives can bind."""

from __future__ import annotations

import asyncio
import json
import uuid

import aio_pika
import aiohttp

from azqueue.events.history import stream_name
from azqueue.model.events import EXCHANGES
from azqueue.testing import sas
from azqueue.testing.tasks import create, definition
from tests.events.consumers import Consumer, Received
from tests.events.test_durability import Proxy
from tests.servers import ServerFactory


async def _exists(amqp_url: str, name: str) -> bool:
    """Whether the exchange exists (a passive declare, on a connection of its own)."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        try:
            await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, passive=True)
        except aio_pika.exceptions.ChannelClosed:
            return False
        return True
    finally:
        await connection.close()


async def test_a_consumer_binding_right_after_start_up_receives_the_first_tasks_events(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str) -> None:
    prefix = f"test-{uuid.uuid4().hex[:12]}/"
    server = await make_server(amqp_url=amqp_url, exchange_prefix=prefix)
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        # Bound by name, without declaring: the server must have declared them.
        for name in EXCHANGES:
            await queue.bind(f"{prefix}{name}", routing_key="primary.#")
        consumer = Consumer()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            async with message.process():
                consumer.receive(Received(message.exchange.removeprefix(prefix),
                                          message.routing_key or "", json.loads(message.body)))

        await queue.consume(on_message)
        task_id = await create(http, server.api, definition("prov/bind-early"))
        code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/claim",
                                 {"workerGroup": "wg", "workerId": "w"})
        assert code == 200
        code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
        assert code == 200
        await consumer.wait_for(lambda got: "task-completed" in [m.exchange for m in got])
        assert [m.exchange for m in consumer.messages
                if m.routing_key.startswith(f"primary.{task_id}.")
                and m.exchange != "task-group-resolved"] == [
            "task-defined", "task-pending", "task-running", "task-completed"]
    finally:
        # The stream the server declared for its prefix's task events (events.history).
        cleanup = await connection.channel()
        await cleanup.queue_delete(stream_name(prefix))
        await connection.close()


async def test_a_broker_down_at_start_up_does_not_stop_serving_and_gets_the_exchanges_later(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str) -> None:
    proxy = Proxy()
    await proxy.start()
    proxy.open = False
    prefix = f"test-{uuid.uuid4().hex[:12]}/"
    try:
        user = amqp_url.split("//", 1)[1].split("@", 1)[0]
        server = await make_server(amqp_url=f"amqp://{user}@127.0.0.1:{proxy.port}/",
                                   exchange_prefix=prefix)
        async with http.get(f"{server.api}/ping") as r:
            assert r.status == 200
        assert not await _exists(amqp_url, f"{prefix}task-completed")
        proxy.restore()
        async with asyncio.timeout(60):
            while not await _exists(amqp_url, f"{prefix}task-completed"):
                await asyncio.sleep(0.5)
        for name in EXCHANGES:
            assert await _exists(amqp_url, f"{prefix}{name}")
    finally:
        await proxy.close()
