"""Every artifact method of the official client (sync and aio), s3 uploads as document
003 describes them, and the official download helpers for every storage type.

The keys checked are those the reference's output schemas require (services/queue/
schemas/v1 in the taskcluster repository): where a schema forbids additional
properties, the answer has exactly those keys.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import os
import socket
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
import requests
import taskcluster
import taskcluster.aio
import taskcluster.aio.download
import taskcluster.download
from azure.storage.blob.aio import BlobServiceClient
from taskcluster.exceptions import TaskclusterArtifactError, TaskclusterRestFailure

from azqueue.devstorage import Azurite
from azqueue.model.upload import UploadGrant, UploadSigner
from azqueue.testing.tasks import definition, iso, slugid
from tests.servers import ROOT, Server, ServerFactory

CREDENTIALS = {"clientId": ROOT.client_id, "accessToken": ROOT.access_token}
TYPES = {"s3", "object", "reference", "link", "error"}  # artifact-response's enum
LISTED_TYPES = {"s3", "reference", "link", "error"}  # list-artifacts-response's enum
INFO_KEYS = {"storageType", "name", "expires", "contentType"}
HEADER = "x-taskcluster-artifact-storage-type"


def _expires(hours: float = 1) -> str:
    return iso(datetime.now(UTC) + timedelta(hours=hours))


def _upload(put_url: str, content: bytes, content_type: str) -> requests.Response:
    """The PUT of docs/workers/artifacts.md: `content-length`, `content-type` and the data as body."""
    return requests.put(put_url, data=content, headers={
        "Content-Type": content_type, "Content-Length": str(len(content))}, timeout=60)


# -- a worker written from docs/workers/artifacts.md alone ----------------------------


def _document_003_worker(root_url: str, task_queue_id: str, content: bytes) -> str:
    """Claim with claimWork, create an s3 artifact with the claim's temporary credentials,
    PUT it with Content-Type and Content-Length only, report completed."""
    queue = taskcluster.Queue({"rootUrl": root_url, "credentials": CREDENTIALS})
    claims = queue.claimWork(task_queue_id, {"workerGroup": "doc003", "workerId": "w1",
                                             "tasks": 1})["tasks"]
    assert len(claims) == 1
    claim = claims[0]
    task_id, run_id = claim["status"]["taskId"], claim["runId"]
    as_task = taskcluster.Queue({"rootUrl": root_url, "credentials": claim["credentials"]})
    made = as_task.createArtifact(task_id, run_id, "public/build/result.txt", {
        "storageType": "s3", "expires": claim["task"]["expires"], "contentType": "text/plain"})
    assert set(made) == {"storageType", "putUrl", "expires", "contentType"}
    assert made["storageType"] == "s3" and made["contentType"] == "text/plain"
    answer = _upload(made["putUrl"], content, "text/plain")
    assert answer.status_code == 200, answer.text
    as_task.reportCompleted(task_id, run_id)
    return str(task_id)


def _download_everything(root_url: str, task_id: str) -> tuple[bytes, bytes, str]:
    reader = taskcluster.Queue({"rootUrl": root_url})  # a second client, anonymous
    data, content_type = taskcluster.download.downloadArtifactToBuf(
        taskId=task_id, runId=0, name="public/build/result.txt", queueService=reader)
    file = io.BytesIO()
    taskcluster.download.downloadArtifactToFile(
        file=file, taskId=task_id, name="public/build/result.txt", queueService=reader)
    return bytes(data), file.getvalue(), content_type


async def test_a_worker_written_from_document_003_uploads_an_s3_artifact_a_second_client_downloads(
        server: Server) -> None:
    """'Workers should create S3 artifacts using createArtifact(taskId, runId, name,
    {storageType: 's3', expires, contentType}) which returns a putUrl. The file is then
    uploaded to S3 by making a PUT request to the putUrl with content-length,
    content-type and artifact data as body' (docs/workers/artifacts.md)."""
    queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "credentials": CREDENTIALS})
    await queue.createTask(slugid(), definition("prov/doc003"))
    content = b"built by a worker that read docs/workers/artifacts.md\n" * 100
    task_id = await asyncio.to_thread(_document_003_worker, server.root_url, "prov/doc003",
                                      content)
    from_buf, from_file, content_type = await asyncio.to_thread(
        _download_everything, server.root_url, task_id)
    assert from_buf == content and from_file == content and content_type == "text/plain"
    info = await queue.artifactInfo(task_id, 0, "public/build/result.txt")
    assert info["storageType"] == "s3" and info["contentType"] == "text/plain"


# -- every artifact method, sync and aio ---------------------------------------------------


def _every_method_sync(root_url: str) -> None:
    queue = taskcluster.Queue({"rootUrl": root_url, "credentials": CREDENTIALS})
    task_id = slugid()
    queue.createTask(task_id, definition("prov/artmethods"))
    queue.claimTask(task_id, 0, {"workerGroup": "wg", "workerId": "sync"})
    expires = _expires()

    # createArtifact: post-artifact-response, one shape per type.
    s3 = queue.createArtifact(task_id, 0, "public/s3.txt", {
        "storageType": "s3", "expires": expires, "contentType": "text/plain"})
    assert set(s3) == {"storageType", "putUrl", "expires", "contentType"}
    assert _upload(s3["putUrl"], b"s3 content", "text/plain").status_code == 200
    blob = queue.createArtifact(task_id, 0, "public/blob.bin", {
        "storageType": "blob", "expires": expires, "contentType": "application/x-blob"})
    put = requests.put(blob["putUrl"], data=b"blob content", headers=blob["headers"], timeout=60)
    assert put.status_code == 201, put.text
    s3_url = queue.buildUrl("getArtifact", task_id, 0, "public/s3.txt")
    for name, body in (
            ("public/ref", {"storageType": "reference", "expires": expires, "url": s3_url,
                            "contentType": "text/plain"}),
            ("public/link", {"storageType": "link", "expires": expires,
                             "artifact": "public/s3.txt", "contentType": "text/plain"}),
            ("public/missing", {"storageType": "error", "expires": expires,
                                "reason": "file-not-readable-on-worker",
                                "message": "permission denied: out/missing"})):
        assert queue.createArtifact(task_id, 0, name, body) == {"storageType": body["storageType"]}

    # finishArtifact: only our direct-to-Blob type has something to finish.
    assert queue.finishArtifact(task_id, 0, "public/blob.bin", {}) in ({}, None)
    for name in ("public/s3.txt", "public/ref", "public/link", "public/missing"):
        with pytest.raises(TaskclusterRestFailure) as info:
            queue.finishArtifact(task_id, 0, name, {})
        assert info.value.status_code == 400 and "nothing to finish" in info.value.body["message"]

    # artifactInfo / latestArtifactInfo: artifact-response, Taskcluster's types only.
    expected = {"public/s3.txt": ("s3", "text/plain"),
                "public/blob.bin": ("s3", "application/x-blob"),
                "public/ref": ("reference", "text/plain"),
                "public/link": ("link", "text/plain"),
                "public/missing": ("error", "application/json")}
    for name, (kind, content_type) in expected.items():
        for info in (queue.artifactInfo(task_id, 0, name),
                     queue.latestArtifactInfo(task_id, name)):
            assert set(info) == INFO_KEYS and info["storageType"] in TYPES
            assert (info["name"], info["storageType"], info["contentType"]) == (
                name, kind, content_type)

    # listArtifacts / listLatestArtifacts: list-artifacts-response.
    for listing in (queue.listArtifacts(task_id, 0), queue.listLatestArtifacts(task_id)):
        assert set(listing) <= {"artifacts", "continuationToken"}
        assert {a["name"]: a["storageType"] for a in listing["artifacts"]} == {
            name: kind for name, (kind, _) in expected.items()}
        for a in listing["artifacts"]:
            assert set(a) == INFO_KEYS and a["storageType"] in LISTED_TYPES

    # getArtifact / getLatestArtifact: get-artifact-response in the body of a 303.
    for name, kind in (("public/s3.txt", "s3"), ("public/blob.bin", "s3"),
                       ("public/ref", "reference"), ("public/link", "s3")):
        for answer in (queue.getArtifact(task_id, 0, name),
                       queue.getLatestArtifact(task_id, name)):
            assert set(answer) == {"storageType", "url"} and answer["storageType"] == kind

    # artifact / latestArtifact: artifact-content-response.
    for name, kind in (("public/s3.txt", "s3"), ("public/blob.bin", "s3"),
                       ("public/ref", "reference"), ("public/link", "s3")):
        for content in (queue.artifact(task_id, 0, name), queue.latestArtifact(task_id, name)):
            assert set(content) == {"storageType", "url"} and content["storageType"] == kind
    for content in (queue.artifact(task_id, 0, "public/missing"),
                    queue.latestArtifact(task_id, "public/missing")):
        assert content == {"storageType": "error", "reason": "file-not-readable-on-worker",
                           "message": "permission denied: out/missing"}

    # The download helpers follow every type.
    for name, wanted in (("public/s3.txt", b"s3 content"), ("public/blob.bin", b"blob content"),
                         ("public/ref", b"s3 content"), ("public/link", b"s3 content")):
        data, _ = taskcluster.download.downloadArtifactToBuf(
            taskId=task_id, runId=0, name=name, queueService=queue)
        assert bytes(data) == wanted, name
        file = io.BytesIO()
        taskcluster.download.downloadArtifactToFile(file=file, taskId=task_id, name=name,
                                                    queueService=queue)
        assert file.getvalue() == wanted, name
    with pytest.raises(TaskclusterArtifactError) as failed:
        taskcluster.download.downloadArtifactToBuf(taskId=task_id, name="public/missing",
                                                   queueService=queue)
    assert failed.value.reason == "file-not-readable-on-worker"
    # The sync helper leaves the event loop it made open when the download raises.
    asyncio.get_event_loop_policy().get_event_loop().close()
    asyncio.set_event_loop(None)


async def test_every_artifact_method_answers_its_schema_with_the_sync_client(
        server: Server) -> None:
    await asyncio.to_thread(_every_method_sync, server.root_url)


async def test_every_artifact_method_answers_its_schema_with_the_aio_client(
        server: Server) -> None:
    async with taskcluster.aio.createSession() as session:
        queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "credentials": CREDENTIALS},
                                      session=session)
        task_id = slugid()
        await queue.createTask(task_id, definition("prov/artmethods"))
        await queue.claimTask(task_id, 0, {"workerGroup": "wg", "workerId": "aio"})
        expires = _expires()
        s3 = await queue.createArtifact(task_id, 0, "public/s3.json", {
            "storageType": "s3", "expires": expires, "contentType": "application/json"})
        assert set(s3) == {"storageType", "putUrl", "expires", "contentType"}
        async with aiohttp.ClientSession() as plain:
            async with plain.put(s3["putUrl"], data=b'{"ok": true}',
                                 headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200, await r.text()
        assert await queue.createArtifact(task_id, 0, "public/link", {
            "storageType": "link", "expires": expires, "artifact": "public/s3.json"}) == {
            "storageType": "link"}
        assert await queue.createArtifact(task_id, 0, "public/gone", {
            "storageType": "error", "expires": expires, "reason": "file-missing-on-worker",
            "message": "no such file"}) == {"storageType": "error"}

        info = await queue.artifactInfo(task_id, 0, "public/s3.json")
        assert set(info) == INFO_KEYS and info["storageType"] == "s3"
        latest = await queue.latestArtifactInfo(task_id, "public/link")
        assert set(latest) == INFO_KEYS and latest["storageType"] == "link"
        for listing in (await queue.listArtifacts(task_id, 0),
                        await queue.listLatestArtifacts(task_id)):
            assert sorted(a["storageType"] for a in listing["artifacts"]) == [
                "error", "link", "s3"]
        for answer in (await queue.getArtifact(task_id, 0, "public/link"),
                       await queue.getLatestArtifact(task_id, "public/s3.json")):
            assert set(answer) == {"storageType", "url"} and answer["storageType"] == "s3"
        assert set(await queue.artifact(task_id, 0, "public/s3.json")) == {"storageType", "url"}
        assert (await queue.latestArtifact(task_id, "public/gone"))["storageType"] == "error"
        with pytest.raises(TaskclusterRestFailure) as info_400:
            await queue.finishArtifact(task_id, 0, "public/s3.json", {})
        assert info_400.value.status_code == 400

        for name in ("public/s3.json", "public/link"):
            data, content_type = await taskcluster.aio.download.downloadArtifactToBuf(
                taskId=task_id, runId=0, name=name, queueService=queue)
            assert bytes(data) == b'{"ok": true}' and content_type == "application/json"
        file = io.BytesIO()
        await taskcluster.aio.download.downloadArtifactToFile(
            file=file, taskId=task_id, name="public/link", queueService=queue)
        assert file.getvalue() == b'{"ok": true}'
        with pytest.raises(TaskclusterArtifactError):
            await taskcluster.aio.download.downloadArtifactToBuf(
                taskId=task_id, name="public/gone", queueService=queue)


async def test_get_artifact_names_the_storage_type_in_a_header(server: Server) -> None:
    """'Artifact storage type. Note that this is also available in the
    x-taskcluster-artifact-storage-type header' (get-artifact-response)."""
    task_id, queue = await _running(server)
    await queue.createArtifact(task_id, 0, "public/ref", {
        "storageType": "reference", "expires": _expires(), "contentType": "text/html",
        "url": "https://example.com/"})
    await queue.createArtifact(task_id, 0, "public/err", {
        "storageType": "error", "expires": _expires(), "reason": "too-large-file-on-worker",
        "message": "12 GB"})
    async with aiohttp.ClientSession() as plain:
        async with plain.get(f"{server.root_url}/api/queue/v1/task/{task_id}/runs/0/"
                             "artifacts/public/ref", allow_redirects=False) as r:
            assert r.status == 303 and r.headers[HEADER] == "reference"
        async with plain.get(f"{server.root_url}/api/queue/v1/task/{task_id}/artifacts/"
                             "public/err", allow_redirects=False) as r:
            assert r.status == 424 and r.headers[HEADER] == "error"
            assert "too-large-file-on-worker" in (await r.json())["message"]


async def test_object_artifacts_are_refused_with_what_to_use_instead(server: Server) -> None:
    task_id, queue = await _running(server)
    with pytest.raises(TaskclusterRestFailure) as info:
        await queue.createArtifact(task_id, 0, "public/obj", {
            "storageType": "object", "expires": _expires(), "contentType": "text/plain"})
    assert info.value.status_code == 400
    assert "object service" in info.value.body["message"]
    assert "storageType 's3'" in info.value.body["message"]


# -- the upload URL refuses what it does not allow, and stores nothing --------------------


async def _running(server: Server) -> tuple[str, taskcluster.aio.Queue]:
    queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "credentials": CREDENTIALS})
    task_id = slugid()
    await queue.createTask(task_id, definition("prov/artupload"))
    await queue.claimTask(task_id, 0, {"workerGroup": "wg", "workerId": "w"})
    return task_id, queue


async def _nothing_stored(queue: taskcluster.aio.Queue, task_id: str, name: str) -> None:
    with pytest.raises(TaskclusterRestFailure) as info:
        await queue.artifact(task_id, 0, name)
    assert info.value.status_code == 404 and "not been uploaded" in info.value.body["message"]


async def test_a_put_with_the_wrong_content_type_is_refused_and_stores_nothing(
        server: Server) -> None:
    """'the ContentType header must be set the value specified below'
    (post-artifact-response, putUrl)."""
    task_id, queue = await _running(server)
    made = await queue.createArtifact(task_id, 0, "public/a.json", {
        "storageType": "s3", "expires": _expires(), "contentType": "application/json"})
    async with aiohttp.ClientSession() as plain:
        async with plain.put(made["putUrl"], data=b"{}", headers={"Content-Type": "text/plain"}
                             ) as r:
            assert r.status == 400
            message = (await r.json())["message"]
            assert "Content-Type: application/json" in message and "'text/plain'" in message
    await _nothing_stored(queue, task_id, "public/a.json")


async def test_a_put_without_content_length_is_411_and_stores_nothing(server: Server) -> None:
    """'the Content-Length must be specified correctly' (post-artifact-response, putUrl)."""
    task_id, queue = await _running(server)
    made = await queue.createArtifact(task_id, 0, "public/a.txt", {
        "storageType": "s3", "expires": _expires(), "contentType": "text/plain"})

    async def chunked() -> Any:
        yield b"sent without a length"

    async with aiohttp.ClientSession() as plain:
        async with plain.put(made["putUrl"], data=chunked(),
                             headers={"Content-Type": "text/plain"}) as r:
            assert r.status == 411
            assert "Content-Length" in (await r.json())["message"]
    await _nothing_stored(queue, task_id, "public/a.txt")


async def test_a_put_of_another_length_than_declared_is_refused_and_stores_nothing(
        server: Server) -> None:
    task_id, queue = await _running(server)
    made = await queue.createArtifact(task_id, 0, "public/a.txt", {
        "storageType": "s3", "expires": _expires(), "contentType": "text/plain",
        "contentLength": 10})
    for body in (b"too short", b"far too long for it"):
        async with aiohttp.ClientSession() as plain:
            async with plain.put(made["putUrl"], data=body,
                                 headers={"Content-Type": "text/plain"}) as r:
                assert r.status == 400
                assert "send exactly 10 bytes" in (await r.json())["message"]
    await _nothing_stored(queue, task_id, "public/a.txt")
    async with aiohttp.ClientSession() as plain:
        async with plain.put(made["putUrl"], data=b"0123456789",
                             headers={"Content-Type": "text/plain"}) as r:
            assert r.status == 200


async def test_a_body_cut_short_of_its_content_length_stores_nothing(server: Server) -> None:
    task_id, queue = await _running(server)
    made = await queue.createArtifact(task_id, 0, "public/cut.bin", {
        "storageType": "s3", "expires": _expires(), "contentType": "application/octet-stream"})
    url = urlsplit(made["putUrl"])
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write((f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                  "Content-Type: application/octet-stream\r\nContent-Length: 100000\r\n\r\n"
                  ).encode() + b"x" * 1000)
    await writer.drain()
    writer.transport.get_extra_info("socket").shutdown(socket.SHUT_WR)
    await reader.read()  # the server is done with the connection
    writer.close()
    await _nothing_stored(queue, task_id, "public/cut.bin")


async def test_a_put_longer_than_a_blob_can_hold_is_refused_before_its_body(
        server: Server) -> None:
    task_id, queue = await _running(server)
    made = await queue.createArtifact(task_id, 0, "public/huge.bin", {
        "storageType": "s3", "expires": _expires(), "contentType": "application/octet-stream"})
    url = urlsplit(made["putUrl"])
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write((f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                  "Content-Type: application/octet-stream\r\n"
                  f"Content-Length: {300 * 10**9}\r\nConnection: close\r\n\r\n").encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n")
    writer.close()
    assert head.startswith(b"HTTP/1.1 413")
    await _nothing_stored(queue, task_id, "public/huge.bin")


async def test_a_tampered_or_expired_upload_url_is_refused_and_stores_nothing(
        server: Server) -> None:
    task_id, queue = await _running(server)
    made = await queue.createArtifact(task_id, 0, "public/a.txt", {
        "storageType": "s3", "expires": _expires(), "contentType": "text/plain"})
    await queue.createArtifact(task_id, 0, "public/b.txt", {
        "storageType": "s3", "expires": _expires(), "contentType": "text/plain"})
    tampered = [made["putUrl"].replace("public%2Fa.txt", "public%2Fb.txt"),
                made["putUrl"].replace("contentType=text%2Fplain", "contentType=text%2Fhtml")]
    signer = UploadSigner(server.settings.tip_secrets)
    grant = UploadGrant(task_id, 0, "public/a.txt", "text/plain",
                        datetime.now(UTC) - timedelta(seconds=5))
    expired = grant.url(server.root_url, signer.sign(grant))
    async with aiohttp.ClientSession() as plain:
        for url, content_type, wanted in ((tampered[0], "text/plain", "does not match"),
                                          (tampered[1], "text/html", "does not match"),
                                          (expired, "text/plain", "expired")):
            async with plain.put(url, data=b"x", headers={"Content-Type": content_type}) as r:
                assert r.status == 401, url
                assert wanted in (await r.json())["message"]
    await _nothing_stored(queue, task_id, "public/a.txt")
    await _nothing_stored(queue, task_id, "public/b.txt")


@pytest.mark.parametrize(("size", "blocks"), [(20 * 1024 * 1024, 5), (2 * 1024 * 1024, 1)],
                         ids=["20MiB", "2MiB"])
async def test_a_large_upload_is_staged_in_blocks_and_reads_back_whole(
        server: Server, azurite: Azurite, size: int, blocks: int) -> None:
    """A body over 1 MiB goes to Blob storage in blocks of at most 4 MiB (never held
    whole), committed once. (Of 2 MiB: stored as one Put Blob, it made aiohttp warn of a
    large body given as bytes, which this suite's warnings-as-errors answered with 500.)"""
    task_id, queue = await _running(server)
    content = hashlib.sha256(b"seed").digest() * (size // 32)
    made = await queue.createArtifact(task_id, 0, "public/big.bin", {
        "storageType": "s3", "expires": _expires(), "contentType": "application/octet-stream",
        "contentLength": len(content)})
    async with aiohttp.ClientSession() as plain:
        async with plain.put(made["putUrl"], data=io.BytesIO(content),
                             headers={"Content-Type": "application/octet-stream"}) as r:
            assert r.status == 200, await r.text()
    data, _ = await taskcluster.aio.download.downloadArtifactToBuf(
        taskId=task_id, runId=0, name="public/big.bin", queueService=queue)
    assert hashlib.sha256(data).digest() == hashlib.sha256(content).digest()
    async with BlobServiceClient.from_connection_string(azurite.connection_string) as service:
        container = f"{server.settings.storage.prefix}-artifacts"
        blob = service.get_blob_client(container, f"{task_id}/0/public/big.bin")
        committed, _ = await blob.get_block_list("all")
        assert len(committed) == blocks and max(b.size for b in committed) <= 4 * 1024 * 1024


async def _raw(url: str) -> tuple[bytes, str | None]:
    """What a GET of ``url`` answers, as sent (not decoded), and its Content-Encoding."""
    async with aiohttp.ClientSession(auto_decompress=False) as plain:
        async with plain.get(url) as r:
            assert r.status == 200, await r.text()
            return await r.read(), r.headers.get("Content-Encoding")


@pytest.mark.parametrize("size", [1000, 6 * 1024 * 1024], ids=["one-request", "in-blocks"])
async def test_an_upload_with_a_content_encoding_is_stored_as_sent_and_served_with_it(
        server: Server, size: int) -> None:
    """As S3 does for scriptworker's gzipped logs: Content-Length counts the bytes on the
    wire, the stored bytes are those, and a read answers them with the same encoding, so
    an HTTP client that decodes gets the original back."""
    task_id, queue = await _running(server)
    original = b"a line of a log\n" * 64 + os.urandom(size)  # beyond a block, once gzipped
    sent = gzip.compress(original)
    made = await queue.createArtifact(task_id, 0, "public/logs/live_backing.log", {
        "storageType": "s3", "expires": _expires(), "contentType": "text/plain"})
    async with aiohttp.ClientSession() as plain:
        async with plain.put(made["putUrl"], data=io.BytesIO(sent), headers={
                "Content-Type": "text/plain", "Content-Encoding": "gzip"}) as r:
            assert r.status == 200, await r.text()
    url = (await queue.artifact(task_id, 0, "public/logs/live_backing.log"))["url"]
    assert await _raw(url) == (sent, "gzip")
    data, _ = await taskcluster.aio.download.downloadArtifactToBuf(
        taskId=task_id, runId=0, name="public/logs/live_backing.log", queueService=queue)
    assert hashlib.sha256(data).digest() == hashlib.sha256(original).digest()


async def test_a_blob_artifact_put_with_a_content_encoding_is_served_with_it(
        server: Server) -> None:
    """Blob storage keeps the encoding a Put Blob declares in `x-ms-blob-content-encoding`
    (Azurite ignores a plain `Content-Encoding` there) and the read URL
    answers it, from the snapshot taken at finishArtifact."""
    task_id, queue = await _running(server)
    sent = gzip.compress(b"a line of a log\n" * 1000)
    made = await queue.createArtifact(task_id, 0, "public/chain-of-trust.json", {
        "storageType": "blob", "expires": _expires(), "contentType": "application/json"})
    async with aiohttp.ClientSession() as plain:
        async with plain.put(made["putUrl"], data=sent, headers={
                **made["headers"], "x-ms-blob-content-encoding": "gzip"}) as r:
            assert r.status == 201, await r.text()
    await queue.finishArtifact(task_id, 0, "public/chain-of-trust.json", {})
    url = (await queue.artifact(task_id, 0, "public/chain-of-trust.json"))["url"]
    assert await _raw(url) == (sent, "gzip")


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_an_api_body_with_a_content_encoding_is_decoded(server: Server,
                                                              encoding: str) -> None:
    """Bodies are read as sent (for uploads); an API body's encoding is undone before it
    is read as JSON, and one that is not what its Content-Encoding says is a 400."""
    task_id, _ = await _running(server)
    raw = json.dumps({"taskIds": [task_id]}).encode()
    body = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
    async with aiohttp.ClientSession() as plain:
        async with plain.post(f"{server.api}/tasks", data=body, headers={
                "Content-Type": "application/json", "Content-Encoding": encoding}) as r:
            assert r.status == 200, await r.text()
            assert [t["taskId"] for t in (await r.json())["tasks"]] == [task_id]
        async with plain.post(f"{server.api}/tasks", data=raw, headers={
                "Content-Type": "application/json", "Content-Encoding": encoding}) as r:
            assert r.status == 400 and encoding in (await r.json())["message"]


async def test_no_upload_after_the_run_is_reported_completed(server: Server) -> None:
    """'Artifacts can be uploaded until reportCompleted or reportFailed is called' (docs/workers/artifacts.md):
    a putUrl handed out before is refused after, and the content stays as it was."""
    task_id, queue = await _running(server)
    made = await queue.createArtifact(task_id, 0, "public/final.txt", {
        "storageType": "s3", "expires": _expires(), "contentType": "text/plain"})
    async with aiohttp.ClientSession() as plain:
        for content in (b"draft", b"final"):  # while the run takes artifacts: replaced
            async with plain.put(made["putUrl"], data=content,
                                 headers={"Content-Type": "text/plain"}) as r:
                assert r.status == 200
        await queue.reportCompleted(task_id, 0)
        async with plain.put(made["putUrl"], data=b"changed",
                             headers={"Content-Type": "text/plain"}) as r:
            assert r.status == 409
            assert "completed" in (await r.json())["message"]
    data, _ = await taskcluster.aio.download.downloadArtifactToBuf(
        taskId=task_id, runId=0, name="public/final.txt", queueService=queue)
    assert bytes(data) == b"final"


async def test_two_uploads_of_one_artifact_at_once_leave_one_of_them_whole(
        server: Server) -> None:
    task_id, queue = await _running(server)
    made = await queue.createArtifact(task_id, 0, "public/twice.bin", {
        "storageType": "s3", "expires": _expires(), "contentType": "application/octet-stream"})
    size = 9 * 1024 * 1024  # three blocks each
    bodies = [bytes([i]) * size for i in (1, 2)]

    async def put(plain: aiohttp.ClientSession, body: bytes) -> tuple[int, str]:
        async with plain.put(made["putUrl"], data=io.BytesIO(body),
                             headers={"Content-Type": "application/octet-stream"}) as r:
            return r.status, (await r.json()).get("message", "")

    async with aiohttp.ClientSession() as plain:
        answers = await asyncio.gather(*(put(plain, body) for body in bodies))
    # Both stored in turn, or one refused (409: the other was under way, or finished first)
    # storing nothing.
    assert [status for status, _ in answers].count(200) >= 1, answers
    for status, message in answers:
        assert status == 200 or (status == 409 and "another upload" in message), answers
    data, _ = await taskcluster.aio.download.downloadArtifactToBuf(
        taskId=task_id, runId=0, name="public/twice.bin", queueService=queue)
    assert bytes(data) in bodies


async def test_an_upload_that_stops_sending_is_cut_off_and_stores_nothing(
        make_server: ServerFactory) -> None:
    """A PUT that announces 1000 bytes, sends 10 and then nothing more is answered (400,
    saying so) once no byte came for the upload read timeout; the artifact stays not
    uploaded."""
    server = await make_server(upload_read_timeout=1.0)
    task_id, queue = await _running(server)
    made = await queue.createArtifact(task_id, 0, "public/stalled.bin", {
        "storageType": "s3", "expires": _expires(), "contentType": "application/octet-stream"})
    url = urlsplit(made["putUrl"])
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write((f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                      "Content-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\n"
                      ).encode() + b"x" * 10)
        await writer.drain()
        # The socket stays open and silent; the guard only keeps a hang from lasting the
        # whole test timeout.
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=60)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        body = await reader.readexactly(length)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 400"), head
    assert b"nothing was stored" in body and b"1000" in body, body
    await _nothing_stored(queue, task_id, "public/stalled.bin")


async def test_an_artifact_past_its_expires_is_not_served_before_the_expiry_sweep(
        server: Server) -> None:
    """As Taskcluster's getArtifact and artifact (content): an artifact whose `expires`
    has passed answers 410 ResourceExpired at once, also through a link, while its info
    and the listings show it until the expiry resolver deletes it."""
    task_id, queue = await _running(server)
    await queue.createArtifact(task_id, 0, "public/old", {
        "storageType": "reference", "expires": iso(datetime.now(UTC) - timedelta(seconds=2)),
        "url": "https://example.com/old"})
    await queue.createArtifact(task_id, 0, "public/to-old", {
        "storageType": "link", "expires": _expires(), "artifact": "public/old"})
    calls = [lambda: queue.getArtifact(task_id, 0, "public/old"),
             lambda: queue.getLatestArtifact(task_id, "public/old"),
             lambda: queue.artifact(task_id, 0, "public/old"),
             lambda: queue.latestArtifact(task_id, "public/old"),
             lambda: queue.getArtifact(task_id, 0, "public/to-old")]
    for call in calls:
        with pytest.raises(TaskclusterRestFailure) as info:
            await call()
        assert info.value.status_code == 410, info.value.body
        assert info.value.body["code"] == "ResourceExpired"
        assert "expired" in info.value.body["message"]
    assert (await queue.artifactInfo(task_id, 0, "public/old"))["name"] == "public/old"


async def test_creating_an_artifact_again_with_a_later_expires_extends_its_life(
        server: Server) -> None:
    """As in Taskcluster's createArtifact: an artifact's `expires` can be extended but not
    shortened; any other difference is still a conflict."""
    task_id, queue = await _running(server)
    now = datetime.now(UTC)
    first, later, latest = (iso(now + timedelta(hours=h)) for h in (1, 2, 3))
    body = {"storageType": "s3", "expires": first, "contentType": "text/plain"}
    await queue.createArtifact(task_id, 0, "public/kept.txt", body)
    made = await queue.createArtifact(task_id, 0, "public/kept.txt", {**body, "expires": later})
    assert made["storageType"] == "s3" and made["putUrl"]
    info = await queue.artifactInfo(task_id, 0, "public/kept.txt")
    assert info["expires"] == later
    # Asked again with the later expires: the same; with the first one: shorter, refused.
    await queue.createArtifact(task_id, 0, "public/kept.txt", {**body, "expires": later})
    for changed in ({**body, "expires": first},
                    {**body, "expires": latest, "contentType": "text/html"}):
        with pytest.raises(TaskclusterRestFailure) as refused:
            await queue.createArtifact(task_id, 0, "public/kept.txt", changed)
        assert refused.value.status_code == 409, refused.value.body
    assert (await queue.artifactInfo(task_id, 0, "public/kept.txt"))["expires"] == later
