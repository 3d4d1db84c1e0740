"""A worker with claim credentials and an ``s3`` putUrl, stalling uploads to hold the
server's memory.

One artifact takes one upload at a time, on any replica, and the uploads of a process
hold a bounded amount in all: a PUT beyond either is refused before its body is read.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
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
