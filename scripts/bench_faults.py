#!/usr/bin/env python3
"""Benchmark: what clients see when Azure Storage throttles and loses answers.

For each fault level (by default none; 3% ServerBusy and 2% of writes applied then
unanswered; 5% and 10%), starts an Azurite (``azqueue.devstorage``, as `azqueue dev`
runs it), the fault proxy (``azqueue.testing.faultproxy``) in front of it and two
`azqueue serve` replicas whose storage is the proxy's (so the SAS URLs they hand out
point at it too), creates N tasks
from 16 concurrent clients spread over both replicas while 4 SAS workers and 4 claimWork
workers (plain aiohttp, as docs/workers/ describes them) claim them, reclaim each
once, read its status and report it completed, and prints the p50, p99 and max of every
endpoint's answer time as the clients saw it, with the count of 5xx answers and of
client time-outs (30 s). claimWork is a long poll: its times include waiting for work
(those that found none, after 20 s, are a line of their own). The storage answers that
took Azurite more than a second are counted ("slow upstream") and, with --verbose,
listed with the calls that took more than 2 s and any stall of this process's own loop.

Usage: .venv/bin/python scripts/bench_faults.py [--tasks 300] [--levels 0/0,3/2,5/10]
                                               [--verbose]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import slugid

import benchlib
from benchlib import definition, signed_session

from azqueue.devstorage import ACCOUNT, KEY, Azurite
from azqueue.testing import sas
from azqueue.testing.faultproxy import FaultProxy, Faults
from azqueue.testing.sas import QueueMessage, delete_url
from azqueue.testing.tasks import UnexpectedAnswer

CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=30)
ENDPOINTS = ("createTask", "pollTaskUrls", "claimTask", "reclaimTask", "status",
             "reportCompleted", "claimWork", "claimWork, no task")
LEVEL_TIMEOUT = 300.0


class Clients:
    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http
        self.times: dict[str, list[float]] = defaultdict(list)
        self.server_errors: Counter[str] = Counter()
        self.timeouts: Counter[str] = Counter()
        self.slow: list[str] = []

    async def call(self, endpoint: str, method: str, url: str,
                   body: dict[str, Any] | None = None,
                   empty: str = "") -> tuple[int, dict[str, Any]]:
        """Call and time; a claimWork answered with no task is timed as ``empty``."""
        start = time.monotonic()
        try:
            async with self.http.request(method, url, json=body, timeout=CLIENT_TIMEOUT) as r:
                data = await r.json()
                status = r.status
        except TimeoutError:
            self.timeouts[endpoint] += 1
            return 0, {}
        except aiohttp.ClientError:
            self.server_errors[endpoint] += 1
            return 0, {}
        if empty and status == 200 and not data.get("tasks"):
            endpoint = empty
        took = time.monotonic() - start
        self.times[endpoint].append(took)
        if took > 2.0:
            self.slow.append(f"{endpoint} {method} {url.split('/api/queue/v1')[-1]} "
                             f"{took:.2f}s from {time.strftime('%H:%M:%S')}-{took:.0f}s")
        if status >= 500:
            self.server_errors[endpoint] += 1
        return status, data


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


class Level:
    """The traffic of one fault level: ``tasks`` created from 16 concurrent clients over
    ``apis``, half for SAS workers and half for claimWork workers, which claim, reclaim,
    read and complete them; and a watch on this process's own loop."""

    def __init__(self, apis: list[str], http: aiohttp.ClientSession, name: str) -> None:
        self.apis = apis
        self.http = http
        self.clients = Clients(http)
        self.queue_sas, self.queue_cw = f"bench/faults-sas-{name}", f"bench/faults-cw-{name}"
        self.created: list[str] = []
        self.completed: set[str] = set()
        self.done = asyncio.Event()
        self.stalls: list[str] = []
        self.limit = asyncio.Semaphore(16)

    async def run(self, tasks: int) -> float:
        """Create ``tasks`` while the workers work, until all are completed (or
        LEVEL_TIMEOUT passes); the seconds it took."""
        start = time.monotonic()
        workers = [asyncio.create_task(self.sas_worker(i)) for i in range(4)] + \
                  [asyncio.create_task(self.claim_work_worker(i)) for i in range(4)] + \
                  [asyncio.create_task(self.watch_loop())]
        await asyncio.gather(*(self.create(i) for i in range(tasks)))
        while (time.monotonic() - start < LEVEL_TIMEOUT
               and not set(self.created) <= self.completed):
            await asyncio.sleep(0.2)
        took = time.monotonic() - start
        self.done.set()
        await asyncio.gather(*workers, return_exceptions=True)
        return took

    async def create(self, i: int) -> None:
        async with self.limit:
            task_id = str(slugid.nice())
            code, _ = await self.clients.call(
                "createTask", "PUT", f"{self.apis[i % len(self.apis)]}/task/{task_id}",
                definition(self.queue_sas if i % 2 else self.queue_cw))
            if code == 200:
                self.created.append(task_id)

    async def work(self, api: str, task_id: str, run_id: int) -> None:
        await self.clients.call("reclaimTask", "POST",
                                f"{api}/task/{task_id}/runs/{run_id}/reclaim")
        await self.clients.call("status", "GET", f"{api}/task/{task_id}/status")
        code, _ = await self.clients.call("reportCompleted", "POST",
                                          f"{api}/task/{task_id}/runs/{run_id}/completed")
        if code == 200:
            self.completed.add(task_id)

    async def sas_worker(self, i: int) -> None:
        api = self.apis[i % len(self.apis)]
        urls: dict[str, Any] = {}
        while not self.done.is_set():
            if not urls:
                code, urls = await self.clients.call(
                    "pollTaskUrls", "GET", f"{api}/poll-task-url/{self.queue_sas}")
                if code != 200:
                    urls = {}
                    continue
            queue = urls["queues"][6]
            try:
                messages = await sas.get_messages(
                    self.http, f"{queue['signedPollUrl']}&visibilitytimeout=10", 4)
            except (UnexpectedAnswer, aiohttp.ClientError):
                await asyncio.sleep(0.1)  # throttled: poll again
                continue
            if not messages:
                await asyncio.sleep(0.2)
            for m in messages:
                await self.claim(api, queue, m, i)

    async def claim(self, api: str, queue: dict[str, str], m: QueueMessage, i: int) -> None:
        tip = m.tip
        code, body = await self.clients.call(
            "claimTask", "POST", f"{api}/task/{tip['taskId']}/runs/{tip['runId']}/claim",
            {"workerGroup": "bench", "workerId": f"sas{i}", "messageId": m.message_id,
             "receipt": m.pop_receipt, "signature": tip["signature"]})
        if code == 200:
            await self.work(api, tip["taskId"], body["runId"])
        elif 400 <= code < 500:
            url = delete_url(queue["signedDeleteUrl"], m)
            try:
                async with self.http.delete(url) as r:
                    await r.read()
            except aiohttp.ClientError:
                pass

    async def claim_work_worker(self, i: int) -> None:
        api = self.apis[i % len(self.apis)]
        while not self.done.is_set():
            code, body = await self.clients.call(
                "claimWork", "POST", f"{api}/claim-work/{self.queue_cw.replace('/', '%2F')}",
                {"workerGroup": "bench", "workerId": f"cw{i}", "tasks": 4},
                empty="claimWork, no task")
            if code == 200:
                for c in body["tasks"]:
                    await self.work(api, c["status"]["taskId"], c["runId"])

    async def watch_loop(self) -> None:
        """This process (clients and proxy) stalled: its calls' times would show it."""
        while not self.done.is_set():
            before = time.monotonic()
            await asyncio.sleep(0.1)
            late = time.monotonic() - before - 0.1
            if late > 0.5:
                self.stalls.append(f"{time.strftime('%H:%M:%S')} this process's loop stalled "
                                   f"{late:.2f}s")


async def level(apis: list[str], proxy: FaultProxy, faults: Faults, tasks: int,
                name: str, verbose: bool = False) -> None:
    """Run one fault level's traffic through ``proxy`` injecting ``faults``, and print
    what the clients saw."""
    proxy.counts.clear()
    proxy.slow.clear()
    async with signed_session(100) as http:
        traffic = Level(apis, http, name)
        proxy.faults = faults
        took = await traffic.run(tasks)
        proxy.faults = Faults()
    report(traffic, proxy, faults, tasks, took, verbose)


def report(traffic: Level, proxy: FaultProxy, faults: Faults, tasks: int, took: float,
           verbose: bool) -> None:
    """A level's summary line, the slow calls and stalls (``verbose``), and the answer
    times of each endpoint."""
    clients, created = traffic.clients, traffic.created
    injected: Counter[str] = Counter()
    for key, n in proxy.counts.items():
        injected[key.split(" ", 1)[1]] += n
    print(f"\nfaults {faults.busy:.0%} ServerBusy, {faults.lost:.0%} of writes applied then "
          f"unanswered: {len(created)}/{tasks} tasks created, "
          f"{len(traffic.completed & set(created))} completed in {took:.1f}s; "
          f"5xx to clients {sum(clients.server_errors.values())}, "
          f"client time-outs {sum(clients.timeouts.values())}; storage requests "
          + ", ".join(f"{k} {v}" for k, v in sorted(injected.items())))
    if verbose:  # which calls took long, and when (to match with the servers' logs)
        for line in clients.slow:
            if not line.startswith("claimWork"):
                print("  slow:", line)
        for line in proxy.slow:
            print("  slow storage:", line)
        for line in traffic.stalls:
            print("  stall:", line)
    for endpoint in ENDPOINTS:
        values = clients.times.get(endpoint, [])
        if values:
            print(f"  {endpoint:16} n={len(values):5}  p50 {statistics.median(values):6.3f}s  "
                  f"p99 {percentile(values, 99):6.3f}s  max {max(values):6.3f}s")


async def main(args: argparse.Namespace) -> None:
    logdir = Path(tempfile.mkdtemp(prefix="azqueue-bench-faults-"))
    print(f"azqueue fault benchmark: {args.tasks} tasks a level, 2 replicas, 4 SAS and "
          f"4 claimWork workers, 16 creating clients; a fresh Azurite a level; server logs "
          f"in {logdir}")
    for spec in args.levels.split(","):
        busy, lost = (float(x) / 100 for x in spec.split("/"))
        name = spec.replace("/", "-")
        # Each level on an Azurite of its own, so that it does not pay for the levels
        # before it: what they left (a deadline message and a task entity per task, and
        # with Azurite's in-memory store, a sweep of their deleted messages that stops
        # every answer for seconds once a minute) slows Azurite, never Azure.
        azurite = await Azurite.start()
        proxy = FaultProxy(azurite.ports)
        await proxy.start()
        servers = []
        try:
            for i in range(2):
                servers.append(await benchlib.start_server(
                    proxy.connection_string(), logdir / f"{name}-server{i}.log"))
            await level([s.api for s in servers], proxy, Faults(busy=busy, lost=lost),
                        args.tasks, name, args.verbose)
        finally:
            for server in servers:
                await server.stop()
            await proxy.stop()
            await azurite.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--levels", default="0/0,3/2,5/10",
                        help="fault levels: percent ServerBusy / percent of writes lost")
    parser.add_argument("--verbose", action="store_true",
                        help="list the calls (but claimWork) that took more than 2 s, the "
                             "storage answers that took more than 1 s, and stalls of this "
                             "process")
    try:
        asyncio.run(main(parser.parse_args()))
    except benchlib.FAILURES as e:
        sys.exit(f"bench_faults: {e}")
