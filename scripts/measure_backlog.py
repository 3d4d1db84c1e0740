"""A waiting backlog's counts over time: what an autoscaler reads while nobody works.

Starts an Azurite (data in a throwaway directory) and the server in this process with its
resolvers on and the tip repair's delay shortened (``--repair-delay``, 2 s; 180 s by
default in a deployment), creates N tasks in one task queue and no worker, and prints
every few seconds, for ``--delays`` repair delays: pendingTasks, taskQueueCounts'
pending and claimed, and the pending queue's own length (Azure's approximate message
count, what a KEDA azure-queue scaler reads), next to the true number of pending runs.
The repair looks at each waiting task at growing intervals (the delay, then as long as it
has waited): a count that grows with the backlog's age would show here.

    .venv/bin/python scripts/measure_backlog.py [--tasks 2000] [--repair-delay 2] [--delays 10]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import slugid
import taskcluster.aio
from azure.storage.queue.aio import QueueClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from measuring import ROOT, in_process  # noqa: E402

from azqueue.config import StorageSettings  # noqa: E402
from azqueue.model import timeutil  # noqa: E402
from azqueue.model.priority import Priority  # noqa: E402
from azqueue.service.tasks import counts  # noqa: E402
from azqueue.storage.account import StorageAccount  # noqa: E402
from azqueue.storage.queues import PendingQueues, Queues  # noqa: E402
TASK_QUEUE = "measure/backlog"


def definition() -> dict[str, Any]:
    now = timeutil.utcnow()
    return {"taskQueueId": TASK_QUEUE, "created": timeutil.fmt(now),
            "deadline": timeutil.fmt(now + timedelta(hours=1)), "payload": {},
            "metadata": {"name": "measure", "description": "", "owner": "measure@example.com",
                         "source": "https://example.com"}}


async def pending_queue(storage: StorageSettings) -> str:
    """The name of TASK_QUEUE's Azure queue at priority lowest."""
    account = StorageAccount(storage)
    try:
        return PendingQueues(account, Queues(account)).name(TASK_QUEUE, Priority.LOWEST)
    finally:
        await account.close()


async def main(n: int, delay: float, delays: int) -> None:
    counts.COUNTS_TTL = 0.0  # every look uncached
    async with in_process(tip_repair_delay=delay,
                          deadline_resolver_interval=min(1.0, delay / 4)) as (azurite, server):
        name = await pending_queue(server.settings.storage)
        async with taskcluster.aio.createSession() as session, \
                QueueClient.from_connection_string(azurite.connection_string, name) as client:
            queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "credentials": {
                "clientId": ROOT.client_id, "accessToken": ROOT.access_token}}, session=session)
            limit = asyncio.Semaphore(16)

            async def create() -> None:
                async with limit:
                    await queue.createTask(slugid.nice(), definition())

            started = time.monotonic()
            await asyncio.gather(*(create() for _ in range(n)))
            print(f"{n} tasks created in {time.monotonic() - started:.1f} s; repair delay "
                  f"{delay} s; no worker")
            print("| waited since the last was created (repair delays) | pendingTasks | taskQueueCounts pending / claimed "
                  "| queue length | true pending |")
            print("| ---: | ---: | ---: | ---: | ---: |")
            worst = 0.0
            created = time.monotonic()
            end = created + delays * delay
            while True:
                pending = (await queue.pendingTasks(TASK_QUEUE))["pendingTasks"]
                both = await queue.taskQueueCounts(TASK_QUEUE)
                length = (await client.get_queue_properties()).approximate_message_count
                waited = (time.monotonic() - created) / delay
                print(f"| {waited:.1f} | {pending} | {both['pendingTasks']} / "
                      f"{both['claimedTasks']} | {length} | {n} |")
                worst = max(worst, *(abs(v - n) / n for v in
                                     (pending, both["pendingTasks"], length)))
                if time.monotonic() >= end:
                    break
                await asyncio.sleep(min(max(delay, end - time.monotonic()), (end - created) / 5))
            print(f"largest difference from the true number: {worst:.1%}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--repair-delay", type=float, default=2.0)
    parser.add_argument("--delays", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.repair_delay, args.delays))
