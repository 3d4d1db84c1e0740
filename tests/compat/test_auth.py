"""Hawk authentication, scopes and temporary credentials, through the official client."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import mohawk
import pytest
import taskcluster
import taskcluster.aio
from taskcluster.exceptions import TaskclusterAuthFailure, TaskclusterRestFailure

from azqueue.config import Client
from azqueue.testing import sas
from azqueue.testing.tasks import definition, slugid
from tests.servers import ROOT, Server, ServerFactory

LIMITED = Client("limited", "limited-access-token-0123456789", (
    "queue:scheduler-id:-", "queue:create-task:lowest:prov/other",
    "queue:create-task:project:none", "queue:status:*"))
ISSUER = Client("issuer", "issuer-access-token-0123456789abc", (
    "queue:create-task:*", "queue:scheduler-id:*", "queue:status:*", "queue:get-task:*",
    "auth:create-client:temp/*"))


def queue(server: Server, credentials: dict[str, Any] | None = None,
          **options: Any) -> taskcluster.Queue:
    opts: dict[str, Any] = {"rootUrl": server.root_url, "maxRetries": 0, **options}
    if credentials:
        opts["credentials"] = credentials
    return taskcluster.Queue(opts)


async def call(flavour: str, server: Server, credentials: dict[str, Any] | None, method: str,
               *args: Any, **options: Any) -> Any:
    """``method`` of the official client's Queue: ``taskcluster.Queue`` (in a thread) or
    ``taskcluster.aio.Queue``, as ``flavour`` says."""
    opts: dict[str, Any] = {"rootUrl": server.root_url, "maxRetries": 0, **options}
    if credentials:
        opts["credentials"] = credentials
    if flavour == "aio":
        return await getattr(taskcluster.aio.Queue(opts), method)(*args)
    return await asyncio.to_thread(getattr(taskcluster.Queue(opts), method), *args)


def creds(client: Client) -> dict[str, str]:
    return {"clientId": client.client_id, "accessToken": client.access_token}


async def _signed(http: aiohttp.ClientSession, method: str, url: str, body: bytes,
                  signed_body: bytes | None = None, client: Client = ROOT,
                  timestamp: int | None = None, header: str | None = None
                  ) -> tuple[int, dict[str, Any], str]:
    if header is None:
        sender = mohawk.Sender({"id": client.client_id, "key": client.access_token,
                                "algorithm": "sha256"}, url, method,
                               content=signed_body if signed_body is not None else body,
                               content_type="application/json", _timestamp=timestamp)
        header = sender.request_header
    async with http.request(method, url, data=body, headers={
            "Authorization": header, "Content-Type": "application/json"}) as r:
        return r.status, await r.json(), header


@pytest.fixture(params=["sync", "aio"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def auth_server(make_server: ServerFactory) -> Server:
    return await make_server(clients=(LIMITED, ISSUER), anonymous_scopes=())


async def test_authentication_failures_are_401_and_change_nothing(
        auth_server: Server, anonymous: aiohttp.ClientSession, flavour: str) -> None:
    server = auth_server
    body = definition()
    refused: list[str] = []
    for bad in ({"clientId": "root", "accessToken": "wrong-token-0123456789012"},
                {"clientId": "nobody", "accessToken": ROOT.access_token}):
        task_id = slugid()
        with pytest.raises(TaskclusterAuthFailure) as info:
            await call(flavour, server, bad, "createTask", task_id, body)
        assert info.value.status_code == 401
        assert info.value.body["code"] == "AuthenticationFailed"
        assert ROOT.access_token not in json.dumps(info.value.body)
        refused.append(task_id)

    raw = json.dumps(body).encode()
    # A tampered body: signed with one payload hash, sent with another body.
    url = f"{server.api}/task/{slugid()}"
    code, err, _ = await _signed(anonymous, "PUT", url, raw.replace(b"test", b"evil"), raw)
    assert code == 401 and "payload hash" in err["message"]
    refused.append(url.rsplit("/", 1)[1])
    # A timestamp 20 minutes off.
    url = f"{server.api}/task/{slugid()}"
    code, err, _ = await _signed(anonymous, "PUT", url, raw, timestamp=int(time.time()) - 20 * 60)
    assert code == 401 and "15 minutes" in err["message"]
    refused.append(url.rsplit("/", 1)[1])
    # A replayed request: the first is served, the identical second refused.
    served = slugid()
    url = f"{server.api}/task/{served}/runs/0/claim"
    await call(flavour, server, creds(ROOT), "createTask", served, body)
    claim = json.dumps({"workerGroup": "g", "workerId": "first"}).encode()
    code, _, header = await _signed(anonymous, "POST", url, claim)
    assert code == 200
    code, err, _ = await _signed(anonymous, "POST", url, claim, header=header)
    assert code == 401 and "replayed" in err["message"]

    # Nothing was written by the refused requests.
    for task_id in refused:
        with pytest.raises(TaskclusterRestFailure) as info:
            await call(flavour, server, creds(ROOT), "status", task_id)
        assert info.value.status_code == 404
    status = (await call(flavour, server, creds(ROOT), "status", served))["status"]
    assert [r["state"] for r in status["runs"]] == ["running"]


async def test_refused_credentials_leave_no_task(auth_server: Server) -> None:
    root = queue(auth_server, creds(ROOT))
    task_id = slugid()
    with pytest.raises(TaskclusterAuthFailure):
        await asyncio.to_thread(queue(auth_server, {"clientId": "root",
                                                    "accessToken": "x" * 30}).createTask,
                                task_id, definition())
    with pytest.raises(TaskclusterRestFailure) as info:
        await asyncio.to_thread(root.status, task_id)
    assert info.value.status_code == 404


async def test_missing_create_task_scope_is_403_naming_it_and_writes_nothing(
        auth_server: Server, flavour: str) -> None:
    async def limited(method: str, *args: Any) -> Any:
        return await call(flavour, auth_server, creds(LIMITED), method, *args)

    task_id = slugid()
    with pytest.raises(TaskclusterRestFailure) as info:
        await limited("createTask", task_id, definition("prov/wt"))
    assert info.value.status_code == 403
    message = info.value.body["message"]
    assert "queue:create-task:lowest:prov/wt" in message and "limited" in message
    with pytest.raises(TaskclusterRestFailure) as info:
        await limited("status", task_id)
    assert info.value.status_code == 404
    # The scopes it has are enough for the queue they name, at the priority they name.
    ok = slugid()
    await limited("createTask", ok, definition("prov/other"))
    assert (await limited("status", ok))["status"]["state"] == "pending"
    with pytest.raises(TaskclusterRestFailure) as info:
        await limited("createTask", slugid(), definition("prov/other", priority="high"))
    assert info.value.status_code == 403 and "queue:create-task:high:prov/other" in str(info.value)
    with pytest.raises(TaskclusterRestFailure) as info:
        await limited("createTask", slugid(), definition("prov/other", routes=["notify.x"]))
    assert info.value.status_code == 403 and "queue:route:notify.x" in str(info.value)


async def test_temporary_credentials_named_and_unnamed(auth_server: Server,
                                                       flavour: str) -> None:
    now = datetime.now(UTC)
    scopes = ["queue:create-task:lowest:prov/temp", "queue:create-task:project:none",
              "queue:scheduler-id:-", "queue:status:*"]
    for name in (None, "temp/ci-job"):
        temp = taskcluster.createTemporaryCredentials(
            ISSUER.client_id, ISSUER.access_token, now, now + timedelta(hours=1), scopes, name=name)
        task_id = slugid()
        await call(flavour, auth_server, temp, "createTask", task_id, definition("prov/temp"))
        assert (await call(flavour, auth_server, temp, "status", task_id)
                )["status"]["state"] == "pending"
        with pytest.raises(TaskclusterRestFailure) as info:  # beyond the certificate's scopes
            await call(flavour, auth_server, temp, "createTask", slugid(),
                       definition("prov/elsewhere"))
        assert info.value.status_code == 403

    async def refused(temp: dict[str, Any]) -> str:
        with pytest.raises(TaskclusterAuthFailure) as info:
            await call(flavour, auth_server, temp, "createTask", slugid(),
                       definition("prov/temp"))
        return str(info.value.body["message"])

    expired = taskcluster.createTemporaryCredentials(
        ISSUER.client_id, ISSUER.access_token, now - timedelta(hours=2),
        now - timedelta(hours=1), scopes)
    assert "expired" in await refused(expired)
    greedy = taskcluster.createTemporaryCredentials(
        ISSUER.client_id, ISSUER.access_token, now, now + timedelta(hours=1), ["queue:*"])
    assert "lacks" in await refused(greedy)
    unnamed_by_other = taskcluster.createTemporaryCredentials(
        ISSUER.client_id, ISSUER.access_token, now, now + timedelta(hours=1), scopes,
        name="not-allowed-name")
    assert "auth:create-client:not-allowed-name" in await refused(unnamed_by_other)
    forged = taskcluster.createTemporaryCredentials(
        ISSUER.client_id, "not-the-issuer-token-0123456789", now, now + timedelta(hours=1), scopes)
    assert "signature" in await refused(forged)


async def test_authorized_scopes_narrow_what_a_request_may_do(auth_server: Server,
                                                             flavour: str) -> None:
    task_id = slugid()
    with pytest.raises(TaskclusterRestFailure) as info:
        await call(flavour, auth_server, creds(ROOT), "createTask", task_id, definition(),
                   authorizedScopes=["queue:status:*"])
    assert info.value.status_code == 403 and "queue:create-task:lowest:prov/wt" in str(info.value)
    with pytest.raises(TaskclusterRestFailure) as info:  # what it still may do, it can
        await call(flavour, auth_server, creds(ROOT), "status", task_id,
                   authorizedScopes=["queue:status:*"])
    assert info.value.status_code == 404
    with pytest.raises(TaskclusterAuthFailure):
        await call(flavour, auth_server, creds(LIMITED), "createTask", slugid(),
                   definition("prov/other"), authorizedScopes=["queue:*"])


async def test_claim_credentials_resolve_their_run_and_no_other(auth_server: Server) -> None:
    root = taskcluster.aio.Queue({"rootUrl": auth_server.root_url, "maxRetries": 0,
                                  "credentials": creds(ROOT)})
    mine, other = slugid(), slugid()
    await root.createTask(mine, definition(scopes=["queue:status:*"]))
    await root.createTask(other, definition())
    claim = await root.claimTask(mine, 0, {"workerGroup": "wg", "workerId": "w"})
    await root.claimTask(other, 0, {"workerGroup": "wg", "workerId": "w"})
    task_creds = claim["credentials"]
    assert task_creds["clientId"].startswith(f"task-client/{mine}/0/on/wg/w/until/")
    as_task = taskcluster.aio.Queue({"rootUrl": auth_server.root_url, "maxRetries": 0,
                                     "credentials": task_creds})
    with pytest.raises(TaskclusterRestFailure) as info:
        await as_task.reportCompleted(other, 0)
    assert info.value.status_code == 403 and f"queue:resolve-task:{other}/0" in str(info.value)
    re = await as_task.reclaimTask(mine, 0)
    assert re["credentials"]["clientId"] != task_creds["clientId"] or re["credentials"] != task_creds
    # The task's own scopes come with the claim.
    assert (await as_task.status(other))["status"]["state"] == "running"
    fresh = taskcluster.aio.Queue({"rootUrl": auth_server.root_url, "maxRetries": 0,
                                   "credentials": re["credentials"]})
    assert (await fresh.reportCompleted(mine, 0))["status"]["state"] == "completed"
    assert (await root.status(other))["status"]["state"] == "running"


async def test_sas_worker_needs_its_scopes(auth_server: Server,
                                           anonymous: aiohttp.ClientSession) -> None:
    """pollTaskUrls and claimTask are refused to a worker without their scopes; the signed
    SAS worker of tests/integration/test_sas_flow.py is the positive case."""
    async with anonymous.get(f"{auth_server.api}/poll-task-url/prov/wt") as r:
        assert r.status == 403
        assert "queue:poll-task-urls:prov/wt" in (await r.json())["message"]
    task_id = slugid()
    await asyncio.to_thread(queue(auth_server, creds(ROOT)).createTask, task_id, definition())
    code, err = await sas.post(anonymous, f"{auth_server.api}/task/{task_id}/runs/0/claim",
                               {"workerGroup": "g", "workerId": "w"})
    # The worker's identity is checked first, before the task is read for its task queue
    # (tests/security/test_tenant_isolation.py checks the task queue's scope).
    assert code == 403 and "queue:worker-id:g/w" in err["message"]


async def test_signed_in_callers_hold_the_anonymous_scopes_too(make_server: ServerFactory,
                                                               flavour: str) -> None:
    """As in Taskcluster, credentials (permanent, temporary, a claim's, or narrowed by
    authorizedScopes, even to none) never hold less than an anonymous request."""
    server = await make_server(clients=(LIMITED, ISSUER), anonymous_scopes=("queue:get-task:*",))
    task_id = slugid()
    await call(flavour, server, creds(ROOT), "createTask", task_id, definition())
    assert (await call(flavour, server, None, "task", task_id))["provisionerId"] == "prov"
    assert (await call(flavour, server, creds(ROOT), "task", task_id, authorizedScopes=[])
            )["provisionerId"] == "prov"
    # authorizedScopes may name an anonymous scope the client lacks.
    assert (await call(flavour, server, creds(LIMITED), "task", task_id,
                       authorizedScopes=["queue:get-task:*"]))["provisionerId"] == "prov"
    now = datetime.now(UTC)
    temp = taskcluster.createTemporaryCredentials(
        ISSUER.client_id, ISSUER.access_token, now, now + timedelta(hours=1), [])
    assert (await call(flavour, server, temp, "task", task_id))["provisionerId"] == "prov"
    # What the anonymous scopes do not cover stays refused.
    with pytest.raises(TaskclusterRestFailure) as info:
        await call(flavour, server, creds(ROOT), "status", task_id, authorizedScopes=[])
    assert info.value.status_code == 403


@pytest.mark.parametrize("verb,method", [("schedule-task", "scheduleTask"),
                                          ("cancel-task", "cancelTask"),
                                          ("rerun-task", "rerunTask")])
async def test_every_scope_alternative_taskcluster_declares_is_accepted(
        auth_server: Server, verb: str, method: str) -> None:
    """By the task's scheduler, group and id; by its project (a `*` pattern too); or the
    bare verb with the scheduler's role for the group: each alone is enough."""
    group = slugid()
    alternatives = [[f"queue:{verb}:sched/{group}/<taskId>"],
                    [f"queue:{verb}-in-project:proj-a"],
                    [f"queue:{verb}-in-project:proj-*"],
                    [f"queue:{verb}", f"assume:scheduler-id:sched/{group}"]]
    refused = [[f"queue:{verb}-in-project:proj-b"], [f"queue:{verb}"],
               [f"assume:scheduler-id:sched/{group}"]]
    for scopes, allowed in [*((s, True) for s in alternatives), *((s, False) for s in refused)]:
        task_id = slugid()
        await call("sync", auth_server, creds(ROOT), "createTask", task_id, definition(
            schedulerId="sched", taskGroupId=group, projectId="proj-a"))
        narrowed = [s.replace("<taskId>", task_id) for s in scopes]
        if allowed:
            await call("sync", auth_server, creds(ROOT), method, task_id,
                       authorizedScopes=narrowed)
        else:
            with pytest.raises(TaskclusterRestFailure) as info:
                await call("sync", auth_server, creds(ROOT), method, task_id,
                           authorizedScopes=narrowed)
            assert info.value.status_code == 403, narrowed


@pytest.mark.parametrize("scope", ["queue:é", "queue:a\nb", "queue:\t"])
async def test_scopes_that_are_not_printable_ascii_are_refused_as_taskcluster_refuses_them(
        auth_server: Server, scope: str) -> None:
    """In authorizedScopes or a certificate: 401; in a task definition: 400, as is a task
    scope ending in `**`."""
    with pytest.raises(TaskclusterAuthFailure) as auth:
        await call("sync", auth_server, creds(ROOT), "createTask", slugid(), definition(),
                   authorizedScopes=["queue:*", scope])
    assert auth.value.status_code == 401 and "printable ASCII" in auth.value.body["message"]
    now = datetime.now(UTC)
    temp = taskcluster.createTemporaryCredentials(
        ISSUER.client_id, ISSUER.access_token, now, now + timedelta(hours=1),
        ["queue:status:*", scope])
    with pytest.raises(TaskclusterAuthFailure) as auth:
        await call("sync", auth_server, temp, "status", slugid())
    assert auth.value.status_code == 401 and "printable ASCII" in auth.value.body["message"]
    for bad in (scope, "queue:create-task:**"):
        task_id = slugid()
        with pytest.raises(TaskclusterRestFailure) as info:
            await call("sync", auth_server, creds(ROOT), "createTask", task_id,
                       definition(scopes=[bad]))
        assert info.value.status_code == 400
        with pytest.raises(TaskclusterRestFailure) as info:
            await call("sync", auth_server, creds(ROOT), "status", task_id)
        assert info.value.status_code == 404


async def test_artifact_reads_need_the_scopes_taskcluster_declares(auth_server: Server) -> None:
    """listLatestArtifacts and latestArtifactInfo: `queue:list-artifacts:<taskId>`;
    artifactInfo: `queue:list-artifacts:<taskId>:<runId>`; an artifact's content:
    `queue:get-artifact:<name>`, under public/ too (here no anonymous scopes grant it)."""
    task_id = slugid()
    root = taskcluster.aio.Queue({"rootUrl": auth_server.root_url, "maxRetries": 0,
                                  "credentials": creds(ROOT)})
    await root.createTask(task_id, definition())
    await root.claimTask(task_id, 0, {"workerGroup": "wg", "workerId": "w"})
    await root.createArtifact(task_id, 0, "public/ref", {
        "storageType": "reference", "url": "https://example.com/",
        "expires": (await root.task(task_id))["expires"]})

    async def code(method: str, *args: Any, scopes: list[str]) -> int:
        try:
            await call("aio", auth_server, creds(ROOT), method, *args, authorizedScopes=scopes)
        except TaskclusterRestFailure as e:
            return int(e.status_code)
        return 200

    listing = [f"queue:list-artifacts:{task_id}"]
    assert await code("listLatestArtifacts", task_id, scopes=listing) == 200
    assert await code("latestArtifactInfo", task_id, "public/ref", scopes=listing) == 200
    assert await code("artifactInfo", task_id, 0, "public/ref", scopes=listing) == 403
    assert await code("artifactInfo", task_id, 0, "public/ref",
                      scopes=[f"queue:list-artifacts:{task_id}:0"]) == 200
    assert await code("latestArtifact", task_id, "public/ref", scopes=listing) == 403
    assert await code("latestArtifact", task_id, "public/ref",
                      scopes=["queue:get-artifact:public/*"]) == 200
