#!/usr/bin/env python3
"""Benchmark: Azure Storage requests per task lifecycle, and lifecycles per second.

Starts `azqueue dev` (embedded Azurite) on a free port, then

1. runs LIFECYCLES lifecycles one at a time -- createTask, pollTaskUrls (once, cached like
   a real worker), GET the poll URLs in priority order, claimTask with the tip, and
   reportCompleted -- and prints the Azure Storage requests they cost: the server's, as
   counted by its SDK transport (GET /api/queue/v1/__metrics__), and the worker's own
   direct requests to the queue service;
2. runs WORKERS concurrent plain-HTTP workers, each looping over the same lifecycle for
   DURATION seconds, and prints lifecycles per second.

Usage: .venv/bin/python scripts/bench_lifecycle.py [--workers 16] [--duration 20]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import dev_server  # noqa: E402
from tests import sas  # noqa: E402
from tests.tasks import definition, slugid  # noqa: E402

QUIET_RESOLVERS = {"AZQUEUE_CLAIM_RESOLVER_INTERVAL": "3600",
                   "AZQUEUE_DEADLINE_RESOLVER_INTERVAL": "3600"}


async def lifecycle(http: aiohttp.ClientSession, api: str, urls: dict, task_queue: str,
                    priority: str, worker_requests: Counter[str]) -> None:
    """One task from creation to completion; the worker claims whatever tip it polls."""
    async with http.put(f"{api}/task/{slugid()}",
                        json=definition(task_queue, priority=priority)) as r:
        assert r.status == 200, await r.text()
    while True:
        for q in urls["queues"]:
            worker_requests["queue GET (worker poll)"] += 1
            messages = await sas.get_messages(http, q["signedPollUrl"], 1)
            if not messages:
                continue
            [m] = messages
            code, claim = await sas.claim(http, api, m)
            if code != 200:
                worker_requests["queue DELETE (worker, after a 4xx)"] += 1
                await sas.delete_message(http, q["signedDeleteUrl"], m)
                break
            code, _ = await sas.post(
                http, f"{api}/task/{m.tip['taskId']}/runs/{claim['runId']}/completed")
            assert code == 200
            return
        await asyncio.sleep(0.05)


async def metrics(http: aiohttp.ClientSession, api: str) -> Counter[str]:
    async with http.get(f"{api}/__metrics__") as r:
        return Counter((await r.json())["storageRequests"])


async def main(args: argparse.Namespace) -> None:
    settings = {**QUIET_RESOLVERS, "AZQUEUE_AMQP_URL": args.amqp}
    async with dev_server(args.workers * 4, **settings) as (api, http):
            urls = await sas.poll_task_urls(http, api, "bench", "count")
            worker: Counter[str] = Counter()
            await lifecycle(http, api, urls, "bench/count", args.priority, Counter())  # warm-up
            before = await metrics(http, api)
            for _ in range(args.lifecycles):
                await lifecycle(http, api, urls, "bench/count", args.priority, worker)
            server_side = await metrics(http, api) - before
            n = args.lifecycles
            print(f"Azure Storage requests per lifecycle (priority {args.priority}, "
                  f"mean of {n}, resolvers idle, events {'on' if args.amqp else 'off'}):")
            for name, count in sorted(server_side.items()):
                print(f"  server  {name:<34} {count / n:5.2f}")
            for name, count in sorted(worker.items()):
                print(f"  worker  {name:<34} {count / n:5.2f}")
            total = (sum(server_side.values()) + sum(worker.values())) / n
            print(f"  total   {'':<34} {total:5.2f}")

            urls = await sas.poll_task_urls(http, api, "bench", "load")
            done = 0
            stop_at = time.monotonic() + args.duration

            async def loop() -> None:
                nonlocal done
                while time.monotonic() < stop_at:
                    await lifecycle(http, api, urls, "bench/load", args.priority, Counter())
                    done += 1

            started = time.monotonic()
            await asyncio.gather(*(loop() for _ in range(args.workers)))
            elapsed = time.monotonic() - started
            print(f"\n{args.workers} concurrent plain-HTTP workers on `azqueue dev` (Azurite): "
                  f"{done} lifecycles in {elapsed:.1f}s = {done / elapsed:.1f} lifecycles/s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--lifecycles", type=int, default=50)
    parser.add_argument("--priority", default="lowest")
    parser.add_argument("--amqp", default="", help="AMQP URL: publish events (default: off)")
    asyncio.run(main(parser.parse_args()))
