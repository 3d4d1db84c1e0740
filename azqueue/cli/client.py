"""``azqueue worker``, ``task …`` and ``queue list``: the command line of workers and
submitters (its arguments are parsed in ``azqueue.cli.parser``, its listings printed by
``azqueue.cli.listings``). Each command is run by the handler its table names
(``COMMANDS``, ``TASK_COMMANDS``): the parser offers exactly those.

All read the usual ``TASKCLUSTER_ROOT_URL``, ``TASKCLUSTER_CLIENT_ID``,
``TASKCLUSTER_ACCESS_TOKEN`` (or ``TASKCLUSTER_ACCESS_TOKEN_FILE``, a file holding it, so
that it is in no environment) and ``TASKCLUSTER_CERTIFICATE``, and use the official
client. A queue that cannot be reached, or a rootUrl that does not answer as a queue,
is one line naming the URL (exit status 1), never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import difflib
import getpass
import json
import logging
import os
import re
import socket
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import aiohttp
import slugid
import taskcluster
from taskcluster.exceptions import TaskclusterConnectionError, TaskclusterFailure

from azqueue.cli import follow, listings, terminal
from azqueue.cli.exitcodes import (ERROR, INTERRUPTED, OK, WAIT_EXIT_CODES, CommandError,
                                   unreachable)
from azqueue.model.task import RESOLVED_STATES
from azqueue.worker import client, shell
from azqueue.worker.client import Credentials
from azqueue.worker.errors import QueueRefused
from azqueue.worker.worker import Worker, WorkerConfig

WAIT_POLL = 1.0
# The official client retries a connection error or a 5xx this often (with backoff):
# enough for a hiccup, not so many that a wrong port keeps a user waiting.
CLI_RETRIES = 2


Command = TypeVar("Command")


def _root_url() -> str:
    root_url = os.environ.get("TASKCLUSTER_ROOT_URL", "").strip().rstrip("/")
    if not root_url:
        raise CommandError("set TASKCLUSTER_ROOT_URL (and TASKCLUSTER_CLIENT_ID, "
                           "TASKCLUSTER_ACCESS_TOKEN) as `azqueue dev` prints them")
    if "://" not in root_url:
        raise CommandError(f"TASKCLUSTER_ROOT_URL={root_url!r} is not a URL: write it with its "
                           f"scheme, e.g. http://{root_url}")
    if not re.match(r"https?://[^/]", root_url, re.IGNORECASE):
        raise CommandError(f"TASKCLUSTER_ROOT_URL={root_url!r} is not an http(s) URL: write it "
                           "as `azqueue dev` prints it, e.g. http://127.0.0.1:8080")
    return root_url


def run(args: argparse.Namespace) -> int:
    root_url = ""
    # The official client warns before each of its retries; the line said once they are
    # used up (or the worker's own, with its backoff) says it all.
    logging.getLogger("taskcluster").setLevel(logging.ERROR)
    try:
        root_url = _root_url()
        return _command(COMMANDS, "", args.command)(args, root_url)
    except CommandError as e:
        print(f"azqueue: {terminal.text(str(e))}", file=sys.stderr)
        return ERROR
    except TaskclusterFailure as e:
        print(f"azqueue: {terminal.text(explain(e, root_url))}", file=sys.stderr)
        return ERROR
    except KeyboardInterrupt:
        return INTERRUPTED


def explain(error: TaskclusterFailure, root_url: str) -> str:
    """One line about a failed call of the official client: the queue's own ``code:
    message``; or that nothing answers at ``root_url``; or that what answers is no queue."""
    if isinstance(error, TaskclusterConnectionError):
        cause = str(getattr(error, "superExc", None) or error)
        errno_text = re.search(r"\[Errno -?\d+\] [^'\")]+", cause)
        why = errno_text[0] if errno_text else (cause.strip()[:200] or "no answer")
        return (f"cannot reach the queue at {root_url} ({why}); check TASKCLUSTER_ROOT_URL "
                "and that the server runs")
    body = getattr(error, "body", None)
    status = client.status_of(error)
    if isinstance(body, dict) and body.get("code"):
        # The message's first line whole: a 403's names the scopes the call needs.
        lines = str(body.get("message", "")).strip().splitlines()
        text = f"{status} {body['code']}: {lines[0] if lines else ''}"
        if status in (401, 403) and not os.environ.get("TASKCLUSTER_CLIENT_ID"):
            text += (" (no credentials are set: set TASKCLUSTER_CLIENT_ID and "
                     "TASKCLUSTER_ACCESS_TOKEN, as `azqueue dev` prints them)")
        return text
    return (f"{root_url} answered {status or 'something unexpected'}, not as an azqueue "
            "(Taskcluster) queue does; TASKCLUSTER_ROOT_URL must be the rootUrl that "
            "`azqueue dev` prints, without /api/queue/v1")


def _credentials() -> Credentials | None:
    try:
        return Credentials.from_env()
    except ValueError as e:
        raise CommandError(str(e)) from None


def _queue(root_url: str) -> taskcluster.Queue:
    options: dict[str, Any] = {"rootUrl": root_url, "maxRetries": CLI_RETRIES}
    credentials = _credentials()
    if credentials is not None:
        options["credentials"] = credentials.as_options()
    return taskcluster.Queue(options)


# -- azqueue worker ------------------------------------------------------------------


async def _worker(args: argparse.Namespace, root_url: str) -> int:
    try:
        config = WorkerConfig(root_url=root_url, credentials=_credentials(),
                              task_queue_id=args.task_queue, worker_group=args.worker_group,
                              worker_id=args.worker_id, capacity=args.capacity, mode=args.mode,
                              reclaim_margin=args.reclaim_margin,
                              idle_sleep=args.idle_sleep, max_idle_sleep=args.max_idle_sleep,
                              priority_recheck=args.priority_recheck,
                              status_interval=args.status_interval,
                              log_interval=args.log_interval)
    except ValueError as e:
        raise CommandError(f"worker: {e}") from None
    await _check_queue(root_url)
    # The commands it runs are of the same user: keep them out of its /proc environment.
    shell.hide_environment()
    worker = Worker(config, shell.run_command)
    print(f"azqueue worker {args.worker_group}/{args.worker_id} on {args.task_queue} "
          f"({args.mode}, capacity {args.capacity}) at {root_url}", file=sys.stderr, flush=True)
    try:
        await worker.run_until_signalled()
    except QueueRefused as e:
        raise CommandError(f"worker: {e}") from None
    return OK


async def _check_queue(root_url: str) -> None:
    """CommandError unless ``root_url`` answers ``ping`` as a queue does."""
    url = f"{root_url}/api/queue/v1/ping"
    try:
        async with aiohttp.ClientSession() as session, session.get(
                url, timeout=aiohttp.ClientTimeout(total=30)) as r:
            body = await r.text()
    except (aiohttp.ClientError, TimeoutError) as e:
        raise unreachable(root_url, e) from None
    try:
        alive = r.status == 200 and "alive" in json.loads(body)
    except (ValueError, TypeError):
        alive = False
    if not alive:
        raise CommandError(f"{url} answered {r.status}, not as an azqueue (Taskcluster) "
                           "queue does; TASKCLUSTER_ROOT_URL must be the rootUrl that "
                           "`azqueue dev` prints, without /api/queue/v1")


def _worker_command(args: argparse.Namespace, root_url: str) -> int:
    if args.action == "list":
        return listings.print_listing(args, _queue(root_url))
    return asyncio.run(_worker(args, root_url))


def _queue_command(args: argparse.Namespace, root_url: str) -> int:
    return listings.print_listing(args, _queue(root_url))


def _task_command(args: argparse.Namespace, root_url: str) -> int:
    return _command(TASK_COMMANDS, "task ", args.task_command)(args, _queue(root_url))


# Each command this module runs (the parser's COMMAND, but the server's) and what runs it.
COMMANDS: dict[str, Callable[[argparse.Namespace, str], int]] = {
    "worker": _worker_command, "queue": _queue_command, "task": _task_command}


def _command(table: Mapping[str, Command], prefix: str, name: str | None) -> Command:
    """What runs the command ``name`` of ``table``; CommandError if it has none (the
    parser offers exactly the commands of the tables)."""
    if name is None or name not in table:
        raise CommandError(f"{prefix}{name}: no such command (`azqueue {prefix}--help` lists "
                           "them)")
    return table[name]


# -- azqueue task ... ----------------------------------------------------------------


def _create(args: argparse.Namespace, queue: taskcluster.Queue) -> int:
    task_id = slugid.nice()
    definition = task_definition(args)
    queue.createTask(task_id, definition)
    print(task_id, flush=True)
    if hint := _unattended(queue, definition["taskQueueId"]):
        print(f"azqueue: {hint}", file=sys.stderr)
    return OK


def _status(args: argparse.Namespace, queue: taskcluster.Queue) -> int:
    _print_status(queue.status(args.task_id)["status"], args.json)
    return OK


def _wait(args: argparse.Namespace, queue: taskcluster.Queue) -> int:
    return wait(queue, args.task_id, args.timeout, args.json)


def _log(args: argparse.Namespace, queue: taskcluster.Queue) -> int:
    if args.follow:
        try:
            return asyncio.run(follow.follow(queue, args.task_id, shell.LOG_ARTIFACT))
        except follow.LogUnavailable as e:
            raise CommandError(str(e)) from None
        except (aiohttp.ClientError, TimeoutError) as e:
            raise unreachable(queue.options["rootUrl"], e) from None
    url = (queue.buildSignedUrl if queue.options.get("credentials") else queue.buildUrl)(
        "getLatestArtifact", args.task_id, shell.LOG_ARTIFACT)
    if asyncio.run(_print_url(url, queue.options["rootUrl"])):
        return OK
    raise CommandError(f"task log: {_why_no_log(queue, args.task_id)}")


def _cancel(args: argparse.Namespace, queue: taskcluster.Queue) -> int:
    _print_status(queue.cancelTask(args.task_id)["status"], args.json)
    return OK


def _rerun(args: argparse.Namespace, queue: taskcluster.Queue) -> int:
    _print_status(queue.rerunTask(args.task_id)["status"], args.json)
    return OK


# Each `azqueue task` command (the parser's TASK_COMMAND) and what runs it.
TASK_COMMANDS: dict[str, Callable[[argparse.Namespace, taskcluster.Queue], int]] = {
    "create": _create, "status": _status, "wait": _wait, "log": _log, "cancel": _cancel,
    "rerun": _rerun, "list": listings.print_listing}


# At most this many pages of listTaskQueues are read for the names a typo may have meant.
MAX_NAME_PAGES = 5


def _unattended(queue: taskcluster.Queue, task_queue_id: str) -> str | None:
    """What to say when no worker has asked ``task_queue_id`` for work lately (a typo in
    its name leaves a task waiting forever): which known task queues it may have meant.
    None when a worker has, or when the queue does not offer the listings."""
    provisioner_id, worker_type = task_queue_id.split("/", 1)
    try:
        # listWorkers lists a worker until a day after it last asked for work.
        if any(page["workers"] for page in listings.pages(queue.listWorkers, provisioner_id,
                                                  worker_type)):
            return None
        known: list[str] = []
        for _, page in zip(range(MAX_NAME_PAGES), listings.pages(queue.listTaskQueues)):
            known += [q["taskQueueId"] for q in page["taskQueues"]]
    except TaskclusterFailure:
        return None
    meant = difflib.get_close_matches(task_queue_id, [k for k in known if k != task_queue_id],
                                      n=3, cutoff=0.7)
    return (f"no worker has asked {task_queue_id} for work in the last day: the task waits "
            "until one does (`azqueue worker --task-queue " + task_queue_id + "`)"
            + (f"; did you mean {' or '.join(meant)}?" if meant else ""))


def task_definition(args: argparse.Namespace) -> dict[str, Any]:
    """The task definition `task create` submits: ``--definition``'s, with a missing
    ``created``/``deadline``/``expires`` filled in; or one built from the options."""
    now = datetime.datetime.now(datetime.UTC)
    if args.definition is not None:
        written = _json_object(args.definition, "--definition", "a task definition")
        written.setdefault("created", _iso(now))
        written.setdefault("deadline", _iso(_at(now, args.deadline)))
        if args.expires is not None:
            written.setdefault("expires", _iso(_at(now, args.expires)))
        return written
    if args.payload is not None:
        payload = _json_object(args.payload, "--payload", "a payload")
    else:
        payload = {"command": args.cmd, "maxRunTime": args.max_run_time}
    if args.env:
        env = payload.setdefault("env", {})
        if not isinstance(env, dict):
            raise CommandError(f"task create: --env cannot be added to the payload of --payload "
                               f"{args.payload}: its \"env\" is not an object")
        env.update(pair.split("=", 1) for pair in args.env)
    who = _user_at_host()
    task: dict[str, Any] = {
        "taskQueueId": args.task_queue, "priority": args.priority, "retries": args.retries,
        "created": _iso(now), "deadline": _iso(_at(now, args.deadline)), "payload": payload,
        "metadata": {"name": args.name or (" ".join(args.cmd) or f"{args.task_queue} task")[:255],
                     "description": "created with `azqueue task create`",
                     "owner": args.owner or who,
                     "source": args.source or _source()}}
    if args.expires is not None:
        task["expires"] = _iso(_at(now, args.expires))
    if args.group:
        task["taskGroupId"] = args.group
    for key, values in (("dependencies", args.dependency), ("routes", args.route),
                        ("scopes", args.scope)):
        if values:
            task[key] = list(values)
    return task


def _json_object(source: str, option: str, what: str) -> dict[str, Any]:
    """The JSON object in file ``source`` (``-``: stdin), or CommandError saying why not."""
    try:
        if source == "-":
            text = sys.stdin.read()
        else:
            with open(source, encoding="utf-8") as f:
                text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise CommandError(f"task create: {option} {source}: cannot read it ({why})") from None
    try:
        value = json.loads(text)
    except ValueError as e:
        raise CommandError(f"task create: {option} {source} is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise CommandError(f"task create: {option} {source} is not a JSON object ({{...}}), as "
                           f"{what} is")
    return value


def _at(now: datetime.datetime, when: datetime.timedelta | datetime.datetime
        ) -> datetime.datetime:
    return now + when if isinstance(when, datetime.timedelta) else when


def _iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _user_at_host() -> str:
    """USER@HOSTNAME of whoever runs the command: who to ask about the task."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no USER variable and no passwd entry (a bare container)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def _source() -> str:
    """Where the task was defined: this host, in this directory, as an ``ssh://`` URL
    (Taskcluster's task metadata takes a ``source`` starting ``https://``, ``http://``,
    ``ssh://`` or ``git@``)."""
    try:
        where = os.getcwd()
    except OSError:
        where = "/"
    return f"ssh://{socket.gethostname()}{urllib.parse.quote(where)}"[:4096]


def describe(status: dict[str, Any]) -> str:
    runs = ", ".join(f"run {r['runId']} {r['state']}"
                     + (f" ({r['reasonResolved']})"
                        if r.get("reasonResolved") not in (None, r["state"]) else "")
                     + (f" on {r['workerGroup']}/{r['workerId']}"
                        if r.get("workerId") and r["state"] == "running" else "")
                     for r in status["runs"])
    return terminal.line(f"{status['taskId']} {status['state']}: {runs or 'no runs'}")


def _print_status(status: dict[str, Any], as_json: bool) -> None:
    print(json.dumps(status) if as_json else describe(status), flush=True)


def wait(queue: taskcluster.Queue, task_id: str, timeout: float | None, as_json: bool,
         clock: Callable[[], float] = time.monotonic) -> int:
    """Print a line whenever the task's status changes (elapsed seconds first), until it
    is resolved or ``timeout`` passes; the exit code of ``WAIT_EXIT_CODES``. With
    ``as_json`` the progress goes to stderr and the final status, as JSON, to stdout."""
    progress = sys.stderr if as_json else sys.stdout
    start = clock()
    last = ""
    while True:
        status = queue.status(task_id)["status"]
        elapsed = clock() - start
        line = describe(status)
        if line != last:
            print(f"[{elapsed:6.0f}s] {line}", file=progress, flush=True)
            last = line
        if status["state"] in RESOLVED_STATES:
            if as_json:
                print(json.dumps(status), flush=True)
            return WAIT_EXIT_CODES[status["state"]]
        if timeout is not None and elapsed + WAIT_POLL > timeout:
            print(f"[{elapsed:6.0f}s] {task_id} is still {status['state']} after "
                  f"--timeout {timeout:g}s", file=sys.stderr, flush=True)
            return WAIT_EXIT_CODES["timeout"]
        time.sleep(WAIT_POLL)


async def _print_url(url: str, root_url: str) -> bool:
    """Print what ``url`` answers; False if it answered 404 (nothing printed)."""
    try:
        async with aiohttp.ClientSession() as session, session.get(url) as r:
            if r.status == 404:
                return False
            if r.status != 200:
                raise CommandError(f"task log: reading the log answered "
                                   f"{client.error_answer(r.status, await r.text())}")
            log = terminal.LogText()
            async for chunk in r.content.iter_chunked(65536):
                sys.stdout.buffer.write(log.feed(chunk))
            sys.stdout.buffer.write(log.feed(b"", final=True))
            sys.stdout.buffer.flush()
    except (aiohttp.ClientError, TimeoutError) as e:
        raise unreachable(root_url, e) from None
    return True


def _why_no_log(queue: taskcluster.Queue, task_id: str) -> str:
    """Why the latest run of ``task_id`` has no log to print, and what to do about it."""
    try:
        status = queue.status(task_id)["status"]
    except TaskclusterFailure as e:
        if client.status_of(e) == 404:
            return (f"there is no task {task_id} (or it has expired); check the taskId, e.g. "
                    "with `azqueue task list --group TASK_GROUP_ID`")
        raise
    runs = status["runs"]
    follow_hint = f"`azqueue task log --follow {task_id}` waits for its log"
    if not runs or runs[-1]["state"] == "pending":
        return f"{task_id} is {status['state']}: no worker has run it yet; {follow_hint}"
    run = runs[-1]
    if run["state"] == "running":
        return (f"run {run['runId']} of {task_id} is running and has no {shell.LOG_ARTIFACT} "
                f"yet; {follow_hint}")
    reason = run.get("reasonResolved")
    return (f"run {run['runId']} of {task_id} is {run['state']}"
            + (f" ({reason})" if reason and reason != run["state"] else "")
            + f" and has no {shell.LOG_ARTIFACT}: its worker wrote none")
