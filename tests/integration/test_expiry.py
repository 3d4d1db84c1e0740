"""Expiry: artifacts and tasks are deleted once past their `expires` ("the task and its
artifacts will be deleted at this time", Taskcluster's task definition)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import aiohttp

from azqueue.testing import sas
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition, iso, status
from tests.servers import Server


async def _artifact(http: aiohttp.ClientSession, server: Server, task_id: str, name: str,
                    expires: datetime) -> tuple[str, str]:
    """Upload a blob artifact; its upload and read URLs."""
    code, made = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/artifacts/{name}",
                                {"storageType": "blob", "contentType": "text/plain",
                                 "expires": iso(expires)})
    assert code == 200, made
    async with http.put(made["putUrl"], data=name.encode(), headers=made["headers"]) as r:
        assert r.status == 201
    async with http.put(f"{server.api}/task/{task_id}/runs/0/artifacts/{name}", json={}) as r:
        assert r.status == 200
    async with http.get(f"{server.api}/task/{task_id}/runs/0/artifacts/{name}",
                        allow_redirects=False) as r:
        assert r.status == 303
        return made["putUrl"], r.headers["Location"]


async def _s3_artifact(http: aiohttp.ClientSession, server: Server, task_id: str, name: str,
                       expires: datetime) -> str:
    """Upload an s3 artifact (a plain PUT to its putUrl); its read URL."""
    code, made = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/artifacts/{name}",
                                {"storageType": "s3", "contentType": "text/plain",
                                 "expires": iso(expires)})
    assert code == 200, made
    async with http.put(made["putUrl"], data=name.encode(),
                        headers={"Content-Type": "text/plain"}) as r:
        assert r.status == 200
    async with http.get(f"{server.api}/task/{task_id}/runs/0/artifacts/{name}",
                        allow_redirects=False) as r:
        assert r.status == 303
        return r.headers["Location"]


async def test_expired_artifacts_then_expired_tasks_are_deleted_with_all_they_kept(
        server: Server, http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    now = datetime.now(UTC)
    task_id = await create(http, server.api, definition("prov/expiry"))
    waiting = await create(http, server.api, definition("prov/expiry", dependencies=[task_id]))
    code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/claim",
                             {"workerGroup": "g", "workerId": "w"})
    assert code == 200
    put, short = await _artifact(http, server, task_id, "public/short.txt",
                                 now + timedelta(days=1))
    async with http.put(f"{put}&comp=snapshot") as r:  # what an upload URL also allows
        assert r.status == 201
    _, long = await _artifact(http, server, task_id, "public/long.txt", now + timedelta(days=300))
    short_s3 = await _s3_artifact(http, server, task_id, "public/short-s3.txt",
                                  now + timedelta(days=1))
    code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
    assert code == 200

    # Two days on: the short-lived artifacts are gone, rows and blobs; the rest stays.
    gone = await server.services.expiry.expire(now + timedelta(days=2))
    assert (gone.tasks, gone.artifacts) == (0, 2)
    async with http.get(f"{server.api}/task/{task_id}/runs/0/artifacts/public/short.txt",
                        allow_redirects=False) as r:
        assert r.status == 404
    async with http.get(short) as r:
        assert r.status == 404  # the blob itself
    async with http.get(short_s3) as r:
        assert r.status == 404
    async with http.get(long) as r:
        assert r.status == 200

    # Past the task's expires (a year after its deadline): the task and all it kept.
    gone = await server.services.expiry.expire(now + timedelta(days=400))
    assert gone.tasks == 1  # not `waiting`: it is still pending, though expired too
    async with http.get(f"{server.api}/task/{task_id}/status") as r:
        assert r.status == 404
    async with http.get(long) as r:
        assert r.status == 404
    assert await storage.row_keys("tasks", task_id) == []
    assert await storage.row_keys("dependents", task_id) == []
    assert task_id not in await storage.row_keys("groups", task_id)  # own group
    assert (await status(http, server.api, waiting))["state"] == "pending"
    # Once more: nothing left to do, and nothing fails.
    gone = await server.services.expiry.expire(now + timedelta(days=400))
    assert (gone.tasks, gone.artifacts) == (0, 0)
