"""Clients that do not read their answers.

An anonymous peer asks for large answers (a listing of big tasks) or sends many
pipelined requests, and never reads what comes back. The server holds neither the
answers' memory nor the connections for longer than the send timeout: its memory comes
back to within 50 MiB of where it was, and others are answered meanwhile. Listings bound
a page by bytes, and the continuationToken still leads through every entry.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from azqueue.devstorage import Azurite, free_port
from azqueue.testing.processes import ServeProcess
from azqueue.testing.tasks import definition, slugid
from tests.serving import serve
from tests.waiting import eventually

MIB = 1024 * 1024
# How far above where it was the server's memory may stay once unread answers are dropped.
ALLOWED_GROWTH = 50 * MIB
SEND_TIMEOUT = 2.0
# No answer of a listing is larger than this, however large its entries.
LARGEST_PAGE = 2 * MIB
MAX_PAGE_BYTES = 512 * 1024  # a page's entries, besides its last
# The payload of each task of the group: a definition just under the 400,000 characters
# a task may have.
BIG = "x" * 390_000
QUEUE = "prov/unread-answers"


def _rss(server: ServeProcess) -> int:
    """The resident memory of the server's process, in bytes."""
    with open(f"/proc/{server.process.pid}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@asynccontextmanager
async def _server(azurite: Azurite, prefix: str, **extra: str) -> AsyncIterator[ServeProcess]:
    async with serve(azurite, prefix, "", free_port(), AZQUEUE_SEND_TIMEOUT=str(SEND_TIMEOUT),
                     **extra) as server:
        yield server


async def _big_group(http: aiohttp.ClientSession, api: str, size: int) -> tuple[str, set[str]]:
    group, ids = slugid(), {slugid() for _ in range(size)}
    limit = asyncio.Semaphore(4)

    async def create(task_id: str) -> None:
        body = definition(QUEUE, taskGroupId=group, payload={"data": BIG})
        async with limit, http.put(f"{api}/task/{task_id}", json=body) as r:
            assert r.status == 200, await r.text()

    await asyncio.gather(*(create(t) for t in ids))
    return group, ids


async def _pages(anonymous: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    """Every page of a listing, following its continuationToken."""
    pages: list[dict[str, Any]] = []
    query: dict[str, str] = {}
    while True:
        async with anonymous.get(url, params=query) as r:
            assert r.status == 200, await r.text()
            pages.append(await r.json())
            assert r.content_length is not None and r.content_length < LARGEST_PAGE
        if "continuationToken" not in pages[-1]:
            return pages
        query = {"continuationToken": pages[-1]["continuationToken"]}


async def _never_reading(port: int, requests: bytes
                         ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sends ``requests`` and reads nothing (a small receive buffer,
    and a reader that stops taking from the socket after a few KiB)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
    writer.write(requests)
    await writer.drain()
    return reader, writer


async def _memory_back(server: ServeProcess, before: int) -> None:
    await eventually(lambda: _rss(server) - before, lambda grown: grown < ALLOWED_GROWTH,
                     what="the server's memory back within 50 MiB of where it was (growth in "
                          "bytes)", timeout=30.0)


async def _unsent_in_the_kernel(port: int) -> int:
    """Bytes the kernel still holds to send on the server's closed connections of ``port``
    (FIN-WAIT-1: closed by the server, their send buffer not yet taken by the client)."""
    held = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                local, state, queues = fields[1], fields[3], fields[4]
                if int(local.rsplit(":", 1)[1], 16) == port and state == "04":
                    held += int(queues.split(":")[0], 16)
    return held


async def _pinged(anonymous: aiohttp.ClientSession, api: str) -> int:
    try:
        async with anonymous.get(f"{api}/ping") as r:
            return r.status
    except aiohttp.ClientError:
        return 0


async def test_listings_of_big_tasks_left_unread_hold_no_memory_and_page_by_bytes(
        azurite: Azurite, storage_prefix: str, http: aiohttp.ClientSession,
        anonymous: aiohttp.ClientSession) -> None:
    async with _server(azurite, storage_prefix) as server:
        group, ids = await _big_group(http, server.api, 25)
        url = f"{server.api}/task-group/{group}/list"
        pages = await _pages(anonymous, url)
        assert len(pages) > 1
        assert {t["status"]["taskId"] for p in pages for t in p["tasks"]} == ids
        pages = await _pages(anonymous, f"{server.api}/task-queues/{QUEUE.replace('/', '%2F')}"
                                        "/pending")
        assert len(pages) > 1
        assert {t["taskId"] for p in pages for t in p["tasks"]} == ids
        before = _rss(server)

        request = (f"GET /api/queue/v1/task-group/{group}/list HTTP/1.1\r\n"
                   f"Host: 127.0.0.1:{server.port}\r\n\r\n").encode()
        hogs = [await _never_reading(server.port, request) for _ in range(20)]
        try:
            assert await eventually(lambda: _pinged(anonymous, server.api),
                                    lambda status: status == 200,
                                    what="ping answered while the listings lie unread",
                                    timeout=30.0) == 200
            await _memory_back(server, before)
        finally:
            for _, writer in hogs:
                writer.close()
        # A client that reads slowly, but keeps reading, gets the whole answer.
        reader, writer = await _never_reading(server.port, request)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            body = b""
            while len(body) < length:
                await asyncio.sleep(SEND_TIMEOUT / 8)  # 64 KiB every quarter of the timeout
                body += await reader.readexactly(min(64 * 1024, length - len(body)))
        finally:
            writer.close()
        assert len(body) == length > MAX_PAGE_BYTES / 2


async def test_pipelined_requests_never_read_are_cut_off_and_free_their_connections(
        azurite: Azurite, storage_prefix: str, anonymous: aiohttp.ClientSession) -> None:
    cap = 8
    async with _server(azurite, storage_prefix, AZQUEUE_MAX_CONNECTIONS=str(cap)) as server:
        before = _rss(server)
        request = (f"GET /dashboard/app.js HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n"
                   ).encode()
        hogs = [await _never_reading(server.port, request * 200) for _ in range(cap)]
        try:
            await eventually(lambda: _pinged(anonymous, server.api),
                             lambda status: status == 200,
                             what="ping answered 200 once the connections holding unread "
                                  "answers were cut", timeout=30.0)
            await _memory_back(server, before)
            # Cut, not closed: a connection closed gracefully would keep its unsent
            # answers in the kernel (outside the cap) while its client keeps it open.
            assert await _unsent_in_the_kernel(server.port) == 0
        finally:
            for _, writer in hogs:
                writer.close()
