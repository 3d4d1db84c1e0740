"""What the benchmark needs besides its phases and the client kit (``azqueue.testing``,
shared with the tests: Hawk-signed sessions, task definitions, a SAS worker's requests,
processes waited for and stopped): a counting proxy in front of Azurite, `azqueue serve`
processes, and CPU times read from /proc.

Nothing here imports from `tests/` or from the service's internals: the benchmark sees
azqueue as a user does, through `azqueue serve`, its HTTP API and the worker SDK.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

import aiohttp

from azqueue.config import ConfigError
from azqueue.devstorage import ACCOUNT, KEY, Azurite, free_port
from azqueue.testing import hawk, sas, tasks
from azqueue.testing.processes import NotServing, stop_process, until_serving
from azqueue.testing.sas import QueueMessage
from azqueue.testing.tasks import UnexpectedAnswer

# The `azqueue` of the environment running the benchmark (.venv/bin/python: .venv/bin/azqueue).
AZQUEUE = Path(sys.executable).parent / "azqueue"
ROOT_ID, ROOT_TOKEN = "root", "bench-root-access-token-0123456789"
SERVICES = ("blob", "queue", "table")
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


# -- the counting proxy ------------------------------------------------------------------

def request_kind(service: str, method: str, path: str, query: str) -> str:
    """What an Azure Storage request does, from its method and URL (path without the
    account), e.g. ``GET messages``, ``PUT message (update)``, ``POST $batch``."""
    params = {k.lower(): v for k, v in parse_qs(query, keep_blank_values=True).items()}
    comp = params.get("comp", [""])[0]
    parts = [p for p in path.split("/") if p]
    if service == "queue":
        if not parts:
            return f"{method} service ({comp or 'properties'})"
        if len(parts) == 1:
            return f"{method} queue{f' ({comp})' if comp else ''}"
        if len(parts) == 2:  # <queue>/messages
            if method == "GET":
                return "GET messages (peek)" if "peekonly" in params else "GET messages"
            return {"POST": "POST message", "DELETE": "DELETE messages (clear)"}.get(
                method, f"{method} messages")
        return {"PUT": "PUT message (update)", "DELETE": "DELETE message"}.get(
            method, f"{method} message")
    if service == "table":
        if not parts:
            return f"{method} service"
        name = unquote(parts[0])
        if name == "$batch":
            return "POST $batch"
        if name.startswith("Tables"):
            return f"{method} Tables"
        keyed = "PartitionKey=" in name and "RowKey=" in name
        if method == "GET":
            return "GET entity" if keyed else "GET query"
        return f"{method} entity"
    return f"{method} {'container' if len(parts) <= 1 else 'blob'}{f' ({comp})' if comp else ''}"


@dataclass(frozen=True, slots=True)
class Hit:
    client: str  # server (SharedKey), workers (SAS sig=), celery (its own ports), other
    service: str
    kind: str


# The background resolvers' periodic reads (deadline, dependency and event triggers, the
# scan of the claim index, the doorbell table with events off): a cost per replica and
# second, not per task.
BACKGROUND = re.compile(r"^/[^/]+/[a-z0-9]+-(deadline|dependencies|events|events-leases)"
                        r"/messages\?"
                        r"|^/[^/]+/[a-z0-9]+(claims|doorbell)\(\)")


def classify(label: str, head: bytes) -> tuple[str, str, str]:
    """(client, method, target) of one request head."""
    lines = head.decode("latin-1").split("\r\n")
    method, target = (lines[0].split(" ") + ["", ""])[:2]
    if label:
        return label, method, target
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "authorization" and value.strip().startswith("SharedKey"):
            if method == "GET" and BACKGROUND.search(target):
                return "resolvers", method, target
            return "server", method, target
    return ("workers" if "sig=" in target else "other"), method, target


# Azurite closes a connection idle for 5 s (Node's keep-alive timeout); a request sent
# just then is lost. The proxy closes its own connection to Azurite once it has been idle
# (answered, and nothing since) this many seconds, and opens a new one for the next
# request, so that race never happens on its side while clients keep their connections.
UPSTREAM_IDLE = 3.0


class _Upstream(asyncio.Protocol):
    """Azurite's side of one proxied connection: bytes go back unchanged."""

    def __init__(self, owner: _Downstream) -> None:
        self.owner = owner
        self.retired = False

    def data_received(self, data: bytes) -> None:
        self.owner.last = self.owner.answered = time.monotonic()
        if self.owner.transport is not None:
            self.owner.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.retired and self.owner.transport is not None:
            self.owner.transport.close()


class _Downstream(asyncio.Protocol):
    """A client's connection to the proxy, piped byte for byte to a connection of its own
    to Azurite; request heads are parsed on the way, only to be counted (HTTP/1.1 with
    Content-Length or chunked bodies, as the Azure SDKs and aiohttp send them)."""

    def __init__(self, proxy: CountingProxy, service: str, label: str) -> None:
        self.proxy, self.service, self.label = proxy, service, label
        self.transport: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.upstream_protocol: _Upstream | None = None
        self.connecting = False
        self.pending: list[bytes] = []
        self.buffer = bytearray()
        self.body_left = 0
        self.chunked = False
        self.last = self.sent = self.answered = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connected(self, upstream: asyncio.Transport, protocol: _Upstream) -> None:
        self.connecting = False
        if self.transport is None or self.transport.is_closing():
            upstream.close()
            return
        self.upstream, self.upstream_protocol = upstream, protocol
        for data in self.pending:
            upstream.write(data)
        self.pending.clear()
        self._arm(UPSTREAM_IDLE)

    def _arm(self, seconds: float) -> None:
        self.timer = asyncio.get_running_loop().call_later(seconds, self._idle)

    def _idle(self) -> None:
        quiet = time.monotonic() - self.last
        if quiet < UPSTREAM_IDLE or self.answered < self.sent:  # quiet, or still waiting
            self._arm(max(UPSTREAM_IDLE - quiet, 0.5))
            return
        self.timer = None
        if self.upstream is not None and self.upstream_protocol is not None:
            self.upstream_protocol.retired = True
            self.upstream.close()
            self.upstream = self.upstream_protocol = None

    def data_received(self, data: bytes) -> None:
        self.last = self.sent = time.monotonic()
        if self.upstream is not None:
            self.upstream.write(data)
        else:
            self.pending.append(data)
            if not self.connecting:
                self.connecting = True
                self.proxy.connect(self)
        self.buffer += data
        self._parse()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.timer is not None:
            self.timer.cancel()
        if self.upstream is not None:
            self.upstream.close()

    def _parse(self) -> None:
        buf = self.buffer
        while buf:
            if self.body_left:
                taken = min(self.body_left, len(buf))
                del buf[:taken]
                self.body_left -= taken
                continue
            if self.chunked:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buf[:end]).split(b";")[0] or b"0", 16)
                del buf[:end + 2]
                if size == 0:
                    self.chunked = False
                    self.body_left = 2  # the empty trailer's CRLF
                else:
                    self.body_left = size + 2
                continue
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end])
            del buf[:end + 4]
            client, method, target = classify(self.label, head)
            path, _, query = target.partition("?")
            inner = path[len(ACCOUNT) + 1:] if path.startswith(f"/{ACCOUNT}") else path
            self.proxy.counts[Hit(client, self.service,
                                  request_kind(self.service, method, inner, query))] += 1
            lowered = head.lower()
            if b"\r\ntransfer-encoding: chunked" in lowered:
                self.chunked = True
            else:
                at = lowered.find(b"\r\ncontent-length:")
                if at >= 0:
                    line_end = lowered.find(b"\r\n", at + 2)
                    self.body_left = int(lowered[at + 17:line_end if line_end > 0 else None])


@dataclass
class CountingProxy:
    """One listening port per Azure service (and per labelled client) piping connections
    to Azurite; every request is counted by client, service and kind. It parses request
    heads and nothing else, so it costs little CPU and adds little latency."""

    azurite: Azurite
    counts: Counter[Hit] = field(default_factory=Counter)
    ports: dict[tuple[str, str], int] = field(default_factory=dict)
    _servers: list[asyncio.Server] = field(default_factory=list)
    _connecting: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self, labels: tuple[str, ...] = ("",)) -> None:
        """Listen for each service; a non-empty label marks every request on those ports
        as coming from that client (the Celery peer gets ports of its own)."""
        loop = asyncio.get_running_loop()
        for label in labels:
            for service in SERVICES:
                server = await loop.create_server(self._factory(service, label), "127.0.0.1", 0,
                                                  backlog=1024)
                self._servers.append(server)
                self.ports[(label, service)] = server.sockets[0].getsockname()[1]

    def _factory(self, service: str, label: str) -> Callable[[], _Downstream]:
        return lambda: _Downstream(self, service, label)

    def connect(self, downstream: _Downstream) -> None:
        async def connect() -> None:
            try:
                upstream, protocol = await asyncio.get_running_loop().create_connection(
                    lambda: _Upstream(downstream), "127.0.0.1",
                    self.azurite.ports[downstream.service])
            except OSError:
                downstream.connecting = False
                if downstream.transport is not None:
                    downstream.transport.close()
                return
            downstream.connected(upstream, protocol)

        task = asyncio.ensure_future(connect())
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._connecting):
            task.cancel()

    def endpoint(self, service: str, label: str = "") -> str:
        return f"http://127.0.0.1:{self.ports[(label, service)]}/{ACCOUNT}"

    def connection_string(self, label: str = "") -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                + "".join(f"{s.capitalize()}Endpoint={self.endpoint(s, label)};"
                          for s in SERVICES))

    def snapshot(self) -> Counter[Hit]:
        return Counter(self.counts)


# -- azqueue serve ---------------------------------------------------------------------

QUIET_RESOLVERS = {
    "AZQUEUE_CLAIM_RESOLVER_INTERVAL": "3600",
    "AZQUEUE_DEADLINE_RESOLVER_INTERVAL": "3600",
    "AZQUEUE_DEPENDENCY_RESOLVER_INTERVAL": "3600",
    "AZQUEUE_EVENTS_RESOLVER_INTERVAL": "3600",
    "AZQUEUE_EXPIRY_INTERVAL": "3600",
    "AZQUEUE_GROUP_RESOLVER_INTERVAL": "3600",
}


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api(self) -> str:
        return f"{self.root_url}/api/queue/v1"

    def cpu(self) -> float:
        return cpu_seconds(self.process.pid)

    async def stop(self) -> None:
        await stop_process(self.process)


TIP_SECRET = secrets.token_hex(24)


async def start_server(connection_string: str, log: Path, **settings: str) -> Server:
    """``azqueue serve`` on a free port, events off, root client ROOT_ID/ROOT_TOKEN; extra
    AZQUEUE_* settings in ``settings``. Returns once it answers ping."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZQUEUE_")}
    env.update({"AZQUEUE_STORAGE_CONNECTION_STRING": connection_string,
                "AZQUEUE_TIP_SECRETS": TIP_SECRET, "AZQUEUE_ROOT_CLIENT_ID": ROOT_ID,
                "AZQUEUE_ROOT_ACCESS_TOKEN": ROOT_TOKEN, "AZQUEUE_PORT": str(port),
                "AZQUEUE_LOG_LEVEL": os.environ.get("BENCH_SERVER_LOG_LEVEL", "WARNING"), **settings})
    with open(log, "ab") as out:
        process = subprocess.Popen([str(AZQUEUE), "serve"], env=env,
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                   start_new_session=True)
    server = Server(process, port)
    try:
        async with aiohttp.ClientSession() as http:
            await until_serving(http, server.api, 60.0, process=process)
    except BaseException:
        await server.stop()
        raise
    return server


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
