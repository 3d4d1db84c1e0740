#!/usr/bin/env python3
"""The benchmark's workers, in a process of their own: WORKERS worker-SDK workers
(``azqueue.worker.Worker``, capacity 1, a handler that returns at once) on one task queue,
spread round-robin over the given rootUrls, with the credentials in TASKCLUSTER_CLIENT_ID
and TASKCLUSTER_ACCESS_TOKEN.

Driven by ``scripts/bench.py`` over stdin/stdout, one JSON object a line:
prints ``{"ready": true}`` once imported; starts the workers on the line ``go``; prints
``{"progress": n}`` whenever the count of completed tasks grows, and
``{"done": seconds, "completed": n}`` when TARGET tasks are completed (never with
``--target 0``), or with ``"stalled": true`` when fewer are and none was for STALL seconds
(seconds: until the last completion); on the line ``stop`` (or end of input) stops the
workers, prints ``{"stopped": true, "completed": n}`` and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time

from azqueue.worker import Credentials, TaskRun, Worker, WorkerConfig

def say(**message: object) -> None:
    print(json.dumps(message), flush=True)


async def noop(run: TaskRun) -> None:
    return None


async def main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    credentials = Credentials.from_env()
    workers = [Worker(WorkerConfig(root_url=args.root_url[i % len(args.root_url)],
                                   credentials=credentials, task_queue_id=args.task_queue,
                                   worker_group="bench", worker_id=f"{args.mode}-{i}",
                                   capacity=1, mode=args.mode), noop)
               for i in range(args.workers)]
    say(ready=True)
    if (await reader.readline()).strip() != b"go":
        return
    started = time.monotonic()
    running = [asyncio.create_task(w.start()) for w in workers]

    def completed() -> int:
        return sum(w.completed for w in workers)

    async def watch() -> None:
        count, last = 0, time.monotonic()
        while count < args.target:
            await asyncio.sleep(0.01)
            if completed() > count:
                count, last = completed(), time.monotonic()
                say(progress=count)
            elif time.monotonic() - last > args.stall:
                say(done=last - started, completed=count, stalled=True)
                return
        say(done=last - started, completed=count)

    watcher = asyncio.create_task(watch()) if args.target else None
    await reader.readline()  # "stop", or the end of input
    if watcher is not None:
        watcher.cancel()
    await asyncio.wait_for(asyncio.gather(*(w.stop(graceful=False) for w in workers)), 30)
    await asyncio.gather(*running, return_exceptions=True)
    say(stopped=True, completed=completed())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["sas", "claim-work"], required=True)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--root-url", action="append", required=True)
    parser.add_argument("--target", type=int, default=0)
    parser.add_argument("--stall", type=float, default=30.0)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(main(parser.parse_args()))
