#!/usr/bin/env python3
"""Benchmark: claim latency of claimWork, from createTask answered to claimWork answered.

Starts `azqueue dev` (embedded Azurite) on a free port with the default claimWork
settings, then for 1 and for 8 waiting claimWork workers creates tasks one at a time
(each after the previous one was claimed and the workers are waiting again) and prints
p50/p99/max of the latency. Negative values mean claimWork answered before the
createTask response reached the client (the wake-up happens before createTask answers).

Usage: .venv/bin/python scripts/bench_claim_work.py [--tasks 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import dev_server  # noqa: E402
from tests.tasks import definition, slugid  # noqa: E402


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def scenario(http: aiohttp.ClientSession, api: str, workers: int, tasks: int) -> list[float]:
    queue = f"bench/latency{workers}"
    claimed: dict[str, float] = {}
    waiting = 0
    stop = False

    async def worker(i: int) -> None:
        nonlocal waiting
        while not stop:
            waiting += 1
            async with http.post(f"{api}/claim-work/{queue.replace('/', '%2F')}",
                                 json={"workerGroup": "bench", "workerId": f"w{i}",
                                       "tasks": 1}) as r:
                body = await r.json()
            waiting -= 1
            at = time.perf_counter()
            for claim in body["tasks"]:
                claimed[claim["status"]["taskId"]] = at
                async with http.post(f"{api}/task/{claim['status']['taskId']}/runs/"
                                     f"{claim['runId']}/completed", json={}) as r:
                    assert r.status == 200

    pool = [asyncio.create_task(worker(i)) for i in range(workers)]
    latencies: list[float] = []
    for _ in range(tasks):
        while waiting < workers:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # let them settle into their wait
        task_id = slugid()
        async with http.put(f"{api}/task/{task_id}", json=definition(queue)) as r:
            assert r.status == 200, await r.text()
        answered = time.perf_counter()
        while task_id not in claimed:
            await asyncio.sleep(0.001)
        latencies.append(claimed[task_id] - answered)
    stop = True
    for p in pool:
        p.cancel()
    await asyncio.gather(*pool, return_exceptions=True)
    return latencies


async def main(args: argparse.Namespace) -> None:
    async with dev_server() as (api, http):
            for workers in (1, 8):
                lat = [x * 1000 for x in await scenario(http, api, workers, args.tasks)]
                print(f"{workers} waiting claimWork worker(s), {args.tasks} tasks created one at "
                      f"a time: p50 {percentile(lat, 50):.1f} ms, p99 {percentile(lat, 99):.1f} "
                      f"ms, max {max(lat):.1f} ms, mean {statistics.mean(lat):.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    asyncio.run(main(parser.parse_args()))
