"""What the messages waiting in other queues cost each queue request on Azurite.

Starts an Azurite of its own (data in a throwaway directory, as `azqueue dev` runs it),
then times a put, a receive and a delete of one message on an empty queue while another
queue of the account holds 0, then each of the counts asked, invisible messages: what a
deployment's deadline queue holds, one message per task until its deadline. Azure's
queues do not slow so; Azurite looks at every message of the account at each request.

    .venv/bin/python scripts/measure_azurite_scan.py [--waiting 0,2000,6000] [--rounds 200]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from azure.storage.queue.aio import QueueClient, QueueServiceClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from azqueue.devstorage import Azurite  # noqa: E402

PUTS_AT_ONCE = 32


async def round_trip_ms(queue: QueueClient, rounds: int) -> float:
    """Milliseconds per put, receive and delete of one message, one after another."""
    started = time.perf_counter()
    for _ in range(rounds):
        await queue.send_message("tip")
        async for message in queue.receive_messages(max_messages=1, messages_per_page=1):
            await queue.delete_message(message)
    return (time.perf_counter() - started) / rounds * 1000


async def fill(queue: QueueClient, count: int) -> None:
    """Put ``count`` messages invisible for a day, as deadline messages wait."""
    limit = asyncio.Semaphore(PUTS_AT_ONCE)

    async def put() -> None:
        async with limit:
            await queue.send_message("deadline", visibility_timeout=86400)

    await asyncio.gather(*(put() for _ in range(count)))


async def main(waiting: list[int], rounds: int) -> None:
    azurite = await Azurite.start()
    try:
        async with QueueServiceClient.from_connection_string(azurite.connection_string) as svc:
            work, other = svc.get_queue_client("work"), svc.get_queue_client("other")
            await work.create_queue()
            await other.create_queue()
            held = 0
            baseline = None
            print("| messages waiting in another queue | put + receive + delete, ms | × empty |")
            print("| ---: | ---: | ---: |")
            for count in sorted(waiting):
                await fill(other, count - held)
                held = count
                ms = await round_trip_ms(work, rounds)
                baseline = baseline or ms
                print(f"| {count} | {ms:.1f} | {ms / baseline:.1f} |")
    finally:
        await azurite.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", default="0,2000,6000",
                        help="messages waiting in the other queue, comma-separated")
    parser.add_argument("--rounds", type=int, default=200, help="round trips timed per count")
    args = parser.parse_args()
    asyncio.run(main([int(n) for n in args.waiting.split(",")], args.rounds))
