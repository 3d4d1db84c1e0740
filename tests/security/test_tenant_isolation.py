"""A tenant holding one task queue's scopes tries to take another task queue's task.

The attacker knows a pending task's taskId (taskIds are not secret: anonymous callers
list them) and holds every scope of its own task queue ``att/pool``: it re-creates the
victim's taskId in its own queue over and over (each attempt is refused 409) while
polling its own queue, through claimWork and through its SAS poll URLs. Nothing it
receives may let it claim the victim's run, and the victim's worker must still get it,
whatever the tips' form (``AZQUEUE_TIP_FORM=run`` leaves the task queue out of their
signature during a rollout from earlier releases: the claims' own checks still hold).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
import taskcluster.aio
from taskcluster.exceptions import TaskclusterRestFailure

from azqueue.config import Client
from azqueue.model.tip import TipForm
from azqueue.testing import sas
from azqueue.testing.hawk import hawk_signer
from azqueue.testing.tasks import definition, slugid
from tests.servers import ROOT, Server, ServerFactory

ATTACKER = Client("tenant-a", "tenant-a-access-token-0123456789", (
    "queue:create-task:lowest:att/pool", "queue:create-task:project:none",
    "queue:scheduler-id:-", "queue:claim-work:att/pool", "queue:claim-task:att/pool",
    "queue:poll-task-urls:att/pool", "queue:worker-id:att/*", "queue:status:*"))
# createTask attempts per test: the claims that this guards against succeeded within
# 170-300 attempts.
ATTEMPTS = 500


def _client(server: Server, client: Client) -> taskcluster.aio.Queue:
    return taskcluster.aio.Queue({
        "rootUrl": server.root_url, "maxRetries": 0,
        "credentials": {"clientId": client.client_id, "accessToken": client.access_token}})


async def _victim(server: Server, root: taskcluster.aio.Queue) -> str:
    task_id = slugid()
    await root.createTask(task_id, definition(
        "vic/pool", scopes=["secrets:get:prod/signing-key"],
        payload={"command": ["deploy"], "env": {"DEPLOY_TOKEN": "s3cr3t"}}))
    return task_id


async def _collide(attacker: taskcluster.aio.Queue, task_id: str, stop: asyncio.Event) -> int:
    """Re-create ``task_id`` in the attacker's queue until ``stop``; the attempts made."""
    body = definition("att/pool")
    attempts = 0
    while attempts < ATTEMPTS and not stop.is_set():
        attempts += 1
        with pytest.raises(TaskclusterRestFailure) as refused:
            await attacker.createTask(task_id, body)
        assert refused.value.status_code == 409
    stop.set()
    return attempts


async def _victim_worker_gets(server: Server, root: taskcluster.aio.Queue, task_id: str) -> None:
    got = await root.claimWork("vic/pool", {"tasks": 1, "workerGroup": "vic", "workerId": "w"})
    assert [(c["status"]["taskId"], c["runId"]) for c in got["tasks"]] == [(task_id, 0)]
    assert got["tasks"][0]["task"]["payload"]["env"]["DEPLOY_TOKEN"] == "s3cr3t"


@pytest.fixture
def root_queue(tenants: Server) -> taskcluster.aio.Queue:
    return _client(tenants, ROOT)


@pytest.fixture(params=list(TipForm), ids=str)
async def tenants(request: pytest.FixtureRequest, make_server: ServerFactory) -> Server:
    return await make_server(clients=(ATTACKER,), anonymous_scopes=(), claim_work_wait=1.0,
                             tip_form=request.param)


@pytest.mark.slow
async def test_claim_work_never_hands_a_tenant_another_queues_task(
        tenants: Server, root_queue: taskcluster.aio.Queue) -> None:
    attacker = _client(tenants, ATTACKER)
    victim_id = await _victim(tenants, root_queue)
    stop = asyncio.Event()
    stolen: list[dict[str, Any]] = []

    async def poll() -> None:
        while not stop.is_set():
            got = await attacker.claimWork("att/pool", {"tasks": 4, "workerGroup": "att",
                                                        "workerId": "w"})
            stolen.extend(got["tasks"])

    poller = asyncio.create_task(poll())
    attempts = await _collide(attacker, victim_id, stop)
    await poller
    assert attempts == ATTEMPTS
    assert [(c["status"]["taskId"], c["status"]["taskQueueId"]) for c in stolen] == []
    status = (await root_queue.status(victim_id))["status"]
    assert [r["state"] for r in status["runs"]] == ["pending"]
    await _victim_worker_gets(tenants, root_queue, victim_id)


@pytest.mark.slow
async def test_a_tip_polled_with_a_sas_url_claims_nothing_outside_its_queue(
        tenants: Server, root_queue: taskcluster.aio.Queue,
        anonymous: aiohttp.ClientSession) -> None:
    attacker = _client(tenants, ATTACKER)
    victim_id = await _victim(tenants, root_queue)
    async with aiohttp.ClientSession(middlewares=(
            hawk_signer(ATTACKER.client_id, ATTACKER.access_token),)) as signed:
        urls = await sas.poll_task_urls(signed, tenants.api, "att", "pool")
    poll_url = urls["queues"][-1]["signedPollUrl"]
    stop = asyncio.Event()
    answers: list[tuple[int, str]] = []

    async def poll() -> None:
        while not stop.is_set():
            for message in await sas.get_messages(anonymous, poll_url, 32):
                if message.tip["taskId"] != victim_id:
                    continue
                # The attacker presents what it received, as its own worker.
                body = {"workerGroup": "att", "workerId": "w", "messageId": message.message_id,
                        "receipt": message.pop_receipt, "signature": message.tip["signature"]}
                try:
                    await attacker.claimTask(victim_id, str(message.tip["runId"]), body)
                    answers.append((200, "claimed"))
                except TaskclusterRestFailure as e:
                    answers.append((e.status_code, str(e.body.get("code"))))
            await asyncio.sleep(0.01)

    poller = asyncio.create_task(poll())
    await _collide(attacker, victim_id, stop)
    await poller
    assert all(code in (400, 403) for code, _ in answers), answers
    await _victim_worker_gets(tenants, root_queue, victim_id)


def _spent(server: Server) -> int:
    return sum(server.services.health.storage_requests().values())


async def test_a_claim_the_caller_may_not_make_is_refused_before_storage_work(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        anonymous: aiohttp.ClientSession) -> None:
    """A signature seen on a tip and a made-up messageId: refused as soon as the caller's
    scopes can be checked, not after waiting for a record of the message."""
    server = await make_server(clients=(ATTACKER,), run_resolvers=False)
    task_id = slugid()
    async with http.put(f"{server.api}/task/{task_id}", json=definition("vic/pool")) as r:
        assert r.status == 200
    queue = (await sas.poll_task_urls(http, server.api, "vic", "pool"))["queues"][-1]
    [message] = await sas.get_messages(http, queue["signedPollUrl"])
    body = {"workerGroup": "att", "workerId": "w", "messageId": "0f6c5f32-4d3c-4d63-9d2e-6f3c2a1b0c9d",
            "receipt": message.pop_receipt, "signature": message.tip["signature"]}
    url = f"{server.api}/task/{task_id}/runs/0/claim"

    before = _spent(server)
    code, answer = await sas.post(anonymous, url, body)
    assert (code, answer["code"]) == (403, "InsufficientScopes")
    assert _spent(server) == before  # the worker's identity alone decides it

    async with aiohttp.ClientSession(middlewares=(
            hawk_signer(ATTACKER.client_id, ATTACKER.access_token),)) as attacker:
        before = _spent(server)
        code, answer = await sas.post(attacker, url, body)
    assert (code, answer["code"]) == (403, "InsufficientScopes")
    assert "queue:claim-task:vic/pool" in answer["message"]
    assert _spent(server) - before <= 2  # the task's first read tells its queue
