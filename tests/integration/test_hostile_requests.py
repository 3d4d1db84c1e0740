"""Requests no client should send get a 4xx and one log line, never a 500: Hawk
timestamps too large for a float, header bytes that are not UTF-8, malformed HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, urlsplit

import aiohttp
import mohawk
import pytest

from tests import sas
from tests.servers import ROOT, Server
from tests.tasks import create, definition, iso, slugid


async def _raw(server: Server, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """Send ``head`` (request line and headers, without the final blank line) as is."""
    url = urlsplit(server.root_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(head + f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                     .encode() + body)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    status = int(answer.split(b" ", 2)[1])
    return status, answer.partition(b"\r\n\r\n")[2]


def _hawk(ts: str = "1", nonce: str = "n", extra: str = "") -> bytes:
    return (f'Authorization: Hawk id="{ROOT.client_id}", ts="{ts}", nonce="{nonce}", '
            f'mac="x"{extra}').encode()


@pytest.mark.parametrize("ts", ["1" + "0" * 310, "-" + "1" * 320, "9" * 400])
async def test_a_hawk_ts_too_large_for_any_clock_is_401(server: Server, ts: str) -> None:
    status, body = await _raw(
        server, b"GET /api/queue/v1/ping HTTP/1.1\r\nHost: x\r\n" + _hawk(ts=ts))
    assert status == 401, body
    assert json.loads(body)["code"] == "AuthenticationFailed"


@pytest.mark.parametrize("where", ["nonce", "hash", "host"])
async def test_header_bytes_that_are_not_utf8_are_refused_not_500(server: Server,
                                                                  where: str) -> None:
    """A signed request (current ts, known id) with a raw 0xff byte where the Hawk
    normalized string takes it."""
    now = str(int(time.time()))
    nonce = b"\xff" if where == "nonce" else b"n"
    hash_ = b', hash="\xff"' if where == "hash" else b""
    host = b"\xff\xfe" if where == "host" else b"x"
    head = (b"GET /api/queue/v1/ping HTTP/1.1\r\nHost: " + host + b"\r\n"
            b'Authorization: Hawk id="' + ROOT.client_id.encode() + b'", ts="' + now.encode()
            + b'", nonce="' + nonce + b'", mac="x"' + hash_)
    status, body = await _raw(server, head)
    assert 400 <= status < 500, (status, body)


async def test_a_content_type_that_is_not_utf8_on_a_signed_body_is_refused_not_500(
        server: Server, http: aiohttp.ClientSession) -> None:
    """The Hawk payload hash covers the Content-Type: a raw 0xff byte in it."""
    task_id = slugid()
    signed = mohawk.Sender({"id": ROOT.client_id, "key": ROOT.access_token,
                            "algorithm": "sha256"}, f"{server.api}/task/{task_id}", "PUT",
                           content=b"{}", content_type="application/json")
    url = urlsplit(server.root_url)
    head = (f"PUT /api/queue/v1/task/{task_id} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: {signed.request_header}\r\n").encode() + \
        b"Content-Type: application/json\xff"
    status, body = await _raw(server, head, b"{}")
    assert 400 <= status < 500, (status, body)


async def test_a_malformed_http_request_is_one_warning_line(
        server: Server, caplog: pytest.LogCaptureFixture) -> None:
    """aiohttp refuses it (400); the log gets one line saying so, not a traceback."""
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    status, _ = await _raw(server, b"GET /api/queue/v1/ping HTTP/1.1\r\nHost: x\r\n"
                                   b"X-Long: " + b"a" * 20_000)
    assert status in (400, 431)
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert records and all(r.levelno <= logging.WARNING and r.exc_info is None
                           for r in records), [(r.levelname, r.getMessage()) for r in records]


@pytest.mark.parametrize(("name", "says"), [
    ("public/" + "a" * 600, "too long"),
    ("public/" + "é" * 200, "too long"),
    ("public/./x", "`.` or `..`"),
    ("public/../../other/0/x", "`.` or `..`"),
    ("public\\x", "backslash"),
])
async def test_artifact_names_storage_cannot_hold_or_that_leave_the_run_are_400(
        server: Server, http: aiohttp.ClientSession, name: str, says: str) -> None:
    """Names whose table key would pass Azure's 512 characters once encoded, and names
    whose `.`/`..` segments a blob path would resolve (into another run's or task's
    blobs), are refused before anything is written."""
    task_id = await create(http, server.api, definition("prov/names"))
    code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/claim",
                             {"workerGroup": "wg", "workerId": "w"})
    assert code == 200
    code, err = await sas.post(
        http, f"{server.api}/task/{task_id}/runs/0/artifacts/{quote(name, safe='')}",
        {"storageType": "reference", "url": "https://example.com/x",
         "expires": iso(datetime.now(UTC) + timedelta(hours=1))})
    assert code == 400 and says in err["message"], (code, err)
