"""Artifacts on Azure Blob storage (the upload rules of docs/workers/artifacts.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
import taskcluster
import taskcluster.aio
import taskcluster.download
from taskcluster.exceptions import TaskclusterRestFailure

from azqueue.testing import sas
from azqueue.testing.tasks import create, definition, iso
from tests.servers import ROOT, Server, ServerFactory

CREDENTIALS = {"clientId": ROOT.client_id, "accessToken": ROOT.access_token}


def _expires(hours: float = 1) -> str:
    return iso(datetime.now(UTC) + timedelta(hours=hours))


async def _running_task(http: aiohttp.ClientSession, server: Server) -> str:
    task_id = await create(http, server.api, definition("prov/art"))
    code, body = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/claim",
                                {"workerGroup": "wg", "workerId": "w"})
    assert code == 200, body
    return task_id


async def _create(http: aiohttp.ClientSession, server: Server, task_id: str, name: str,
                  body: dict[str, Any], run_id: int = 0) -> tuple[int, dict[str, Any]]:
    return await sas.post(http, f"{server.api}/task/{task_id}/runs/{run_id}/artifacts/{name}", body)


async def test_blob_upload_through_put_url_and_download_two_ways(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession) -> None:
    task_id = await _running_task(http, server)
    content = b"hello artifact\n" * 1000
    code, made = await _create(http, server, task_id, "public/logs/live.log",
                               {"storageType": "blob", "expires": _expires(),
                                "contentType": "text/plain; charset=utf-8"})
    assert code == 200, made
    assert "sp=cw" in made["putUrl"]  # create and write only
    async with anonymous.put(made["putUrl"], data=content, headers=made["headers"]) as r:
        assert r.status == 201, await r.text()
    async with http.put(f"{server.api}/task/{task_id}/runs/0/artifacts/public/logs/live.log",
                        json={}) as r:
        assert r.status == 200, await r.text()

    # getArtifact redirects (303) to a short-lived read URL.
    async with anonymous.get(f"{server.api}/task/{task_id}/runs/0/artifacts/public/logs/live.log",
                             allow_redirects=False) as r:
        assert r.status == 303
        location = r.headers["Location"]
        assert "sp=r" in location
    async with anonymous.get(location) as r:
        assert await r.read() == content
        assert r.headers["Content-Type"] == "text/plain; charset=utf-8"
    async with anonymous.get(f"{server.api}/task/{task_id}/artifacts/public%2Flogs%2Flive.log") as r:
        assert await r.read() == content  # getLatestArtifact, followed

    # The official client's download helper, unmodified.
    queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "credentials": CREDENTIALS})
    data, content_type = await taskcluster.aio.download.downloadArtifactToBuf(
        taskId=task_id, runId=0, name="public/logs/live.log", queueService=queue)
    assert bytes(data) == content and content_type == "text/plain"
    info = await queue.artifactInfo(task_id, 0, "public/logs/live.log")
    # What clients read is Taskcluster's vocabulary: a direct-to-Blob artifact is `s3`.
    assert info["contentType"] == "text/plain; charset=utf-8" and info["storageType"] == "s3"


async def test_private_artifacts_need_get_artifact_scope_or_a_signed_url(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession) -> None:
    task_id = await _running_task(http, server)
    code, made = await _create(http, server, task_id, "private/secret.txt",
                               {"storageType": "blob", "expires": _expires(),
                                "contentType": "text/plain"})
    async with anonymous.put(made["putUrl"], data=b"s3cret", headers=made["headers"]) as r:
        assert r.status == 201
    async with http.put(f"{server.api}/task/{task_id}/runs/0/artifacts/private/secret.txt",
                        json={}) as r:
        assert r.status == 200
    url = f"{server.api}/task/{task_id}/runs/0/artifacts/private%2Fsecret.txt"
    async with anonymous.get(url, allow_redirects=False) as r:
        assert r.status == 403
        assert "queue:get-artifact:private/secret.txt" in (await r.json())["message"]
    queue = taskcluster.Queue({"rootUrl": server.root_url, "credentials": CREDENTIALS})
    signed = queue.buildSignedUrl("getArtifact", task_id, 0, "private/secret.txt")
    async with anonymous.get(signed) as r:
        assert r.status == 200 and await r.read() == b"s3cret"
    expired = queue.buildSignedUrl("getArtifact", task_id, 0, "private/secret.txt",
                                   expiration=-10)
    async with anonymous.get(expired, allow_redirects=False) as r:
        assert r.status == 401 and "expired" in (await r.json())["message"]


async def test_error_reference_and_link_artifacts(server: Server, http: aiohttp.ClientSession,
                                                  anonymous: aiohttp.ClientSession) -> None:
    task_id = await _running_task(http, server)
    code, _ = await _create(http, server, task_id, "public/missing.zip", {
        "storageType": "error", "expires": _expires(), "reason": "file-missing-on-worker",
        "message": "no such file: out/missing.zip"})
    assert code == 200
    async with anonymous.get(f"{server.api}/task/{task_id}/runs/0/artifacts/public/missing.zip",
                             allow_redirects=False) as r:
        assert r.status == 424
        assert "file-missing-on-worker" in (await r.json())["message"]
    code, _ = await _create(http, server, task_id, "public/ref", {
        "storageType": "reference", "expires": _expires(), "url": "https://example.com/x"})
    assert code == 200
    code, _ = await _create(http, server, task_id, "public/link", {
        "storageType": "link", "expires": _expires(), "artifact": "public/ref"})
    assert code == 200
    async with anonymous.get(f"{server.api}/task/{task_id}/runs/0/artifacts/public/link",
                             allow_redirects=False) as r:
        assert r.status == 303 and r.headers["Location"] == "https://example.com/x"
    queue = taskcluster.aio.Queue({"rootUrl": server.root_url})
    assert await queue.artifact(task_id, 0, "public/missing.zip") == {
        "storageType": "error", "reason": "file-missing-on-worker",
        "message": "no such file: out/missing.zip"}


async def test_creation_rules_completed_exception_expiry_and_idempotency(
        server: Server, http: aiohttp.ClientSession) -> None:
    """'Artifacts can be uploaded until reportCompleted or reportFailed is called. If the
    task is resolved exception with reportException then artifacts can be uploaded for an
    additional 20 minutes' (docs/workers/artifacts.md)."""
    body = {"storageType": "reference", "expires": _expires(), "url": "https://example.com/a"}
    done = await _running_task(http, server)
    assert (await _create(http, server, done, "public/a", body))[0] == 200
    assert (await _create(http, server, done, "public/a", body))[0] == 200  # same: harmless
    code, err = await _create(http, server, done, "public/a", {**body, "url": "https://example.com/b"})
    assert code == 409 and "different definition" in err["message"]
    code, err = await _create(http, server, done, "public/late",
                              {**body, "expires": iso(datetime.now(UTC) + timedelta(days=800))})
    assert code == 400 and "expires" in err["message"]
    await sas.post(http, f"{server.api}/task/{done}/runs/0/completed")
    code, err = await _create(http, server, done, "public/after", body)
    assert code == 409 and "completed" in err["message"]

    broken = await _running_task(http, server)
    await sas.post(http, f"{server.api}/task/{broken}/runs/0/exception", {"reason": "internal-error"})
    assert (await _create(http, server, broken, "public/after", body))[0] == 200

    code, err = await _create(http, server, done, "public/bad", {"storageType": "link",
                                                                "expires": _expires()})
    assert code == 400 and "artifact" in err["message"]
    code, err = await _create(http, server, done, "public/bad", {"storageType": "s3",
                                                                "expires": _expires()})
    assert code == 400 and "contentType" in err["message"]
    code, err = await _create(http, server, done, "public/bad", {
        "storageType": "blob", "expires": _expires(), "url": "https://example.com/"})
    assert code == 400 and "`url` cannot be given with storageType 'blob'" in err["message"]


async def test_list_artifacts_paginates(server: Server, http: aiohttp.ClientSession) -> None:
    task_id = await _running_task(http, server)
    names = [f"public/file-{i:02d}" for i in range(7)]
    for name in names:
        code, _ = await _create(http, server, task_id, name, {
            "storageType": "reference", "expires": _expires(), "url": "https://example.com/"})
        assert code == 200
    queue = taskcluster.aio.Queue({"rootUrl": server.root_url})
    seen: list[str] = []
    query: dict[str, Any] = {"limit": 3}
    pages = 0
    while True:
        page = await queue.listArtifacts(task_id, 0, query=query)
        pages += 1
        seen += [a["name"] for a in page["artifacts"]]
        if "continuationToken" not in page:
            break
        query = {"limit": 3, "continuationToken": page["continuationToken"]}
    assert seen == names and pages >= 3
    latest = await queue.listLatestArtifacts(task_id)
    assert [a["name"] for a in latest["artifacts"]] == names


async def test_artifact_credentials_from_a_claim(make_server: ServerFactory,
                                                 http: aiohttp.ClientSession) -> None:
    """'The createArtifact calls must be signed with the most recent temporary credentials
    returned from claimWork or reclaimTask' (docs/workers/artifacts.md)."""
    server = await make_server()
    task_id = await create(http, server.api, definition("prov/artcred"))
    root = taskcluster.aio.Queue({"rootUrl": server.root_url, "credentials": CREDENTIALS})
    claim = await root.claimTask(task_id, 0, {"workerGroup": "wg", "workerId": "w"})
    as_task = taskcluster.aio.Queue({"rootUrl": server.root_url,
                                     "credentials": claim["credentials"]})
    made = await as_task.createArtifact(task_id, 0, "public/x", {
        "storageType": "reference", "expires": _expires(), "url": "https://example.com/"})
    assert made["storageType"] == "reference"
    other = await create(http, server.api, definition("prov/artcred"))
    await root.claimTask(other, 0, {"workerGroup": "wg", "workerId": "w"})
    with pytest.raises(TaskclusterRestFailure) as info:
        await as_task.createArtifact(other, 0, "public/x", {
            "storageType": "reference", "expires": _expires(), "url": "https://example.com/"})
    assert info.value.status_code == 403


async def test_a_public_link_to_a_private_artifact_needs_the_private_ones_scope(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession) -> None:
    """A link is read 'as if the client fetched the linked artifact (including
    corresponding scope validation)' (Taskcluster's post-artifact-request, link)."""
    task_id = await _running_task(http, server)
    code, _ = await _create(http, server, task_id, "private/secret", {
        "storageType": "reference", "expires": _expires(), "url": "https://example.com/s"})
    assert code == 200
    code, _ = await _create(http, server, task_id, "public/door", {
        "storageType": "link", "expires": _expires(), "artifact": "private/secret"})
    assert code == 200
    for path in ("artifacts", "artifact-content"):
        async with anonymous.get(f"{server.api}/task/{task_id}/runs/0/{path}/public/door",
                                 allow_redirects=False) as r:
            assert r.status == 403
            assert "queue:get-artifact:private/secret" in (await r.json())["message"]
        async with http.get(f"{server.api}/task/{task_id}/runs/0/{path}/public/door",
                            allow_redirects=False) as r:
            assert r.status in (200, 303)
