"""The SAS polling flow end to end: the worker's side and the queue's (docs/workers/sas.md)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import aiohttp

from azqueue.config import StorageSettings
from azqueue.model import timeutil
from azqueue.model.priority import Priority
from azqueue.testing import sas
from azqueue.testing.faultproxy import FaultProxy
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition, slugid, status
from tests.integration.test_claim_work import callers_waiting
from tests.servers import Server, ServerFactory, tip_signer
from tests.waiting import eventually


async def test_worker_does_the_seed_000_dance_with_plain_http(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector) -> None:
    """'the worker must call queue.pollTaskUrls ... GET request to signedPollUrl ...
    base64 decode and JSON parse ... call queue.claimTask()' then reportCompleted."""
    server = await make_server()
    task_id = await create(http, server.api, definition("prov/seed000"))

    urls = await sas.poll_task_urls(http, server.api, "prov", "seed000")
    assert len(urls["queues"]) == 7
    for q in urls["queues"]:
        assert "sp=p&" in q["signedPollUrl"]  # the process permission only
        assert "{{messageId}}" in q["signedDeleteUrl"] and "{{popReceipt}}" in q["signedDeleteUrl"]
    messages = await sas.poll_once(http, urls, n=32)
    assert len(messages) == 1
    tip = messages[0].tip
    assert tip["taskId"] == task_id and tip["runId"] == 0 and tip["signature"]

    code, claim = await sas.claim(http, server.api, messages[0])
    assert code == 200, claim
    assert claim["status"]["state"] == "running" and claim["runId"] == 0
    assert claim["task"]["taskQueueId"] == "prov/seed000"

    code, done = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
    assert code == 200, done
    assert done["status"]["state"] == "completed"
    assert (await status(http, server.api, task_id))["runs"][0]["reasonResolved"] == "completed"
    # The tip goes (once the report is answered): not visible, and not hidden either (the
    # queue is empty).
    await eventually(lambda: storage.message_count(storage.pending_queue("prov/seed000")),
                     lambda n: n == 0, what="the run's message deleted after its report")
    for q in urls["queues"]:
        assert await sas.get_messages(http, q["signedPollUrl"], 32) == []


async def test_poll_urls_are_ordered_highest_priority_first(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'the worker must poll the Azure queues in order they are given' (docs/workers/sas.md): a task at
    `highest` comes out of the first poll URL even when a `lowest` one was created first."""
    server = await make_server()
    low = await create(http, server.api, definition("prov/prio", priority="lowest"))
    high = await create(http, server.api, definition("prov/prio", priority="highest"))
    urls = await sas.poll_task_urls(http, server.api, "prov", "prio")
    first = await sas.get_messages(http, urls["queues"][0]["signedPollUrl"], 32)
    assert [m.tip["taskId"] for m in first] == [high]
    last = await sas.get_messages(http, urls["queues"][6]["signedPollUrl"], 32)
    assert [m.tip["taskId"] for m in last] == [low]


async def test_unreclaimed_claim_reappears_as_next_run_and_expires_the_old_one(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'if a worker failed to reclaim a task on time ... the Azure queue message will become
    visible ... Remember that we modified the message text to have runId + 1' (docs/workers/sas.md)."""
    server = await make_server(claim_timeout=2.0, run_resolvers=False)
    task_id = await create(http, server.api, definition("prov/expiry"))
    urls = await sas.poll_task_urls(http, server.api, "prov", "expiry")
    poll_url = urls["queues"][6]["signedPollUrl"]
    [message] = await sas.get_messages(http, poll_url)
    code, _ = await sas.claim(http, server.api, message, worker_id="first")
    assert code == 200
    assert await sas.get_messages(http, poll_url) == []  # invisible while claimed

    [again] = await eventually(lambda: sas.get_messages(http, poll_url),
                               what="the tip reappearing once the claim expired")
    assert again.message_id == message.message_id
    tip = again.tip
    assert tip["taskId"] == task_id and tip["runId"] == 1
    assert tip["signature"] == tip_signer(server).sign("prov/expiry", task_id, 1)

    code, claim = await sas.claim(http, server.api, again, worker_id="second")
    assert code == 200, claim
    runs = claim["status"]["runs"]
    assert runs[0]["state"] == "exception" and runs[0]["reasonResolved"] == "claim-expired"
    assert runs[1]["state"] == "running" and runs[1]["reasonCreated"] == "retry"
    assert runs[1]["workerId"] == "second"
    assert claim["status"]["retriesLeft"] == 4


async def test_reclaim_keeps_the_tip_invisible_past_the_first_taken_until(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'As the worker calls queue.reclaimTask, the queue updates the invisibility timeout'."""
    server = await make_server(claim_timeout=3.0, run_resolvers=False)
    task_id = await create(http, server.api, definition("prov/reclaim"))
    urls = await sas.poll_task_urls(http, server.api, "prov", "reclaim")
    poll_url = urls["queues"][6]["signedPollUrl"]
    [message] = await sas.get_messages(http, poll_url)
    code, claim = await sas.claim(http, server.api, message)
    assert code == 200
    first_taken_until = claim["takenUntil"]
    taken_until = first_taken_until
    # Reclaimed halfway through each claim, until well past the first takenUntil.
    while timeutil.utcnow() < timeutil.parse(first_taken_until) + timedelta(seconds=1.5):
        halfway = timeutil.parse(taken_until) - timedelta(seconds=1.5)
        await eventually(timeutil.utcnow, lambda now, at=halfway: now >= at, interval=0.1,
                         what="halfway through the claim")
        code, re = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/reclaim")
        assert code == 200, re
        assert re["takenUntil"] > first_taken_until
        assert await sas.get_messages(http, poll_url) == []
        taken_until = re["takenUntil"]
    # Well past the first takenUntil: still running, tip still hidden.
    assert (await status(http, server.api, task_id))["runs"][0]["state"] == "running"
    code, done = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
    assert code == 200 and done["status"]["state"] == "completed"


async def test_bad_signature_or_foreign_message_is_refused_and_worker_deletes_tip(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'the worker must delete messages if the queue.claimTask operations fails with a 4xx
    error' with 'the URI encoded contents of <PopReceipt>' (docs/workers/sas.md)."""
    server = await make_server()
    task_a = await create(http, server.api, definition("prov/tamper"))
    task_b = await create(http, server.api, definition("prov/tamper"))
    urls = await sas.poll_task_urls(http, server.api, "prov", "tamper")
    queue = urls["queues"][6]
    # One GET each: Azurite hands every message of one GET the same pop receipt.
    messages = [*await sas.get_messages(http, queue["signedPollUrl"], 1),
                *await sas.get_messages(http, queue["signedPollUrl"], 1)]
    assert {m.tip["taskId"] for m in messages} == {task_a, task_b}
    assert messages[0].pop_receipt != messages[1].pop_receipt
    m_a = next(m for m in messages if m.tip["taskId"] == task_a)
    m_b = next(m for m in messages if m.tip["taskId"] == task_b)

    # A tampered signature.
    forged = sas.QueueMessage(m_a.message_id, m_a.pop_receipt, 1, base64.b64encode(json.dumps(
        {"taskId": task_a, "runId": 0, "signature": "A" * 43}).encode()).decode())
    code, err = await sas.claim(http, server.api, forged)
    assert code == 400 and "signature" in err["message"]
    # A valid signature and receipt with another message's id.
    foreign = sas.QueueMessage(m_b.message_id, m_a.pop_receipt, 1, m_a.text)
    code, err = await sas.claim(http, server.api, foreign)
    assert code == 400 and "messageId" in err["message"]
    # A messageId of no message in this queue.
    made_up = sas.QueueMessage("0f6c5f32-4d3c-4d63-9d2e-6f3c2a1b0c9d", m_a.pop_receipt, 1, m_a.text)
    code, err = await sas.claim(http, server.api, made_up)
    assert code == 400 and "messageId" in err["message"]
    # A run that does not exist: also a 4xx.
    fake = sas.QueueMessage(m_a.message_id, m_a.pop_receipt, 1, base64.b64encode(json.dumps(
        {"taskId": slugid(), "runId": 0, "signature": "x"}).encode()).decode())
    code, _ = await sas.claim(http, server.api, fake)
    assert 400 <= code < 500

    # Nothing changed...
    for task_id in (task_a, task_b):
        assert (await status(http, server.api, task_id))["state"] == "pending"
    # ...and the worker deletes its tip with the URI-encoded receipt.
    assert "%" in sas.delete_url(queue["signedDeleteUrl"], m_a) or "/" not in m_a.pop_receipt
    assert await sas.delete_message(http, queue["signedDeleteUrl"], m_a) == 204
    assert await sas.delete_message(http, queue["signedDeleteUrl"], m_b) == 204
    # A delete with a stale receipt is "not mine any more" (400 on Azurite, 404 on Azure).
    assert await sas.delete_message(http, queue["signedDeleteUrl"], m_a) in (400, 404)


async def test_a_tip_paired_with_another_held_message_is_refused_and_strands_nothing(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """The signature 'reduces the workers ability to mix-up claimed tasks by accident'
    (docs/workers/sas.md); the receipt does not help when both messages are held (Azurite hands every
    message of one GET the same receipt). Task A's tip presented with task B's message
    is refused before B's message is touched, and both tasks are then claimed normally."""
    server = await make_server()
    task_a = await create(http, server.api, definition("prov/mixup"))
    task_b = await create(http, server.api, definition("prov/mixup"))
    urls = await sas.poll_task_urls(http, server.api, "prov", "mixup")
    queue = urls["queues"][6]
    held = await sas.get_messages(http, queue["signedPollUrl"], 2)
    m_a = next(m for m in held if m.tip["taskId"] == task_a)
    m_b = next(m for m in held if m.tip["taskId"] == task_b)
    mixed = sas.QueueMessage(m_b.message_id, m_b.pop_receipt, 1, m_a.text)
    code, err = await sas.claim(http, server.api, mixed)
    assert code == 400 and "does not carry a tip" in err["message"], err
    # B's message still says B: claiming it as received works.
    code, claim_b = await sas.claim(http, server.api, m_b, worker_id="w2")
    assert code == 200 and claim_b["status"]["taskId"] == task_b
    code, claim_a = await sas.claim(http, server.api, m_a)
    assert code == 200 and claim_a["status"]["taskId"] == task_a
    for task_id in (task_a, task_b):
        code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
        assert code == 200


async def test_a_tip_whose_record_was_lost_is_replaced_by_a_recorded_one(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector) -> None:
    """If the queue died between putting a tip and recording it, the tip is refused (and
    deleted by the worker) but the pending run gets a new, recorded tip at once."""
    server = await make_server()
    task_id = await create(http, server.api, definition("prov/unrecorded"))
    urls = await sas.poll_task_urls(http, server.api, "prov", "unrecorded")
    queue = urls["queues"][6]
    [recorded] = await sas.get_messages(http, queue["signedPollUrl"])
    assert await sas.delete_message(http, queue["signedDeleteUrl"], recorded) == 204
    qclient = storage.queue(storage.pending_queue("prov/unrecorded", Priority.LOWEST))
    await qclient.send_message(
        tip_signer(server).tip("prov/unrecorded", task_id, 0).encode())  # unrecorded
    [orphan] = await sas.get_messages(http, queue["signedPollUrl"])
    code, err = await sas.claim(http, server.api, orphan)
    assert code == 400 and "does not carry a tip" in err["message"]
    assert await sas.delete_message(http, queue["signedDeleteUrl"], orphan) == 204
    [fresh] = await sas.get_messages(http, queue["signedPollUrl"])
    code, claim = await sas.claim(http, server.api, fresh)
    assert code == 200 and claim["status"]["taskId"] == task_id


async def _pending(http: aiohttp.ClientSession, api: str, worker_type: str) -> list[bool]:
    async with http.get(f"{api}/poll-task-url/prov/{worker_type}?pending=true") as r:
        assert r.status == 200, await r.text()
        body = await r.json()
    assert len(body["queues"]) == 7 and body["pending"]["sampled"]
    assert len(body["pending"]["ages"]) == 7 and min(body["pending"]["ages"]) >= 0
    queues: list[bool] = body["pending"]["queues"]
    return queues


async def test_poll_task_urls_says_which_queues_hold_visible_tips_when_asked(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """``?pending=true``: beside the URLs, which of the seven queues (in their order) held
    visible tips at ``sampled``. A tip this replica puts shows at once; one put by another
    replica once that replica's sample is renewed; a claimed tip (invisible) does not."""
    a, b = await make_server(), await make_server()
    assert await _pending(http, a.api, "hints") == [False] * 7
    assert await _pending(http, b.api, "hints") == [False] * 7
    assert "pending" not in await sas.poll_task_urls(http, a.api, "prov", "hints")

    await create(http, a.api, definition("prov/hints", priority="high"))
    assert await _pending(http, a.api, "hints") == [False, False, True] + [False] * 4
    await eventually(lambda: _pending(http, b.api, "hints"),
                     lambda q: q == [False, False, True] + [False] * 4,
                     what="the other replica's sample to show the tip")

    urls = await sas.poll_task_urls(http, a.api, "prov", "hints")
    [message] = await sas.get_messages(http, urls["queues"][2]["signedPollUrl"], 1)
    code, _ = await sas.claim(http, a.api, message)
    assert code == 200
    await eventually(lambda: _pending(http, b.api, "hints"), lambda q: q == [False] * 7,
                     what="the claimed tip to leave the sample")


async def test_poll_task_urls_refuses_a_pending_that_is_not_a_boolean(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    server = await make_server()
    async with http.get(f"{server.api}/poll-task-url/prov/hints?pending=yes") as r:
        assert r.status == 400
        body = await r.json()
    assert body["code"] == "InputValidationError" and "`pending`" in body["message"]


async def test_a_claim_whose_message_id_or_receipt_is_not_azures_is_refused_at_once(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """Azure and Azurite give a message a GUID for its id and a base64 pop receipt; a
    claimTask carrying anything else, even with the tip's genuine signature, is a 400
    that says what a messageId (or receipt) looks like, before any storage request."""
    server = await make_server(run_resolvers=False)
    task_id = await create(http, server.api, definition("prov/shape"))
    queue = (await sas.poll_task_urls(http, server.api, "prov", "shape"))["queues"][6]
    [message] = await sas.get_messages(http, queue["signedPollUrl"])
    url = f"{server.api}/task/{task_id}/runs/0/claim"
    genuine = {"workerGroup": "wg", "workerId": "w", "messageId": message.message_id,
               "receipt": message.pop_receipt, "signature": message.tip["signature"]}

    for field, value in [("messageId", "a/b#c?d"), ("messageId", "not-a-guid"),
                         ("receipt", "a/b#c?d&x=1"), ("receipt", "AgAA AAMA")]:
        before = sum(server.services.health.storage_requests().values())
        code, answer = await sas.post(http, url, {**genuine, field: value})
        assert (code, answer["code"]) == (400, "InputValidationError"), (field, value, answer)
        assert field in answer["message"]
        assert ("GUID" if field == "messageId" else "base64") in answer["message"]
        assert sum(server.services.health.storage_requests().values()) == before

    code, claim = await sas.post(http, url, genuine)
    assert code == 200, claim


async def test_a_tip_handed_to_claim_work_before_its_record_serves_the_retry_of_its_run(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """A tip handed to a claimWork caller waiting on the replica that created its task is
    never recorded on its own: the claim that holds it records it. So when that claim is
    not reclaimed, the message reappears as the retry's tip, and a SAS worker's claim of
    it expires the run and claims the retry, as for any tip."""
    server = await make_server(claim_timeout=2.0, run_resolvers=False)
    waiting = asyncio.create_task(sas.post(
        http, f"{server.api}/claim-work/prov%2Fhanded-retry",
        {"workerGroup": "wg", "workerId": "gone", "tasks": 1}))
    await callers_waiting(server, "prov/handed-retry")
    task_id = await create(http, server.api, definition("prov/handed-retry"))
    code, answer = await waiting
    assert code == 200 and [c["status"]["taskId"] for c in answer["tasks"]] == [task_id]
    urls = await sas.poll_task_urls(http, server.api, "prov", "handed-retry")
    poll_url = urls["queues"][6]["signedPollUrl"]
    [again] = await eventually(lambda: sas.get_messages(http, poll_url),
                               what="the tip reappearing once the claim expired")
    assert again.tip["taskId"] == task_id and again.tip["runId"] == 1
    code, claim = await sas.claim(http, server.api, again, worker_id="second")
    assert code == 200, claim
    runs = claim["status"]["runs"]
    assert runs[0]["reasonResolved"] == "claim-expired" and runs[1]["workerId"] == "second"


@asynccontextmanager
async def _record_held(proxy: FaultProxy, server: Server, storage: StorageInspector,
                       http: aiohttp.ClientSession, task_queue_id: str) -> AsyncIterator[str]:
    """A task created on ``server`` whose tip's record, which follows createTask's
    answer, storage holds back until the body is done; yields its taskId."""
    task_id = slugid()
    record = proxy.hold("PATCH", f"/{storage.table_name('tasks')}(PartitionKey='{task_id}'")
    try:
        await create(http, server.api, definition(task_queue_id), task_id)
        await asyncio.wait_for(record.reached.wait(), 30)
        yield task_id
    finally:
        record.release()


async def test_a_worker_that_polls_a_new_tip_before_its_record_waits_for_the_record(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        storage: StorageInspector, http: aiohttp.ClientSession) -> None:
    """The tip of a task that is its own group is recorded after createTask answered; a
    worker whose claim comes first waits for the record, and claims once it is stored."""
    server = await make_server(storage=StorageSettings(proxy.connection_string(),
                                                       storage_prefix),
                               run_resolvers=False)
    async with _record_held(proxy, server, storage, http, "prov/record-wait") as task_id:
        urls = await sas.poll_task_urls(http, server.api, "prov", "record-wait")
        [message] = await sas.get_messages(http, urls["queues"][6]["signedPollUrl"])
        claiming = asyncio.create_task(sas.claim(http, server.api, message))
        await asyncio.sleep(0.3)
        assert not claiming.done()  # waiting for the record
    code, claim = await claiming
    assert code == 200 and claim["status"]["taskId"] == task_id, claim


async def test_a_record_that_comes_after_a_new_priority_records_nothing_stale(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        storage: StorageInspector, http: aiohttp.ClientSession) -> None:
    """The record of a new task's tip is written on the task as createTask left it, else
    on a fresh read by the rules of every change: when changeTaskPriority came first, the
    tip it recorded in the new priority's queue stays the task's live tip, and the old
    tip is not recorded (a worker presenting it is refused and deletes it)."""
    server = await make_server(storage=StorageSettings(proxy.connection_string(),
                                                       storage_prefix),
                               run_resolvers=False)
    async with _record_held(proxy, server, storage, http, "prov/late-record") as task_id:
        code, _ = await sas.post(http, f"{server.api}/task/{task_id}/priority",
                                 {"newPriority": "highest"})
        assert code == 200
        proxy.trips = []
    trips = proxy.trips
    # The late record is refused (the task changed), and the task read again.
    await eventually(lambda: [t.hit.kind for t in trips if t.hit.client == "server"],
                     lambda kinds: "PATCH entity" in kinds and "GET entity" in kinds[
                         kinds.index("PATCH entity"):],
                     what="the late record refused and the task read again")
    proxy.trips = None
    urls = await sas.poll_task_urls(http, server.api, "prov", "late-record")
    lowest, highest = urls["queues"][-1], urls["queues"][0]
    [old] = await sas.get_messages(http, lowest["signedPollUrl"])
    [new] = await sas.get_messages(http, highest["signedPollUrl"])
    stored = await storage.stored(task_id)
    assert stored.live_tip is not None and stored.live_tip.message_id == new.message_id
    assert old.message_id not in stored.tips and new.message_id in stored.tips
    code, refused = await sas.claim(http, server.api, old)
    assert code == 400, refused
    code, claim = await sas.claim(http, server.api, new)
    assert code == 200 and claim["task"]["priority"] == "highest", claim
