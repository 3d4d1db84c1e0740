"""Claims interrupted half-way, as a fault-injection soak saw them: a replica that dies
in the middle of a claim, and a worker and a claim resolver expiring the same claim."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import aiohttp

from azqueue.model.priority import Priority
from azqueue.storage.claims import ClaimRecord
from azqueue.storage.queues import Queues
from azqueue.testing import sas
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition, slugid, status
from tests.servers import Server, ServerFactory, tip_signer
from tests.waiting import eventually


def _task_queue() -> tuple[str, str]:
    return "prov", f"int{slugid()[:10].replace('-', 'x').replace('_', 'y').lower()}"


async def _poll_one(http: aiohttp.ClientSession, server: Server, provisioner: str,
                    worker_type: str) -> tuple[sas.QueueMessage, dict[str, str]]:
    queue = (await sas.poll_task_urls(http, server.api, provisioner, worker_type))["queues"][6]

    async def received() -> list[sas.QueueMessage]:
        return await sas.get_messages(http, queue["signedPollUrl"])

    [message] = await eventually(received, what="a tip to become visible")
    return message, queue


async def test_a_claim_retried_on_another_replica_after_the_first_died_mid_claim_succeeds(
        make_server: ServerFactory, http: aiohttp.ClientSession, queues: Queues,
        storage: StorageInspector) -> None:
    """"A claimTask whose replica died mid-request, retried unchanged on another replica,
    got 400 ... the README promises that a repeated claim answers the same claim. Make the
    retry of an in-flight claim succeed when the first attempt's effects are partly
    stored": replica A rewrote the message (as a claim does) and died before storing the
    claim; the same request sent to replica B claims the run, and again answers the same."""
    first, second = await make_server(), await make_server()
    provisioner, worker_type = _task_queue()
    task_id = await create(http, first.api, definition(f"{provisioner}/{worker_type}"))
    message, _ = await _poll_one(http, first, provisioner, worker_type)
    task_queue_id = f"{provisioner}/{worker_type}"
    claim_timeout = first.services.claims.claim_timeout
    await queues.update(storage.pending_queue(task_queue_id, Priority.LOWEST),
                        message.message_id, message.pop_receipt,
                        visible_in=timedelta(seconds=claim_timeout.total_seconds()),
                        text=tip_signer(first).tip(task_queue_id, task_id, 1).encode())
    for _ in range(2):
        code, claim = await sas.claim(http, second.api, message)
        assert code == 200, claim
        assert claim["runId"] == 0 and claim["workerId"] == "w1"
    code, done = await sas.post(http, f"{second.api}/task/{task_id}/runs/0/completed")
    assert code == 200 and done["status"]["state"] == "completed"


async def test_a_claim_expired_by_a_worker_and_then_by_a_resolver_gets_no_second_tip(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector) -> None:
    """"When a worker's poll expires a claim and a replica's claim resolver expires the same
    claim a moment later, a second tip for the retry appears ... the second resolver should
    see the first one's work": the worker has polled the reappeared message (its receipt
    changed) and claims the retry while the resolver, having resolved the expired run,
    would give the retry its tip; the resolver sees the claim and queues none."""
    server = await make_server(claim_timeout=1.0, run_resolvers=False)
    provisioner, worker_type = _task_queue()
    task_id = await create(http, server.api, definition(f"{provisioner}/{worker_type}"))
    message, queue = await _poll_one(http, server, provisioner, worker_type)
    code, claim = await sas.claim(http, server.api, message)
    assert code == 200
    reappeared, _ = await _poll_one(http, server, provisioner, worker_type)  # run 1's tip
    assert reappeared.tip["runId"] == 1
    taken_until = (await storage.task(task_id)).runs[0].taken_until
    assert taken_until is not None
    record = ClaimRecord(task_id, 0, taken_until)

    async def worker_claims_the_retry() -> int:
        await eventually(lambda: status(http, server.api, task_id),
                         lambda s: len(s["runs"]) == 2, what="the resolver to add run 1")
        code, _ = await sas.claim(http, server.api, reappeared, worker_id="w2")
        return code

    resolved, code = await asyncio.gather(server.services.resolution.expire_claim(record),
                                          worker_claims_the_retry())
    assert resolved and code == 200
    stored = await storage.stored(task_id)
    assert [r.state.value for r in stored.task.runs] == ["exception", "running"]
    assert len(stored.tips) == 1, f"{len(stored.tips)} tips recorded"
    assert await sas.get_messages(http, queue["signedPollUrl"]) == []
