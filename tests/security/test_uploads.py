"""A worker with claim credentials and an ``s3`` putUrl, stalling uploads to hold the
server's memory.

One artifact takes one upload at a time, on any replica, and the uploads of a process
hold a bounded amount in all: a PUT beyond either is refused before its body is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from azqueue.testing import sas
from azqueue.testing.tasks import iso
from azqueue.testing.storage import StorageInspector
from tests.integration.test_artifacts import _running_task
from tests.servers import Server, ServerFactory
from tests.waiting import eventually

MIB = 1024 * 1024
TYPE = "application/octet-stream"


async def _put_url(http: aiohttp.ClientSession, server: Server, task_id: str, name: str) -> str:
    expires = iso(datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1))
    code, made = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/artifacts/{name}",
                                {"storageType": "s3", "expires": expires, "contentType": TYPE})
    assert code == 200, made
    return str(made["putUrl"])


@asynccontextmanager
async def _stalled(put_url: str, length: int, sent: int) -> AsyncIterator[None]:
    """A PUT announcing ``length`` bytes that sends ``sent`` of them and then nothing."""
    url = urlsplit(put_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write((f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                      f"Content-Type: {TYPE}\r\nContent-Length: {length}\r\n\r\n").encode()
                     + b"x" * sent)
        await writer.drain()
        yield
    finally:
        writer.close()


async def _put(put_url: str, body: bytes) -> tuple[int, dict[str, str], dict[str, str]]:
    """A whole PUT: its status, headers and JSON answer (given up after a minute: a PUT
    that is neither refused nor stored then is taken as waiting behind the stalled ones)."""
    async with aiohttp.ClientSession() as plain, plain.put(
            put_url, data=io.BytesIO(body), headers={"Content-Type": TYPE},
            timeout=aiohttp.ClientTimeout(total=60)) as r:
        return r.status, dict(r.headers), json.loads(await r.read())


async def _under_way(storage: StorageInspector, task_id: str, name: str) -> None:
    """Wait until the artifact's row bears the mark of an upload under way."""
    async def marked() -> bool:
        rows = await storage.rows("tasks", task_id)
        return any(r.get("name") == name and r.get("uploadId") for r in rows)

    await eventually(marked, what=f"the upload of {name} under way")


async def _until(put_url: str, body: bytes, wanted: int
                 ) -> tuple[int, dict[str, str], dict[str, str]]:
    """PUT ``body`` until the answer is ``wanted`` (the server sees a stalled PUT begin, or
    go, a moment after the client): the last answer."""
    for _ in range(50):
        status, headers, answer = await _put(put_url, body)
        if status == wanted:
            break
        await asyncio.sleep(0.1)
    return status, headers, answer


async def _refused_while_under_way(storage: StorageInspector, task_id: str, name: str,
                                   put_url: str, again: str) -> None:
    """A PUT to ``again`` while one to ``put_url`` stalls is refused, saying why; once
    the stalled one is gone, it is taken."""
    async with _stalled(put_url, 10 * MIB, 1000):
        await _under_way(storage, task_id, name)
        status, _, answer = await _until(again, b"y" * 1000, 409)
    assert status == 409, answer
    assert answer["code"] == "RequestConflict"
    assert f"another upload of artifact {name!r}" in answer["message"]
    assert "under way" in answer["message"]
    status, _, answer = await _until(again, b"z" * 1000, 200)
    assert status == 200, answer


async def test_a_second_put_on_a_put_url_while_one_is_under_way_is_refused(
        server: Server, http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    task_id = await _running_task(http, server)
    put_url = await _put_url(http, server, task_id, "public/once.bin")
    await _refused_while_under_way(storage, task_id, "public/once.bin", put_url, put_url)


async def test_a_put_on_another_replica_while_one_is_under_way_is_refused(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector) -> None:
    first, second = await make_server(), await make_server()  # replicas of one deployment
    task_id = await _running_task(http, first)
    put_url = await _put_url(http, first, task_id, "public/once-anywhere.bin")
    elsewhere = urlsplit(put_url)._replace(netloc=urlsplit(second.root_url).netloc).geturl()
    await _refused_while_under_way(storage, task_id, "public/once-anywhere.bin", put_url,
                                   elsewhere)


async def test_the_uploads_of_a_process_hold_a_bounded_amount_in_all(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """Each body over 4 MiB takes 20 MiB of the process's 40: a third waits its turn."""
    server = await make_server(upload_memory_mib=40)
    task_id = await _running_task(http, server)
    urls = [await _put_url(http, server, task_id, f"public/big-{i}.bin") for i in range(3)]
    async with _stalled(urls[0], 100 * MIB, 4 * MIB - 1), \
            _stalled(urls[1], 100 * MIB, 4 * MIB - 1):
        status, headers, answer = await _until(urls[2], b"y" * (5 * MIB), 503)
        assert status == 503, answer
        assert answer["code"] == "ServerBusy"
        assert "AZQUEUE_UPLOAD_MEMORY_MIB" in answer["message"]
        assert headers["Retry-After"] == "5"
    status, _, answer = await _until(urls[2], b"y" * (5 * MIB), 200)  # their buffers freed
    assert status == 200, answer


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of the answer to a PUT written by hand."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    status_line, *lines = head.strip().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), json.loads(body)


@asynccontextmanager
async def _sending(put_url: str, length: int, pieces: AsyncIterator[bytes]
                   ) -> AsyncIterator[asyncio.Task[tuple[int, dict[str, Any]]]]:
    """A PUT announcing ``length`` bytes whose body is ``pieces`` as they come (it goes
    on sending while the answer is read): the answer, once there is one."""
    url = urlsplit(put_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write((f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                  f"Content-Type: {TYPE}\r\nContent-Length: {length}\r\n\r\n").encode())

    async def send() -> None:
        with contextlib.suppress(ConnectionError):
            async for piece in pieces:
                writer.write(piece)
                await writer.drain()

    sending = asyncio.create_task(send())
    answer = asyncio.create_task(_answer(reader))
    try:
        yield answer
    finally:
        sending.cancel()
        answer.cancel()
        await asyncio.gather(sending, answer, return_exceptions=True)
        writer.close()


async def _paced(piece: bytes, count: int | None, every: float) -> AsyncIterator[bytes]:
    """``piece`` every ``every`` seconds, ``count`` times (None: for ever)."""
    sent = 0
    while count is None or sent < count:
        yield piece
        sent += 1
        await asyncio.sleep(every)


async def test_an_upload_that_trickles_is_cut_off_and_its_buffers_go_to_another_worker(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector) -> None:
    """A PUT announcing 10 MiB that sends a byte every half second never sends nothing for
    the 4 s read timeout, but falls ever further behind the 32 KiB/s an upload must
    average (with those 4 s to spare): it is answered 400 with nothing stored, and the
    20 MiB of buffers it held, all the process has, go to another worker's upload at once,
    though the trickle goes on."""
    server = await make_server(upload_memory_mib=20, upload_read_timeout=4.0,
                               upload_min_rate_kib=32)
    trickler, other = await _running_task(http, server), await _running_task(http, server)
    slow = await _put_url(http, server, trickler, "public/trickle.bin")
    fair = await _put_url(http, server, other, "public/fair.bin")
    async with _sending(slow, 10 * MIB, _paced(b"x", None, 0.5)) as answer:
        await _under_way(storage, trickler, "public/trickle.bin")
        status, _, busy = await _put(fair, b"y" * (5 * MIB))
        assert status == 503, busy  # the trickle holds the buffers
        status, refused = await asyncio.wait_for(answer, 60)
        assert status == 400, refused
        assert "AZQUEUE_UPLOAD_MIN_RATE_KIB" in refused["message"]
        assert "nothing was stored" in refused["message"]
        status, _, stored = await _put(fair, b"y" * (5 * MIB))
        assert status == 200, stored
    async with http.get(f"{server.api}/task/{trickler}/runs/0/artifacts/public/trickle.bin",
                        allow_redirects=False) as r:
        assert r.status == 404  # not uploaded


async def test_an_upload_over_a_slow_link_is_not_cut_off(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """A 5 MiB body sent at 1 MiB/s (pieces of 512 KiB every half second) takes far
    longer than the 2 s to spare, but keeps above the 32 KiB/s minimum: it is stored."""
    server = await make_server(upload_read_timeout=2.0, upload_min_rate_kib=32)
    task_id = await _running_task(http, server)
    put_url = await _put_url(http, server, task_id, "public/slow.bin")
    piece = bytes(range(256)) * 2048
    async with _sending(put_url, 10 * len(piece), _paced(piece, 10, 0.5)) as answer:
        status, stored = await asyncio.wait_for(answer, 60)
    assert status == 200, stored
    async with http.get(f"{server.api}/task/{task_id}/runs/0/artifacts/public/slow.bin") as r:
        assert r.status == 200
        assert await r.read() == piece * 10


async def test_one_run_holds_no_more_than_its_share_of_the_upload_buffers(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """Each run may hold 40 MiB of the process's 100: a run with two uploads over 4 MiB
    under way (20 MiB each) is refused a third, while another run's goes through."""
    server = await make_server(upload_memory_mib=100, upload_run_memory_mib=40)
    greedy, other = await _running_task(http, server), await _running_task(http, server)
    urls = [await _put_url(http, server, greedy, f"public/big-{i}.bin") for i in range(3)]
    theirs = await _put_url(http, server, other, "public/big.bin")
    async with _stalled(urls[0], 100 * MIB, 4 * MIB - 1), \
            _stalled(urls[1], 100 * MIB, 4 * MIB - 1):
        status, headers, answer = await _until(urls[2], b"y" * (5 * MIB), 503)
        assert status == 503, answer
        assert answer["code"] == "ServerBusy"
        assert "AZQUEUE_UPLOAD_RUN_MEMORY_MIB" in answer["message"]
        assert headers["Retry-After"] == "5"
        status, _, answer = await _put(theirs, b"z" * (5 * MIB))
        assert status == 200, answer
    status, _, answer = await _until(urls[2], b"y" * (5 * MIB), 200)  # their buffers freed
    assert status == 200, answer
