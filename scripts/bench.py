#!/usr/bin/env python3
"""Benchmark: azqueue next to a Celery peer on one Azurite, in one run.

Starts one Azurite (telemetry off; its data in files in RAM, or `--azurite memory`), a
counting proxy in front of it (one port per Azure service; every request counted by
client -- the server signs with SharedKey, workers with SAS, the Celery peer has ports of
its own -- by service and by kind), and
`azqueue serve` in a subprocess whose storage endpoints are the proxy's (so the SAS URLs it
hands out point at the proxy too). Then, in phases (all by default):

  steps     storage requests per step of one lifecycle, one task at a time, resolvers quiet,
            events off and on
  celery    the Celery peer: enqueue N no-op tasks from 16 threads, then time the drain by
            Celery's worker (--pool threads --concurrency 16)
  create    azqueue createTask: N tasks by 16 concurrent clients, default priority (lowest)
  sas       drain of those N by 16 SDK workers, mode "sas" (capacity 1, no-op handler)
  claimwork the same with mode "claim-work" (a fresh backlog of N)
  versus    the Celery peer (enqueue and drain) and azqueue (createTask and a claimWork
            drain) in alternating rounds (--rounds, 4): medians of each and of the
            rounds' ratios, so that neither meets a warmer Azurite and machine more often
  latency   claimWork wake-up: createTask answered -> claimWork answered, 1 and 8 waiting
  rtt       at Azure's latency: for each round trip of --rtt (0 and 10 ms; 30 on request)
            added to every storage request by the proxy (half each way, the Celery
            peer's too), each call one at a time (createTask, with a dependency resolved,
            into a group with tasks; created -> a waiting claimWork caller has it;
            claimTask, reclaimTask, reportCompleted, pollTaskUrls) beside the Celery
            peer's enqueue: p50, p99 and the storage round trips it waited for one after
            another; then createTask from 16 clients and a claimWork drain beside the
            peer's, on a server of its own with quiet resolvers
  replicas  claimWork drain with two `azqueue serve` on the same storage, half the workers each
  idle      16 idle workers per mode, 10 s, no tasks: storage requests/s per idle worker
  events    the claimwork lifecycle with events off and on in alternating rounds (--rounds,
            4), on two servers of its own with quiet resolvers (the main one stopped
            meanwhile), one with AZQUEUE_AMQP_URL (--amqp, default the local RabbitMQ); a
            consumer bound to task-completed before the first task;
            medians of each mode and of the rounds' on / off ratios, then reportCompleted
            sent -> task-completed received, one task at a time
  rest      at rest, events off and on, two replicas of their own: storage requests/s with
            nobody waiting, and with a claimWork caller on each replica for each of
            --rest-queues (20) task queues; the wake-up of a caller (and of a SAS worker's
            pollTaskUrls?pending=true&wait) waiting on one replica by a task created on the
            other, and on the same one (--wake-rounds, 12, seconds apart)

and prints a summary with the performance goals next to the measured values. Workers run in
a child process (scripts/bench_workers.py); CPU times come from /proc.

Usage: .venv/bin/python scripts/bench.py [--tasks 400] [--workers 16] [--skip-celery]
                                         [--phases steps,create,sas,...]
                                         [--azurite files|memory]
The Celery peer needs the bench extra: .venv/bin/pip install -e ".[bench]"
BENCH_SERVER_LOG_LEVEL=INFO (with --keep-logs) has the servers log more than warnings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

import benchlib
from benchlib import (FAILURES, QUIET_RESOLVERS, ROOT_ID, ROOT_TOKEN, BenchError,
                      claim_message, cpu_seconds, create_task, signed_session)

from azure.core.exceptions import ResourceNotFoundError

from azqueue.devstorage import KEY, Azurite
from azqueue.testing import sas, tasks
from azqueue.testing.faultproxy import FaultProxy, Trip, round_trips
from azqueue.testing.processes import ServeProcess, stop_process
from azqueue.testing.requestkinds import Hit
from azqueue.testing.sas import get_messages
from azqueue.testing.tasks import call

SCRIPTS = Path(__file__).resolve().parent
PHASES = ("steps", "celery", "create", "sas", "claimwork", "versus", "latency", "rtt",
          "replicas", "idle", "events", "rest")
DEFAULT_AMQP = "amqp://guest:guest@127.0.0.1:5672/"
PYTHON = sys.executable


# -- measuring -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Mark:
    """The proxy's counters and the CPU seconds of every process, at one moment."""

    at: float
    counts: Counter[Hit]
    cpu: dict[str, float]


@dataclass(frozen=True, slots=True)
class Span:
    seconds: float
    counts: Counter[Hit]
    cpu: dict[str, float]

    def requests(self, client: str | None = None, kind: str | None = None) -> int:
        return sum(n for h, n in self.counts.items()
                   if (client is None or h.client == client) and (kind is None or h.kind == kind))

    def cores(self, name: str) -> float:
        return self.cpu.get(name, 0.0) / self.seconds if self.seconds else 0.0


@dataclass
class Bench:
    args: argparse.Namespace
    azurite: Azurite
    proxy: FaultProxy
    logs: Path
    server: ServeProcess | None = None
    pids: dict[str, int] = field(default_factory=dict)
    summary: dict[str, float] = field(default_factory=dict)
    anomalies: list[str] = field(default_factory=list)

    def mark(self) -> Mark:
        cpu = {"azurite": cpu_seconds(self.azurite.process.pid),
               "bench": cpu_seconds(os.getpid())}
        for name, pid in self.pids.items():
            cpu[name] = cpu_seconds(pid)
        return Mark(time.monotonic(), self.proxy.snapshot(), cpu)

    @staticmethod
    def span(a: Mark, b: Mark) -> Span:
        return Span(b.at - a.at, b.counts - a.counts,
                    {k: b.cpu[k] - a.cpu.get(k, 0.0) for k in b.cpu})

    async def start_server(self, name: str = "server", **settings: str) -> ServeProcess:
        server = await benchlib.start_server(self.proxy.connection_string(),
                                             self.logs / f"{name}.log", **settings)
        self.pids[name] = server.process.pid
        return server

    async def stop_server(self, name: str, server: ServeProcess) -> None:
        await server.stop()
        self.pids.pop(name, None)

    @property
    def main(self) -> ServeProcess:
        assert self.server is not None
        return self.server


def cpu_line(span: Span, *names: str) -> str:
    return ", ".join(f"{n} {span.cores(n):.2f}" for n in names if n in span.cpu)


def print_kinds(span: Span, per: int, clients: tuple[str, ...] = ("server", "workers")) -> None:
    for client in clients:
        rows = sorted((h.service, h.kind, n) for h, n in span.counts.items() if h.client == client)
        if rows:
            print(f"    {client}: " + ", ".join(f"{s} {k} {n / per:.2f}" for s, k, n in rows))


# -- phase: per-step requests --------------------------------------------------------------

STEP_ORDER = ("createTask", "SAS poll (the queue's sample, then the queues it flags)",
              "claimTask",
              "reportCompleted", "claimWork, waiting (before the task exists)",
              "createTask + claimWork's claim", "reportCompleted (claimWork run)")


def where(counts: Counter[Hit], n: int, client: str) -> str:
    parts = sorted((h.service, h.kind, c) for h, c in counts.items() if h.client == client)
    return ", ".join(f"{s} {k} {round(c / n, 2):g}" for s, k, c in parts)


async def phase_steps(b: Bench) -> None:
    n = b.args.step_tasks
    amqp = b.args.amqp or DEFAULT_AMQP
    print(f"\n== steps: storage requests per step, {n} lifecycles one at a time, events off "
          f"and on ({amqp}), resolvers quiet ==")
    off = await measure_steps(b, n, {})
    on = await measure_steps(b, n, {"AZQUEUE_AMQP_URL": amqp,
                                    "AZQUEUE_EXCHANGE_PREFIX": f"bench-{secrets.token_hex(4)}/"})

    def server(c: Counter[Hit]) -> float:
        return float(sum(v for h, v in c.items() if h.client == "server")) / n

    def workers(c: Counter[Hit]) -> float:
        return float(sum(v for h, v in c.items() if h.client == "workers")) / n

    print("\n| step | server | server, events on | workers | where the requests go (per "
          "lifecycle, events off; on) |\n| --- | ---: | ---: | ---: | --- |")
    totals = {flow: (Counter[Hit](), Counter[Hit]()) for flow in ("SAS", "claimWork")}
    for step in STEP_ORDER:
        c, e = off[step], on[step]
        for total, part in zip(totals["SAS" if step in STEP_ORDER[:4] else "claimWork"], (c, e)):
            total += part
        detail = "; ".join(x for x in (where(c, n, "server"), where(c, n, "workers")) if x)
        more = where(e, n, "server") if where(e, n, "server") != where(c, n, "server") else ""
        print(f"| {step} | {server(c):.2f} | {server(e):.2f} | {workers(c):.2f} | {detail}"
              f"{'; events on: ' + more if more else ''} |")
    for flow, (c, e) in totals.items():
        print(f"| **{flow} lifecycle** | **{server(c):.2f}** | **{server(e):.2f}** | "
              f"**{workers(c):.2f}** | total {server(c) + workers(c):.2f}, events on "
              f"{server(e) + workers(e):.2f} |")
        b.summary[f"steps {flow} server"] = server(c)
        b.summary[f"steps {flow} total"] = server(c) + workers(c)
        b.summary[f"steps {flow} server events"] = server(e)


async def measure_steps(b: Bench, n: int, settings: dict[str, str]) -> dict[str, Counter[Hit]]:
    """The storage requests of each step, summed over ``n`` lifecycles, on a server with
    ``settings``. With events on, a lifecycle ends when its task group's resolution has
    arrived: the work a report causes after its answer is counted with it."""
    server = await b.start_server("server-quiet", **QUIET_RESOLVERS, **settings)
    steps: dict[str, Counter[Hit]] = {s: Counter() for s in STEP_ORDER}
    queue = "bench/steps"
    listener = await GroupListener.start(settings)
    try:
        async with signed_session() as http:
            api = server.api
            urls = await call(http, "GET", f"{api}/poll-task-url/{queue}")

            async def sas_lifecycle(record: bool) -> None:
                marks = [b.proxy.snapshot()]
                task_id = await create_task(http, api, queue)
                marks.append(b.proxy.snapshot())
                # As the SDK's worker polls: only the queues the replica's sample flags.
                sample = await call(http, "GET", f"{api}/poll-task-url/{queue}?pending=true")
                messages = []
                for q, flagged in zip(urls["queues"], sample["pending"]["queues"]):
                    messages = await get_messages(http, q["signedPollUrl"], 1) if flagged else []
                    if messages:
                        break
                assert messages, "the task's tip was not in any of the queues flagged"
                marks.append(b.proxy.snapshot())
                claim = await claim_message(http, api, messages[0])
                assert claim["status"]["taskId"] == task_id
                marks.append(b.proxy.snapshot())
                await call(http, "POST", f"{api}/task/{task_id}/runs/{claim['runId']}/completed")
                await listener.resolved(task_id)
                await settled(b, marks[-1])
                marks.append(b.proxy.snapshot())
                if record:
                    for step, (x, y) in zip(STEP_ORDER[:4], zip(marks, marks[1:])):
                        steps[step] += y - x

            async def claim_work_lifecycle(record: bool) -> None:
                marks = [b.proxy.snapshot()]
                waiting = asyncio.create_task(call(
                    http, "POST", f"{api}/claim-work/{queue.replace('/', '%2F')}",
                    {"workerGroup": "bench", "workerId": "steps", "tasks": 1}))
                await asyncio.sleep(0.3)  # its first pass over the queues finds nothing
                marks.append(b.proxy.snapshot())
                task_id = await create_task(http, api, queue)
                [claim] = (await waiting)["tasks"]
                assert claim["status"]["taskId"] == task_id
                marks.append(b.proxy.snapshot())
                await call(http, "POST", f"{api}/task/{task_id}/runs/{claim['runId']}/completed")
                await listener.resolved(task_id)
                await settled(b, marks[-1])
                marks.append(b.proxy.snapshot())
                if record:
                    for step, (x, y) in zip(STEP_ORDER[4:], zip(marks, marks[1:])):
                        steps[step] += y - x

            await sas_lifecycle(False)  # warm-up: queues and tables exist, connections open
            await claim_work_lifecycle(False)
            for _ in range(n):
                await sas_lifecycle(True)
            for _ in range(n):
                await claim_work_lifecycle(True)
    finally:
        await listener.close()
        await b.stop_server("server-quiet", server)
    return steps


async def settled(b: Bench, since: Counter[Hit]) -> None:
    """Back once the server deleted the message of the run reported since ``since`` (it
    does so after the report's answer), or after a second: counted with the report."""
    deleted = Hit("server", "queue", "DELETE message")
    for _ in range(100):
        if b.proxy.snapshot()[deleted] > since[deleted]:
            return
        await asyncio.sleep(0.01)


class GroupListener:
    """With events on, the task-group-resolved messages of a server, to wait for."""

    def __init__(self, connection: Any, arrived: set[str], event: asyncio.Event) -> None:
        self._connection, self._arrived, self._event = connection, arrived, event

    @classmethod
    async def start(cls, settings: dict[str, str]) -> GroupListener:
        if "AZQUEUE_AMQP_URL" not in settings:
            return cls(None, set(), asyncio.Event())
        import aio_pika  # (the benchmark's other phases do without RabbitMQ)

        connection = await aio_pika.connect(settings["AZQUEUE_AMQP_URL"])
        arrived: set[str] = set()
        event = asyncio.Event()
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(f"{settings['AZQUEUE_EXCHANGE_PREFIX']}task-group-resolved",
                         routing_key="#")

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            async with message.process():
                arrived.add(json.loads(message.body)["taskGroupId"])
                event.set()

        await queue.consume(on_message)
        return cls(connection, arrived, event)

    async def resolved(self, task_group_id: str) -> None:
        """Back once the group's resolution has arrived (at once with events off)."""
        while self._connection is not None and task_group_id not in self._arrived:
            self._event.clear()
            await asyncio.wait_for(self._event.wait(), 30)

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()



# -- phase: the Celery peer ----------------------------------------------------------------

async def phase_celery(b: Bench) -> None:
    n = b.args.tasks
    print(f"\n== celery: Celery 5 on kombu's azurestoragequeues transport, {n} no-op tasks ==")
    rates = await celery_round(b, "celery")
    if rates is not None:
        b.summary["celery enqueue"], b.summary["celery drain"] = rates


def celery_peer(b: Bench) -> Any:
    """The Celery peer's no-op task, its broker the proxy's ``celery`` ports; None,
    saying how to install it, without the ``bench`` extra."""
    try:
        sys.path.insert(0, str(SCRIPTS))
        os.environ["BENCH_CELERY_BROKER"] = (f"azurestoragequeues://{KEY}@"
                                             f"{b.proxy.endpoint('queue', 'celery')}")
        import bench_celery
    except ImportError as e:
        print(f"  skipped: {e}. Install the peer with: .venv/bin/pip install -e \".[bench]\"")
        return None
    return bench_celery.noop


async def celery_round(b: Bench, name: str) -> tuple[float, float] | None:
    """The Celery peer enqueues N no-op tasks and its worker drains them: (enqueue, drain)
    in tasks/s; None, saying how to install it, without the ``bench`` extra."""
    n, w = b.args.tasks, b.args.workers
    noop = celery_peer(b)
    if noop is None:
        return None

    def send(count: int) -> None:
        for _ in range(count):
            noop.delay()

    with ThreadPoolExecutor(w) as pool:
        # One task per thread first, outside the timing: each opens its broker connection
        # and creates or finds the queue.
        await asyncio.to_thread(lambda: list(pool.map(send, [1] * w)))
        share = [n // w + (1 if i < n % w else 0) for i in range(w)]
        before = b.mark()
        await asyncio.to_thread(lambda: list(pool.map(send, share)))
        enqueue = b.span(before, b.mark())
    print(f"  enqueue: {n} tasks from {w} threads in {enqueue.seconds:.2f}s = "
          f"{n / enqueue.seconds:.1f} tasks/s; "
          f"{enqueue.requests('celery') / n:.2f} storage requests per task")

    done_file = b.logs / f"{name}-done.json"
    env = {**os.environ, "BENCH_CELERY_TARGET": str(n + w), "BENCH_CELERY_DONE": str(done_file),
           "PYTHONPATH": str(SCRIPTS)}
    with open(b.logs / f"{name}.log", "ab") as log:
        worker = subprocess.Popen(
            [str(Path(PYTHON).parent / "celery"), "-A", "bench_celery", "worker", "--pool",
             "threads", "--concurrency", str(w), "--loglevel", "WARNING", "--without-heartbeat",
             "--without-mingle", "--without-gossip"],
            env=env, cwd=b.logs, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True)
    b.pids["celery"] = worker.pid
    try:
        before = b.mark()
        while not done_file.exists():
            if worker.poll() is not None:
                raise BenchError(f"the Celery worker exited with {worker.returncode}; "
                                 f"see {b.logs / f'{name}.log'}")
            if time.monotonic() - before.at > b.args.timeout:
                raise BenchError(f"the Celery worker did not finish in {b.args.timeout}s")
            await asyncio.sleep(0.05)
        span = b.span(before, b.mark())
    finally:
        await stop_process(worker)
        b.pids.pop("celery", None)
    seen = json.loads(done_file.read_text())
    seconds = seen["done"] - min(seen.get("ready", seen["first"]), seen["first"])
    print(f"  drain: {n + w} tasks in {seconds:.2f}s (worker ready -> last task done) = "
          f"{(n + w) / seconds:.1f} tasks/s; {span.requests('celery') / (n + w):.2f} storage "
          f"requests per task; CPU cores: {cpu_line(span, 'celery', 'azurite', 'bench')}")
    return n / enqueue.seconds, (n + w) / seconds


# -- phases: createTask, drains ------------------------------------------------------------

async def create_backlog(b: Bench, queue: str, label: str, key: str = "",
                         server: ServeProcess | None = None) -> float:
    """N tasks on ``queue`` by ``workers`` concurrent clients (to ``server``, the main one
    unless told); prints and returns tasks/s, and keeps the server's requests and CPU per
    createTask under ``key``."""
    n, w = b.args.tasks, b.args.workers
    api = (server or b.main).api
    async with signed_session(w * 2) as http:
        await create_task(http, api, queue)  # the queue's Azure queues exist: not timed
        left = n - 1

        async def client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await create_task(http, api, queue)

        before = b.mark()
        await asyncio.gather(*(client() for _ in range(w)))
        span = b.span(before, b.mark())
    rate = float(n - 1) / span.seconds
    server_cpu = sum(v for k, v in span.cpu.items() if k.startswith("server"))
    print(f"  {label}: {n - 1} createTask by {w} concurrent clients in {span.seconds:.2f}s = "
          f"{rate:.1f} tasks/s; server {span.requests('server') / (n - 1):.2f} storage requests "
          f"and {server_cpu * 1000 / (n - 1):.1f} ms CPU per task; CPU cores: "
          f"{cpu_line(span, *(k for k in span.cpu if k.startswith('server')), 'azurite', 'bench')}")
    print_kinds(span, n - 1, ("server",))
    if key:
        b.summary[f"{key} create requests"] = span.requests("server") / (n - 1)
        b.summary[f"{key} create cpu"] = server_cpu * 1000 / (n - 1)
        b.summary[f"{key} create rate"] = rate
    return rate


class WorkerProcess:
    """scripts/bench_workers.py as a child, driven over stdin/stdout."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, b: Bench, mode: str, queue: str, root_urls: list[str],
                    target: int) -> WorkerProcess:
        args = [PYTHON, str(SCRIPTS / "bench_workers.py"), "--mode", mode, "--task-queue", queue,
                "--workers", str(b.args.workers), "--target", str(target),
                "--stall", str(b.args.stall)]
        for url in root_urls:
            args += ["--root-url", url]
        env = {**os.environ, "TASKCLUSTER_CLIENT_ID": ROOT_ID,
               "TASKCLUSTER_ACCESS_TOKEN": ROOT_TOKEN}
        with open(b.logs / f"workers-{mode}.log", "ab") as log:
            process = await asyncio.create_subprocess_exec(
                *args, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=log, start_new_session=True)
        b.pids["workers"] = process.pid
        wp = cls(process)
        await wp.expect("ready", 60)
        return wp

    async def next(self, key: str, seconds: float) -> dict[str, Any]:
        """The workers' next message, which should come before ``key`` within ``seconds``."""
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), max(seconds, 0))
        except TimeoutError:
            raise BenchError(f"the workers did not say {key!r} within the time given") from None
        if not line:
            raise BenchError(f"the worker process exited ({self.process.returncode}) "
                             f"before saying {key!r}; see its log")
        message: dict[str, Any] = json.loads(line)
        return message

    async def expect(self, key: str, seconds: float) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        while True:
            message = await self.next(key, deadline - time.monotonic())
            if key in message:
                return message

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()

    async def stop(self, b: Bench) -> dict[str, Any]:
        """Ask the workers to stop (a forced stop: tasks they hold go back to the queue);
        KILL them if they do not within 40 s or if this wait is cancelled. Returns their
        last word (``completed``: how many tasks they completed), if any."""
        last: dict[str, Any] = {}
        try:
            if self.process.returncode is None:
                with contextlib.suppress(Exception):
                    await self.send("stop")
                    last = await self.expect("stopped", 40)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            b.pids.pop("workers", None)
        await self.process.wait()
        return last


def warnings(b: Bench, most: int = 10) -> str:
    """The last warnings in the servers' logs."""
    lines = [line for log in sorted(b.logs.glob("server*.log"))
             for line in log.read_text(errors="replace").splitlines()
             if (" WARNING " in line or " ERROR " in line) and "AMQP_URL" not in line]
    return "\n".join(lines[-most:]) or "(none)"


@dataclass(frozen=True, slots=True)
class Drain:
    rate: float
    span: Span
    completed: int


async def drain(b: Bench, mode: str, queue: str, root_urls: list[str]) -> Drain:
    """The backlog of N tasks on ``queue`` drained; the figures are per task completed. If
    completions stall short of N, the drain ends at the last one, saying so."""
    n = b.args.tasks
    workers = await WorkerProcess.start(b, mode, queue, root_urls, n)
    try:
        before = b.mark()
        await workers.send("go")
        last = before  # at the last completion: a stall at the end is not measured
        deadline = time.monotonic() + b.args.timeout
        try:
            while "done" not in (message := await workers.next("done",
                                                               deadline - time.monotonic())):
                if "progress" in message:
                    last = b.mark()
            done = message
        except BenchError:
            stopped = await workers.stop(b)
            raise BenchError(
                f"the {mode} drain did not finish within {b.args.timeout:.0f}s: "
                f"{stopped.get('completed', '?')} of {n} tasks completed. A task whose claim "
                "could not be stored stays invisible until the claim expires; the servers' "
                f"warnings:\n{warnings(b)}") from None
        span = b.span(before, last)
    finally:
        await workers.stop(b)
    n = int(done["completed"])
    if done.get("stalled"):
        b.anomalies.append(f"{mode} drain: {n} of {b.args.tasks} tasks completed, then none for "
                           f"{b.args.stall:.0f}s")
        print(f"  WARNING: only {n} of {b.args.tasks} tasks were completed, then none for "
              f"{b.args.stall:.0f}s (a task whose claim was lost stays invisible until the claim "
              f"expires); the figures below are per task completed. Servers' warnings:\n"
              f"{warnings(b)}")
    rate = n / done["done"]
    servers = [k for k in span.cpu if k.startswith("server")]
    server_cpu = sum(span.cpu[k] for k in servers)
    print(f"  drain: {n} tasks by {b.args.workers} {mode} workers in {done['done']:.2f}s = "
          f"{rate:.1f} tasks/s")
    print(f"  per task drained (claim to completed): server {span.requests('server') / n:.2f} "
          f"storage requests and {server_cpu * 1000 / n:.1f} ms CPU, workers "
          f"{span.requests('workers') / n:.2f} requests (polls "
          f"{span.requests('workers', 'GET messages') / n:.2f})")
    print(f"  CPU cores: {cpu_line(span, *servers, 'azurite', 'workers', 'bench')}")
    print_kinds(span, n)
    print(f"    resolvers (background polls, per second, not per task): "
          f"{span.requests('resolvers') / span.seconds:.2f}/s")
    return Drain(rate, span, n)


def record_drain(b: Bench, key: str, d: Drain) -> None:
    """Keep a drain's figures; with its backlog's, print the whole lifecycle's."""
    n, s = d.completed, b.summary
    s[f"{key} rate"] = d.rate
    s[f"{key} server requests"] = d.span.requests("server") / n
    s[f"{key} worker polls"] = d.span.requests("workers", "GET messages") / n
    s[f"{key} server cpu"] = sum(v for k, v in d.span.cpu.items()
                                 if k.startswith("server")) * 1000 / n
    s[f"{key} azurite cores"] = d.span.cores("azurite")
    if f"{key} create requests" in s:
        s[f"{key} lifecycle requests"] = s[f"{key} create requests"] + s[f"{key} server requests"]
        s[f"{key} lifecycle cpu"] = s[f"{key} create cpu"] + s[f"{key} server cpu"]
        print(f"  per lifecycle (createTask + drain): server {s[f'{key} lifecycle requests']:.2f} "
              f"storage requests, {s[f'{key} lifecycle cpu']:.1f} ms CPU")


async def phase_create(b: Bench) -> None:
    print("\n== create: azqueue createTask, priority lowest ==")
    b.summary["create"] = await create_backlog(b, "bench/sas", "backlog for the SAS drain", "sas")


async def phase_sas(b: Bench) -> None:
    print(f"\n== sas: drain by {b.args.workers} SDK workers, mode sas, capacity 1 ==")
    if "create" not in b.args.phases:
        await create_backlog(b, "bench/sas", "backlog", "sas")
    record_drain(b, "sas", await drain(b, "sas", "bench/sas", [b.main.root_url]))


async def phase_claimwork(b: Bench) -> None:
    print(f"\n== claimwork: drain by {b.args.workers} SDK workers, mode claim-work, capacity 1 ==")
    rate = await create_backlog(b, "bench/claimwork", "backlog", "claimwork")
    b.summary.setdefault("create", rate)
    record_drain(b, "claimwork", await drain(b, "claim-work", "bench/claimwork",
                                             [b.main.root_url]))


async def phase_versus(b: Bench) -> None:
    """The Celery peer and azqueue (createTask, then a claimWork drain) in ``--rounds``
    rounds, each first in every other round, each phase clear of earlier tasks' deadline
    messages: Azurite, the server and the machine get faster as a run goes on (the first
    phase that creates tasks is the slowest whatever came before), so single phases
    compare the peer, which runs early, with a warmer azqueue. Medians of each, and the
    medians of the rounds' ratios."""
    rounds = b.args.rounds
    print(f"\n== versus: the Celery peer and azqueue's claimWork lifecycle, {rounds} rounds, "
          "each first in turn ==")
    seen: list[tuple[float, float, float, float]] = []
    for r in range(rounds):
        figures: dict[str, tuple[float, float]] = {}
        for who in (("celery", "azqueue") if r % 2 == 0 else ("azqueue", "celery")):
            print(f"  -- round {r + 1} of {rounds}, {who} --")
            await forget_resolved(b)
            if who == "celery":
                rates = await celery_round(b, f"celery-versus{r}")
                if rates is None:
                    return
                figures[who] = rates
            else:
                q = f"bench/versus{r}"
                created = await create_backlog(b, q, "backlog")
                figures[who] = (created, (await drain(b, "claim-work", q,
                                                      [b.main.root_url])).rate)
        seen.append((*figures["celery"], *figures["azqueue"]))
    enqueue, peer_drain, created, drained = (
        statistics.median(f[i] for f in seen) for i in range(4))
    create_ratio = statistics.median(f[2] / f[0] for f in seen)
    drain_ratio = statistics.median(f[3] / f[1] for f in seen)
    print(f"\n| figure (median of {rounds} rounds) | Celery | azqueue | azqueue / Celery |\n"
          "| --- | ---: | ---: | ---: |\n"
          f"| enqueue / createTask, tasks/s | {enqueue:.1f} | {created:.1f} | "
          f"{create_ratio:.2f}x |\n"
          f"| drain (claimWork), tasks/s | {peer_drain:.1f} | {drained:.1f} | "
          f"{drain_ratio:.2f}x |")
    b.summary["versus create ratio"] = create_ratio
    b.summary["versus drain ratio"] = drain_ratio


# -- phase: events on ----------------------------------------------------------------------

EVENT_FIGURES = (("server storage requests / lifecycle", "lifecycle requests"),
                 ("createTask/s", "create rate"),
                 ("claimWork backlog drain, tasks/s", "rate"),
                 ("server CPU / lifecycle, ms", "lifecycle cpu"))


async def events_on_lifecycles(b: Bench, server: ServeProcess, q: str, completed: dict[str, float],
                               arrived: asyncio.Event) -> None:
    """A backlog created and drained on the server with events on; the background work
    the lifecycles caused is counted until every task-completed has arrived."""
    await create_backlog(b, q, "backlog, events on", "events", server)
    expected = len(completed)
    d = await drain(b, "claim-work", q, [server.root_url])
    before_settle = b.mark()
    deadline = time.monotonic() + b.args.timeout
    while len(completed) < expected + d.completed and time.monotonic() < deadline:
        arrived.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(arrived.wait(), 1.0)
    settle = b.span(before_settle, b.mark())
    if len(completed) < expected + d.completed:
        b.anomalies.append(f"events: {len(completed) - expected} task-completed received "
                           f"for {d.completed} tasks completed")
    record_drain(b, "events", Drain(d.rate, Span(
        d.span.seconds + settle.seconds, d.span.counts + settle.counts,
        {k: v + settle.cpu.get(k, 0.0) for k, v in d.span.cpu.items()}), d.completed))


async def phase_events(b: Bench) -> None:
    """The claimwork lifecycle with events off and on, side by side: ``--rounds`` rounds,
    each a backlog created and drained on a server without events and on one with events
    (same Azurite, same RabbitMQ), each mode first in every other round, so that both meet
    the same load of a shared machine and of an Azurite that slows as it fills. The
    figures are each mode's medians, the ratios the medians of the rounds' ratios. Then
    the change -> delivered latency as a listener sees it."""
    import aio_pika  # (the benchmark's other phases do without RabbitMQ)

    amqp = b.args.amqp or DEFAULT_AMQP
    prefix = f"bench-{secrets.token_hex(4)}/"  # exchanges of this run only
    rounds = b.args.rounds
    print(f"\n== events: claimwork with events off and on, {rounds} rounds, each first in turn "
          f"({amqp}, exchanges {prefix}*; two servers of their own, resolvers quiet) ==")
    # Both modes on servers of their own with quiet resolvers, and the main server stopped
    # meanwhile: the tasks of earlier phases reach their deadline messages' first look
    # (the tip repair delay) a few minutes after they were created, and that work, done by
    # whichever server's resolver gets there, would be counted with these drains.
    await b.stop_server("server", b.main)
    b.server = None
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(restart_main, b)
        off = await b.start_server("server-events-off", **QUIET_RESOLVERS)
        stack.push_async_callback(b.stop_server, "server-events-off", off)
        server = await b.start_server("server-events", AZQUEUE_AMQP_URL=amqp,
                                      AZQUEUE_EXCHANGE_PREFIX=prefix, **QUIET_RESOLVERS)
        stack.push_async_callback(b.stop_server, "server-events", server)
        connection = await aio_pika.connect(amqp)
        stack.push_async_callback(connection.close)
        await events_rounds(b, off, server, connection, prefix)


async def restart_main(b: Bench) -> None:
    b.server = await b.start_server("server")


async def events_rounds(b: Bench, off: ServeProcess, server: ServeProcess, connection: Any,
                        prefix: str) -> None:
    """The rounds of the events phase and the latency, on ``off`` (events off) and
    ``server`` (events on, exchanges ``prefix``*); ``connection`` to the broker."""
    import aio_pika

    rounds = b.args.rounds
    completed: dict[str, float] = {}
    arrived = asyncio.Event()
    channel = await connection.channel()
    queue = await channel.declare_queue(exclusive=True, auto_delete=True)
    # Bound before the first task, to the exchange the server declared at start-up.
    await queue.bind(f"{prefix}task-completed", routing_key="#")

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        async with message.process():
            task_id = json.loads(message.body)["status"]["taskId"]
            completed.setdefault(task_id, time.monotonic())
            arrived.set()

    await queue.consume(on_message, no_ack=False)
    seen: dict[str, list[dict[str, float]]] = {"events-off": [], "events": []}
    for r in range(rounds):
        # Off then on, then on then off: Azurite slows as it fills, and each mode
        # goes first as often as the other.
        for key in (("events-off", "events") if r % 2 == 0 else ("events", "events-off")):
            mode = "off" if key == "events-off" else "on"
            print(f"  -- round {r + 1} of {rounds}, events {mode} --")
            await forget_resolved(b)
            if key == "events-off":
                q = f"bench/events-off{r}"
                await create_backlog(b, q, "backlog, events off", key, off)
                record_drain(b, key, await drain(b, "claim-work", q, [off.root_url]))
            else:
                await events_on_lifecycles(b, server, f"bench/events{r}", completed, arrived)
            seen[key].append({k: b.summary[f"{key} {k}"] for _, k in EVENT_FIGURES})
    s = b.summary
    print(f"\n| figure (claimWork, median of {rounds} rounds) | events off | events on "
          "| on / off |\n| --- | ---: | ---: | ---: |")
    for what, key in EVENT_FIGURES:
        without = statistics.median(f[key] for f in seen["events-off"])
        with_ = statistics.median(f[key] for f in seen["events"])
        ratio = statistics.median(n[key] / f[key]
                                  for f, n in zip(seen["events-off"], seen["events"]))
        s[f"events-off {key}"], s[f"events {key}"], s[f"events/off {key}"] = \
            without, with_, ratio
        print(f"| {what} | {without:.2f} | {with_:.2f} | {ratio:.2f}x |")
    lat: list[float] = []
    q = "bench/events-latency"
    async with signed_session() as http:
        for i in range(b.args.latency_tasks + 1):
            task_id = await create_task(http, server.api, q)
            claimed = await call(http, "POST", f"{server.api}/claim-work/{q.replace('/', '%2F')}",
                                 {"workerGroup": "bench", "workerId": "events", "tasks": 1})
            [claim] = claimed["tasks"]
            assert claim["status"]["taskId"] == task_id
            sent = time.monotonic()
            await call(http, "POST",
                       f"{server.api}/task/{task_id}/runs/{claim['runId']}/completed")
            while task_id not in completed:
                arrived.clear()
                await asyncio.wait_for(arrived.wait(), 30)
            if i:  # the first warms the connections up
                lat.append((completed[task_id] - sent) * 1000)
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    print(f"| reportCompleted sent -> task-completed received, {len(lat)} tasks one at a "
          f"time, p50 / p99 | | {p50:.1f} / {p99:.1f} ms | |")
    s["events delivered p50"], s["events delivered p99"] = p50, p99


# -- phase: claimWork wake-up latency --------------------------------------------------------

def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def latency(b: Bench, http: aiohttp.ClientSession, workers: int, tasks: int) -> list[float]:
    api, queue = b.main.api, f"bench/latency{workers}"
    claimed: dict[str, float] = {}
    waiting = 0
    stop = False

    async def worker(i: int) -> None:
        nonlocal waiting
        while not stop:
            waiting += 1
            try:
                body = await call(http, "POST", f"{api}/claim-work/{queue.replace('/', '%2F')}",
                                  {"workerGroup": "bench", "workerId": f"l{i}", "tasks": 1})
            finally:
                waiting -= 1
            at = time.perf_counter()
            for claim in body["tasks"]:
                claimed[claim["status"]["taskId"]] = at
                await call(http, "POST", f"{api}/task/{claim['status']['taskId']}/runs/"
                                         f"{claim['runId']}/completed", {})

    pool = [asyncio.create_task(worker(i)) for i in range(workers)]
    out: list[float] = []
    try:
        for _ in range(tasks):
            while waiting < workers:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # let them settle into their wait
            task_id = await create_task(http, api, queue)
            answered = time.perf_counter()
            while task_id not in claimed:
                await asyncio.sleep(0.001)
            out.append((claimed[task_id] - answered) * 1000)
    finally:
        stop = True
        for p in pool:
            p.cancel()
        await asyncio.gather(*pool, return_exceptions=True)
    return out


async def phase_latency(b: Bench) -> None:
    n = b.args.latency_tasks
    print(f"\n== latency: claimWork wake-up, createTask answered -> claimWork answered, "
          f"{n} tasks one at a time ==")
    async with signed_session() as http:
        for workers in (1, 8):
            lat = await latency(b, http, workers, n)
            p50, p99 = percentile(lat, 50), percentile(lat, 99)
            print(f"  {workers} waiting: p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(lat):.1f} "
                  f"ms, mean {statistics.mean(lat):.1f} ms")
            b.summary[f"latency{workers} p50"] = p50
            b.summary[f"latency{workers} p99"] = p99


# -- phase: at Azure's latency ------------------------------------------------------------

# The calls of the per-call table, in its order.
CALLS = ("createTask", "createTask, dependencies resolved", "createTask, existing group",
         "createTask, waiting for a dependency", "createTask, as taskgraph's",
         "created -> waiting claimWork has it",
         "claimTask", "reclaimTask", "reportCompleted", "pollTaskUrls")
# Those the goals name: the createTasks held to one round trip, the hand-over, and the
# calls held to one round trip each unless a second must be in line (``SECOND_TRIP``).
CREATES = CALLS[:3]
HAND_OVER = "created -> waiting claimWork has it"
IN_LINE = ("claimTask", "reclaimTask", "reportCompleted")
SECOND_TRIP = {
    what: "the message's rewrite (a claim) or push (a reclaim), then the task's write: Azure "
          "answers either with a new "
          "pop receipt, which every later move of the message needs (a reclaim, the release for "
          "a retry, the delete at the resolution), so it is stored with the claim in the task's "
          "one write; stored later, every claim would cost a third request, and a replica dying "
          "in between would leave a run holding a message it cannot move (docs/capacity.md)"
    for what in ("claimTask", "reclaimTask")}


@dataclass
class Timings:
    """Each call's durations (ms) and storage round trips one after another."""

    ms: dict[str, list[float]] = field(default_factory=dict)
    trips: dict[str, list[int]] = field(default_factory=dict)
    chain: dict[str, str] = field(default_factory=dict)  # the longest chain of each

    def note(self, what: str, seconds: float, chain: list[Trip]) -> None:
        self.ms.setdefault(what, []).append(seconds * 1000)
        self.trips.setdefault(what, []).append(len(chain))
        if len(chain) >= max(self.trips[what]):
            self.chain[what] = " -> ".join(f"{t.hit.service} {t.hit.kind}" for t in chain)


class Timed:
    """Times one call and counts the storage round trips it waited for, one after
    another (``faultproxy.round_trips``), of ``clients`` (the server and SAS workers by
    default)."""

    def __init__(self, b: Bench, timings: Timings, what: str,
                 clients: tuple[str, ...] = ("server", "workers")) -> None:
        self.b, self.timings, self.what, self.clients = b, timings, what, clients
        self.since = 0.0

    def __enter__(self) -> Timed:
        self.since = time.monotonic()
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        until = time.monotonic()
        if kind is None:
            assert self.b.proxy.trips is not None
            self.timings.note(self.what, until - self.since, round_trips(
                self.b.proxy.trips, self.since, until, self.clients))


async def rtt_lifecycles(b: Bench, http: aiohttp.ClientSession, api: str, t: Timings) -> None:
    """One task at a time: createTask, a SAS worker's claimTask (its poll not timed),
    reclaimTask, reportCompleted, pollTaskUrls."""
    queue = f"bench/rtt{b.proxy.delay * 2000:g}-sas"
    urls = await call(http, "GET", f"{api}/poll-task-url/{queue}")
    for i in range(b.args.rtt_calls + 1):
        record = Timings() if i == 0 else t  # the first warms connections up
        with Timed(b, record, "createTask"):
            task_id = await create_task(http, api, queue)
        messages = await sas.poll_once(http, urls)
        assert messages and messages[0].tip["taskId"] == task_id, "the tip was not polled"
        with Timed(b, record, "claimTask"):
            claim = await claim_message(http, api, messages[0])
        run = f"{api}/task/{task_id}/runs/{claim['runId']}"
        with Timed(b, record, "reclaimTask"):
            await call(http, "POST", f"{run}/reclaim")
        with Timed(b, record, "reportCompleted"):
            await call(http, "POST", f"{run}/completed")
        with Timed(b, record, "pollTaskUrls"):
            urls = await call(http, "GET", f"{api}/poll-task-url/{queue}")


async def rtt_variants(b: Bench, http: aiohttp.ClientSession, api: str, t: Timings) -> None:
    """createTask with a dependency already resolved, into a group that has tasks, and
    waiting for a dependency that is pending; and as a taskgraph decision task creates its
    tasks: members of its group (the decision task's) that wait for it, pending."""
    queue = f"bench/rtt{b.proxy.delay * 2000:g}-variants"
    resolved = await create_task(http, api, queue)
    claimed = await call(http, "POST", f"{api}/claim-work/{queue.replace('/', '%2F')}",
                         {"workerGroup": "bench", "workerId": "rtt", "tasks": 1})
    [claim] = claimed["tasks"]
    assert claim["status"]["taskId"] == resolved
    await call(http, "POST", f"{api}/task/{resolved}/runs/{claim['runId']}/completed")
    group = await create_task(http, api, queue)
    pending = await create_task(http, api, f"{queue}-pending")
    # What a call finishes after its answer (a tip's record, a waiting task's last read
    # of its dependencies and its trigger's delete) is over before the next call starts,
    # so that it is not counted among the next call's round trips.
    settle = max(0.02, b.proxy.delay * 2 * 4)
    for i in range(b.args.rtt_calls + 1):
        record = Timings() if i == 0 else t
        with Timed(b, record, "createTask, dependencies resolved"):
            await tasks.create(http, api, {**benchlib.definition(queue),
                                           "dependencies": [resolved]})
        await asyncio.sleep(settle)
        with Timed(b, record, "createTask, existing group"):
            await tasks.create(http, api, {**benchlib.definition(queue), "taskGroupId": group})
        await asyncio.sleep(settle)
        with Timed(b, record, "createTask, waiting for a dependency"):
            await tasks.create(http, api, {**benchlib.definition(queue),
                                           "dependencies": [pending]})
        await asyncio.sleep(settle)
        with Timed(b, record, "createTask, as taskgraph's"):
            await tasks.create(http, api, {**benchlib.definition(queue), "taskGroupId": pending,
                                           "dependencies": [pending]})
        await asyncio.sleep(settle)


async def rtt_hand_over(b: Bench, http: aiohttp.ClientSession, api: str, t: Timings) -> None:
    """A claimWork caller waits; createTask sent -> the caller answered with the task."""
    queue = f"bench/rtt{b.proxy.delay * 2000:g}-claimwork"
    settle = max(0.3, b.proxy.delay * 2 * 20)  # past its first look at the queues
    for i in range(b.args.rtt_calls + 1):
        record = Timings() if i == 0 else t
        waiting = asyncio.create_task(call(
            http, "POST", f"{api}/claim-work/{queue.replace('/', '%2F')}",
            {"workerGroup": "bench", "workerId": "rtt", "tasks": 1}))
        await asyncio.sleep(settle)
        with Timed(b, record, "created -> waiting claimWork has it"):
            task_id = await create_task(http, api, queue)
            [claim] = (await waiting)["tasks"]
        assert claim["status"]["taskId"] == task_id
        await call(http, "POST", f"{api}/task/{task_id}/runs/{claim['runId']}/completed")


async def rtt_celery(b: Bench, t: Timings) -> bool:
    """The Celery peer's enqueue, one task at a time; False without the peer."""
    noop = None if b.args.skip_celery else celery_peer(b)
    if noop is None:
        return False
    await asyncio.to_thread(noop.delay)  # its connection and queue
    for _ in range(b.args.rtt_calls):
        with Timed(b, t, "Celery enqueue", ("celery",)):
            await asyncio.to_thread(noop.delay)
    return True


async def phase_rtt(b: Bench) -> None:
    """Each call one at a time, then the 16-client figures, at each round trip of
    ``--rtt`` added to every storage request (the proxy holds every chunk back half of it
    each way: azqueue's and the Celery peer's alike)."""
    for rtt in b.args.rtt:
        print(f"\n== rtt: {rtt:g} ms added to every storage request ({rtt / 2:g} ms each way), "
              f"{b.args.rtt_calls} calls each one at a time, then {b.args.workers} clients, events "
              f"{'on' if b.args.rtt_events else 'off'} ==")
        b.proxy.delay, b.proxy.trips = rtt / 2000, []
        try:
            await rtt_round(b, rtt)
        finally:
            b.proxy.delay, b.proxy.trips = 0.0, None


async def rtt_round(b: Bench, rtt: float) -> None:
    t, peer = Timings(), Timings()
    events = {"AZQUEUE_AMQP_URL": b.args.amqp or DEFAULT_AMQP} if b.args.rtt_events else {}
    server = await b.start_server("server-rtt", **QUIET_RESOLVERS, **events)
    try:
        async with signed_session() as http:
            await rtt_lifecycles(b, http, server.api, t)
            await rtt_variants(b, http, server.api, t)
            await rtt_hand_over(b, http, server.api, t)
        celery = await rtt_celery(b, peer)
        await forget_resolved(b)
        created = await create_backlog(b, f"bench/rtt{rtt:g}", "createTask", server=server)
        drained = (await drain(b, "claim-work", f"bench/rtt{rtt:g}", [server.root_url])).rate
    finally:
        await b.stop_server("server-rtt", server)
    rates = await celery_round(b, f"celery-rtt{rtt:g}") if celery else None
    print_rtt(b, rtt, t, peer, created, drained, rates)


def print_rtt(b: Bench, rtt: float, t: Timings, peer: Timings, created: float, drained: float,
              rates: tuple[float, float] | None) -> None:
    s, key = b.summary, f"rtt{rtt:g}"
    enqueue = peer.ms.get("Celery enqueue")
    print(f"\n| call ({rtt:g} ms a round trip) | p50 ms | p99 ms | storage round trips one "
          "after another (median, max) | p50 / Celery enqueue p50 |\n"
          "| --- | ---: | ---: | ---: | ---: |")
    for what in (*CALLS, "Celery enqueue"):
        ms, trips = (peer if what == "Celery enqueue" else t).ms.get(what), \
            (peer if what == "Celery enqueue" else t).trips.get(what, [])
        if not ms:
            continue
        p50, p99 = percentile(ms, 50), percentile(ms, 99)
        s[f"{key} {what} p50"], s[f"{key} {what} p99"] = p50, p99
        s[f"{key} {what} trips"] = statistics.median(trips)
        ratio = f"{p50 / percentile(enqueue, 50):.2f}x" if enqueue else ""
        # Without a delay, requests sent together may be answered one after another.
        chained = f"{statistics.median(trips):g}, {max(trips)}" if rtt else "-"
        print(f"| {what} | {p50:.1f} | {p99:.1f} | {chained} | {ratio} |")
    print(f"\n| {b.args.workers} clients / workers ({rtt:g} ms) | azqueue | Celery | azqueue / "
          f"Celery |\n| --- | ---: | ---: | ---: |")
    for what, mine, theirs in (("createTask / enqueue, tasks/s", created, rates and rates[0]),
                               ("drain (claimWork), tasks/s", drained, rates and rates[1])):
        ratio = f"{mine / theirs:.2f}x" if theirs else ""
        print(f"| {what} | {mine:.1f} | {f'{theirs:.1f}' if theirs else '-'} | {ratio} |")
    s[f"{key} create rate"], s[f"{key} drain rate"] = created, drained
    if rates is not None:
        s[f"{key} create ratio"], s[f"{key} drain ratio"] = created / rates[0], drained / rates[1]
    if rtt:
        print("\nthe longest chain of each call (the storage requests it waited for one after "
              "another, the longest seen):")
        for chains in (t.chain, peer.chain):
            for what, chain in chains.items():
                print(f"  {what}: {chain or '(none)'}")


# -- phase: two replicas -------------------------------------------------------------------

async def phase_replicas(b: Bench) -> None:
    print(f"\n== replicas: claimWork drain, two `azqueue serve` on one storage, "
          f"{b.args.workers // 2} workers on each ==")
    if "claimwork rate" not in b.summary:
        await create_backlog(b, "bench/replicas1", "backlog, one replica", "claimwork")
        record_drain(b, "claimwork", await drain(b, "claim-work", "bench/replicas1",
                                                 [b.main.root_url]))
    second = await b.start_server("server2")
    try:
        await create_backlog(b, "bench/replicas", "backlog")
        d = await drain(b, "claim-work", "bench/replicas", [b.main.root_url, second.root_url])
    finally:
        await b.stop_server("server2", second)
    ratio = d.rate / b.summary["claimwork rate"]
    print(f"  two replicas / one: {ratio:.2f}x; Azurite {d.span.cores('azurite'):.2f} cores "
          f"(one replica: {b.summary['claimwork azurite cores']:.2f})")
    b.summary["replicas ratio"] = ratio
    b.summary["replicas azurite cores"] = d.span.cores("azurite")


# -- phase: idle cost ----------------------------------------------------------------------

async def phase_idle(b: Bench) -> None:
    w, seconds = b.args.workers, b.args.idle_seconds
    print(f"\n== idle: {w} workers per mode, no tasks, {seconds:.0f} s ==")
    for mode in ("sas", "claim-work"):
        workers = await WorkerProcess.start(b, mode, f"bench/idle-{mode}", [b.main.root_url], 0)
        try:
            await workers.send("go")
            await asyncio.sleep(3)  # past start-up (pollTaskUrls, first calls)
            before = b.mark()
            await asyncio.sleep(seconds)
            span = b.span(before, b.mark())
        finally:
            await workers.stop(b)
        per = (span.requests("server") + span.requests("workers")) / span.seconds / w
        print(f"  {mode}: {per:.2f} storage requests/s per idle worker (server "
              f"{span.requests('server') / span.seconds / w:.2f}, workers "
              f"{span.requests('workers') / span.seconds / w:.2f}); the resolvers' background "
              f"polls besides: {span.requests('resolvers') / span.seconds:.2f}/s; CPU cores: "
              f"{cpu_line(span, 'server', 'azurite', 'workers')}")
        b.summary[f"idle {mode}"] = per


# -- phase: at rest -------------------------------------------------------------------------

async def waiting_callers(http: aiohttp.ClientSession, api: str, queue: str, worker_id: str,
                          stop: asyncio.Event, claimed: dict[str, float]) -> None:
    """A claimWork caller that calls again as soon as it is answered, noting when each
    task it got was answered, and completing it."""
    url = f"{api}/claim-work/{queue.replace('/', '%2F')}"
    while not stop.is_set():
        body = await call(http, "POST", url, {"workerGroup": "bench", "workerId": worker_id,
                                               "tasks": 1})
        at = time.perf_counter()
        for claim in body["tasks"]:
            claimed[claim["status"]["taskId"]] = at
            await call(http, "POST", f"{api}/task/{claim['status']['taskId']}/runs/"
                                     f"{claim['runId']}/completed", {})


async def wake_rounds(http: aiohttp.ClientSession, creator: ServeProcess, waiter: ServeProcess,
                      queue: str, rounds: int) -> list[float]:
    """createTask answered on ``creator`` -> claimWork answered on ``waiter``, seconds, one
    task per round, rounds 2-4 s apart so that pollers settle between them."""
    stop = asyncio.Event()
    claimed: dict[str, float] = {}
    caller = asyncio.create_task(waiting_callers(http, waiter.api, queue, "wake", stop, claimed))
    out: list[float] = []
    try:
        await asyncio.sleep(4.0)  # the doorbell covers the queue (ears are read by then)
        for _ in range(rounds):
            await asyncio.sleep(2.0 + 2.0 * (len(out) % 3) / 2)
            task_id = await create_task(http, creator.api, queue)
            created = time.perf_counter()
            while task_id not in claimed:
                if time.perf_counter() > created + 60.0:
                    raise BenchError(f"task {task_id} reached no caller within 60 s")
                await asyncio.sleep(0.002)
            out.append(claimed[task_id] - created)
    finally:
        stop.set()
        caller.cancel()
        await asyncio.gather(caller, return_exceptions=True)
    return out


async def sas_wake_rounds(http: aiohttp.ClientSession, creator: ServeProcess, waiter: ServeProcess,
                          queue: str, rounds: int) -> list[float]:
    """createTask answered on ``creator`` -> pollTaskUrls?pending=true&wait=20 answered with a
    visible tip on ``waiter`` (how an idle SDK SAS worker waits), seconds."""
    provisioner, worker_type = queue.split("/")
    url = f"{waiter.api}/poll-task-url/{provisioner}/{worker_type}?pending=true&wait=20"
    out: list[float] = []
    await call(http, "GET", url.replace("&wait=20", ""))
    await asyncio.sleep(4.0)
    for _ in range(rounds):
        await asyncio.sleep(2.0 + 2.0 * (len(out) % 3) / 2)
        asking = asyncio.create_task(call(http, "GET", url))
        await asyncio.sleep(0.3)
        await create_task(http, creator.api, queue)
        created = time.perf_counter()
        answer = await asking
        while not any(answer["pending"]["queues"]):
            answer = await call(http, "GET", url)
        out.append(time.perf_counter() - created)
        urls = answer["queues"][6]["signedPollUrl"]
        for message in await get_messages(http, urls, 32):
            await claim_message(http, waiter.api, message)
    return out


async def phase_rest(b: Bench) -> None:
    """At rest, with events off and on: two replicas of their own (default resolvers),
    storage requests/s with nobody waiting and with claimWork callers waiting on
    ``--rest-queues`` task queues on each replica; then the wake-up of a caller waiting on
    one replica by a task created on the other, and on the same one."""
    amqp = b.args.amqp or DEFAULT_AMQP
    n, seconds, rounds = b.args.rest_queues, b.args.rest_seconds, b.args.wake_rounds
    print(f"\n== rest: two replicas, {n} task queues with a claimWork caller waiting on each "
          f"replica, {seconds:.0f} s per figure; wake-up over {rounds} rounds ==")
    await b.stop_server("server", b.main)
    b.server = None
    try:
        for mode in ("off", "on"):
            # A storage prefix of their own: the tasks of earlier phases, whose deadline
            # messages surface for the tip repair's look minutes after they were created,
            # are not theirs to handle while they rest.
            extra = {"AZQUEUE_STORAGE_PREFIX": f"rest{mode}{secrets.token_hex(3)}"}
            if mode == "on":
                extra |= {"AZQUEUE_AMQP_URL": amqp,
                          "AZQUEUE_EXCHANGE_PREFIX": f"bench-{secrets.token_hex(4)}/"}
            await rest_mode(b, mode, n, seconds, rounds, extra)
    finally:
        await restart_main(b)


async def rest_mode(b: Bench, mode: str, n: int, seconds: float, rounds: int,
                    extra: dict[str, str]) -> None:
    a = await b.start_server(f"rest-{mode}-a", **extra)
    z = await b.start_server(f"rest-{mode}-b", **extra)
    stop = asyncio.Event()
    callers: list[asyncio.Task[None]] = []
    try:
        async with signed_session(4 * n + 20) as http:
            await asyncio.sleep(5.0)  # past start-up
            before = b.mark()
            await asyncio.sleep(seconds)
            idle = b.span(before, b.mark())
            claimed: dict[str, float] = {}
            for i in range(n):
                for name, server in (("a", a), ("b", z)):
                    callers.append(asyncio.create_task(waiting_callers(
                        http, server.api, f"bench/rest{i}", f"{name}{i}", stop, claimed)))
            # Past the callers' first answers (AZQUEUE_CLAIM_WORK_WAIT, 20 s): each first
            # sight of a worker and a task queue is recorded once, then rarely.
            await asyncio.sleep(25.0)
            before = b.mark()
            await asyncio.sleep(seconds)
            busy = b.span(before, b.mark())
            cross = await wake_rounds(http, a, z, "bench/wake-cross", rounds)
            same = await wake_rounds(http, a, a, "bench/wake-same", rounds)
            sas_cross = await sas_wake_rounds(http, a, z, "bench/wake-sas", rounds)
    finally:
        stop.set()
        for c in callers:
            c.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        await b.stop_server(f"rest-{mode}-a", a)
        await b.stop_server(f"rest-{mode}-b", z)
    resting = idle.requests() / idle.seconds
    waiting = busy.requests() / busy.seconds
    per_queue = (waiting - resting) / n
    print(f"  events {mode}: {resting:.2f} storage requests/s with nobody waiting "
          f"({resting / 2:.2f} per replica), {waiting:.2f} with {n} task queues waiting: "
          f"{per_queue:.4f} per waiting task queue")
    print(f"    by kind, waiting: " + ", ".join(
        f"{h.service} {h.kind} {c / busy.seconds:.2f}/s"
        for h, c in busy.counts.most_common(6)))
    for label, values in (("another replica", cross), ("the same replica", same),
                          ("another replica, SAS pollTaskUrls?wait", sas_cross)):
        print(f"    wake-up, task created on {label}: p50 {percentile(values, 50):.3f} s, "
              f"max {max(values):.3f} s")
    s = b.summary
    s[f"rest {mode} idle per replica"] = resting / 2
    s[f"rest {mode} per queue"] = per_queue
    s[f"rest {mode} wake cross max"] = max(cross)
    s[f"rest {mode} wake same max"] = max(same)
    s[f"rest {mode} wake sas max"] = max(sas_cross)


# -- summary -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Goal:
    what: str
    target: str
    value: Callable[[dict[str, float]], float | None]
    met: Callable[[float], bool]
    unit: str = ""
    # Why a goal not met by the figure is met otherwise (None: it is not).
    excused: Callable[[dict[str, float]], str | None] = lambda s: None


def _get(*keys: str, combine: Callable[..., float] | None = None) -> Callable[
        [dict[str, float]], float | None]:
    def value(s: dict[str, float]) -> float | None:
        if not all(k in s for k in keys):
            return None
        return float(combine(*(s[k] for k in keys))) if combine else s[keys[0]]
    return value


def _second_trip(what: str) -> Callable[[dict[str, float]], str | None]:
    """Why ``what`` waits for two round trips at 10 ms, if it does and must."""
    def why(s: dict[str, float]) -> str | None:
        trips = s.get(f"rtt10 {what} trips")
        return f"{trips:g} round trips: {SECOND_TRIP[what]}" \
            if trips == 2 and what in SECOND_TRIP else None
    return why


GOALS = (
    Goal("server storage requests / lifecycle, SAS (steps)", "<= 8",
         _get("steps SAS server"), lambda v: v <= 8),
    Goal("server storage requests / lifecycle, claimWork (steps)", "<= 8",
         _get("steps claimWork server"), lambda v: v <= 8),
    Goal("server storage requests / lifecycle, SAS (createTask + drain)", "<= 8",
         _get("sas lifecycle requests"), lambda v: v <= 8),
    Goal("server storage requests / lifecycle, claimWork (createTask + drain)", "<= 8",
         _get("claimwork lifecycle requests"), lambda v: v <= 8),
    Goal("worker queue polls / lifecycle, SAS drain (backlog)", "<= 1",
         _get("sas worker polls"), lambda v: v <= 1),
    Goal("drain, 16 SAS workers", ">= 45 tasks/s", _get("sas rate"), lambda v: v >= 45, " tasks/s"),
    Goal("drain, 16 claimWork workers", ">= 45 tasks/s", _get("claimwork rate"), lambda v: v >= 45,
         " tasks/s"),
    Goal("SAS drain / Celery drain", ">= 0.8x",
         _get("sas rate", "celery drain", combine=lambda a, c: a / c), lambda v: v >= 0.8, "x"),
    Goal("claimWork drain / Celery drain", ">= 0.8x",
         _get("claimwork rate", "celery drain", combine=lambda a, c: a / c), lambda v: v >= 0.8,
         "x"),
    Goal("createTask / Celery enqueue", ">= 0.9x",
         _get("create", "celery enqueue", combine=lambda a, c: a / c), lambda v: v >= 0.9, "x"),
    Goal("createTask / Celery enqueue, rounds in turn (versus)", ">= 0.9x",
         _get("versus create ratio"), lambda v: v >= 0.9, "x"),
    Goal("claimWork drain / Celery drain, rounds in turn (versus)", ">= 0.8x",
         _get("versus drain ratio"), lambda v: v >= 0.8, "x"),
    Goal("server CPU / lifecycle, SAS (createTask + drain)", "<= 8 ms", _get("sas lifecycle cpu"),
         lambda v: v <= 8, " ms"),
    Goal("server CPU / lifecycle, claimWork (createTask + drain)", "<= 8 ms",
         _get("claimwork lifecycle cpu"), lambda v: v <= 8, " ms"),
    Goal("claimWork wake-up p50, 1 / 8 waiting", "<= 20 ms",
         _get("latency1 p50", "latency8 p50", combine=max), lambda v: v <= 20, " ms (worse)"),
    Goal("claimWork wake-up p99, 1 / 8 waiting", "<= 100 ms",
         _get("latency1 p99", "latency8 p99", combine=max), lambda v: v <= 100, " ms (worse)"),
    Goal("two replicas / one, claimWork drain", ">= 1.7x", _get("replicas ratio"),
         lambda v: v >= 1.7, "x"),
    Goal("events on: server storage requests / lifecycle (claimWork)", "<= 10",
         _get("events lifecycle requests"), lambda v: v <= 10),
    Goal("events on / off: createTask/s", ">= 0.8x", _get("events/off create rate"),
         lambda v: v >= 0.8, "x"),
    Goal("events on / off: claimWork drain", ">= 0.8x", _get("events/off rate"),
         lambda v: v >= 0.8, "x"),
    Goal("events on / off: server CPU / lifecycle", "<= 1.5x", _get("events/off lifecycle cpu"),
         lambda v: v <= 1.5, "x"),
    *(Goal(f"10 ms a round trip (rtt): {what} p50 / Celery enqueue p50", "<= 1.2x",
           _get(f"rtt10 {what} p50", "rtt10 Celery enqueue p50", combine=lambda a, c: a / c),
           lambda v: v <= 1.2, "x") for what in CREATES),
    *(Goal(f"10 ms a round trip (rtt): {what} p99", "<= 30 ms", _get(f"rtt10 {what} p99"),
           lambda v: v <= 30, " ms") for what in CREATES),
    Goal(f"10 ms a round trip (rtt): {HAND_OVER}, p50", "<= 40 ms",
         _get(f"rtt10 {HAND_OVER} p50"), lambda v: v <= 40, " ms"),
    *(Goal(f"10 ms a round trip (rtt): {what} p50", "<= 15 ms, or a second round trip "
           "that must be in line", _get(f"rtt10 {what} p50"), lambda v: v <= 15, " ms",
           _second_trip(what)) for what in IN_LINE),
    Goal("10 ms a round trip (rtt): createTask / Celery enqueue, 16 clients", ">= 1.2x",
         _get("rtt10 create ratio"), lambda v: v >= 1.2, "x"),
    Goal("10 ms a round trip (rtt): claimWork drain / Celery drain", ">= 3x",
         _get("rtt10 drain ratio"), lambda v: v >= 3, "x"),
    *(goal for mode, cross in (("off", 2.0), ("on", 0.5)) for goal in (
        Goal(f"at rest, events {mode}: storage requests/s per replica, nobody waiting", "<= 2",
             _get(f"rest {mode} idle per replica"), lambda v: v <= 2),
        Goal(f"at rest, events {mode}: added per waiting task queue (two replicas)", "<= 0.05",
             _get(f"rest {mode} per queue"), lambda v: v <= 0.05, " req/s"),
        Goal(f"wake-up, events {mode}: created on another replica, worst", f"<= {cross} s",
             _get(f"rest {mode} wake cross max"), lambda v, c=cross: v <= c, " s"),
        Goal(f"wake-up, events {mode}: SAS worker, created on another replica, worst",
             f"<= {cross} s", _get(f"rest {mode} wake sas max"), lambda v, c=cross: v <= c, " s"),
        Goal(f"wake-up, events {mode}: created on the same replica, worst", "<= 0.1 s",
             _get(f"rest {mode} wake same max"), lambda v: v <= 0.1, " s"))),
)

FIGURES = (
    ("celery enqueue", "tasks/s", "Celery: noop.delay() from 16 threads, broker connections open"),
    ("celery drain", "tasks/s", "Celery worker (16 threads): from ready to the last task done"),
    ("create", "tasks/s", "azqueue createTask, 16 concurrent Hawk-signed clients, priority lowest"),
    ("sas rate", "tasks/s", "16 SAS SDK workers: workers started -> all N reported completed"),
    ("claimwork rate", "tasks/s", "16 claimWork SDK workers: the same"),
    ("sas server requests", "requests", "server's storage requests per task drained (SAS)"),
    ("claimwork server requests", "requests", "the same, claimWork"),
    ("sas server cpu", "ms", "server CPU per task drained, createTask not included (SAS)"),
    ("claimwork server cpu", "ms", "the same, claimWork"),
    ("sas azurite cores", "cores", "Azurite's CPU during the SAS drain (1.0 = one core busy)"),
    ("claimwork azurite cores", "cores", "Azurite's CPU during the claimWork drain"),
    ("replicas azurite cores", "cores", "Azurite's CPU during the two-replica drain"),
    ("idle sas", "req/s", "storage requests/s per idle SAS worker (its polls + the server's)"),
    ("idle claim-work", "req/s", "storage requests/s per idle claimWork worker (the server's)"),
)


def print_summary(b: Bench) -> None:
    s = b.summary
    print("\n== summary (one run; this machine is shared and noisy: compare figures of one "
          "run, not across runs) ==")
    print("\n| goal | target | measured | met |\n| --- | --- | --- | --- |")
    excuses: list[str] = []
    for g in GOALS:
        v = g.value(s)
        if v is None:
            continue
        met, excuse = g.met(v), g.excused(s)
        if not met and excuse:
            excuses.append(f"{g.what}: {excuse}.")
        verdict = "yes" if met else f"in line ({len(excuses)})" if excuse else "NO"
        print(f"| {g.what} | {g.target} | {v:.2f}{g.unit} | {verdict} |")
    for n, excuse in enumerate(excuses, 1):
        print(f"\n({n}) {excuse}")
    figures = [(key, unit, meaning) for key, unit, meaning in FIGURES if key in s]
    if figures:
        print("\n| figure | value | what it means |\n| --- | --- | --- |")
    for key, unit, meaning in figures:
        print(f"| {key} | {s[key]:.2f} {unit} | {meaning} |")
    if benchlib.RETRIED_503:
        b.anomalies.append(f"{len(benchlib.RETRIED_503)} createTask calls were answered 503 "
                           f"(storage unavailable within the request's budget) and retried; "
                           f"the first: {benchlib.RETRIED_503[0]}")
    for anomaly in b.anomalies:
        print(f"\nWARNING: {anomaly}.")
    print("\nPer lifecycle: what the server spent (storage requests counted by the proxy in "
          "front of Azurite, signed with the account key; CPU: utime+stime of `azqueue serve`) "
          "while the backlog was created, plus while it was drained, each divided by N. "
          "Workers' requests are those signed with SAS.")


# -- main ----------------------------------------------------------------------------------

# The deadline trigger queues of the benchmark's servers (the default storage prefix):
# this release's and earlier releases'.
DEADLINE_QUEUES = ("azq-deadline-batches", "azq-deadline")
# The phases that start with no task of theirs yet (``sas`` drains the backlog ``create``
# made, whose deadline triggers it needs).
OWN_TASKS = ("steps", "celery", "create", "claimwork", "latency", "rtt", "replicas", "idle",
             "rest")


async def forget_resolved(b: Bench) -> None:
    """Delete the deadline triggers that earlier phases' tasks, all resolved, left: Azurite
    looks at every message of the account at each queue request (tips, the Celery peer's
    messages, anything), so a phase would otherwise be slower the later it runs, and the
    Celery peer, which runs early, would meet an emptier Azurite than the phases it is
    compared with. Straight to Azurite, not counted. A phase's own tasks keep theirs."""
    from azure.storage.queue.aio import QueueClient

    held = 0
    for name in DEADLINE_QUEUES:
        async with QueueClient.from_connection_string(b.azurite.connection_string,
                                                      name) as queue:
            try:
                held += (await queue.get_queue_properties()).approximate_message_count
                await queue.clear_messages()
            except ResourceNotFoundError:
                pass
    if held:
        print(f"  (deleted {held} deadline trigger messages of earlier phases' resolved tasks)")


RUNNERS: dict[str, Callable[[Bench], Awaitable[None]]] = {
    "steps": phase_steps, "celery": phase_celery, "create": phase_create, "sas": phase_sas,
    "claimwork": phase_claimwork, "versus": phase_versus, "latency": phase_latency,
    "rtt": phase_rtt, "replicas": phase_replicas,
    "idle": phase_idle, "events": phase_events, "rest": phase_rest}


async def main(args: argparse.Namespace) -> None:
    main_task = asyncio.current_task()
    assert main_task is not None
    # SIGTERM as Ctrl-C: cancel the run, so that the cleanup below stops every process it
    # started while the proxy still forwards their last requests.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    logs = Path(tempfile.mkdtemp(prefix="azqueue-bench-logs-"))
    print(f"azqueue benchmark: {args.tasks} tasks, {args.workers} workers, phases "
          f"{','.join(args.phases)}; Azurite on {args.azurite}; {os.cpu_count()} CPUs")
    keep_logs = args.keep_logs
    azurite = await Azurite.start(memory=args.azurite == "memory")
    proxy = FaultProxy(azurite.ports)
    b = Bench(args, azurite, proxy, logs)
    try:
        await proxy.start(("", "celery"))
        b.server = await b.start_server("server")
        for phase in args.phases:
            if phase in OWN_TASKS:
                await forget_resolved(b)
            await RUNNERS[phase](b)
        print_summary(b)
    except Exception:
        keep_logs = True
        raise
    finally:
        if b.server is not None:
            await b.stop_server("server", b.server)
        await proxy.stop()
        await azurite.stop()
        if keep_logs:
            print(f"logs of the servers, workers and Celery: {logs}")
        else:
            shutil.rmtree(logs, ignore_errors=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=400, help="backlog size N (default 400)")
    parser.add_argument("--workers", type=int, default=16, help="workers and clients (16)")
    parser.add_argument("--azurite", choices=("files", "memory"), default="files",
                        help="where Azurite keeps its data: files in a throwaway directory in "
                             "RAM (/dev/shm) where there is one, as `azqueue dev` runs it "
                             "(default), or Azurite's in-memory store, faster by a tenth to a "
                             "fifth but silent for seconds once a minute after thousands of "
                             "queue messages")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated subset of {','.join(PHASES)} (default: all)")
    parser.add_argument("--skip-celery", action="store_true", help="leave the Celery peer out")
    parser.add_argument("--step-tasks", type=int, default=30,
                        help="lifecycles of the per-step table (30)")
    parser.add_argument("--latency-tasks", type=int, default=50,
                        help="tasks per claimWork latency scenario (50)")
    parser.add_argument("--rtt", default="0,10", metavar="MS,...",
                        help="round trips added to every storage request in the rtt phase, "
                             "in ms, comma-separated (0,10; 30 as Azure at its slower)")
    parser.add_argument("--rtt-calls", type=int, default=40,
                        help="calls of each kind timed one at a time per round trip (rtt, 40)")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--rest-queues", type=int, default=20,
                        help="task queues with a caller waiting on each replica (rest, 20)")
    parser.add_argument("--rest-seconds", type=float, default=30.0,
                        help="seconds each at-rest figure is counted over (rest, 30)")
    parser.add_argument("--wake-rounds", type=int, default=12,
                        help="tasks of each wake-up figure, one at a time (rest, 12)")
    parser.add_argument("--rounds", type=int, default=4,
                        help="rounds of the versus and events phases, each the two sides "
                             "compared, which goes first taking turns (4)")
    parser.add_argument("--rtt-events", action="store_true",
                        help="run the rtt phase's server with events on (the broker of --amqp): "
                             "its calls then publish their events too")
    parser.add_argument("--amqp", default="", metavar="URL",
                        help="RabbitMQ URL for the phases with events on (steps, events; default "
                             "the local RabbitMQ as guest)")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds a drain may take before the run is abandoned")
    parser.add_argument("--stall", type=float, default=30.0,
                        help="seconds without a completion that end a drain short of N")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the servers', workers' and Celery's logs")
    args = parser.parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases {', '.join(sorted(unknown))}; choose from "
                     f"{', '.join(PHASES)}")
    args.phases = [p for p in PHASES if p in phases
                   and not (p in ("celery", "versus") and args.skip_celery)]
    try:
        args.rtt = [float(x) for x in args.rtt.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--rtt wants milliseconds separated by commas, such as 0,10,30, "
                     f"not {args.rtt!r}")
    if args.tasks < 2 or args.workers < 2:
        parser.error("--tasks and --workers must be at least 2")
    return args


if __name__ == "__main__":
    try:
        asyncio.run(main(parse_args()))
    except FAILURES as e:
        sys.exit(f"bench: {e}")
    except (KeyboardInterrupt, asyncio.CancelledError):
        sys.exit("bench: interrupted; every process it started is stopped")
