"""``azqueue worker`` and ``azqueue task ...``: the command line of workers and submitters.

Both read the usual ``TASKCLUSTER_ROOT_URL``, ``TASKCLUSTER_CLIENT_ID``,
``TASKCLUSTER_ACCESS_TOKEN`` (and ``TASKCLUSTER_CERTIFICATE``) and use the official
client.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import re
import socket
import sys
import time
from typing import Any

import aiohttp
import slugid
import taskcluster
from taskcluster.exceptions import TaskclusterFailure

from azqueue.worker import shell
from azqueue.worker.client import Credentials
from azqueue.worker.worker import Worker, WorkerConfig

PRIORITIES = ["highest", "very-high", "high", "medium", "low", "very-low", "lowest", "normal"]


def _env_credentials() -> tuple[str, Credentials | None]:
    root_url = os.environ.get("TASKCLUSTER_ROOT_URL", "")
    if not root_url:
        raise SystemExit("azqueue: set TASKCLUSTER_ROOT_URL (and TASKCLUSTER_CLIENT_ID, "
                         "TASKCLUSTER_ACCESS_TOKEN) as `azqueue dev` prints them")
    client_id = os.environ.get("TASKCLUSTER_CLIENT_ID", "")
    token = os.environ.get("TASKCLUSTER_ACCESS_TOKEN", "")
    if not client_id or not token:
        return root_url, None
    return root_url, Credentials(client_id, token, os.environ.get("TASKCLUSTER_CERTIFICATE"))


def _default_worker_id() -> str:
    name = re.sub(r"[^a-zA-Z0-9_-]", "-", socket.gethostname())[:24] or "worker"
    return f"{name}-{os.getpid()}"[:38]


def add_parsers(sub: Any) -> None:
    worker = sub.add_parser("worker", help="run tasks whose payload is {command, env, maxRunTime}")
    worker.add_argument("--task-queue", required=True, metavar="P/W")
    worker.add_argument("--capacity", type=int, default=1)
    worker.add_argument("--mode", choices=["sas", "claim-work"], default="claim-work")
    worker.add_argument("--worker-group", default="azqueue")
    worker.add_argument("--worker-id", default=_default_worker_id())
    worker.add_argument("--reclaim-margin", type=float, default=60.0,
                        help="seconds before takenUntil to reclaim (default 60)")
    worker.add_argument("--idle-sleep", type=float, default=1.0,
                        help="sas mode: seconds slept after an empty polling pass, doubled "
                             "after each further one (default 1)")
    worker.add_argument("--max-idle-sleep", type=float, default=5.0,
                        help="sas mode: the longest sleep between empty polling passes "
                             "(default 5)")
    worker.add_argument("--priority-recheck", type=float, default=5.0,
                        help="sas mode: seconds after which a worker that keeps finding work "
                             "in one queue polls the higher-priority queues again (default 5)")

    task = sub.add_parser("task", help="create and follow tasks")
    tsub = task.add_subparsers(dest="task_command", required=True)
    create = tsub.add_parser("create", help="create a task running CMD; prints its taskId")
    create.add_argument("--task-queue", required=True, metavar="P/W")
    create.add_argument("--priority", choices=PRIORITIES, default="lowest")
    create.add_argument("--max-run-time", type=int, default=shell.DEFAULT_MAX_RUN_TIME)
    create.add_argument("--deadline", type=int, default=3600, help="seconds (default 3600)")
    create.add_argument("--retries", type=int, default=5)
    create.add_argument("--name", default="")
    create.add_argument("cmd", nargs="+", metavar="CMD")
    for name, text in (("status", "print the task's status"),
                       ("wait", "wait until the task is resolved; exit 0 if completed"),
                       ("log", "print the latest run's public/logs/live.log"),
                       ("cancel", "cancel the task: its current run is resolved exception canceled")):
        tsub.add_parser(name, help=text).add_argument("task_id")


def run(args: argparse.Namespace) -> int:
    if args.command == "worker":
        return asyncio.run(_worker(args))
    return _task(args)


async def _worker(args: argparse.Namespace) -> int:
    root_url, credentials = _env_credentials()
    try:
        config = WorkerConfig(root_url=root_url, credentials=credentials,
                              task_queue_id=args.task_queue, worker_group=args.worker_group,
                              worker_id=args.worker_id, capacity=args.capacity, mode=args.mode,
                              reclaim_margin=args.reclaim_margin,
                              idle_sleep=args.idle_sleep, max_idle_sleep=args.max_idle_sleep,
                              priority_recheck=args.priority_recheck)
    except ValueError as e:
        raise SystemExit(f"azqueue worker: {e}") from None
    worker = Worker(config, shell.run_command)
    print(f"azqueue worker {args.worker_group}/{args.worker_id} on {args.task_queue} "
          f"({args.mode}, capacity {args.capacity})", file=sys.stderr, flush=True)
    await worker.run_until_signalled()
    return 0


def _queue() -> taskcluster.Queue:
    root_url, credentials = _env_credentials()
    options: dict[str, Any] = {"rootUrl": root_url}
    if credentials is not None:
        options["credentials"] = credentials.as_options()
    return taskcluster.Queue(options)


def _task(args: argparse.Namespace) -> int:
    queue = _queue()
    try:
        if args.task_command == "create":
            now = datetime.datetime.now(datetime.UTC)
            task_id = slugid.nice()
            queue.createTask(task_id, {
                "taskQueueId": args.task_queue, "priority": args.priority,
                "retries": args.retries, "created": taskcluster.stringDate(now),
                "deadline": taskcluster.stringDate(now + datetime.timedelta(seconds=args.deadline)),
                "payload": {"command": args.cmd, "maxRunTime": args.max_run_time},
                "metadata": {"name": args.name or " ".join(args.cmd)[:255],
                             "description": "created with azqueue task create",
                             "owner": os.environ.get("USER", "someone") + "@localhost",
                             "source": "https://github.com/azqueue/azqueue"}})
            print(task_id)
            return 0
        if args.task_command == "status":
            status = queue.status(args.task_id)["status"]
            print(_describe(status))
            return 0
        if args.task_command == "wait":
            return _wait(queue, args.task_id)
        if args.task_command == "log":
            url = queue.buildSignedUrl("getLatestArtifact", args.task_id, shell.LOG_ARTIFACT) \
                if queue.options.get("credentials") else \
                queue.buildUrl("getLatestArtifact", args.task_id, shell.LOG_ARTIFACT)
            return asyncio.run(_print_url(url))
        status = queue.cancelTask(args.task_id)["status"]  # the last command: cancel
        print(_describe(status))
        return 0
    except TaskclusterFailure as e:
        print(f"azqueue: {e}", file=sys.stderr)
        return 1


def _describe(status: dict[str, Any]) -> str:
    runs = ", ".join(f"run {r['runId']} {r['state']}"
                     + (f" ({r['reasonResolved']})" if r.get("reasonResolved") else "")
                     for r in status["runs"])
    return f"{status['taskId']} {status['state']}: {runs or 'no runs'}"


def _wait(queue: taskcluster.Queue, task_id: str) -> int:
    last = ""
    while True:
        status = queue.status(task_id)["status"]
        line = _describe(status)
        if line != last:
            print(line, flush=True)
            last = line
        if status["state"] in ("completed", "failed", "exception"):
            return 0 if status["state"] == "completed" else 1
        time.sleep(1)


async def _print_url(url: str) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as r:
            if r.status != 200:
                print(f"azqueue: no log ({r.status}): {(await r.text())[:300]}", file=sys.stderr)
                return 1
            sys.stdout.write((await r.read()).decode(errors="replace"))
    return 0
