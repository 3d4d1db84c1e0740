"""What a connection may hold of a server process, and for how long.

aiohttp, left to its defaults, keeps a connection whose request headers never end, or
whose declared body never arrives, for as long as the peer keeps it open, and accepts
connections until the process runs out of file descriptors. So:

* **Headers**: a request's headers must be complete within ``header_timeout`` (a few
  seconds) of its first byte, or the connection is closed (``_Counted.data_received``).
  The timer runs only while the connection waits for a request, so it never cuts a body
  or a long poll.
* **Idle**: aiohttp's keep-alive timer, set to ``idle_timeout``, closes a connection that
  has sent nothing of a request that long, from its start or from the answer before.
* **API bodies**: ``read_body`` reads an API request's body (at most 2 MiB) within
  ``body_timeout`` of its headers, or answers 408 and closes the connection (``LINGER``
  seconds later). The ``s3``
  upload receiver reads its bodies itself, cut off only when nothing arrives for
  ``upload_read_timeout`` seconds or the body falls behind ``upload_min_rate_kib`` on
  average (``service/artifacts/uploads.py``): an upload of gigabytes that keeps up is
  never cut.
* **Answers**: an answer is written while the client reads it. Once more than
  ``HIGH_WATER`` bytes of it wait unsent (the socket's buffers full), the client must
  take at least ``HIGH_WATER`` bytes more of it every ``send_timeout`` seconds until
  less than ``LOW_WATER`` wait, or the connection is dropped with the rest of the answer
  (``_Counted.pause_writing``): a client that stops reading, or sends pipelined requests
  it never reads the answers of, holds neither memory nor a connection for longer. The
  listings bound each page by bytes as well as by count (``service.common.paging``), so that
  what one answer holds is small.
* **How many**: ``ListeningSite`` answers a connection beyond ``max_connections`` open at
  once in this process with a 503 (``Retry-After``) and closes it, before reading
  anything of it; the log says so, once a minute at most while it goes on.

What a proxy in front should enforce as well is in docs/operating/running.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
import time
import zlib
from typing import Any

from aiohttp import web

from azqueue import errors
from azqueue.config import Settings
from azqueue.internals.aiohttp import awaiting_request, listen, requests_parsed

log = logging.getLogger(__name__)

# After an answer given before the body was read whole (408, 413), how long the rest of
# it is read and dropped before the connection is closed, so that the client reads the
# answer rather than a reset (aiohttp's default: 10 s).
LINGER = 2.0
RETRY_AFTER = 1  # seconds, in the 503 of a connection over the cap
REFUSED_LINGER = 1.0  # seconds a refused connection stays open for its peer to read
LOG_EVERY = 60.0  # seconds between two log lines about refused connections
BODY_TIMEOUT_KEY = web.AppKey("body_timeout", float)
# Bytes of an answer waiting unsent above which a connection's writes pause (and the send
# timer runs), and under which they resume (asyncio's defaults, stated for the docs).
HIGH_WATER = 64 * 1024
LOW_WATER = 16 * 1024


def _options(settings: Settings) -> dict[str, Any]:
    """How each connection's requests are read (aiohttp's RequestHandler's options).
    Bodies are read as sent: an upload's ``Content-Encoding`` is the artifact's, kept
    (``service/artifacts/uploads.py``), and ``read_body`` decodes an API body's."""
    return {"access_log": None, "keepalive_timeout": settings.idle_timeout,
            "lingering_time": LINGER, "auto_decompress": False}


def make_runner(app: web.Application, settings: Settings, **kwargs: Any) -> web.AppRunner:
    """The runner of the API ``app``, with the idle timeout of ``settings``."""
    return web.AppRunner(app, **_options(settings), **kwargs)


async def read_body(request: web.Request) -> bytes:
    """The body of an API request, read whole within the application's body timeout
    (``BODY_TIMEOUT_KEY``, which ``create_app`` sets)."""
    timeout = request.app[BODY_TIMEOUT_KEY]
    try:
        async with asyncio.timeout(timeout):
            raw = await request.read()
    except TimeoutError:
        raise errors.SlowRequest(
            f"the request body did not arrive within {timeout:g} s of its headers "
            f"({request.content_length or 'no'} bytes declared); send it whole at once"
        ) from None
    return _decoded(request.headers.get("Content-Encoding", "identity"), raw,
                    request.client_max_size)


def _decoded(encoding: str, raw: bytes, limit: int) -> bytes:
    """An API body as it was before its ``Content-Encoding`` (gzip or deflate), at most
    ``limit`` bytes."""
    encoding = encoding.strip().lower()
    if encoding == "identity":
        return raw
    if encoding not in ("gzip", "deflate", "x-gzip"):
        raise errors.InputError(
            f"Content-Encoding {encoding!r} is not one an API request may use: send the body "
            "as it is, or gzip- or deflate-encoded")
    inflate = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip's header or zlib's (deflate)
    try:
        body = inflate.decompress(raw, limit)
    except zlib.error as e:
        raise errors.InputError(f"the body is not {encoding}-encoded as its Content-Encoding "
                                f"says ({e})") from None
    if inflate.unconsumed_tail:
        raise errors.TooLarge(f"the body decoded is larger than {limit} bytes")
    if not inflate.eof:
        raise errors.InputError(f"the {encoding}-encoded body ends before its encoding does")
    return body


def _refusal() -> bytes:
    body = json.dumps({
        "code": "TooManyConnections",
        "message": "this server has as many connections open as it takes; try again in "
                   f"{RETRY_AFTER} s",
        "requestInfo": {}}).encode()
    head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Retry-After: {RETRY_AFTER}\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


class _Refused(asyncio.Protocol):
    """A connection over the cap: answered 503 at once, and closed once the peer has
    closed its side or ``REFUSED_LINGER`` seconds later (what it sends is dropped).
    Closed at once with its request unread, the peer could get a reset instead."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(_refusal())
        if transport.can_write_eof():
            transport.write_eof()
        self._closing = asyncio.get_running_loop().call_later(REFUSED_LINGER, transport.close)

    def eof_received(self) -> bool:
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing.cancel()


class _Counted(web.RequestHandler):
    """aiohttp's handler of one connection, counted by its site while it is open, and
    closed when a request's headers, once begun, are not complete within the header
    timeout, or dropped when its client leaves an answer unread for the send timeout.
    (What it reads of aiohttp's handler beyond its public API is in
    ``azqueue.internals.aiohttp``.)"""

    def __init__(self, site: ListeningSite, manager: web.Server, header_timeout: float,
                 send_timeout: float, **options: Any) -> None:
        super().__init__(manager, **options)
        self._site = site
        self._header_timeout = header_timeout
        self._send_timeout = send_timeout
        self._headers_due: asyncio.TimerHandle | None = None
        self._unread_due: asyncio.TimerHandle | None = None
        self._unsent = 0  # bytes waiting to be sent when the send timer was set

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert isinstance(transport, asyncio.WriteTransport)
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)

    def pause_writing(self) -> None:
        """The client has not read what was written; it has the send timeout to take
        some of it."""
        super().pause_writing()
        if self._unread_due is None:
            self._set_send_timer()

    def _set_send_timer(self) -> None:
        assert self.transport is not None
        self._unsent = self.transport.get_write_buffer_size()
        self._unread_due = asyncio.get_running_loop().call_later(
            self._send_timeout, self._drop_unread)

    def resume_writing(self) -> None:
        self._stop_send_timer()
        super().resume_writing()

    def _stop_send_timer(self) -> None:
        if self._unread_due is not None:
            self._unread_due.cancel()
            self._unread_due = None

    def _drop_unread(self) -> None:
        """Drop the connection unless its client took ``HIGH_WATER`` bytes since the
        timer was set (then it has the send timeout again). Abort, not close: a close
        would wait to send the unread rest first. The handler writing the answer gets a
        ConnectionResetError and ends. The socket lingers for no time, so the kernel
        resets the connection and frees what its send buffer holds: closed gracefully,
        it would stay in FIN-WAIT-1 with that buffer for as long as the client keeps its
        window shut, outside the connection cap."""
        self._unread_due = None
        if self.transport is None:
            return
        if self._unsent - self.transport.get_write_buffer_size() >= HIGH_WATER:
            self._set_send_timer()
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        parsed = requests_parsed(self)
        super().data_received(data)
        if requests_parsed(self) > parsed:  # the headers are complete
            self._stop_header_timer()
        elif self._headers_due is None and awaiting_request(self) and data:
            self._headers_due = asyncio.get_running_loop().call_later(
                self._header_timeout, self.force_close)

    def _stop_header_timer(self) -> None:
        if self._headers_due is not None:
            self._headers_due.cancel()
            self._headers_due = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_timer()
        self._stop_send_timer()
        super().connection_lost(exc)
        self._site.open -= 1


class ListeningSite(web.TCPSite):
    """A TCP site of ``runner`` that keeps at most ``settings.max_connections``
    connections open at once. They are counted as they are accepted: aiohttp's server
    learns of a connection only later, after the others accepted with it."""

    def __init__(self, runner: web.AppRunner, host: str, port: int,
                 settings: Settings, sock: socket.socket | None = None) -> None:
        """With ``sock``, a socket bound to ``host`` and ``port`` already, it listens on
        that one (and closes it when stopped)."""
        super().__init__(runner, host, port)
        self._app_runner = runner
        self._bound_socket = sock
        self.max_connections = settings.max_connections
        self._options = _options(settings)
        self._header_timeout = settings.header_timeout
        self._send_timeout = settings.send_timeout
        self.open = 0
        self.refused = 0  # since the last log line
        self._logged = -LOG_EVERY

    def _protocol(self) -> asyncio.Protocol:
        server = self._app_runner.server
        assert server is not None
        if self.open < self.max_connections:
            self.open += 1
            return _Counted(self, server, self._header_timeout, self._send_timeout,
                            loop=asyncio.get_running_loop(), **self._options)
        self.refused += 1
        now = time.monotonic()
        if now - self._logged >= LOG_EVERY:
            log.warning("refused %d connection(s) with 503: %d are open, the most "
                        "AZQUEUE_MAX_CONNECTIONS allows this process (see "
                        "docs/operating/running.md, Slow and idle connections)",
                        self.refused, self.open)
            self._logged, self.refused = now, 0
        return _Refused()

    async def start(self) -> None:
        await listen(self, self._protocol, self._bound_socket)
