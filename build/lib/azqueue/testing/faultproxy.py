"""A proxy in front of Azure Storage (Azurite) that injects Azure's own failures.

Real storage accounts answer ``503 ServerBusy`` when throttled, and sometimes apply a
write and then fail to answer it (``500 OperationTimedOut``, or a dropped connection).
This proxy does both, at rates you choose, for every request that passes through it (the
server's, and a SAS worker's through the URLs the server hands out):

* ``busy``: the share of requests answered ``503 ServerBusy`` before they are forwarded
  (nothing applied), with Azure's headers and body (JSON for Tables, XML for Queues and
  Blobs);
* ``lost``: the share of writes (anything but a read; receiving queue messages counts as
  a write: it hides them and hands out receipts) that are forwarded and applied, whose
  answer is then replaced by ``500 OperationTimedOut`` or, for ``drop_share`` of them,
  by a connection closed without an answer.

Requests are forwarded as they came (path, query, headers and body unchanged), so Shared
Key and SAS signatures hold. Use::

    proxy = FaultProxy({"table": "http://127.0.0.1:10002", ...}, Faults(busy=0.03, lost=0.02))
    await proxy.start()
    connection_string = proxy.connection_string(account, key)
    ...
    await proxy.stop()

``faults`` may be replaced while it runs (``proxy.faults = Faults()``); ``once`` injects
one fault into the next request that matches, whatever the rates; ``hold`` keeps the
next request that matches until the caller lets it through; ``counts`` says what
was done to how many requests (and how many took Azurite itself more than ``SLOW``
seconds to answer); ``slow`` lists those, each with when it came and how long the
storage behind took, to match with what the clients saw.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from email.utils import formatdate

import aiohttp
import yarl
from aiohttp import web
from multidict import CIMultiDict

SERVICES = ("blob", "queue", "table")
# How long a "stalled" request waits before it is forwarded.
STALL = 1.0
# An answer of the storage behind that takes longer is counted as "slow upstream".
SLOW = 1.0
# Hop-by-hop headers, and those aiohttp writes itself from the body.
_NOT_FORWARDED = frozenset({"host", "content-length", "transfer-encoding", "connection",
                            "keep-alive"})
_MESSAGES = {
    "ServerBusy": "Operations per second is over the account limit.",
    "OperationTimedOut": "Operation could not be completed within the specified time.",
}


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


def azure_error(service: str, status: int, code: str) -> web.Response:
    """An error answer shaped as Azure Storage shapes it."""
    request_id = str(uuid.uuid4())
    message = f"{_MESSAGES.get(code, code)}\nRequestId:{request_id}\nTime:{formatdate(usegmt=True)}"
    headers = {"x-ms-error-code": code, "x-ms-request-id": request_id,
               "x-ms-version": "2021-12-02", "Date": formatdate(usegmt=True)}
    if service == "table":
        body = json.dumps({"odata.error": {"code": code, "message": {
            "lang": "en-US", "value": message}}}).encode()
        content_type = "application/json;odata=minimalmetadata;streaming=true;charset=utf-8"
    else:
        body = (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code>'
                f"<Message>{message}</Message></Error>").encode()
        content_type = "application/xml"
    reason = {503: "The server is busy.", 500: "Operation could not be completed within the "
              "specified time."}.get(status)
    return web.Response(status=status, reason=reason, body=body, headers=headers,
                        content_type=content_type.split(";")[0],
                        charset="utf-8")


class FaultProxy:
    """One port per storage service, forwarding to ``upstream[service]`` (an origin such as
    ``http://127.0.0.1:10002``) and injecting ``faults``."""

    def __init__(self, upstream: Mapping[str, str], faults: Faults = Faults(),
                 seed: int | None = None) -> None:
        self.upstream = dict(upstream)
        self.faults = faults
        self.counts: Counter[str] = Counter()
        self.ports: dict[str, int] = {}
        self._random = random.Random(seed)
        self._runners: list[web.AppRunner] = []
        self._once: list[tuple[str, str, str]] = []
        self._holds: list[Held] = []
        self._session: aiohttp.ClientSession | None = None
        self.slow: list[str] = []

    async def start(self) -> None:
        # Idle connections to Azurite are closed before Node closes them (after 5 s): a
        # request sent just as the other side closes is lost, which is no fault of ours.
        self._session = aiohttp.ClientSession(
            auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            connector=aiohttp.TCPConnector(limit=500, keepalive_timeout=3.0),
            timeout=aiohttp.ClientTimeout(total=60))
        for service in self.upstream:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handler(service))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
            await site.start()
            self._runners.append(runner)
            self.ports[service] = int(runner.addresses[0][1])

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def once(self, method: str, path_contains: str, fault: str) -> None:
        """Inject ``fault`` ("busy", "timed out", "dropped", "refused": answered 403
        AuthenticationFailed without reaching storage, as an expired SAS is, or "stalled":
        forwarded after ``STALL`` seconds) into the next request with ``method`` ("*":
        any) whose path contains ``path_contains``."""
        assert fault in ("busy", "timed out", "dropped", "refused", "stalled")
        self._once.append((method, path_contains, fault))

    def hold(self, method: str, path_contains: str) -> Held:
        """Keep the next request with ``method`` ("*": any) whose path contains
        ``path_contains`` until ``release()`` is called on what this returns. Its sender's
        own attempt time-out still applies (5 s for the server's storage requests)."""
        held = Held(method, path_contains)
        self._holds.append(held)
        return held

    def _held(self, request: web.Request) -> Held | None:
        for i, held in enumerate(self._holds):
            if held.method in ("*", request.method) and held.path_contains in request.path:
                del self._holds[i]
                return held
        return None

    def _scripted(self, request: web.Request) -> str:
        for i, (method, fragment, fault) in enumerate(self._once):
            if method in ("*", request.method) and fragment in request.path:
                del self._once[i]
                return fault
        return ""

    def endpoint(self, service: str, account: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}/{account}"

    def connection_string(self, account: str, key: str) -> str:
        """A connection string for ``account`` whose endpoints are this proxy."""
        return (f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={key};"
                + "".join(f"{s.capitalize()}Endpoint={self.endpoint(s, account)};"
                          for s in self.ports))

    def _handler(self, service: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            faults = self.faults
            draw = self._random.random
            held = self._held(request)
            if held is not None:
                await held.until_released()
            scripted = self._scripted(request)
            if scripted == "stalled":
                await asyncio.sleep(STALL)
                scripted = ""
            if scripted == "refused":
                self.counts[f"{service} refused"] += 1
                return azure_error(service, 403, "AuthenticationFailed")
            if scripted == "busy" or (not scripted and faults.busy and draw() < faults.busy):
                self.counts[f"{service} busy"] += 1
                return azure_error(service, 503, "ServerBusy")
            body = await request.read()
            headers = {k: v for k, v in request.headers.items()
                       if k.lower() not in _NOT_FORWARDED}
            url = yarl.URL(self.upstream[service] + request.raw_path, encoded=True)
            assert self._session is not None
            started = asyncio.get_running_loop().time()
            async with self._session.request(
                    request.method, url, headers=headers, data=io.BytesIO(body) if body else None,
                    skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type",
                                       "Accept")) as answer:
                content = await answer.read()
                status, answer_headers = answer.status, answer.headers
            took = asyncio.get_running_loop().time() - started
            if took > SLOW:
                self.counts[f"{service} slow upstream"] += 1
                came = time.time() - took
                self.slow.append(f"{time.strftime('%H:%M:%S', time.localtime(came))}"
                                 f".{int(came % 1 * 1000):03d} {service} {request.method} "
                                 f"{request.path} {status} answered in {took:.2f}s")
            if scripted or (faults.lost and is_write(request.method, request.path, request.query)
                            and draw() < faults.lost):
                if scripted == "dropped" or (not scripted and draw() < faults.drop_share):
                    self.counts[f"{service} dropped"] += 1
                    if request.transport is not None:
                        request.transport.close()
                    return web.Response()  # written to nobody: the connection is closed
                self.counts[f"{service} timed out"] += 1
                return azure_error(service, 500, "OperationTimedOut")
            self.counts[f"{service} forwarded"] += 1
            return web.Response(status=status, body=content, headers=CIMultiDict(
                (k, v) for k, v in answer_headers.items() if k.lower() not in _NOT_FORWARDED))

        return handle
