"""deploy/nginx/azqueue.conf in front of a server, run by Debian's nginx with a
self-signed certificate made here, only its address, certificate and upstream replaced:
the official client goes through it (Hawk with the Host it signed, a task queue id with
`%2F`, claimWork's long poll, an `s3` upload streamed to the server as it is sent), and
it holds the limits the threat model asks of the proxy (body sizes, headers' time,
connections and requests per address).

Skipped without nginx (scripts/bootstrap --test installs it), except under CI."""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import shutil
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
import taskcluster
import taskcluster.download

from azqueue.devstorage import free_port
from azqueue.model import upload
from azqueue.testing.tasks import definition, slugid
from tests.servers import IN_CI, ROOT, Server, ServerFactory
from tests.tls import self_signed
from tests.waiting import eventually

CONF = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "azqueue.conf"
CREDENTIALS = {"clientId": ROOT.client_id, "accessToken": ROOT.access_token}


@dataclass
class Proxy:
    root_url: str
    port: int
    ca_file: Path
    server: Server

    def queue(self, credentials: dict[str, str] | None = CREDENTIALS) -> Any:
        options: dict[str, Any] = {"rootUrl": self.root_url, "maxRetries": 0}
        if credentials:
            options["credentials"] = credentials
        return taskcluster.Queue(options)

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port, ssl=self.tls(),
                                             server_hostname="localhost")


def configured(directory: Path, port: int, upstream: int, cert: Path, key: Path) -> Path:
    """The shipped file with the address, certificate and upstream replaced (each
    exactly once), in a main configuration of this directory's own."""
    text = CONF.read_text()
    for old, new in (("listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;"),
                     ("server 127.0.0.1:8080;", f"server 127.0.0.1:{upstream};"),
                     ("server_name queue.example.com;", "server_name localhost;"),
                     ("/etc/nginx/tls/queue.example.com.crt", str(cert)),
                     ("/etc/nginx/tls/queue.example.com.key", str(key))):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    (directory / "azqueue.conf").write_text(text)
    temp = "\n".join(f"  {kind}_temp_path {directory / kind};"
                     for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    main = directory / "nginx.conf"
    main.write_text(f"""{'user root;' if os.geteuid() == 0 else ''}
daemon off;
worker_processes 1;
pid {directory / 'nginx.pid'};
error_log {directory / 'error.log'} info;
events {{}}
http {{
  access_log {directory / 'access.log'};
{temp}
  include {directory / 'azqueue.conf'};
}}
""")
    return main


@pytest.fixture
async def nginx(make_server: ServerFactory, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Proxy]:
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists()
                                      else None)
    if nginx is None:
        message = "nginx is missing: scripts/bootstrap --test installs Debian's"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    port = free_port()
    root_url = f"https://localhost:{port}"
    server = await make_server(root_url=root_url, claim_work_wait=20.0,
                               upload_read_timeout=2.0)
    cert, key = self_signed(tmp_path)
    main = configured(tmp_path, port, server.settings.port, cert, key)
    process = await asyncio.create_subprocess_exec(nginx, "-p", str(tmp_path), "-c", str(main))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))  # the official client's requests
    here = Proxy(root_url, port, cert, server)
    try:
        await eventually(lambda: _answers(here), what=f"nginx answering on {port}")
        yield here
    finally:
        process.terminate()
        await process.wait()


async def _answers(proxy: Proxy) -> bool:
    try:
        async with aiohttp.ClientSession() as session, session.get(
                f"{proxy.root_url}/__lbheartbeat__", ssl=proxy.tls()) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def test_the_official_client_through_the_proxy(nginx: Proxy) -> None:
    """claimWork waits on the server for a task queue whose id the client writes with
    `%2F`, and gets the task a Hawk-signed createTask made meanwhile; its s3 artifact,
    over the API's body limit, is uploaded through the putUrl and downloaded whole."""
    task_queue_id = f"prov/nginx-{secrets.token_hex(4)}"
    queue, task_id = nginx.queue(), slugid()
    claiming = asyncio.create_task(asyncio.to_thread(
        queue.claimWork, task_queue_id, {"workerGroup": "wg", "workerId": "w1", "tasks": 1}))
    waiting = nginx.server.services.work.waiting
    await eventually(lambda: waiting.entry(task_queue_id).demand() == 1,
                     what="claimWork waiting on the server")
    await asyncio.to_thread(queue.createTask, task_id, definition(task_queue_id))
    claims = (await claiming)["tasks"]
    assert [c["status"]["taskId"] for c in claims] == [task_id]
    as_task = nginx.queue(claims[0]["credentials"])
    made = await asyncio.to_thread(as_task.createArtifact, task_id, 0, "public/big.bin", {
        "storageType": "s3", "expires": claims[0]["task"]["expires"],
        "contentType": "application/octet-stream"})
    assert made["putUrl"].startswith(f"{nginx.root_url}{upload.PATH}/")
    content = os.urandom(5 * 1024 * 1024)  # over client_max_body_size of the API
    answer = await asyncio.to_thread(requests.put, made["putUrl"], data=content, timeout=120,
                                     headers={"Content-Type": "application/octet-stream"})
    assert answer.status_code == 200, answer.text
    await asyncio.to_thread(as_task.reportCompleted, task_id, 0)
    data, _ = await asyncio.to_thread(
        taskcluster.download.downloadArtifactToBuf, taskId=task_id, runId=0,
        name="public/big.bin", queueService=nginx.queue(None))
    assert bytes(data) == content


async def test_an_upload_reaches_the_server_as_it_is_sent(nginx: Proxy) -> None:
    """Half an upload's body, then nothing: the server, which has been reading it as it
    came, gives up after its AZQUEUE_UPLOAD_READ_TIMEOUT (2 s here) and its 400 comes
    back through the proxy, which would still be waiting for the rest (60 s) had it
    buffered the body."""
    queue, task_id = nginx.queue(), slugid()
    task_queue_id = f"prov/nginx-{secrets.token_hex(4)}"
    await asyncio.to_thread(queue.createTask, task_id, definition(task_queue_id))
    claim = (await asyncio.to_thread(queue.claimWork, task_queue_id, {
        "workerGroup": "wg", "workerId": "w1", "tasks": 1}))["tasks"][0]
    made = await asyncio.to_thread(nginx.queue(claim["credentials"]).createArtifact, task_id,
                                   0, "public/half.bin", {
                                       "storageType": "s3", "expires": claim["task"]["expires"],
                                       "contentType": "application/octet-stream"})
    target = made["putUrl"].removeprefix(nginx.root_url)
    reader, writer = await nginx.connect()
    writer.write(f"PUT {target} HTTP/1.1\r\nHost: localhost:{nginx.port}\r\n"
                 "Content-Type: application/octet-stream\r\nContent-Length: 2000000\r\n\r\n"
                 .encode() + b"x" * 1_000_000)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 45)
    body = await asyncio.wait_for(reader.read(4096), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 400"), head
    assert b"application/json" in head and b'"code"' in body, (head, body)


async def test_api_bodies_over_the_limit_are_refused_by_the_proxy(nginx: Proxy) -> None:
    async with aiohttp.ClientSession() as session, session.put(
            f"{nginx.root_url}/api/queue/v1/task/{slugid()}", data=io.BytesIO(b"{" * (4 * 1024 * 1024)),
            ssl=nginx.tls()) as r:
        assert r.status == 413
        assert r.headers["Content-Type"].startswith("text/html")  # nginx's, not azqueue's


@pytest.mark.slow
async def test_headers_that_do_not_finish_are_cut(nginx: Proxy) -> None:
    reader, writer = await nginx.connect()
    writer.write(f"GET /api/queue/v1/ping HTTP/1.1\r\nHost: localhost:{nginx.port}\r\n".encode())
    await writer.drain()
    rest = await asyncio.wait_for(reader.read(), 60)  # until the proxy closes it
    writer.close()
    assert not rest.startswith(b"HTTP/1.1 200"), rest


async def test_connections_per_address_are_capped(nginx: Proxy) -> None:
    """Fifty requests under way from one address (their bodies trickling in) take every
    connection the proxy gives it: the next request is answered 429."""
    held = []
    for _ in range(50):
        reader, writer = await nginx.connect()
        writer.write(f"POST /api/queue/v1/task/{slugid()}/cancel HTTP/1.1\r\n"
                     f"Host: localhost:{nginx.port}\r\nContent-Type: application/json\r\n"
                     "Content-Length: 1000\r\n\r\n{".encode())
        await writer.drain()
        held.append(writer)
    trickle = asyncio.create_task(_trickle(held))
    try:
        async def status() -> int:
            async with aiohttp.ClientSession() as session, session.get(
                    f"{nginx.root_url}/api/queue/v1/ping", ssl=nginx.tls()) as r:
                return r.status
        assert await eventually(status, lambda s: s == 429, what="the 51st refused") == 429
    finally:
        trickle.cancel()
        for writer in held:
            writer.close()


async def _trickle(writers: list[asyncio.StreamWriter]) -> None:
    """A byte every 2 s on each connection, within the proxy's 10 s between reads."""
    while True:
        await asyncio.sleep(2)
        for writer in writers:
            writer.write(b" ")


async def test_requests_per_address_are_rate_limited(nginx: Proxy) -> None:
    """Past 50 a second (and a burst of 100) from one address, requests are answered 429
    until the rate falls; at most 3,000 are sent."""
    statuses: list[int] = []
    connector = aiohttp.TCPConnector(limit=20, ssl=nginx.tls())
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one() -> None:
            async with session.get(f"{nginx.root_url}/__lbheartbeat__") as r:
                statuses.append(r.status)
        for _ in range(30):
            await asyncio.gather(*(one() for _ in range(100)))
            if 429 in statuses:
                break
    assert 429 in statuses and 200 in statuses, sorted(set(statuses))
