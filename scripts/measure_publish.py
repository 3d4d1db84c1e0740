#!/usr/bin/env python3
"""What one event costs the process that publishes it: CPU per message of azqueue's
``Publisher`` (persistent, publisher confirms), one at a time and 16 at once, beside
aiormq's ``basic_publish`` alone as aio-pika's ``Exchange.publish`` calls it (holding the
channel's lock until the frames are on the socket), on a RabbitMQ of your choice. A
lifecycle publishes five events (task-defined, task-pending, task-running,
task-completed, task-group-resolved), so this is most of what events on add to a
lifecycle's server CPU.

Usage: .venv/bin/python scripts/measure_publish.py [--amqp URL] [--messages 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import time
from collections.abc import Awaitable, Callable

import aio_pika
from pamqp import commands

from azqueue.events.publisher import Publisher
from azqueue.model.events import EXCHANGES, Event


PAYLOAD = {"status": {"taskId": "fN1R8yHkT0WPqJ3M2xVb9A", "taskQueueId": "prov/type",
                      "state": "running", "retriesLeft": 5,
                      "runs": [{"runId": 0, "state": "running", "reasonCreated": "scheduled",
                                "scheduled": "2026-11-26T00:00:00.000Z",
                                "takenUntil": "2026-11-26T00:20:00.000Z",
                                "workerGroup": "g", "workerId": "w"}]},
           "runId": 0, "workerGroup": "g", "workerId": "w", "version": 1}


def cpu() -> float:
    t = os.times()
    return t.user + t.system


async def measure(label: str, publish: Callable[[], Awaitable[object]], messages: int) -> None:
    for at_once in (1, 16):
        slots = asyncio.Semaphore(at_once)

        async def one() -> None:
            async with slots:
                await publish()

        await asyncio.gather(*(one() for _ in range(200)))  # warm up
        before, started = cpu(), time.perf_counter()
        await asyncio.gather(*(one() for _ in range(messages)))
        used, took = cpu() - before, time.perf_counter() - started
        print(f"| {label} | {at_once} | {used * 1000 / messages:.3f} | {messages / took:.0f} |")


async def main(url: str, messages: int) -> None:
    prefix = f"measure-{secrets.token_hex(4)}/"
    event = Event("task-running", "primary.fN1R8yHkT0WPqJ3M2xVb9A.0.g.w.prov.type._._._",
                  PAYLOAD, cc=("route.example",))
    publisher = Publisher(url, prefix)
    await publisher.start()
    print("| publishing | at once | CPU per message, ms | messages/s |\n"
          "| --- | ---: | ---: | ---: |")
    try:
        await measure("azqueue's Publisher", lambda: publisher.publish(event), messages)
    finally:
        await publisher.close()

    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = f"{prefix}task-running"
        raw = await channel.get_underlay_channel()
        properties = commands.Basic.Properties(content_type="application/json", delivery_mode=2,
                                               headers={"CC": ["route.example"]})

        async def basic_publish() -> None:
            await raw.basic_publish(json.dumps(PAYLOAD).encode(), exchange=exchange,
                                    routing_key=event.routing_key, properties=properties)

        await measure("aiormq basic_publish, as aio-pika calls it", basic_publish, messages)
        for name in EXCHANGES:  # those the Publisher declared
            await raw.exchange_delete(f"{prefix}{name}")
    finally:
        await connection.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--messages", type=int, default=3000)
    args = parser.parse_args()
    asyncio.run(main(args.amqp, args.messages))
