"""What the benchmark needs besides its phases and the client kit (``azqueue.testing``,
shared with the tests: Hawk-signed sessions, task definitions, a SAS worker's requests,
`azqueue serve` processes, the proxy in front of Azurite that counts requests by kind):
the servers' settings, and CPU times read from /proc.

Nothing here imports from `tests/` or from the service's internals: the benchmark sees
azqueue as a user does, through `azqueue serve`, its HTTP API and the worker SDK.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from azqueue.config import ConfigError
from azqueue.testing import hawk, sas, tasks
from azqueue.testing.processes import NotServing, ServeProcess
from azqueue.testing.sas import QueueMessage
from azqueue.testing.tasks import UnexpectedAnswer

ROOT_ID, ROOT_TOKEN = "root", "bench-root-access-token-0123456789"
TICK = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    """The benchmark cannot go on; the message says why."""


# What ends a benchmark with a message rather than a traceback: its own verdicts, a
# server or Azurite that did not come up.
FAILURES = (BenchError, NotServing, ConfigError)


# -- CPU time --------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads; not its children), from /proc; 0 once
    it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / TICK


# -- azqueue serve ---------------------------------------------------------------------

QUIET_RESOLVERS = {
    "AZQUEUE_CLAIM_RESOLVER_INTERVAL": "3600",
    "AZQUEUE_DEADLINE_RESOLVER_INTERVAL": "3600",
    "AZQUEUE_DEPENDENCY_RESOLVER_INTERVAL": "3600",
    "AZQUEUE_EVENTS_RESOLVER_INTERVAL": "3600",
    "AZQUEUE_EXPIRY_INTERVAL": "3600",
    "AZQUEUE_GROUP_RESOLVER_INTERVAL": "3600",
}
TIP_SECRET = secrets.token_hex(24)


async def start_server(connection_string: str, log: Path, source: Path | None = None,
                       **settings: str) -> ServeProcess:
    """``azqueue serve`` on a free port, events off, root client ROOT_ID/ROOT_TOKEN, its
    output appended to ``log``; extra AZQUEUE_* settings in ``settings``; with ``source``,
    the ``azqueue`` package of that source tree (another revision) serves. Returns once it
    answers ping."""
    return await ServeProcess.start({
        "AZQUEUE_STORAGE_CONNECTION_STRING": connection_string,
        "AZQUEUE_TIP_SECRETS": TIP_SECRET, "AZQUEUE_ROOT_CLIENT_ID": ROOT_ID,
        "AZQUEUE_ROOT_ACCESS_TOKEN": ROOT_TOKEN,
        "AZQUEUE_LOG_LEVEL": os.environ.get("BENCH_SERVER_LOG_LEVEL", "WARNING"), **settings},
        log=log, source=source)


# -- the queue API over plain aiohttp --------------------------------------------------

@asynccontextmanager
async def signed_session(connections: int = 100) -> AsyncIterator[aiohttp.ClientSession]:
    """A session signing as the servers' root client."""
    async with hawk.signed_session(ROOT_ID, ROOT_TOKEN, connections) as http:
        yield http


def definition(task_queue_id: str, priority: str | None = None) -> dict[str, Any]:
    """A task with a no-op payload, an hour's deadline, at ``priority`` (default: none
    given, so the queue's default, ``lowest``)."""
    return tasks.definition(task_queue_id, priority=priority, payload={})


# The 503 answers createTask retried, as the official client retries 5xx: each a line for
# the benchmark's anomalies.
RETRIED_503: list[str] = []
CREATE_ATTEMPTS = 5


async def create_task(http: aiohttp.ClientSession, api: str, task_queue_id: str) -> str:
    """Create a task; a 503 (storage unavailable) is retried after its Retry-After, as a
    client should, and noted in ``RETRIED_503``."""
    return await tasks.create(http, api, definition(task_queue_id), attempts=CREATE_ATTEMPTS,
                              busy=RETRIED_503)


async def claim_message(http: aiohttp.ClientSession, api: str, message: QueueMessage,
                        worker_id: str = "w0") -> dict[str, Any]:
    """claimTask with a polled message; its answer, which must be 200."""
    code, body = await sas.claim(http, api, message, worker_id, worker_group="bench")
    if code != 200:
        raise UnexpectedAnswer(f"claimTask answered {code}: {body}")
    return body
