"""``azqueue task list``, ``queue list`` and ``worker list``: a line per item (escaped for
a terminal, ``azqueue.cli.terminal``), or its JSON with ``--json``, read page after page
with the official client; ``task list --task-queue --state`` of resolved states reads the
server's recent changes (``/dashboard/recent``), which the client does not offer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import mohawk
import taskcluster
from taskcluster.exceptions import TaskclusterFailure

from azqueue.cli import terminal
from azqueue.cli.exitcodes import OK, CommandError, unreachable
from azqueue.model.task import RESOLVED_STATES
from azqueue.worker import client


def pages(call: Callable[..., dict[str, Any]], *args: str) -> Iterator[dict[str, Any]]:
    """Every page of a paginated call of the official client."""
    query: dict[str, str] = {}
    while True:
        page = call(*args, query=query)
        yield page
        token = page.get("continuationToken")
        if not token:
            return
        query = {"continuationToken": token}


def print_listing(args: argparse.Namespace, queue: taskcluster.Queue) -> int:
    """`task list`, `queue list`, `worker list`: a line per item, or its JSON (--json)."""
    try:
        return _listing(args, queue)
    except TaskclusterFailure as e:
        body = getattr(e, "body", None)
        message = str(body.get("message", "")) if isinstance(body, dict) else ""
        if client.status_of(e) == 501 or (client.status_of(e) == 404
                                          and message.startswith("no such API endpoint")):
            raise CommandError(f"the queue at {queue.options['rootUrl']} does not offer this "
                               f"listing ({message})") from None
        raise


def _recent(queue: taskcluster.Queue, task_queue_id: str) -> dict[str, Any]:
    """``GET /dashboard/recent?taskQueueId=``: the task queue's tasks the server heard of
    lately (not an API method of the official client: signed here as it signs)."""
    root_url = queue.options["rootUrl"]
    url = f"{root_url}/dashboard/recent?" + urllib.parse.urlencode(
        {"taskQueueId": task_queue_id}, safe="/")  # as aiohttp sends it: signed as sent
    headers = {}
    credentials = queue.options.get("credentials")
    if credentials:
        sender = mohawk.Sender({"id": credentials["clientId"], "key": credentials["accessToken"],
                                "algorithm": "sha256"}, url, "GET",
                               always_hash_content=False, ext=queue.makeHawkExt() or None)
        headers["Authorization"] = sender.request_header

    async def get() -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, session.get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as r:
            return r.status, await r.text()

    try:
        status, text = asyncio.run(get())
    except (aiohttp.ClientError, TimeoutError) as e:
        raise unreachable(root_url, e) from None
    if status != 200:
        raise CommandError(f"task list: the recent changes answered "
                           f"{client.error_answer(status, text)}")
    answer: dict[str, Any] = json.loads(text)
    return answer


def _listing(args: argparse.Namespace, queue: taskcluster.Queue) -> int:
    items: Iterator[dict[str, Any]]
    line: Callable[[dict[str, Any]], str]
    if args.command == "queue":
        items = (q for page in pages(queue.listTaskQueues) for q in page["taskQueues"])
        line = lambda q: f"{q['taskQueueId']}  last active {q.get('lastDateActive', '-')}"  # noqa: E731
    elif args.command == "worker":
        provisioner_id, worker_type = args.task_queue.split("/", 1)
        items = (w for page in pages(queue.listWorkers, provisioner_id, worker_type)
                 for w in page["workers"])
        line = lambda w: (f"{w['workerGroup']}/{w['workerId']}  first claim "  # noqa: E731
                          f"{w.get('firstClaim', '-')}  latest task "
                          f"{(w.get('latestTask') or {}).get('taskId', '-')}"
                          + (f"  quarantined until {w['quarantineUntil']}"
                             if w.get("quarantineUntil") else ""))
    elif args.group:
        items = (t for page in pages(queue.listTaskGroup, args.group) for t in page["tasks"])
        line = lambda t: (f"{t['status']['taskId']}  {t['status']['state']:<11} "  # noqa: E731
                          f"{t['task']['metadata']['name']}")
    elif args.state in (None, "pending"):
        items = (t for page in pages(queue.listPendingTasks, args.task_queue)
                 for t in page["tasks"])
        line = lambda t: (f"{t['taskId']}  run {t.get('runId', '-')}  pending since "  # noqa: E731
                          f"{t.get('inserted', '-')}  "
                          f"{(t.get('task') or {}).get('metadata', {}).get('name', '')}")
    elif args.state == "running":
        items = (t for page in pages(queue.listClaimedTasks, args.task_queue)
                 for t in page["tasks"])
        line = lambda t: (f"{t['taskId']}  run {t.get('runId', '-')}  running since "  # noqa: E731
                          f"{t.get('claimed') or '-'}  on {t['workerGroup']}/{t['workerId']}  "
                          f"{(t.get('task') or {}).get('metadata', {}).get('name', '')}")
    else:
        recent = _recent(queue, args.task_queue)
        print(f"azqueue: tasks {args.state} lately, {terminal.line(recent['note'])}",
              file=sys.stderr)
        items = iter([t for t in recent["tasks"] if t["state"] == args.state or (
            args.state == "resolved" and t["state"] in RESOLVED_STATES)])
        line = lambda t: (f"{t['taskId']}  {t['state']:<11} "  # noqa: E731
                          f"{t.get('resolved') or t['changed']}  {t['name']}")
    for item in items:
        print(json.dumps(item) if args.json else terminal.line(line(item)), flush=True)
    return OK
