"""``blob`` artifacts once their run is resolved: whoever still holds a putUrl (a SAS that
may create, write and snapshot the blob for 30 minutes) cannot change what readers get.
Readers are served what was finished, with the content type artifactInfo states."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
import taskcluster.aio

from azqueue.testing import sas
from azqueue.testing.tasks import iso
from tests.integration.test_artifacts import CREDENTIALS, _running_task
from tests.servers import Server

EVIL = b"<script>alert(document.cookie)</script>"


def _blob(**extra: Any) -> dict[str, Any]:
    return {"storageType": "blob", "contentType": "text/plain",
            "expires": iso(datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=50)),
            **extra}


async def _artifact_url(server: Server, task_id: str, name: str) -> str:
    return f"{server.api}/task/{task_id}/runs/0/artifacts/{name}"


async def _finish(http: aiohttp.ClientSession, server: Server, task_id: str, name: str) -> int:
    async with http.put(await _artifact_url(server, task_id, name), json={}) as r:
        return r.status


async def _report_completed(http: aiohttp.ClientSession, server: Server, task_id: str) -> None:
    code, body = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed", {})
    assert code == 200, body


async def _tamper(session: aiohttp.ClientSession, put_url: str) -> None:
    """What a holder of the putUrl can try: replace the blob with a page, relabel it as
    HTML, and take a snapshot. Whether Azure accepts each is not the point: readers must
    not see any of it."""
    async with session.put(put_url, data=EVIL, headers={
            "x-ms-blob-type": "BlockBlob", "Content-Type": "text/html"}) as r:
        await r.read()
    async with session.put(f"{put_url}&comp=properties", headers={
            "x-ms-blob-content-type": "text/html", "Content-Length": "0"}) as r:
        await r.read()
    async with session.put(f"{put_url}&comp=snapshot", headers={"Content-Length": "0"}) as r:
        await r.read()


async def _served(session: aiohttp.ClientSession, url: str) -> tuple[bytes, str]:
    async with session.get(url) as r:
        assert r.status == 200, await r.text()
        return await r.read(), r.headers["Content-Type"]


async def test_a_put_url_used_after_report_completed_does_not_change_what_readers_get(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession) -> None:
    task_id = await _running_task(http, server)
    name = "public/build.txt"
    code, made = await sas.post(http, await _artifact_url(server, task_id, name), _blob())
    assert code == 200, made
    async with anonymous.put(made["putUrl"], data=b"the build", headers=made["headers"]) as r:
        assert r.status == 201, await r.text()
    assert await _finish(http, server, task_id, name) == 200
    await _report_completed(http, server, task_id)

    await _tamper(anonymous, made["putUrl"])

    for url in (await _artifact_url(server, task_id, name),  # getArtifact
                f"{server.api}/task/{task_id}/artifacts/public%2Fbuild.txt"):  # getLatest
        assert await _served(anonymous, url) == (b"the build", "text/plain")
    queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "credentials": CREDENTIALS})
    content = await queue.artifact(task_id, 0, name)
    assert await _served(anonymous, content["url"]) == (b"the build", "text/plain")
    assert (await queue.artifactInfo(task_id, 0, name))["contentType"] == "text/plain"


async def test_content_replaced_after_finish_is_not_served_even_while_the_run_runs(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession) -> None:
    task_id = await _running_task(http, server)
    name = "public/report.txt"
    code, made = await sas.post(http, await _artifact_url(server, task_id, name), _blob())
    assert code == 200, made
    async with anonymous.put(made["putUrl"], data=b"finished", headers=made["headers"]) as r:
        assert r.status == 201, await r.text()
    assert await _finish(http, server, task_id, name) == 200

    await _tamper(anonymous, made["putUrl"])

    assert await _served(anonymous, await _artifact_url(server, task_id, name)) == (
        b"finished", "text/plain")


async def test_a_blob_artifact_cannot_be_finished_after_report_completed(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession) -> None:
    task_id = await _running_task(http, server)
    name = "public/late.txt"
    code, made = await sas.post(http, await _artifact_url(server, task_id, name), _blob())
    assert code == 200, made
    await _report_completed(http, server, task_id)
    async with anonymous.put(made["putUrl"], data=EVIL, headers={
            "x-ms-blob-type": "BlockBlob", "Content-Type": "text/html"}) as r:
        await r.read()

    async with http.put(await _artifact_url(server, task_id, name), json={}) as r:
        assert r.status == 409, await r.text()
        assert "completed" in (await r.json())["message"]
    async with anonymous.get(await _artifact_url(server, task_id, name),
                             allow_redirects=False) as r:
        assert r.status == 404, await r.text()


async def _live_log(http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession,
                    server: Server, task_id: str, name: str) -> tuple[str, dict[str, Any]]:
    """An append blob artifact with its blob created, empty: its URL and createArtifact's
    answer."""
    url = await _artifact_url(server, task_id, name)
    code, made = await sas.post(http, url, _blob(blobType="append"))
    assert code == 200, made
    async with anonymous.put(made["putUrl"], data=b"", headers=made["headers"]) as r:
        assert r.status == 201, await r.text()
    return url, made


async def test_a_live_log_serves_what_it_held_when_last_finished_once_the_run_is_resolved(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession) -> None:
    task_id = await _running_task(http, server)
    name = "public/logs/live.log"
    url, made = await _live_log(http, anonymous, server, task_id, name)
    assert await _finish(http, server, task_id, name) == 200
    async with anonymous.put(f"{made['putUrl']}&comp=appendblock", data=b"step 1\n") as r:
        assert r.status == 201, await r.text()
    assert await _served(anonymous, url) == (b"step 1\n", "text/plain")  # live while running
    assert await _finish(http, server, task_id, name) == 200  # the writer's last word
    await _report_completed(http, server, task_id)

    async with anonymous.put(f"{made['putUrl']}&comp=appendblock", data=EVIL) as r:
        await r.read()
    await _tamper(anonymous, made["putUrl"])

    assert await _served(anonymous, url) == (b"step 1\n", "text/plain")


# A copy through a putUrl: Copy Blob (asynchronous) and Copy Blob From URL (synchronous).
COPIES = {"copy": {}, "sync copy": {"x-ms-requires-sync": "true"}}
SECRET = b"the other tenant's signing key"


async def _private_artifact(http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession,
                            server: Server) -> tuple[str, str]:
    """Another tenant's private artifact, finished: its task and name."""
    task_id = await _running_task(http, server)
    name = "private/key.txt"
    code, made = await sas.post(http, await _artifact_url(server, task_id, name), _blob())
    assert code == 200, made
    async with anonymous.put(made["putUrl"], data=SECRET, headers=made["headers"]) as r:
        assert r.status == 201, await r.text()
    assert await _finish(http, server, task_id, name) == 200
    async with anonymous.get(await _artifact_url(server, task_id, name),
                             allow_redirects=False) as r:
        assert r.status == 403, await r.text()  # what the attacker may read of it
    return task_id, name


def _source(put_url: str, own: str, task_id: str, name: str) -> str:
    """The blob of ``task_id``'s run 0 artifact ``name``, named as the putUrl of an artifact
    of task ``own`` names its own (``<container>/<taskId>/<runId>/<name>``), unsigned."""
    container = put_url.split("?")[0].split(f"/{own}/")[0]
    return f"{container}/{task_id}/0/{name}"


async def _copy(session: aiohttp.ClientSession, put_url: str, source: str,
                extra: dict[str, str]) -> None:
    async with session.put(put_url, headers={"x-ms-copy-source": source,
                                             "Content-Length": "0", **extra}) as r:
        assert r.status in (201, 202), await r.text()  # Azurite copies it: the attack's start


async def _not_the_secret(session: aiohttp.ClientSession, url: str) -> None:
    async with session.get(url) as r:
        assert SECRET not in await r.read(), r.status


@pytest.mark.parametrize("kind", COPIES)
async def test_a_put_url_copying_another_tenants_private_blob_cannot_be_finished(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession,
        kind: str) -> None:
    victim, secret_name = await _private_artifact(http, anonymous, server)
    task_id = await _running_task(http, server)
    name = "public/copy.bin"
    code, made = await sas.post(http, await _artifact_url(server, task_id, name), _blob())
    assert code == 200, made
    await _copy(anonymous, made["putUrl"], _source(made["putUrl"], task_id, victim, secret_name),
                COPIES[kind])

    async with http.put(await _artifact_url(server, task_id, name), json={}) as r:
        refused = await r.json()
        assert r.status == 409, refused
    assert "copy" in refused["message"], refused["message"]
    async with anonymous.get(await _artifact_url(server, task_id, name),
                             allow_redirects=False) as r:
        assert r.status == 404, await r.text()
    await _not_the_secret(anonymous, await _artifact_url(server, task_id, name))

    # Uploaded again by Put Blob, the artifact finishes as usual.
    async with anonymous.put(made["putUrl"], data=b"mine", headers=made["headers"]) as r:
        assert r.status == 201, await r.text()
    assert await _finish(http, server, task_id, name) == 200
    assert await _served(anonymous, await _artifact_url(server, task_id, name)) == (
        b"mine", "text/plain")


async def test_a_live_log_copied_over_while_its_run_runs_serves_what_was_finished(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession) -> None:
    victim, secret_name = await _private_artifact(http, anonymous, server)
    task_id = await _running_task(http, server)
    name = "public/logs/live.log"
    url, made = await _live_log(http, anonymous, server, task_id, name)
    async with anonymous.put(f"{made['putUrl']}&comp=appendblock", data=b"step 1\n") as r:
        assert r.status == 201, await r.text()
    assert await _finish(http, server, task_id, name) == 200

    await _copy(anonymous, made["putUrl"], _source(made["putUrl"], task_id, victim, secret_name), {})

    await _not_the_secret(anonymous, url)
    assert await _served(anonymous, url) == (b"step 1\n", "text/plain")
    async with http.put(url, json={}) as r:
        assert r.status == 409, await r.text()
    await _report_completed(http, server, task_id)
    assert await _served(anonymous, url) == (b"step 1\n", "text/plain")
