"""``blob`` artifacts once their run is resolved: whoever still holds a putUrl (a SAS that
may create, write and snapshot the blob for 30 minutes) cannot change what readers get.
Readers are served what was finished, with the content type artifactInfo states."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
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


async def test_a_live_log_serves_what_it_held_when_last_finished_once_the_run_is_resolved(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession) -> None:
    task_id = await _running_task(http, server)
    name = "public/logs/live.log"
    url = await _artifact_url(server, task_id, name)
    code, made = await sas.post(http, url, _blob(blobType="append"))
    assert code == 200, made
    async with anonymous.put(made["putUrl"], data=b"", headers=made["headers"]) as r:
        assert r.status == 201, await r.text()
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
