"""``blob`` artifacts with ``blobType: append``: created empty, finished at once, readable
while they grow by Append Block through the SAS putUrl (the live log's protocol)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from azqueue.testing import sas
from azqueue.testing.tasks import iso
from tests.integration.test_artifacts import _running_task
from tests.servers import Server

NAME = "public/logs/live.log"
TEXT = "text/plain; charset=utf-8"


def _body(**extra: Any) -> dict[str, Any]:
    return {"storageType": "blob", "blobType": "append", "contentType": TEXT,
            "expires": iso(datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=50)),
            **extra}


async def _read(session: aiohttp.ClientSession, server: Server, task_id: str) -> bytes:
    async with session.get(f"{server.api}/task/{task_id}/runs/0/artifacts/{NAME}") as r:
        assert r.status == 200, await r.text()
        return await r.read()


async def _finish(http: aiohttp.ClientSession, server: Server, task_id: str) -> int:
    async with http.put(f"{server.api}/task/{task_id}/runs/0/artifacts/{NAME}", json={}) as r:
        return r.status


async def _append(session: aiohttp.ClientSession, put_url: str, data: bytes,
                  position: int) -> tuple[int, str]:
    async with session.put(f"{put_url}&comp=appendblock", data=data,
                           headers={"x-ms-blob-condition-appendpos": str(position)}) as r:
        return r.status, r.headers.get("x-ms-error-code", "")


async def test_an_append_blob_is_readable_from_creation_and_a_retried_append_adds_nothing(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession) -> None:
    task_id = await _running_task(http, server)
    code, made = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/artifacts/{NAME}",
                                _body())
    assert code == 200, made
    assert made["headers"] == {"x-ms-blob-type": "AppendBlob", "Content-Type": TEXT}
    assert "sp=acw" in made["putUrl"]  # add, create, write: no read, no delete
    async with anonymous.put(made["putUrl"], data=b"", headers={**made["headers"],
                                                                 "If-None-Match": "*"}) as r:
        assert r.status == 201, await r.text()
    assert await _finish(http, server, task_id) == 200
    assert await _read(anonymous, server, task_id) == b""  # present, and empty so far

    assert await _append(anonymous, made["putUrl"], b"first line\n", 0) == (201, "")
    assert await _read(anonymous, server, task_id) == b"first line\n"
    # The same append again (its answer was lost, say): refused, nothing doubled.
    assert await _append(anonymous, made["putUrl"], b"first line\n", 0) == (
        412, "AppendPositionConditionNotMet")
    assert await _append(anonymous, made["putUrl"], "ünïcode\n".encode(), 11) == (201, "")
    assert await _read(anonymous, server, task_id) == "first line\nünïcode\n".encode()
    # Creating the blob again is refused too: a retried creation cannot empty the log.
    async with anonymous.put(made["putUrl"], data=b"", headers={**made["headers"],
                                                                 "If-None-Match": "*"}) as r:
        assert (r.status, r.headers.get("x-ms-error-code")) == (409, "BlobAlreadyExists")
    assert await _read(anonymous, server, task_id) == "first line\nünïcode\n".encode()


async def test_creating_again_gives_a_fresh_url_and_keeps_the_log_another_blob_type_is_409(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession) -> None:
    task_id = await _running_task(http, server)
    url = f"{server.api}/task/{task_id}/runs/0/artifacts/{NAME}"
    body = _body()
    code, made = await sas.post(http, url, body)
    assert code == 200, made
    async with anonymous.put(made["putUrl"], data=b"", headers=made["headers"]) as r:
        assert r.status == 201, await r.text()
    assert await _finish(http, server, task_id) == 200
    assert await _append(anonymous, made["putUrl"], b"before\n", 0) == (201, "")

    code, again = await sas.post(http, url, body)  # as a worker does before putUrl expires
    assert code == 200, again
    assert again["expires"] >= made["expires"] and "sp=acw" in again["putUrl"]
    assert await _read(anonymous, server, task_id) == b"before\n"  # still present
    assert await _append(anonymous, again["putUrl"], b"after\n", 7) == (201, "")
    assert await _read(anonymous, server, task_id) == b"before\nafter\n"

    for different in (_body(blobType="block", expires=body["expires"]),
                      {k: v for k, v in body.items() if k != "blobType"}):
        code, refused = await sas.post(http, url, different)
        assert code == 409, refused
        assert "blobType" in refused["message"]
    assert await _read(anonymous, server, task_id) == b"before\nafter\n"


async def test_blob_type_is_only_for_blob_artifacts_and_only_block_or_append(
        server: Server, http: aiohttp.ClientSession) -> None:
    task_id = await _running_task(http, server)
    url = f"{server.api}/task/{task_id}/runs/0/artifacts/public/other.txt"
    code, refused = await sas.post(http, url, _body(blobType="page"))
    assert code == 400 and "blobType" in refused["message"], refused
    code, refused = await sas.post(http, url, _body(storageType="s3"))
    assert code == 400 and "`blobType` cannot be given with storageType 's3'" in refused[
        "message"], refused
    code, made = await sas.post(http, url, _body(blobType="block"))
    assert code == 200 and made["headers"]["x-ms-blob-type"] == "BlockBlob", made
    assert "sp=cw" in made["putUrl"]
