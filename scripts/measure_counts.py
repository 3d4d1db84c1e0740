"""Storage requests per call of the pending and claimed counts and listings.

Starts an Azurite (data in a throwaway directory) and the server in this process
(resolvers off), fills one task queue with a backlog of N tasks per priority for each N
asked, and prints how many storage requests (the server's own count, ``__metrics__``)
one uncached call of pendingTasks, taskQueueCounts and listPendingTasks costs, and what
each answered.

    .venv/bin/python scripts/measure_counts.py [--backlogs 0,5,40]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import slugid
import taskcluster.aio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from measuring import ROOT, in_process  # noqa: E402

from azqueue.model import timeutil  # noqa: E402
from azqueue.model.priority import ORDER  # noqa: E402
from azqueue.service.tasks import counts  # noqa: E402


def definition(task_queue_id: str, priority: str) -> dict[str, Any]:
    now = timeutil.utcnow()
    return {"taskQueueId": task_queue_id, "priority": priority, "created": timeutil.fmt(now),
            "deadline": timeutil.fmt(now + timedelta(hours=1)), "payload": {},
            "metadata": {"name": "measure", "description": "", "owner": "measure@example.com",
                         "source": "https://example.com"}}


async def _cost(http: aiohttp.ClientSession, api: str,
                call: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
    async def requests() -> int:
        async with http.get(f"{api}/__metrics__") as r:
            return sum((await r.json())["storageRequests"].values())

    before = await requests()
    answer = await call()
    return await requests() - before, answer


async def main(backlogs: list[int]) -> None:
    counts.COUNTS_TTL = 0.0  # every call uncached
    async with in_process(run_resolvers=False) as (_, server), \
            taskcluster.aio.createSession() as session, aiohttp.ClientSession() as http:
        api = server.api
        queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "credentials": {
            "clientId": ROOT.client_id, "accessToken": ROOT.access_token}}, session=session)
        print("| tasks per priority (7 priorities) | pendingTasks: requests (answer) "
              "| taskQueueCounts: requests | listPendingTasks limit 100: requests (tasks) |")
        print("| ---: | ---: | ---: | ---: |")
        for n in backlogs:
            tq = f"measure/backlog-{n}"
            limit = asyncio.Semaphore(8)

            async def create(priority: str) -> None:
                async with limit:
                    await queue.createTask(slugid.nice(), definition(tq, priority))
            await asyncio.gather(*(create(str(p)) for p in ORDER for _ in range(n)))
            pending_cost, pending = await _cost(http, api, lambda: queue.pendingTasks(tq))
            counts_cost, _ = await _cost(http, api, lambda: queue.taskQueueCounts(tq))
            list_cost, listed = await _cost(
                http, api, lambda: queue.listPendingTasks(tq, query={"limit": 100}))
            print(f"| {n} | {pending_cost} ({pending['pendingTasks']}) | {counts_cost} "
                  f"| {list_cost} ({len(listed['tasks'])}) |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlogs", default="0,5,40",
                        help="comma-separated numbers of tasks per priority")
    args = parser.parse_args()
    asyncio.run(main([int(n) for n in args.backlogs.split(",")]))
