"""What task queue names nobody uses any more leave behind, measured on ``azqueue serve``
(events off, on an Azurite of its own), with a short ``AZQUEUE_TASK_QUEUE_IDLE_EXPIRY``.

1. **Before**: the server's resident memory, its ``/metrics`` (bytes, series, and the
   server's CPU time per scrape, over SCRAPES scrapes, once the background sample that
   the first scrape starts had SAMPLE_SETTLE seconds to end), the Azure queues and doorbell
   rows of the deployment, and Azurite's latency (the median of 50 reads of a queue's
   properties and 50 doorbell queries, each sent alone).
2. **Named**: NAMES new task queue names asked through pollTaskUrls with
   ``pending=true`` (as an idle SAS worker asks: SAS URLs, a sample of the seven queues,
   an ear in the doorbell table), 16 at a time; the same figures.
3. **Expired**: the same figures once the idle expiry and a sweep of the doorbell table
   have passed (the expiry, 1.2 times half of it, and the table's 5 s margin). Then 2
   and 3 again with NAMES other names: what the first round freed is used again, or
   memory grows with every round.
4. **Claimed** (``--claimed N``): a task created, claimed (claimWork) and completed in
   each of N more new task queues, so that the metrics have seen N task queues; the same
   figures. Each of these task queues has its seven Azure queues, empty once its task
   is completed (and Azurite slows down as they grow: a few thousand take many
   minutes).
4b. **Claimed, expired**: the expiry pass's part for task queues (their expired records
   deleted, then the empty Azure queues of task queues with no record left:
   ``azqueue.service.upkeep.idlequeues``), run in this process with its clock
   ``EXPIRED_AFTER`` on (past the records' five days; the server's own pass runs every
   ``AZQUEUE_EXPIRY_INTERVAL``), and how long it took; the same figures; again (up to
   EXPIRY_PASSES passes) while a pass deletes any, as Azurite's listing of more than
   5,000 queues leaves some out.
5. **The metrics alone**, in this process: the text of ``/metrics`` (``generate_latest``)
   once ``azqueue.metrics`` has seen a claim and a change in each of METRICS_NAMES task
   queues (``--metrics-names``): CPU time per rendering, over SCRAPES renderings.

Not a test: the figures depend on the machine, and nothing here asserts them.

Usage: .venv/bin/python scripts/measure_names.py [--names 10000] [--claimed 1000]
       [--expiry 30] [--scrapes 50] [--metrics-names 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from benchlib import QUIET_RESOLVERS, cpu_seconds, signed_session
from measuring import serving
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from azqueue import metrics
from azqueue.config import StorageSettings
from azqueue.service.upkeep.idlequeues import IdleQueues
from azqueue.storage.account import StorageAccount
from azqueue.storage.queues import PendingQueues, Queues
from azqueue.storage.workers import TaskQueueStore
from azqueue.testing.processes import ServeProcess
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition

PREFIX = "azq"
SWEEP_MARGIN = 5.0  # the doorbell table's margin (azqueue.storage.bells.MARGIN)
LATENCY_SAMPLES = 50
# How long the background sample a scrape starts is given before scrapes are timed.
SAMPLE_SETTLE = 10.0
# How far past now phase 4b runs the expiry pass: past a task queue record's expiry.
EXPIRED_AFTER = timedelta(days=6)
EXPIRY_PASSES = 3


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _median_ms(probe: Callable[[], Awaitable[Any]]) -> float:
    times = []
    for _ in range(LATENCY_SAMPLES):
        start = time.perf_counter()
        await probe()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


async def figures(server: ServeProcess, http: aiohttp.ClientSession,
                  storage: StorageInspector, scrapes: int) -> dict[str, str]:
    """One line of the table: memory, /metrics, storage and Azurite's latency."""
    url = f"{server.root_url}/metrics"
    async with http.get(url) as r:  # starts the background sample, which is not a scrape's
        await r.read()
    await asyncio.sleep(SAMPLE_SETTLE)
    async with http.get(url) as r:
        text = await r.text()
    series = sum(len(f.samples) for f in text_string_to_metric_families(text))
    pid = server.process.pid
    cpu = cpu_seconds(pid)
    for _ in range(scrapes):
        async with http.get(url) as r:
            await r.read()
    per_scrape = (cpu_seconds(pid) - cpu) / scrapes * 1000
    queues = await storage.queue_names()
    rows = await storage.row_keys("doorbell", "bell")
    internal = storage.queue_name("deadline-batches")
    table = storage.table("doorbell")

    async def query() -> None:
        async for _ in table.query_entities("PartitionKey eq 'bell' and RowKey eq 'none'"):
            pass

    queue_ms = await _median_ms(lambda: storage.queue(internal).get_queue_properties())
    table_ms = await _median_ms(query)
    return {"RSS MiB": f"{rss_mib(pid):.0f}", "/metrics kB": f"{len(text) / 1000:.0f}",
            "series": str(series), "CPU ms/scrape": f"{per_scrape:.1f}",
            "Azure queues": str(len(queues)), "doorbell rows": str(len(rows)),
            "queue read ms": f"{queue_ms:.1f}", "table query ms": f"{table_ms:.1f}"}


async def _limited(jobs: list[Callable[[], Awaitable[None]]], at_once: int = 16) -> None:
    limit = asyncio.Semaphore(at_once)

    async def run(job: Callable[[], Awaitable[None]]) -> None:
        async with limit:
            await job()

    await asyncio.gather(*(run(j) for j in jobs))


async def name(http: aiohttp.ClientSession, api: str, i: int, round_: str) -> None:
    async with http.get(f"{api}/poll-task-url/wild/name{round_.strip()}-{i}?pending=true") as r:
        if r.status != 200:
            raise SystemExit(f"pollTaskUrls answered {r.status}: {await r.text()}")
        await r.read()


async def claim(http: aiohttp.ClientSession, api: str, i: int) -> None:
    queue = f"claimed/name-{i}"
    task_id = await create(http, api, definition(queue, payload={}), attempts=5)
    async with http.post(f"{api}/claim-work/{queue.replace('/', '%2F')}", json={
            "workerGroup": "wg", "workerId": "w", "tasks": 1}) as r:
        if r.status != 200:
            raise SystemExit(f"claimWork answered {r.status}: {await r.text()}")
        await r.read()
    async with http.post(f"{api}/task/{task_id}/runs/0/completed", json={}) as r:
        if r.status != 200:
            raise SystemExit(f"reportCompleted answered {r.status}: {await r.text()}")
        await r.read()


async def expire_task_queues(connection_string: str) -> int:
    """Phase 4b: the expiry pass's part for task queues, ``EXPIRED_AFTER`` from now; the
    number of Azure queues deleted."""
    account = StorageAccount(StorageSettings(connection_string, PREFIX))
    try:
        now = datetime.now(UTC) + EXPIRED_AFTER
        records = TaskQueueStore(account)
        await records.delete_expired(now)
        return await IdleQueues(PendingQueues(account, Queues(account)), records).delete(now)
    finally:
        await account.close()


def show(phase: str, values: dict[str, str], head: bool = False) -> None:
    if head:
        print("| phase | " + " | ".join(values) + " |")
        print("| --- " * (len(values) + 1) + "|")
    print(f"| {phase} | " + " | ".join(values.values()) + " |", flush=True)


def metrics_alone(names: int, renderings: int) -> None:
    """Phase 5: the CPU time of one rendering of this process's metrics once they have
    seen ``names`` task queues."""
    for i in range(names):
        metrics.observe_pending(f"seen/name-{i}", 1.0)
        metrics.PENDING.seen(f"seen/name-{i}")
    text = generate_latest()
    lines = text.count(b"\n")
    start = time.process_time()
    for _ in range(renderings):
        generate_latest()
    per = (time.process_time() - start) / renderings * 1000
    print(f"metrics alone, {names} task queues seen: {len(text) / 1000:.0f} kB, "
          f"{lines} lines, {per:.1f} ms CPU per rendering")


async def main(args: argparse.Namespace) -> None:
    async with serving(**QUIET_RESOLVERS,
                       AZQUEUE_TASK_QUEUE_IDLE_EXPIRY=str(args.expiry)) as (azurite, server):
        async with signed_session() as http, StorageInspector(StorageSettings(
                azurite.connection_string, PREFIX)) as storage:
            show("before", await figures(server, http, storage, args.scrapes), True)
            for again in ("", " again"):  # the second round: is memory reused?
                started = time.monotonic()
                await _limited([lambda i=i: name(http, server.api, i, again)
                                for i in range(args.names)])
                named = await figures(server, http, storage, args.scrapes)
                took = time.monotonic() - started
                show(f"{args.names} named{again} ({took:.0f} s)", named)
                await asyncio.sleep(args.expiry + args.expiry / 2 * 1.2 + SWEEP_MARGIN + 5)
                show(f"expired{again}", await figures(server, http, storage,
                                                      args.scrapes))
            if args.claimed:
                started = time.monotonic()
                await _limited([lambda i=i: claim(http, server.api, i)
                                for i in range(args.claimed)])
                took = time.monotonic() - started
                show(f"{args.claimed} claimed ({took:.0f} s)",
                     await figures(server, http, storage, args.scrapes))
                # Azurite's listing of more than 5,000 queues leaves some
                # out: the passes after the first delete those.
                for n in range(1, EXPIRY_PASSES + 1):
                    started = time.monotonic()
                    deleted = await expire_task_queues(azurite.connection_string)
                    took = time.monotonic() - started
                    show(f"claimed, expired: pass {n} ({deleted} deleted in "
                         f"{took:.0f} s)",
                         await figures(server, http, storage, args.scrapes))
                    if not deleted:
                        break


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", type=int, default=10_000)
    parser.add_argument("--claimed", type=int, default=1_000)
    parser.add_argument("--expiry", type=float, default=30.0)
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--metrics-names", type=int, default=10_000)
    arguments = parser.parse_args()
    asyncio.run(main(arguments))
    metrics_alone(arguments.metrics_names, arguments.scrapes)
