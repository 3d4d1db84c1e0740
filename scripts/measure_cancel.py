"""How soon a cancel stops a running command, and what watching for it costs the server.

1. TASKS tasks running ``sleep 600`` under one worker (``azqueue worker``'s handler,
   capacity TASKS, default ``status_interval``), canceled one at a time at random moments:
   seconds from the cancelTask answer to the command's process being gone (min, median,
   max). The claims last 20 minutes, so no reclaim comes into it.
2. While those TASKS tasks run (from 40 s after their claims, when the claim index has
   written their rows), the server's storage requests per second over WINDOW seconds,
   against the same window with nothing running (the resolvers' own): the difference
   per running task is what the status checks cost.

Not a test: the figures depend on the machine, and nothing here asserts them.

Usage: .venv/bin/python scripts/measure_cancel.py [--tasks 8] [--window 60]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from measuring import ROOT_ID, ROOT_TOKEN, dev_server

from azqueue.testing.processes import alive
from azqueue.testing.tasks import create, definition
from azqueue.worker import Credentials, Worker, WorkerConfig, shell

INDEX_SETTLED = 40.0


async def _storage_requests(http: aiohttp.ClientSession, api: str) -> int:
    async with http.get(f"{api}/__metrics__") as r:
        counts: dict[str, Any] = (await r.json())["storageRequests"]
    return sum(v for v in counts.values() if isinstance(v, int))


async def _rate(http: aiohttp.ClientSession, api: str, seconds: float) -> float:
    before = await _storage_requests(http, api)
    await asyncio.sleep(seconds)
    return (await _storage_requests(http, api) - before - 1) / seconds  # less our own read


async def main(args: argparse.Namespace) -> None:
    async with dev_server() as (api, http):
        idle = await _rate(http, api, args.window)
        pids_dir = Path(tempfile.mkdtemp(prefix="azqueue-measure-cancel-"))
        tasks = [await create(http, api, definition("measure/cancel", payload={
            "command": ["sh", "-c", f"echo $$ > {pids_dir}/$TASK_ID; exec sleep 600"]}))
            for _ in range(args.tasks)]
        worker = Worker(WorkerConfig(
            root_url=api.removesuffix("/api/queue/v1"), credentials=Credentials(
                ROOT_ID, ROOT_TOKEN), task_queue_id="measure/cancel", worker_group="measure",
            worker_id="w", capacity=args.tasks), shell.run_command)
        running = asyncio.ensure_future(worker.start())
        while len(list(pids_dir.iterdir())) < args.tasks:
            await asyncio.sleep(0.2)
        # Past the claim index's one-off writes for runs still running 30 s after
        # their claim: what is left is the status checks.
        await asyncio.sleep(INDEX_SETTLED)
        busy = await _rate(http, api, args.window)
        delays = []
        for task_id in tasks:
            pid = int((pids_dir / task_id).read_text())
            await asyncio.sleep(random.uniform(0, 10))
            async with http.post(f"{api}/task/{task_id}/cancel") as r:
                assert r.status == 200, await r.text()
            canceled = time.monotonic()
            while alive(pid):
                await asyncio.sleep(0.05)
            delays.append(time.monotonic() - canceled)
        await worker.stop()
        await running
    print(f"cancel to command gone, {args.tasks} tasks, status_interval "
          f"{worker.config.status_interval:g} s: min {min(delays):.1f} s, median "
          f"{statistics.median(delays):.1f} s, max {max(delays):.1f} s")
    print(f"server storage requests per second over {args.window:g} s: idle {idle:.2f}, "
          f"with {args.tasks} tasks running {busy:.2f}: "
          f"{(busy - idle) / args.tasks:.3f} per running task")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--window", type=float, default=60.0)
    asyncio.run(main(parser.parse_args()))
