"""Connections that hold a server process without finishing a request.

An anonymous peer opens sockets and never completes them: headers that never end, a body
declared and never sent. Each is cut off within seconds, a process keeps at most
``AZQUEUE_MAX_CONNECTIONS`` open and says so in its log, and a request that keeps sending
(an ``s3`` upload longer than any of these limits) is never cut.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import aiohttp
import pytest

from azqueue.config import Settings
from azqueue.testing import sas
from azqueue.testing.tasks import iso
from tests.integration.test_artifacts import _running_task
from tests.servers import Server, ServerFactory

DEFAULTS = Settings.__dataclass_fields__
# How long past its limit a connection may stay open in these tests (a loaded machine).
SLACK = 10.0


async def _connect(server: Server) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    address = urlsplit(server.root_url)
    assert address.hostname and address.port
    return await asyncio.open_connection(address.hostname, address.port)


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> tuple[float, bytes]:
    """Read until the server closes the connection: how long that took, and what it sent.
    Fails if it is still open after ``seconds``."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(seconds):
            answer = await reader.read()
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {seconds:g} s")
    return time.monotonic() - started, answer


async def _trickle(writer: asyncio.StreamWriter, data: bytes, every: float) -> None:
    """Send ``data`` a byte at a time, one each ``every`` seconds, until the peer closes."""
    try:
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(every)
    except ConnectionError:
        pass


async def test_headers_that_never_end_are_cut_off_within_seconds(server: Server) -> None:
    timeout = server.settings.header_timeout
    assert timeout == DEFAULTS["header_timeout"].default <= 10
    reader, writer = await _connect(server)
    endless = b"GET /api/queue/v1/ping HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 1000
    sending = asyncio.create_task(_trickle(writer, endless, 0.1))
    took, _ = await _closed_within(reader, timeout + SLACK)
    sending.cancel()
    writer.close()
    assert took >= timeout * 0.5


async def test_a_connection_that_sends_nothing_is_closed_after_the_idle_timeout(
        make_server: ServerFactory) -> None:
    assert DEFAULTS["idle_timeout"].default <= 60
    server = await make_server(idle_timeout=2.0)
    reader, writer = await _connect(server)
    await _closed_within(reader, server.settings.idle_timeout + SLACK)
    writer.close()


async def test_an_api_body_that_stalls_is_answered_408_and_cut_off(
        make_server: ServerFactory) -> None:
    """By default a body must arrive within 10 s; the test's server waits 1 s."""
    assert DEFAULTS["body_timeout"].default <= 10
    server = await make_server(body_timeout=1.0)
    timeout = server.settings.body_timeout
    reader, writer = await _connect(server)
    writer.write(b"PUT /api/queue/v1/task/AAAAAAAAAAAAAAAAAAAAAA HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 2000000\r\n\r\n{")
    await writer.drain()
    _, answer = await _closed_within(reader, timeout + SLACK)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert json.loads(body)["code"] == "RequestTimeout"


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """What the server sent on a connection before closing it at once (b"": nothing)."""
    try:
        async with asyncio.timeout(1.0):
            return await reader.read()
    except TimeoutError:
        return b""


async def test_connections_beyond_the_cap_are_answered_503_and_logged(
        make_server: ServerFactory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "azqueue.api.connections")
    capped = await make_server(max_connections=4, header_timeout=60.0)
    cap = capped.settings.max_connections
    # All at once, as an attacker opens them: accepted together, counted one by one.
    opened = await asyncio.gather(*(_connect(capped) for _ in range(3 * cap)))
    for _, writer in opened:
        writer.write(b"GET /api/queue/v1/ping HTTP/1.1\r\n")
    answers = [await _answer(reader) for reader, _ in opened]
    assert [a[:12] for a in answers if a] == [b"HTTP/1.1 503"] * (2 * cap), answers
    head, _, body = next(a for a in answers if a).partition(b"\r\n\r\n")
    assert b"\r\nRetry-After: 1\r\n" in head
    assert json.loads(body)["code"] == "TooManyConnections"
    assert any("AZQUEUE_MAX_CONNECTIONS" in m for m in caplog.messages), caplog.messages

    for _, writer in opened:
        writer.close()
    async with aiohttp.ClientSession() as fresh:
        for _ in range(50):  # the server sees them closed in a moment
            async with fresh.get(f"{capped.api}/ping") as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.1)
        assert r.status == 200, await r.text()


async def test_an_s3_upload_that_keeps_sending_outlasts_every_timeout(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    server = await make_server(header_timeout=1.0, body_timeout=1.0, idle_timeout=1.0)
    task_id = await _running_task(http, server)
    url = f"{server.api}/task/{task_id}/runs/0/artifacts/public/big.bin"
    expires = iso(datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1))
    code, made = await sas.post(http, url, {"storageType": "s3", "expires": expires,
                                            "contentType": "application/octet-stream"})
    assert code == 200, made
    chunk, chunks = b"x" * 65536, 12

    async def steady() -> AsyncIterator[bytes]:
        for _ in range(chunks):  # about 4 s in all, four times each timeout
            yield chunk
            await asyncio.sleep(0.3)

    started = time.monotonic()
    async with aiohttp.ClientSession() as uploader, uploader.put(
            made["putUrl"], data=steady(), headers={
                "Content-Type": "application/octet-stream",
                "Content-Length": str(len(chunk) * chunks)}) as r:
        assert r.status == 200, await r.text()
    assert time.monotonic() - started > 3 * server.settings.body_timeout
    async with http.get(url) as r:
        assert await r.read() == chunk * chunks
