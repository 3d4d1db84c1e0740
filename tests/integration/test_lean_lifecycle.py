"""What makes a lifecycle cheap must keep the claim protocol's rules: the tip put with
its task and recorded after, this process's copies of tasks, the claim index written late, the claimWork
poller shared by every waiting call."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from azqueue.api.app import create_app
from azqueue.config import Settings, StorageSettings
from azqueue.devstorage import Azurite, free_port
from azqueue.model import definition as definitions
from azqueue.model import task as model
from azqueue.model import timeutil
from azqueue.model.events import Event
from azqueue.model.priority import Priority
from azqueue.service.dispatch.tips import records_after
from azqueue.storage.account import StorageAccount
from azqueue.storage.queues import PendingQueues, Queues
from azqueue.storage.taskrows import TIP
from azqueue.storage.tasks import TaskStore
from azqueue.testing import sas
from azqueue.testing.events import RecordedEvents
from azqueue.testing.faultproxy import FaultProxy, round_trips
from azqueue.testing.inprocess import InProcessServer
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition, slugid, status
from tests.integration.test_claim_work import callers_waiting, claim_work
from tests.servers import ROOT, Server, ServerFactory, tip_signer
from tests.waiting import eventually, stays


async def _stage_tip(server: Server, account: StorageAccount,
                     task_queue_id: str) -> tuple[str, model.Task, str]:
    """What createTask does first: a task's run-0 tip, signed as ``server`` signs it, put
    in its queue (through the test's ``account``), the task not yet stored. Returns the
    taskId, the task to store, and the tip's messageId."""
    task_id = slugid()
    task = model.new_task(task_id, definitions.normalize(
        task_id, definition(task_queue_id), timeutil.utcnow()), timeutil.utcnow())
    pending = PendingQueues(account=account, queues=Queues(account))
    name = await pending.ensure(task_queue_id, Priority.LOWEST)
    message = await pending.queues.put(
        name, tip_signer(server).tip(task_queue_id, task_id, 0).encode())
    return task_id, task, message.message_id


async def _poll_one(http: aiohttp.ClientSession, server: Server,
                    worker_type: str) -> tuple[sas.QueueMessage, dict[str, Any]]:
    urls = await sas.poll_task_urls(http, server.api, "prov", worker_type)
    queue = urls["queues"][6]
    [message] = await sas.get_messages(http, queue["signedPollUrl"])
    return message, queue


async def test_a_tip_polled_before_its_task_is_stored_is_claimed_once_it_is(
        make_server: ServerFactory, http: aiohttp.ClientSession, account: StorageAccount,
        task_store: TaskStore) -> None:
    """createTask puts the tip, then stores the task with the tip's record. A worker that
    polls the tip in between must not be told to delete it ('if ... claimTask fails with
    a 4xx error, the worker must delete the messages', docs/workers/sas.md): its claim waits for the task."""
    server = await make_server()
    task_id, task, message_id = await _stage_tip(server, account, "prov/early")
    message, _ = await _poll_one(http, server, "early")
    assert message.message_id == message_id
    claiming = asyncio.create_task(sas.claim(http, server.api, message))
    await stays(claiming.done, lambda done: not done, what="the claim waiting for its task",
                for_=0.5)
    assert await task_store.insert(task, tips=(message_id,)) is not None
    code, claim = await claiming
    assert code == 200 and claim["status"]["taskId"] == task_id and claim["runId"] == 0


async def test_a_tip_whose_task_is_never_stored_answers_404_and_is_deleted(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        account: StorageAccount) -> None:
    """A createTask that died between its tip and its task leaves a tip of no task: the
    claim answers 404 and the worker deletes the message."""
    server = await make_server()
    await _stage_tip(server, account, "prov/never")
    message, queue = await _poll_one(http, server, "never")
    code, err = await sas.claim(http, server.api, message)
    assert code == 404, err
    assert await sas.delete_message(http, queue["signedDeleteUrl"], message) in (200, 204)


async def test_a_tip_recorded_as_a_row_by_an_earlier_version_is_still_honoured(
        make_server: ServerFactory, http: aiohttp.ClientSession, account: StorageAccount,
        task_store: TaskStore) -> None:
    server = await make_server()
    task_id, task, message_id = await _stage_tip(server, account, "prov/legacy")
    assert await task_store.insert(task) is not None
    await account.tables.get_table_client(task_store.name).create_entity(
        {"PartitionKey": task_id, "RowKey": TIP + message_id})
    message, _ = await _poll_one(http, server, "legacy")
    code, claim = await sas.claim(http, server.api, message)
    assert code == 200 and claim["runId"] == 0


async def test_replicas_deciding_on_their_own_copies_never_disagree(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """A replica decides a claim, reclaim or report on its copy of the task only if its
    conditional write succeeds: claimed on A, reclaimed on B, reclaimed and reported on A
    (whose copy, and held receipt, are stale), reported again on B."""
    a, b = await make_server(), await make_server()
    task_id = await create(http, a.api, definition("prov/copies"))
    message, _ = await _poll_one(http, a, "copies")
    code, _ = await sas.claim(http, a.api, message)
    assert code == 200
    for replica in (b, a, b, a):
        code, body = await sas.post(http, f"{replica.api}/task/{task_id}/runs/0/reclaim")
        assert code == 200, body
    code, body = await sas.post(http, f"{a.api}/task/{task_id}/runs/0/completed")
    assert code == 200 and body["status"]["state"] == "completed", body
    code, body = await sas.post(http, f"{b.api}/task/{task_id}/runs/0/completed")
    assert code == 200 and body["status"]["state"] == "completed", body
    code, body = await sas.post(http, f"{a.api}/task/{task_id}/runs/0/failed")
    assert code == 409, body
    # The message the claim held was deleted when the run was resolved.
    urls = await sas.poll_task_urls(http, a.api, "prov", "copies")
    for q in urls["queues"]:
        assert await sas.get_messages(http, q["signedPollUrl"], 32) == []


async def test_a_report_on_a_stale_copy_is_refused_only_after_a_fresh_read(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """Replica A created (and kept a copy of) the task; B claimed it. A report to A must
    see B's claim, not refuse the run as pending."""
    a, b = await make_server(), await make_server()
    task_id = await create(http, a.api, definition("prov/stale"))
    message, _ = await _poll_one(http, b, "stale")
    code, _ = await sas.claim(http, b.api, message)
    assert code == 200
    code, body = await sas.post(http, f"{a.api}/task/{task_id}/runs/0/completed")
    assert code == 200 and body["status"]["state"] == "completed", body


async def test_a_short_run_costs_the_claim_index_nothing_and_a_long_one_is_indexed(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector) -> None:
    """The claim resolver's index holds the runs still running some time after their
    claim (here half the 2 s claim timeout); a run resolved sooner never gets a row, and
    the row of an indexed run goes when it is resolved."""
    server = await make_server(claim_timeout=2.0, run_resolvers=False)
    short = await create(http, server.api, definition("prov/index"))
    long = await create(http, server.api, definition("prov/index"))
    for task_id in (short, long):
        code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/claim",
                                 {"workerGroup": "wg", "workerId": "w"})
        assert code == 200
    code, _ = await sas.post(http, f"{server.api}/task/{short}/runs/0/completed")
    assert code == 200
    await eventually(lambda: storage.claim(long, 0), lambda row: row is not None,
                     what="the long run indexed")
    assert await storage.claim(short, 0) is None
    code, _ = await sas.post(http, f"{server.api}/task/{long}/runs/0/completed")
    assert code == 200
    assert await storage.claim(long, 0) is None


async def test_a_closing_server_indexes_the_claims_it_has_not_written_yet(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector) -> None:
    server = await make_server(claim_timeout=600.0, run_resolvers=False)
    task_id = await create(http, server.api, definition("prov/closing"))
    code, claim = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/claim",
                                 {"workerGroup": "wg", "workerId": "w"})
    assert code == 200
    assert await storage.claim(task_id, 0) is None  # 300 s to go
    await server.services.index.close()
    row = await storage.claim(task_id, 0)
    assert row is not None and timeutil.fmt(row.taken_until) == claim["takenUntil"]


@pytest.mark.slow
async def test_waiting_claim_work_calls_share_one_poller_and_get_distinct_tasks(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'claimWork ... long-polling' (docs/workers/sdk.md): eight callers waiting at once on a replica that
    did not create the tasks (so nothing is handed over) each get their own task."""
    creator, server = await make_server(), await make_server(claim_work_poll_interval=0.5)
    callers = [asyncio.create_task(claim_work(http, server, "prov/shared", worker_id=f"w{i}"))
               for i in range(8)]
    await callers_waiting(server, "prov/shared", 8)
    created = {await create(http, creator.api, definition("prov/shared")) for _ in range(8)}
    claimed = [c["status"]["taskId"] for got in await asyncio.gather(*callers) for c in got]
    assert len(claimed) == len(set(claimed)) and set(claimed) <= created
    # Whatever a caller did not get is still there for the next one.
    rest = [c["status"]["taskId"] for c in await claim_work(http, server, "prov/shared",
                                                              tasks=8, worker_id="late")]
    assert sorted(claimed + rest) == sorted(created)
    for task_id in created:
        assert (await status(http, server.api, task_id))["state"] == "running"


async def test_a_write_replayed_after_its_answer_was_lost_is_reported_as_the_change_it_was(
        server: Server, http: aiohttp.ClientSession, task_store: TaskStore) -> None:
    """A storage request whose answer is lost is sent again (``storage.rest``); a
    conditional write that was stored the first time then finds its own ETag moved (412).
    ``modify`` must recognise its own write and report the change it made (so the claim
    is answered and its message settled), not a no-op; a concurrent write of someone else
    that happens to decide the same is not taken for its own."""
    task_id = await create(http, server.api, definition("prov/replay"))
    rest = task_store._rest
    send = rest.update_entity

    async def answer_lost_once(*args: Any, **kwargs: Any) -> dict[str, Any]:
        await send(*args, **kwargs)   # stored, but its answer never arrives:
        return await send(*args, **kwargs)   # so it is sent again, and refused (412)

    now = timeutil.utcnow()

    def claim(task: model.Task) -> model.Task:
        return model.claim(task, 0, "wg", "w", now, server.services.claims.claim_timeout)

    first = await task_store.load(task_id)
    rest.update_entity = answer_lost_once  # type: ignore[method-assign]
    try:
        replayed = await task_store.modify(task_id, claim, first, records=records_after)
    finally:
        rest.update_entity = send  # type: ignore[method-assign]
    assert replayed.changed and replayed.before == first.task
    assert replayed.after.runs[0].state is model.RunState.RUNNING
    # The same decision again, from the same old read, is another request: no change.
    again = await task_store.modify(task_id, claim, first, records=records_after)
    assert not again.changed


async def test_create_task_of_a_group_of_one_costs_three_storage_requests_and_a_record(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        storage: StorageInspector, http: aiohttp.ClientSession) -> None:
    """A task that is its own group (Taskcluster's default) costs createTask its deadline
    trigger, its tip and its insert, nothing for the group (docs/capacity.md): the insert
    writes the group's ``members`` row, which a task joining the group first would have
    written, so no record of the group is asked or written. The record of its tip, for
    the claims of SAS workers, follows the answer: a fourth request."""
    server = await make_server(
        storage=StorageSettings(proxy.connection_string(), storage_prefix),
        run_resolvers=False, doorbell_interval=3600.0)
    first = await create(http, server.api, definition("prov/alone"))

    async def recorded() -> bool:
        async with http.get(f"{server.api}/task-queues/prov%2Falone") as r:
            return r.status == 200

    await eventually(recorded, what="the task queue recorded (in the background)")
    await eventually(lambda: storage.stored(first), lambda s: s.live_tip is not None,
                     what="the first task's tip recorded")
    before = proxy.snapshot()
    task_id = slugid()
    await create(http, server.api, definition("prov/alone", taskGroupId=task_id), task_id)
    await eventually(lambda: storage.stored(task_id), lambda s: s.live_tip is not None,
                     what="the tip recorded")
    spent = {hit.kind: n for hit, n in (proxy.snapshot() - before).items()
             if hit.client == "server"}
    assert spent == {"POST message": 2, "POST $batch": 1, "PATCH entity": 1}, spent


async def test_create_task_of_a_group_of_one_waits_for_one_storage_round_trip(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        storage: StorageInspector, http: aiohttp.ClientSession) -> None:
    """At Azure's latency a caller waits for the storage requests of its call that go one
    after another: createTask of a task that is its own group sends its deadline trigger,
    its tip and its insert at once (docs/capacity.md), and records the tip after its
    answer. Storage here answers half a second late, far more than the server takes to
    send the three, so requests sent one after another cannot pass for sent together."""
    server = await make_server(
        storage=StorageSettings(proxy.connection_string(), storage_prefix),
        run_resolvers=False, doorbell_interval=3600.0)
    first = await create(http, server.api, definition("prov/latency"))  # queues, connections

    async def recorded(task_id: str) -> bool:
        return (await storage.stored(task_id)).live_tip is not None

    await eventually(lambda: recorded(first), what="the first task's tip recorded")
    proxy.delay, proxy.trips = 0.25, []
    try:
        since = time.monotonic()
        task_id = await create(http, server.api, definition("prov/latency"))
        until = time.monotonic()
        chain = round_trips(proxy.trips, since, until, ("server",))
        assert len(chain) == 1, [t.hit for t in chain]
        waited = [t.hit.kind for t in proxy.trips if t.hit.client == "server" and
                  since <= t.sent and t.answered <= until]
        assert sorted(waited) == ["POST $batch", "POST message", "POST message"], waited
        # The record of the tip, a merge into the task, is answered after the call was.
        assert not await recorded(task_id)
        await eventually(lambda: recorded(task_id), what="the tip recorded after the answer")
    finally:
        proxy.delay, proxy.trips = 0.0, None
    assert (await status(http, server.api, task_id))["state"] == "pending"


async def test_create_task_of_a_task_that_waits_for_a_dependency_takes_three_round_trips(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        http: aiohttp.ClientSession) -> None:
    """A task that waits for a dependency (as each task a taskgraph decision task creates
    does): its reads with its deadline trigger and dependents row; its definition trigger,
    wait row and the mark on the dependency; the task while the dependency is read again
    (docs/capacity.md). The read once more that follows the answer is not waited for."""
    server = await make_server(
        storage=StorageSettings(proxy.connection_string(), storage_prefix),
        run_resolvers=False, doorbell_interval=3600.0)
    dependency = await create(http, server.api, definition("prov/waits"))
    await create(http, server.api, definition("prov/waits", dependencies=[dependency]))
    proxy.delay, proxy.trips = 0.25, []
    try:
        since = time.monotonic()
        task_id = await create(http, server.api, definition("prov/waits",
                                                            dependencies=[dependency]))
        until = time.monotonic()
        chain = round_trips(proxy.trips, since, until, ("server",))
        kinds = [t.hit.kind for t in chain]
        assert len(chain) == 3, kinds
    finally:
        proxy.delay, proxy.trips = 0.0, None
    assert (await status(http, server.api, task_id))["state"] == "unscheduled"


async def test_a_claim_work_caller_waiting_on_the_creating_replica_has_its_task_in_two_round_trips(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        storage: StorageInspector, http: aiohttp.ClientSession) -> None:
    """A claimWork caller waits on the replica that creates a task of its task queue: the
    tip is put already as the caller's claim holds it (hidden, saying run 1), with the
    trigger and the insert, and the claim is written next (docs/capacity.md). Two round
    trips from createTask sent to the caller answered, none a rewrite; the task is
    running with the message it was put in, and nobody else could poll that message."""
    server = await make_server(
        storage=StorageSettings(proxy.connection_string(), storage_prefix),
        run_resolvers=False, doorbell_interval=3600.0, claim_work_poll_interval=60.0)
    queue = "prov/handed"

    async def handed() -> tuple[str, list[dict[str, Any]]]:
        waiting = asyncio.create_task(claim_work(http, server, queue))
        await callers_waiting(server, queue)
        entry = server.services.work.waiting.entry(queue)
        await eventually(lambda: not entry.dirty, interval=0.05,
                         what="the caller's poller done with its first look at the queues")
        return await create(http, server.api, definition(queue)), await waiting

    await handed()  # the queues, the connections, the worker's quarantine look (10 s)
    proxy.delay, proxy.trips = 0.25, []
    try:
        since = time.monotonic()
        task_id, claims = await handed()
        until = time.monotonic()
        chain = round_trips(proxy.trips, since, until, ("server",))
    finally:
        proxy.delay, proxy.trips = 0.0, None
    assert [c["status"]["taskId"] for c in claims] == [task_id]
    kinds = [t.hit.kind for t in chain]
    assert len(chain) == 2 and kinds[1] == "PUT entity", kinds
    stored = await storage.stored(task_id)
    assert stored.task.runs[0].state.value == "running" and stored.held is not None
    urls = await sas.poll_task_urls(http, server.api, "prov", "handed")
    assert await sas.get_messages(http, urls["queues"][6]["signedPollUrl"]) == []


async def test_a_sas_claim_on_the_replica_that_created_the_task_costs_two_requests(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        storage: StorageInspector, http: aiohttp.ClientSession) -> None:
    """The record of a new task's tip, written after createTask answered, keeps the
    replica's copy of the task (with the ETag the record left): a worker's claim there
    is decided on it, and costs the tip's rewrite and the claim's write, no read of the
    task."""
    server = await make_server(storage=StorageSettings(proxy.connection_string(),
                                                       storage_prefix),
                               run_resolvers=False, doorbell_interval=3600.0)
    task_id = await create(http, server.api, definition("prov/copykept"))
    await eventually(lambda: storage.stored(task_id), lambda s: s.live_tip is not None,
                     what="the tip recorded")
    urls = await sas.poll_task_urls(http, server.api, "prov", "copykept")
    [message] = await sas.get_messages(http, urls["queues"][6]["signedPollUrl"])
    before = proxy.snapshot()
    code, claim = await sas.claim(http, server.api, message)
    assert code == 200 and claim["status"]["taskId"] == task_id, claim
    spent = {hit.kind: n for hit, n in (proxy.snapshot() - before).items()
             if hit.client == "server" and (hit.service == "queue" or hit.kind.endswith("entity"))}
    # (The worker's first claim here also reads whether it is quarantined: a query.)
    assert spent == {"PUT message (update)": 1, "PUT entity": 1}, spent


class _SlowBroker(RecordedEvents):
    """A broker that takes its time to confirm each event."""

    async def publish(self, event: Event) -> None:
        await asyncio.sleep(1.5)
        await super().publish(event)


async def test_a_broker_slow_to_confirm_the_new_tasks_events_queues_no_second_tip(
        azurite: Azurite, storage_prefix: str, storage: StorageInspector,
        http: aiohttp.ClientSession) -> None:
    """A task stored long after its tip gets another (a claim of the tip waits only so
    long for the task); the time its events then take to be published is not the
    task's: one tip, however slow the broker."""
    settings = Settings(storage=StorageSettings(azurite.connection_string, storage_prefix),
                        tip_secrets=("test-secret-0123456789abcdef",), root=ROOT,
                        host="127.0.0.1", port=free_port()).with_(run_resolvers=False)
    broker = _SlowBroker()
    server = await InProcessServer.start(settings, create_app(settings, events=broker))
    try:
        task_id = await create(http, server.api, definition("prov/slow-broker"))
        assert broker.messages  # published before the answer, slowly
        stored = await eventually(lambda: storage.stored(task_id),
                                  lambda s: s.live_tip is not None, what="the tip recorded")
        assert len(stored.tips) == 1, stored.tips
        assert await storage.pending_count("prov/slow-broker") == 1
    finally:
        await server.stop()
