"""A proxy in front of Azure Storage (Azurite) that counts every request and injects
Azure's own failures.

It pipes each client connection, byte for byte, to a connection of its own to Azurite,
and reads nothing but request heads on the way (HTTP/1.1 with Content-Length or chunked
bodies, one request at a time on a connection, as the Azure SDKs and aiohttp send them),
so it costs little CPU and adds little latency: the benchmarks count through it too.
Every request is counted in ``requests`` by client, service and kind
(``requestkinds.Hit``).

Real storage accounts answer ``503 ServerBusy`` when throttled, and sometimes apply a
write and then fail to answer it (``500 OperationTimedOut``, or a dropped connection).
The proxy does both, at rates you choose, for every request that passes through it (the
server's, and a SAS worker's through the URLs the server hands out):

* ``busy``: the share of requests answered ``503 ServerBusy`` instead of being forwarded
  (nothing applied), with Azure's headers and body (JSON for Tables, XML for Queues and
  Blobs);
* ``lost``: the share of writes (anything but a read; receiving queue messages counts as
  a write: it hides them and hands out receipts) that are forwarded and applied, whose
  answer is then replaced by ``500 OperationTimedOut`` or, for ``drop_share`` of them,
  by a connection closed without an answer.

Requests are forwarded as they came, so Shared Key and SAS signatures hold. Use::

    proxy = FaultProxy(azurite.ports, Faults(busy=0.03, lost=0.02))
    await proxy.start()
    connection_string = proxy.connection_string()
    ...
    await proxy.stop()

To measure at a real account's latency, ``delay`` (seconds, 0 by default) holds every
chunk back that long on its way to Azurite and again on its way back, so each request
takes twice that more; ``trips``, when a list, gets a ``Trip`` for every request
answered (who sent it, when it came and when its answer went back), from which
``round_trips`` tells which requests of a call ran one after another.

``faults`` may be replaced while it runs (``proxy.faults = Faults()``); ``once`` injects
one fault into the next request that matches, whatever the rates; ``hold`` keeps the
next request that matches until the caller lets it through; ``counts`` says what was
done to how many requests (and how many took Azurite itself more than ``SLOW`` seconds
to answer); ``slow`` lists those, each with when it came and how long the storage behind
took, to match with what the clients saw.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qsl, unquote

from azqueue.devstorage import ACCOUNT, KEY
from azqueue.testing.requestkinds import SERVICES, Hit, classify, request_kind

# How long a "stalled" request waits before it is forwarded.
STALL = 1.0
# An answer of the storage behind that takes longer is counted as "slow upstream".
SLOW = 1.0
# Azurite closes a connection idle for 5 s (Node's keep-alive timeout); a request sent
# just then is lost. The proxy closes its own connection to Azurite once it has been idle
# (answered, and nothing since) this many seconds, and opens a new one for the next
# request, so that race never happens on its side while clients keep their connections.
UPSTREAM_IDLE = 3.0
FAULTS = ("busy", "timed out", "dropped", "refused", "stalled", "being deleted")
_MESSAGES = {
    "ServerBusy": "Operations per second is over the account limit.",
    "OperationTimedOut": "Operation could not be completed within the specified time.",
    "AuthenticationFailed": "Server failed to authenticate the request.",
    "QueueBeingDeleted": "The specified queue is being deleted.",
}
_REASONS = {503: "The server is busy.",
            500: "Operation could not be completed within the specified time.",
            403: "Server failed to authenticate the request.",
            409: "The specified queue is being deleted."}


class Held:
    """A request kept by the proxy (``FaultProxy.hold``): ``reached`` is set when it
    arrives; it is forwarded, and answered as usual, once ``release()`` is called."""

    def __init__(self, method: str, path_contains: str) -> None:
        self.method = method
        self.path_contains = path_contains
        self.reached = asyncio.Event()
        self._released = asyncio.Event()

    def release(self) -> None:
        self._released.set()

    async def until_released(self) -> None:
        self.reached.set()
        await self._released.wait()


@dataclass(frozen=True, slots=True)
class Trip:
    """One request forwarded and answered: ``sent`` when its head came, ``answered`` when
    its answer's first bytes went back to the client (``time.monotonic()``)."""

    hit: Hit
    sent: float
    answered: float


def round_trips(trips: list[Trip], since: float, until: float,
                clients: tuple[str, ...] = ("server", "workers")) -> list[Trip]:
    """The longest chain of ``clients``' requests sent at or after ``since`` and answered
    by ``until`` in which each was sent only once the one before was answered: the
    storage round trips a call between those moments waited for, one after another."""
    chosen = sorted((t for t in trips if t.hit.client in clients and since <= t.sent
                     and t.answered <= until), key=lambda t: t.sent)
    chains: list[list[Trip]] = []
    for i, trip in enumerate(chosen):
        before = max((chains[j] for j in range(i) if chosen[j].answered <= trip.sent),
                     key=len, default=[])
        chains.append([*before, trip])
    return max(chains, key=len, default=[])


class _Delayed:
    """Bytes written ``delay`` seconds after they were given, in the order given."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self.write = write
        self.items: deque[tuple[float, bytes]] = deque()
        self.timer: asyncio.TimerHandle | None = None
        self.then: Callable[[], None] | None = None  # once all is written

    def push(self, data: bytes, delay: float) -> None:
        if delay <= 0 and not self.items:
            self.write(data)
            return
        loop = asyncio.get_running_loop()
        self.items.append((loop.time() + delay, data))
        if self.timer is None:
            self.timer = loop.call_at(self.items[0][0], self._due)

    def _due(self) -> None:
        self.timer = None
        loop = asyncio.get_running_loop()
        while self.items and self.items[0][0] <= loop.time():
            self.write(self.items.popleft()[1])
        if self.items:
            self.timer = loop.call_at(self.items[0][0], self._due)
        elif self.then is not None:
            then, self.then = self.then, None
            then()

    def after(self, then: Callable[[], None]) -> None:
        """Call ``then`` once everything given is written (now, if it is)."""
        if self.items:
            self.then = then
        else:
            then()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.items.clear()


@dataclass(frozen=True, slots=True)
class Faults:
    """What to inject: shares between 0 and 1 (see the module docstring)."""

    busy: float = 0.0
    lost: float = 0.0
    drop_share: float = 0.5


def is_write(method: str, path: str, query: Mapping[str, str]) -> bool:
    """Whether a request changes state: any method but GET and HEAD, and receiving queue
    messages (a GET of ``<queue>/messages`` that is not a peek)."""
    if method not in ("GET", "HEAD"):
        return True
    return path.rstrip("/").endswith("/messages") and \
        query.get("peekonly", "").lower() != "true"


def azure_error(service: str, status: int, code: str) -> bytes:
    """An error answer (status line, headers and body) shaped as Azure Storage shapes it."""
    request_id = str(uuid.uuid4())
    date = formatdate(usegmt=True)
    message = f"{_MESSAGES.get(code, code)}\nRequestId:{request_id}\nTime:{date}"
    if service == "table":
        body = json.dumps({"odata.error": {"code": code, "message": {
            "lang": "en-US", "value": message}}}).encode()
        content_type = "application/json; charset=utf-8"
    else:
        body = (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code>'
                f"<Message>{message}</Message></Error>").encode()
        content_type = "application/xml; charset=utf-8"
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, code)}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            f"x-ms-error-code: {code}\r\nx-ms-request-id: {request_id}\r\n"
            f"x-ms-version: 2021-12-02\r\nDate: {date}\r\n\r\n")
    return head.encode("latin-1") + body


@dataclass(slots=True)
class _Fate:
    """What the proxy does with one request: answer it itself (``answer``), or forward it
    after ``wait`` (a hold, a stall) and, if ``lost``, replace Azurite's answer."""

    answer: bytes = b""
    lost: str = ""  # "timed out" or "dropped"
    held: Held | None = None
    stall: bool = False


class _Upstream(asyncio.Protocol):
    """Azurite's side of one proxied connection."""

    def __init__(self, owner: _Downstream) -> None:
        self.owner = owner
        self.retired = False

    def data_received(self, data: bytes) -> None:
        if not self.retired:
            self.owner.answered(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.retired:
            self.owner.close()


class _Downstream(asyncio.Protocol):
    """A client's connection to the proxy, piped to a connection of its own to Azurite."""

    def __init__(self, proxy: FaultProxy, service: str, label: str) -> None:
        self.proxy, self.service, self.label = proxy, service, label
        self.transport: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.upstream_protocol: _Upstream | None = None
        self.connecting = False
        self.pending: list[bytes] = []
        self.buffer = bytearray()
        self.body_left = 0
        self.chunked = False
        self.forwarding = True  # the current request's bytes go to Azurite
        self.answer = b""  # what the proxy answers once the current request is whole
        self.paused: bytes | None = None  # the head of a request held back
        self.lost = ""
        self.waiting: tuple[float, str] | None = None  # since when, and what
        self.hit: Hit | None = None
        self.last = self.sent = self.replied = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None
        self.outward = _Delayed(self._send_now)  # towards Azurite
        self.back = _Delayed(self._reply_now)  # towards the client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.proxy.open.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.proxy.open.discard(self)
        if self.timer is not None:
            self.timer.cancel()
        self.outward.cancel()
        self.back.cancel()
        if self.upstream is not None:
            self.upstream.close()

    def close(self) -> None:
        """Close both sides, once what is on its way back to the client is written."""
        self.back.after(self._close_now)

    def _close_now(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.upstream is not None:
            self.upstream.close()

    # -- towards Azurite ---------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.last = self.sent = time.monotonic()
        self.outward.push(data, self.proxy.delay)

    def _send_now(self, data: bytes) -> None:
        if self.upstream is not None:
            self.upstream.write(data)
            return
        self.pending.append(data)
        if not self.connecting:
            self.connecting = True
            self.proxy.connect(self)

    def connected(self, upstream: asyncio.Transport, protocol: _Upstream) -> None:
        self.connecting = False
        if self.transport is None or self.transport.is_closing():
            upstream.close()
            return
        self.upstream, self.upstream_protocol = upstream, protocol
        for data in self.pending:
            upstream.write(data)
        self.pending.clear()
        if self.timer is None:
            self._arm(UPSTREAM_IDLE)

    def _arm(self, seconds: float) -> None:
        self.timer = asyncio.get_running_loop().call_later(seconds, self._idle)

    def _idle(self) -> None:
        quiet = time.monotonic() - self.last
        if quiet < UPSTREAM_IDLE or self.replied < self.sent:  # busy, or still waiting
            self._arm(max(UPSTREAM_IDLE - quiet, 0.5))
            return
        self.timer = None
        self._retire()

    def _retire(self) -> None:
        """Close the connection to Azurite, ignoring what more it sends; the next request
        opens another."""
        if self.upstream is not None and self.upstream_protocol is not None:
            self.upstream_protocol.retired = True
            self.upstream.close()
        self.upstream = self.upstream_protocol = None

    # -- Azurite's answers ----------------------------------------------------------

    def answered(self, data: bytes) -> None:
        self.last = self.replied = time.monotonic()
        if self.waiting is not None:  # the first bytes of the answer to the request
            self.proxy.took(self.service, *self.waiting, data)
            if self.proxy.trips is not None and self.hit is not None and not self.lost:
                self.proxy.trips.append(Trip(self.hit, self.waiting[0],
                                             self.replied + self.proxy.delay))
            self.waiting = None
            if self.lost:
                lost, self.lost = self.lost, ""
                if lost == "dropped":
                    self.close()
                    return
                self._retire()
                self.reply(azure_error(self.service, 500, "OperationTimedOut"))
                return
        self.reply(data)

    def reply(self, data: bytes) -> None:
        self.back.push(data, self.proxy.delay)

    def _reply_now(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    # -- the client's requests ---------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.paused is None:
            self._parse()

    def _parse(self) -> None:
        buf = self.buffer
        while buf and self.paused is None:
            if self.body_left:
                taken = min(self.body_left, len(buf))
                if self.forwarding:
                    self.send(bytes(buf[:taken]))
                del buf[:taken]
                self.body_left -= taken
                if not self.body_left and not self.chunked:
                    self._whole()
                continue
            if self.chunked:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buf[:end]).split(b";")[0] or b"0", 16)
                if self.forwarding:
                    self.send(bytes(buf[:end + 2]))
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
            head = bytes(buf[:end + 4])
            del buf[:end + 4]
            self._frame(head)
            self._request(head)

    def _frame(self, head: bytes) -> None:
        lowered = head.lower()
        if b"\r\ntransfer-encoding: chunked" in lowered:
            self.chunked = True
            return
        at = lowered.find(b"\r\ncontent-length:")
        if at >= 0:
            line_end = lowered.find(b"\r\n", at + 2)
            self.body_left = int(lowered[at + 17:line_end])

    def _request(self, head: bytes) -> None:
        client, method, target = classify(self.label, head)
        path, _, query = target.partition("?")
        inner = path[len(ACCOUNT) + 1:] if path.startswith(f"/{ACCOUNT}") else path
        self.hit = Hit(client, self.service, request_kind(self.service, method, inner, query))
        self.proxy.requests[self.hit] += 1
        fate = self.proxy.fate(self.service, method, unquote(path), query)
        self.forwarding = not fate.answer
        self.answer = fate.answer
        if fate.held is not None or fate.stall:
            self.paused = head
            self.proxy.spawn(self._resume(fate))
            return
        self._forward(head, fate.lost, method, path)

    def _forward(self, head: bytes, lost: str, method: str, path: str) -> None:
        if self.forwarding:
            self.lost = lost
            self.waiting = (time.monotonic(), f"{method} {unquote(path)}")
            self.send(head)
        if not self.body_left and not self.chunked:
            self._whole()

    async def _resume(self, fate: _Fate) -> None:
        if fate.held is not None:
            await fate.held.until_released()
        if fate.stall:
            await asyncio.sleep(STALL)
        head, self.paused = self.paused, None
        if head is None or self.transport is None:
            return
        method, target = head.split(b" ", 2)[:2]
        self._forward(head, fate.lost, method.decode("latin-1"),
                      target.decode("latin-1").partition("?")[0])
        self._parse()

    def _whole(self) -> None:
        """The current request has arrived whole."""
        if self.answer:
            answer, self.answer = self.answer, b""
            self.forwarding = True
            self.reply(answer)


class FaultProxy:
    """One listening port per storage service in ``upstream`` (service -> the port of
    Azurite's, on 127.0.0.1), and per label given to ``start``; counting every request
    and injecting ``faults``."""

    def __init__(self, upstream: Mapping[str, int], faults: Faults = Faults(),
                 seed: int | None = None) -> None:
        self.upstream = dict(upstream)
        self.faults = faults
        self.delay = 0.0
        self.trips: list[Trip] | None = None
        self.counts: Counter[str] = Counter()
        self.requests: Counter[Hit] = Counter()
        self.ports: dict[tuple[str, str], int] = {}
        self.slow: list[str] = []
        self.open: set[_Downstream] = set()
        self._random = random.Random(seed)
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._once: list[tuple[str, str, str]] = []
        self._holds: list[Held] = []

    async def start(self, labels: tuple[str, ...] = ("",)) -> None:
        """Listen for each service; a non-empty label marks every request on those ports
        as coming from that client (``endpoint(service, label)``)."""
        loop = asyncio.get_running_loop()
        for label in labels:
            for service in self.upstream:
                server = await loop.create_server(self._factory(service, label), "127.0.0.1",
                                                  0, backlog=1024)
                self._servers.append(server)
                self.ports[(label, service)] = server.sockets[0].getsockname()[1]

    def _factory(self, service: str, label: str) -> Callable[[], _Downstream]:
        return lambda: _Downstream(self, service, label)

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for downstream in list(self.open):
            downstream.close()
        for server in self._servers:
            await server.wait_closed()

    def endpoint(self, service: str, label: str = "") -> str:
        return f"http://127.0.0.1:{self.ports[(label, service)]}/{ACCOUNT}"

    def connection_string(self, label: str = "") -> str:
        """A connection string for Azurite's account whose endpoints are this proxy."""
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                + "".join(f"{s.capitalize()}Endpoint={self.endpoint(s, label)};"
                          for s in SERVICES if (label, s) in self.ports))

    def snapshot(self) -> Counter[Hit]:
        """The requests counted so far, by client, service and kind."""
        return Counter(self.requests)

    def once(self, method: str, path_contains: str, fault: str) -> None:
        """Inject ``fault`` ("busy", "timed out", "dropped", "refused": answered 403
        AuthenticationFailed without reaching storage, as an expired SAS is, "stalled":
        forwarded after ``STALL`` seconds, or "being deleted": answered 409
        QueueBeingDeleted without reaching storage, as Azure answers for a while after a
        queue's delete and Azurite does not) into the next request with ``method`` ("*":
        any) whose path contains ``path_contains``."""
        assert fault in FAULTS
        self._once.append((method, path_contains, fault))

    def forget_once(self) -> int:
        """Forget the faults ``once`` injected that no request has met yet; how many."""
        left = len(self._once)
        self._once.clear()
        return left

    def hold(self, method: str, path_contains: str) -> Held:
        """Keep the next request with ``method`` ("*": any) whose path contains
        ``path_contains`` until ``release()`` is called on what this returns. Its sender's
        own attempt time-out still applies (5 s for the server's storage requests)."""
        held = Held(method, path_contains)
        self._holds.append(held)
        return held

    def fate(self, service: str, method: str, path: str, query: str) -> _Fate:
        """What to do with a request (``path`` decoded), and count it."""
        fate = _Fate(held=self._held(method, path))
        scripted = self._scripted(method, path)
        if scripted == "stalled":
            fate.stall, scripted = True, ""
        faults, draw = self.faults, self._random.random
        if scripted == "refused":
            self.counts[f"{service} refused"] += 1
            fate.answer = azure_error(service, 403, "AuthenticationFailed")
        elif scripted == "being deleted":
            self.counts[f"{service} being deleted"] += 1
            fate.answer = azure_error(service, 409, "QueueBeingDeleted")
        elif scripted == "busy" or (not scripted and faults.busy and draw() < faults.busy):
            self.counts[f"{service} busy"] += 1
            fate.answer = azure_error(service, 503, "ServerBusy")
        elif scripted or (faults.lost and is_write(method, path, dict(parse_qsl(query)))
                          and draw() < faults.lost):
            dropped = scripted == "dropped" or (not scripted and draw() < faults.drop_share)
            fate.lost = "dropped" if dropped else "timed out"
            self.counts[f"{service} {fate.lost}"] += 1
        else:
            self.counts[f"{service} forwarded"] += 1
        return fate

    def _held(self, method: str, path: str) -> Held | None:
        for i, held in enumerate(self._holds):
            if held.method in ("*", method) and held.path_contains in path:
                del self._holds[i]
                return held
        return None

    def _scripted(self, method: str, path: str) -> str:
        for i, (wanted, fragment, fault) in enumerate(self._once):
            if wanted in ("*", method) and fragment in path:
                del self._once[i]
                return fault
        return ""

    def took(self, service: str, since: float, what: str, answer: bytes) -> None:
        """Note an answer of Azurite's that was slow to come."""
        took = time.monotonic() - since
        if took <= SLOW:
            return
        self.counts[f"{service} slow upstream"] += 1
        came = time.time() - took
        status = answer[9:12].decode("latin-1") if answer.startswith(b"HTTP/") else "?"
        self.slow.append(f"{time.strftime('%H:%M:%S', time.localtime(came))}"
                         f".{int(came % 1 * 1000):03d} {service} {what} {status} "
                         f"answered in {took:.2f}s")

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def connect(self, downstream: _Downstream) -> None:
        async def connect() -> None:
            try:
                upstream, protocol = await asyncio.get_running_loop().create_connection(
                    lambda: _Upstream(downstream), "127.0.0.1",
                    self.upstream[downstream.service])
            except OSError:
                downstream.connecting = False
                downstream.close()
                return
            downstream.connected(upstream, protocol)

        self.spawn(connect())
