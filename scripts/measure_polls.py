"""What getting work costs a SAS worker in Azure requests, measured on ``azqueue dev``.

1. A backlog of TASKS tasks at the default priority (``lowest``, the last of the seven
   queues), run by one worker of capacity 1 and by one of capacity 4 with a handler that
   returns at once: Azure polls (and the empty ones among them) per claimed task, for
   the worker's defaults, for the defaults without the queue's samples (``hints``
   False), and for the plain loop of docs/workers/sas.md (every pass from the top, no samples).
2. The same with LONG tasks that each take twice ``priority_recheck`` (0.2 s and 0.1 s
   here, standing for tasks that outlast the 5 s default), capacity 1.
3. An idle worker for IDLE seconds, after 15 idle seconds: Azure requests per second,
   with the defaults, without samples, and with the plain loop (a second's sleep after
   every empty pass).

Not a test: the figures depend on the machine, and nothing here asserts them.

Usage: .venv/bin/python scripts/measure_polls.py [--tasks 200] [--long 40] [--idle 30]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from typing import Any

from measuring import ROOT_ID, ROOT_TOKEN, dev_server

from azqueue.testing.tasks import create, definition
from azqueue.worker import Credentials, TaskRun, Worker, WorkerConfig
from azqueue.worker.sas import EMPTY_POLL, POLL

IDLE_WARM_UP = 15.0
PLAIN = {"priority_recheck": 1e-9, "max_idle_sleep": 1.0, "hints": False}
WAYS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("defaults", {}), ("no samples", {"hints": False}), ("plain loop", PLAIN))
LONG_TASK, LONG_RECHECK = 0.2, 0.1


def config(api: str, queue: str, **overrides: Any) -> WorkerConfig:
    return WorkerConfig(root_url=api.removesuffix("/api/queue/v1"),
                        credentials=Credentials(ROOT_ID, ROOT_TOKEN), task_queue_id=queue,
                        worker_group="measure", worker_id="w", mode="sas", **overrides)


async def backlog(http: Any, api: str, queue: str, tasks: int, seconds: float = 0.0,
                  **overrides: Any) -> tuple[Counter[str], int, float]:
    """The worker's requests up to its last claim, its claims, and the seconds taken."""
    for _ in range(tasks):
        await create(http, api, definition(queue))
    at_last_claim: Counter[str] = Counter()
    done = asyncio.Event()

    async def handler(run: TaskRun) -> None:
        if worker.claimed >= tasks and not done.is_set():
            at_last_claim.update(worker.requests)
            done.set()
        await asyncio.sleep(seconds)

    worker = Worker(config(api, queue, **overrides), handler)
    started = time.monotonic()
    running = asyncio.ensure_future(worker.start())
    await asyncio.wait_for(done.wait(), 600)
    elapsed = time.monotonic() - started
    await worker.stop()
    await running
    return at_last_claim, worker.claimed, elapsed


async def idle(api: str, queue: str, seconds: float, **overrides: Any) -> float:
    """Azure requests per second of a worker finding nothing, over ``seconds`` that follow
    ``IDLE_WARM_UP`` seconds of finding nothing (its sleeps have grown to their longest)."""
    async def nothing(run: Any) -> None:
        return None

    worker = Worker(config(api, queue, **overrides), nothing)
    running = asyncio.ensure_future(worker.start())
    await asyncio.sleep(IDLE_WARM_UP)
    before = worker.requests[POLL]
    await asyncio.sleep(seconds)
    after = worker.requests[POLL]
    await worker.stop()
    await running
    return (after - before) / seconds


async def main(args: argparse.Namespace) -> None:
    async with dev_server(AZQUEUE_CLAIM_RESOLVER_INTERVAL="3600") as (api, http):
        print(f"backlog of {args.tasks} tasks at priority lowest "
              "(Azure polls per claimed task, empty ones in brackets):")
        for capacity in (1, 4):
            for name, overrides in WAYS:
                counts, claimed, elapsed = await backlog(
                    http, api, f"measure/c{capacity}{name[:2]}", args.tasks, capacity=capacity,
                    **overrides)
                print(f"  capacity {capacity}, {name:<10}: {counts[POLL] / claimed:5.2f} "
                      f"({counts[EMPTY_POLL] / claimed:4.2f})  "
                      f"[{claimed} claims in {elapsed:.1f} s]")
        print(f"backlog of {args.long} tasks of {LONG_TASK} s, priority_recheck {LONG_RECHECK} s, "
              "capacity 1:")
        for name, overrides in WAYS:
            counts, claimed, elapsed = await backlog(
                http, api, f"measure/long{name[:2]}", args.long, LONG_TASK,
                **{"priority_recheck": LONG_RECHECK, **overrides})
            print(f"  {name:<10}: {counts[POLL] / claimed:5.2f} "
                  f"({counts[EMPTY_POLL] / claimed:4.2f})  [{claimed} claims in {elapsed:.1f} s]")
        print(f"idle for {args.idle:.0f} s after {IDLE_WARM_UP:.0f} s (the worker's Azure "
              "requests per second; with samples the queue peeks at the seven queues at most "
              "every 2 s while any of the task queue's workers asks, for all of them):")
        for name, overrides in WAYS:
            rate = await idle(api, f"measure/idle{name[:2]}", args.idle, **overrides)
            print(f"  {name:<10}: {rate:5.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--long", type=int, default=40)
    parser.add_argument("--idle", type=float, default=30.0)
    asyncio.run(main(parser.parse_args()))
