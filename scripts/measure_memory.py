"""Memory and connections of one ``azqueue serve`` replica, at rest and at work, for
setting a deployment's requests and limits (docs/capacity.md, "Memory").

The replica runs as a process of its own on an Azurite of its own, with events on
(RabbitMQ at --amqp) unless --no-events, with the default settings (claimWork waits
20 s). What is read of it: its resident memory (VmRSS of /proc/PID/status, the highest
sample of each phase) and its peak (VmHWM), and the TCP connections it holds, by peer
(``ss``). Phases, one after the other:

1. started: 10 s after it answers;
2. at rest: 10 s after a warm-up of WARMUP tasks created, claimed and completed;
3. waiting: WAITING claimWork callers over QUEUES task queues, waiting for work;
4. busy: CONCURRENT callers each creating tasks one after another for SECONDS;
5. both: the waiting callers and the busy ones at once.

Not a test: the figures depend on the machine and its load, and nothing here asserts
them.

Usage: .venv/bin/python scripts/measure_memory.py [--waiting 800] [--queues 50]
           [--concurrent 150] [--seconds 20] [--amqp URL | --no-events]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from benchlib import create_task, signed_session
from measuring import serving

from azqueue.devstorage import Azurite
from azqueue.testing import sas

MIB = 1024 * 1024


def memory(pid: int) -> tuple[float, float]:
    """The process's resident memory now and at its peak, in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines() if ":" in line)
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def connections(pid: int, api_port: int, azurite: Azurite) -> dict[str, int]:
    """The process's established TCP connections, by what is at the other end."""
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True,
                         text=True, check=True).stdout
    peers = {port: name for name, port in azurite.ports.items()}
    found: Counter[str] = Counter()
    for line in out.splitlines():
        if f"pid={pid}," not in line:
            continue
        local, remote = line.split()[2:4]
        if int(local.rsplit(":", 1)[1]) == api_port:
            found["API clients"] += 1
        else:
            port = int(remote.rsplit(":", 1)[1])
            found[f"storage ({peers[port]})" if port in peers
                  else "RabbitMQ" if port == 5672 else f"port {port}"] += 1
    return dict(sorted(found.items()))


class Sampler:
    """The highest resident memory seen while a phase runs, sampled every 0.2 s."""

    def __init__(self, pid: int) -> None:
        self.pid, self.highest = pid, 0.0

    async def during(self, work: Awaitable[Any]) -> Any:
        task = asyncio.ensure_future(work)
        while not task.done():
            self.highest = max(self.highest, memory(self.pid)[0])
            await asyncio.wait([task], timeout=0.2)
        return task.result()


async def wait_for_work(http: aiohttp.ClientSession, api: str, callers: int, queues: int,
                        tag: str) -> int:
    """``callers`` claimWork calls at once over ``queues`` task queues with no task:
    how many came back empty after their wait."""
    async def one(i: int) -> bool:
        code, body = await sas.post(http, f"{api}/claim-work/mem%2F{tag}-{i % queues}",
                                    {"workerGroup": "mem", "workerId": f"w{i}", "tasks": 1})
        return code == 200 and body["tasks"] == []
    return sum(await asyncio.gather(*(one(i) for i in range(callers))))


async def keep_creating(http: aiohttp.ClientSession, api: str, callers: int,
                        seconds: float) -> int:
    """``callers`` loops each creating tasks one after another for ``seconds``: how many."""
    end = time.monotonic() + seconds

    async def loop(i: int) -> int:
        made = 0
        while time.monotonic() < end:
            await create_task(http, api, f"mem/busy-{i % 10}")
            made += 1
        return made
    return sum(await asyncio.gather(*(loop(i) for i in range(callers))))


async def warm_up(http: aiohttp.ClientSession, api: str, tasks: int) -> None:
    for _ in range(tasks):
        await create_task(http, api, "mem/warm")
    claimed = 0
    while claimed < tasks:
        code, body = await sas.post(http, f"{api}/claim-work/mem%2Fwarm",
                                    {"workerGroup": "mem", "workerId": "warm", "tasks": 32})
        assert code == 200, body
        for claim in body["tasks"]:
            task_id, run_id = claim["status"]["taskId"], claim["runId"]
            code, _ = await sas.post(http, f"{api}/task/{task_id}/runs/{run_id}/completed", {})
            assert code == 200
            claimed += 1


def report(phase: str, sampler: Sampler, pid: int, api_port: int, azurite: Azurite,
           extra: str = "") -> None:
    now, peak = memory(pid)
    held = connections(pid, api_port, azurite)
    print(f"{phase:<10} RSS highest {sampler.highest or now:7.1f} MiB  now {now:7.1f} MiB  "
          f"peak so far {peak:7.1f} MiB  {extra}")
    print(f"{'':<10} connections: {held}")


async def phase(name: str, sampler: Sampler, work: Callable[[], Awaitable[Any]], pid: int,
                port: int, azurite: Azurite, describe: Callable[[Any], str]) -> None:
    sampler.highest = 0.0
    held: dict[str, int] = {}

    async def watched() -> Any:
        task = asyncio.ensure_future(work())
        await asyncio.sleep(5)  # the callers are in by now: count what the replica holds
        held.update(connections(pid, port, azurite))
        return await task
    result = await sampler.during(watched())
    now, peak = memory(pid)
    print(f"{name:<8} RSS highest {sampler.highest:7.1f} MiB, after {now:7.1f} MiB, "
          f"peak so far {peak:7.1f} MiB; {describe(result)}")
    print(f"{'':<8} connections 5 s in: {held}")


async def main(args: argparse.Namespace) -> None:
    settings = {} if args.no_events else {"AZQUEUE_AMQP_URL": args.amqp}
    async with serving(AZQUEUE_CLAIM_WORK_WAIT="20", **settings) as (azurite, server):
        pid, port = server.process.pid, server.port
        assert "azqueue" in Path(f"/proc/{pid}/cmdline").read_text()
        sampler = Sampler(pid)
        print(f"azqueue serve, pid {pid}, events {'off' if args.no_events else 'on'}")
        async with signed_session(args.waiting + args.concurrent + 10) as http:
            await asyncio.sleep(10)
            report("started", sampler, pid, port, azurite)
            await warm_up(http, server.api, args.warmup)
            await asyncio.sleep(10)
            report("at rest", sampler, pid, port, azurite,
                   f"(after {args.warmup} tasks' lifecycles)")
            await phase("waiting", sampler, lambda: wait_for_work(
                http, server.api, args.waiting, args.queues, "a"), pid, port, azurite,
                lambda n: f"{n} of {args.waiting} claimWork callers over "
                          f"{args.queues} task queues waited out 20 s")
            await phase("busy", sampler, lambda: keep_creating(
                http, server.api, args.concurrent, args.seconds), pid, port, azurite,
                lambda n: f"{args.concurrent} callers made {n} createTasks in "
                          f"{args.seconds:g} s")

            async def both() -> tuple[int, int]:
                return tuple(await asyncio.gather(  # type: ignore[return-value]
                    wait_for_work(http, server.api, args.waiting, args.queues, "b"),
                    keep_creating(http, server.api, args.concurrent, args.seconds)))
            await phase("both", sampler, both, pid, port, azurite,
                        lambda r: f"{r[0]} waited out, {r[1]} createTasks")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiting", type=int, default=800)
    parser.add_argument("--queues", type=int, default=50)
    parser.add_argument("--concurrent", type=int, default=150)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--no-events", action="store_true")
    asyncio.run(main(parser.parse_args()))
