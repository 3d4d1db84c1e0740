"""Task events on AMQP exchanges (see docs/concepts.md), on a real RabbitMQ."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from azure.data.tables import UpdateMode

from azqueue.config import StorageSettings
from azqueue.events import outbox
from azqueue.testing import sas
from azqueue.testing.faultproxy import FaultProxy
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition, iso, slugid, status
from tests.events.consumers import Consumer, ConsumerFactory, Received
from tests.servers import Server, ServerFactory
from tests.waiting import eventually, stays


def _kinds(messages: list[Received]) -> list[str]:
    return [m.exchange for m in messages]


def iso_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def _expires(http: aiohttp.ClientSession, api: str, task_id: str) -> str:
    async with http.get(f"{api}/task/{task_id}/status") as r:
        return str((await r.json())["status"]["expires"])


async def _claim(http: aiohttp.ClientSession, api: str, task_id: str, run_id: int = 0) -> dict:
    code, body = await sas.post(http, f"{api}/task/{task_id}/runs/{run_id}/claim",
                                {"workerGroup": "wg", "workerId": "w1"})
    assert code == 200, body
    return body


async def test_primary_binding_sees_the_whole_life_cycle_in_order(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory) -> None:
    """'You'll notice that all the exchanges in the document shares the same routing key
    pattern': defined, pending, running, artifact-created, completed, with routing keys
    primary.<taskId>.<runId>.<workerGroup>.<workerId>.<provisionerId>.<workerType>.
    <schedulerId>.<taskGroupId>._ (payloads valid against their exchange's schemas, as
    the consumer checks every message)."""
    consumer = await consume("primary.#")
    server = await make_server(amqp_url=amqp_url)
    group = slugid()
    task_id = await create(http, server.api, definition("prov/life", taskGroupId=group))
    await _claim(http, server.api, task_id)
    code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/artifacts/public/x", {
        "storageType": "reference", "expires": definition()["deadline"],
        "url": "https://example.com/x"})
    assert code == 200
    await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
    await consumer.wait_for(lambda _: len(consumer.about(task_id)) >= 5)
    mine = consumer.about(task_id)
    assert _kinds(mine) == ["task-defined", "task-pending", "task-running", "artifact-created",
                            "task-completed"]
    keys = [m.routing_key for m in mine]
    assert keys[0] == f"primary.{task_id}._._._.prov.life.-.{group}._"
    assert keys[1] == f"primary.{task_id}.0._._.prov.life.-.{group}._"
    assert keys[2:] == [f"primary.{task_id}.0.wg.w1.prov.life.-.{group}._"] * 3
    assert mine[1].body["runId"] == 0
    assert mine[2].body["takenUntil"] and mine[2].body["workerId"] == "w1"
    assert mine[3].body["artifact"]["name"] == "public/x"
    assert mine[4].body["status"]["state"] == "completed"

    failed = await create(http, server.api, definition("prov/life"))
    await _claim(http, server.api, failed)
    await sas.post(http, f"{server.api}/task/{failed}/runs/0/failed")
    await consumer.wait_for(lambda _: "task-failed" in _kinds(consumer.about(failed)))
    assert _kinds(consumer.about(failed)) == ["task-defined", "task-pending", "task-running",
                                              "task-failed"]


async def test_s3_artifacts_publish_no_artifact_created(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory) -> None:
    """Taskcluster's artifact-created message: 'Note that artifacts with the `s3` storage
    type do not produce this message.' Nor do ours that read as `s3` (`blob`)."""
    consumer = await consume("primary.#")
    server = await make_server(amqp_url=amqp_url)
    task_id = await create(http, server.api, definition("prov/s3-events"))
    await _claim(http, server.api, task_id)
    expires = definition()["deadline"]
    for name, body in [("public/s3", {"storageType": "s3", "contentType": "text/plain"}),
                       ("public/blob", {"storageType": "blob"}),
                       ("public/error", {"storageType": "error", "reason": "file-missing-on-worker",
                                         "message": "no such file"})]:
        code, answer = await sas.post(
            http, f"{server.api}/task/{task_id}/runs/0/artifacts/{name}",
            {**body, "expires": expires})
        assert code == 200, answer
    await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
    await consumer.wait_for(lambda _: "task-completed" in _kinds(consumer.about(task_id)))
    mine = consumer.about(task_id)
    assert _kinds(mine) == ["task-defined", "task-pending", "task-running", "artifact-created",
                            "task-completed"]
    assert mine[3].body["artifact"]["name"] == "public/error"


async def test_routes_are_cced_and_delivered_once_per_bound_queue(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory) -> None:
    """'all messages about this task will be CC'ed with the routing-key
    route.notify.by-email' and 'the message will only arrive in your queue once'."""
    routed = await consume("route.notify.by-email")
    both = await consume("route.notify.by-email", "primary.#")
    server = await make_server(amqp_url=amqp_url)
    task_id = await create(http, server.api, definition("prov/routes",
                                                        routes=["notify.by-email"]))
    await _claim(http, server.api, task_id)
    await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
    for consumer in (routed, both):
        await consumer.wait_for(lambda _, c=consumer: "task-completed" in _kinds(c.about(task_id)))
    expected = ["task-defined", "task-pending", "task-running", "task-completed"]
    await stays(lambda: (_kinds(routed.about(task_id)), _kinds(both.about(task_id))),
                lambda seen: seen == (expected, expected), for_=0.5,
                what="each consumer receiving each event once")
    # Delivered under the primary routing key, CC'd to the route.
    assert all(m.routing_key.startswith(f"primary.{task_id}.") and m.cc == ["route.notify.by-email"]
               for m in routed.about(task_id))


async def test_claim_expired_retry_publishes_pending_and_exhaustion_publishes_exception(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory) -> None:
    consumer = await consume("primary.#")
    server = await make_server(amqp_url=amqp_url, claim_timeout=1.0,
                               claim_resolver_interval=0.3)
    task_id = await create(http, server.api, definition("prov/expire", retries=1))
    await _claim(http, server.api, task_id, 0)
    await consumer.wait_for(lambda _: _kinds(consumer.about(task_id)).count("task-pending") == 2)
    await _claim(http, server.api, task_id, 1)
    await consumer.wait_for(lambda _: "task-exception" in _kinds(consumer.about(task_id)))
    mine = consumer.about(task_id)
    assert _kinds(mine) == ["task-defined", "task-pending", "task-running", "task-pending",
                            "task-running", "task-exception"]
    assert mine[3].body["runId"] == 1 and mine[3].body["status"]["runs"][0]["reasonResolved"] == (
        "claim-expired")
    assert mine[5].body["runId"] == 1
    assert mine[5].body["status"]["runs"][1]["reasonResolved"] == "claim-expired"


async def test_task_group_resolved_fires_once_when_its_last_task_resolves(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory) -> None:
    """'A message is published on task-group-resolved whenever all submitted tasks ...
    for a given task group have been resolved'; 'A task group may be resolved multiple
    times, since new tasks may be submitted against an already resolved task group.'"""
    group = slugid()
    consumer = await consume(f"primary.{group}.#", exchanges=("task-group-resolved",))
    server = await make_server(amqp_url=amqp_url)
    tasks = [await create(http, server.api, definition("prov/group", taskGroupId=group))
             for _ in range(3)]
    for i, task_id in enumerate(tasks):
        await _claim(http, server.api, task_id)
        await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
        if i < 2:
            await stays(lambda: consumer.messages, lambda m: m == [], for_=0.3,
                        what=f"the group unresolved after {i + 1} of 3 tasks")
    await consumer.wait_for(lambda m: len(m) >= 1)
    await stays(lambda: len(consumer.messages), lambda n: n == 1, for_=0.5,
                what="the group announced once")
    [message] = consumer.messages
    assert message.routing_key == f"primary.{group}.-._"
    latest = max([await _expires(http, server.api, t) for t in tasks], key=iso_time)
    assert message.body == {"version": 1, "taskGroupId": group, "schedulerId": "-",
                            "expires": latest}

    late = await create(http, server.api, definition("prov/group", taskGroupId=group))
    await _claim(http, server.api, late)
    await sas.post(http, f"{server.api}/task/{late}/runs/0/exception", {"reason": "malformed-payload"})
    await consumer.wait_for(lambda m: len(m) >= 2)


async def test_a_group_is_not_resolved_while_the_task_it_is_named_after_runs(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory) -> None:
    """A decision task's group (taskGroupId = its taskId) is resolved when all its tasks
    are, the decision task included: its children resolving first announce nothing."""
    server = await make_server(amqp_url=amqp_url)
    decision = await create(http, server.api, definition("prov/decision"))
    consumer = await consume(f"primary.{decision}.#", exchanges=("task-group-resolved",))
    await _claim(http, server.api, decision)
    child = await create(http, server.api, definition("prov/decision", taskGroupId=decision))
    await _claim(http, server.api, child)
    await sas.post(http, f"{server.api}/task/{child}/runs/0/completed")
    await stays(lambda: consumer.messages, lambda m: m == [], for_=0.5,
                what="nothing announced while the decision task runs")
    await sas.post(http, f"{server.api}/task/{decision}/runs/0/completed")
    await consumer.wait_for(lambda m: len(m) >= 1)
    await stays(lambda: len(consumer.messages), lambda n: n == 1, for_=0.5,
                what="the group announced once")
    [message] = consumer.messages
    latest = max([await _expires(http, server.api, t) for t in (decision, child)],
                 key=iso_time)
    assert message.body == {"version": 1, "taskGroupId": decision, "schedulerId": "-",
                            "expires": latest}


async def _announced(consumer: Consumer, group: str, count: int, timeout: float = 15,
                     for_: float = 1.0) -> None:
    """Until the ``count``-th announcement that ``group`` is resolved arrives, then that
    no other follows for ``for_`` seconds."""
    await consumer.wait_for(lambda m: len(m) >= count, timeout=timeout)
    assert consumer.messages[count - 1].body["taskGroupId"] == group
    await stays(lambda: len(consumer.messages), lambda n: n == count, for_=for_,
                what=f"the group announced {count} time(s), no more")


async def _resolve_decision_then_member(http: aiohttp.ClientSession, api: str,
                                        consumer: Consumer, decision: str, child: str) -> None:
    """Claim both, resolve the decision task: nothing is announced while its member runs;
    resolve the member: the group is announced."""
    for task_id in (decision, child):
        await _claim(http, api, task_id)
    await sas.post(http, f"{api}/task/{decision}/runs/0/completed")
    await stays(lambda: consumer.messages, lambda m: m == [], for_=0.5,
                what="nothing announced while a member runs")
    await sas.post(http, f"{api}/task/{child}/runs/0/completed")
    await consumer.wait_for(lambda m: len(m) >= 1)


@pytest.mark.parametrize("again", ["the group's own task", "a member that did not announce it",
                                   "the member that did"])
async def test_a_group_resolved_again_after_a_rerun_is_announced_again(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory, again: str) -> None:
    """'A task group may be resolved multiple times' (Taskcluster's task-group-resolved):
    a task of a resolved group is rerun; nothing is announced while its new run is
    unresolved, and once it resolves the group is announced again, once, whether or not
    that task's resolution announced it the first time."""
    server = await make_server(amqp_url=amqp_url)
    decision = slugid()
    consumer = await consume(f"primary.{decision}.#", exchanges=("task-group-resolved",))
    await create(http, server.api, definition("prov/again"), decision)
    first = await create(http, server.api, definition("prov/again", taskGroupId=decision))
    last = await create(http, server.api, definition("prov/again", taskGroupId=decision))
    for task_id in (decision, first, last):  # the last one's resolution announces it
        await _claim(http, server.api, task_id)
        await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
    await consumer.wait_for(lambda m: len(m) >= 1)
    rerun = {"the group's own task": decision, "a member that did not announce it": first,
             "the member that did": last}[again]
    code, _ = await sas.post(http, f"{server.api}/task/{rerun}/rerun")
    assert code == 200
    await _claim(http, server.api, rerun, 1)
    await stays(lambda: len(consumer.messages), lambda n: n == 1, for_=0.5,
                what="nothing announced while the rerun task runs")
    code, _ = await sas.post(http, f"{server.api}/task/{rerun}/runs/1/completed")
    assert code == 200
    await _announced(consumer, decision, 2)


async def _group_with_one_task_running(http: aiohttp.ClientSession, api: str,
                                       decision: str, queue: str) -> tuple[str, str]:
    """A group ``decision`` (its own task) with two members, all claimed, the decision
    task and the first member completed: the first member (to rerun) and the last, still
    running."""
    await create(http, api, definition(queue), decision)
    first = await create(http, api, definition(queue, taskGroupId=decision))
    last = await create(http, api, definition(queue, taskGroupId=decision))
    for task_id in (decision, first, last):
        await _claim(http, api, task_id)
    for task_id in (decision, first):
        await sas.post(http, f"{api}/task/{task_id}/runs/0/completed")
    return first, last


@pytest.mark.parametrize("which", ["a member", "the group's own task"])
async def test_a_task_being_rerun_keeps_its_group_from_being_announced_early(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        http: aiohttp.ClientSession, amqp_url: str, consume: ConsumerFactory,
        which: str) -> None:
    """A task of a group is rerun while the group's last other task resolves, before
    the rerun's new run is stored (storage holds that write back): the group is not
    announced then, with a task about to run again, but once that task's new run
    resolves."""
    server = await make_server(amqp_url=amqp_url, storage=StorageSettings(
        proxy.connection_string(), storage_prefix))
    decision = slugid()
    consumer = await consume(f"primary.{decision}.#", exchanges=("task-group-resolved",))
    first, last = await _group_with_one_task_running(http, server.api, decision, "prov/rerunning")
    rerun = first if which == "a member" else decision
    write = proxy.hold("POST", "/$batch")  # the rerun's new run, with its events
    rerunning = asyncio.create_task(sas.post(http, f"{server.api}/task/{rerun}/rerun"))
    try:
        await asyncio.wait_for(write.reached.wait(), 30)
        code, _ = await sas.post(http, f"{server.api}/task/{last}/runs/0/completed")
        assert code == 200
        await eventually(server.services.outbox.pending, lambda n: n == 1,
                         what="the group's check held back, to look again")
        await stays(lambda: consumer.messages, lambda m: m == [], for_=0.5,
                    what="nothing announced while a task of the group is being rerun")
    finally:
        write.release()
    code, _ = await rerunning
    assert code == 200
    await _claim(http, server.api, rerun, 1)
    code, _ = await sas.post(http, f"{server.api}/task/{rerun}/runs/1/completed")
    assert code == 200
    await _announced(consumer, decision, 1)


async def test_a_late_check_of_a_members_first_resolution_does_not_count_its_rerun_resolved(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory) -> None:
    """A member's resolution is checked late (its events were handed over while the
    broker was away, say) and marks its row resolved again after the member was rerun:
    the group's last other task resolving is not announced while the rerun's run is
    pending; the group is, once that run resolves."""
    server = await make_server(amqp_url=amqp_url)
    decision = slugid()
    consumer = await consume(f"primary.{decision}.#", exchanges=("task-group-resolved",))
    member, last = await _group_with_one_task_running(http, server.api, decision, "prov/latecheck")
    code, _ = await sas.post(http, f"{server.api}/task/{member}/rerun")
    assert code == 200
    # What the late check of the member's first resolution writes.
    await server.services.definitions.groups.resolve(decision, member, 1)
    code, _ = await sas.post(http, f"{server.api}/task/{last}/runs/0/completed")
    assert code == 200
    await stays(lambda: consumer.messages, lambda m: m == [], for_=1.0,
                what="nothing announced while the rerun's run is pending")
    await _claim(http, server.api, member, 1)
    code, _ = await sas.post(http, f"{server.api}/task/{member}/runs/1/completed")
    assert code == 200
    await consumer.wait_for(lambda m: len(m) >= 1, timeout=15)


async def test_a_rerun_that_failed_after_marking_its_task_unresolved_does_not_hold_its_group(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        http: aiohttp.ClientSession, amqp_url: str, consume: ConsumerFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rerun marks its task unresolved in its group, then storage refuses its new run
    (the rerun answers 500, and its client gives up): the group's last other task
    resolves meanwhile; the group is announced once the mark is old enough to tell that
    rerun will not come (2 s here), not never."""
    monkeypatch.setattr(outbox, "ORPHAN_AGE", timedelta(seconds=2))
    monkeypatch.setattr(outbox, "LOOK_AGAIN_MARGIN", timedelta(seconds=0.5))
    server = await make_server(amqp_url=amqp_url, events_resolver_interval=0.3,
                               storage=StorageSettings(proxy.connection_string(),
                                                       storage_prefix))
    decision = slugid()
    consumer = await consume(f"primary.{decision}.#", exchanges=("task-group-resolved",))
    failed, last = await _group_with_one_task_running(http, server.api, decision,
                                                      "prov/rerunfailed")
    proxy.once("POST", "/$batch", "refused")  # the rerun's new run
    code, _ = await sas.post(http, f"{server.api}/task/{failed}/rerun")
    assert code == 500
    code, _ = await sas.post(http, f"{server.api}/task/{last}/runs/0/completed")
    assert code == 200
    await _announced(consumer, decision, 1, timeout=30)
    assert (await status(http, server.api, failed))["state"] == "completed"


@pytest.mark.parametrize("order", ["its own task first", "a member first",
                                   "a record of an earlier version"])
async def test_the_task_a_group_is_named_after_announces_nothing_while_a_member_runs(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory, storage: StorageInspector, order: str) -> None:
    """The decision task resolved while a task it made still runs: nothing is announced
    until that task resolves too, whichever was created first, and for a group whose
    record and own task an earlier version wrote (which note no members)."""
    server = await make_server(amqp_url=amqp_url)
    decision = slugid()
    consumer = await consume(f"primary.{decision}.#", exchanges=("task-group-resolved",))
    child_body = definition("prov/members", taskGroupId=decision)
    if order == "a member first":
        child = await create(http, server.api, child_body)
    await create(http, server.api, definition("prov/members"), task_id=decision)
    if order != "a member first":
        child = await create(http, server.api, child_body)
    if order == "a record of an earlier version":
        groups = storage.table("groups")
        record = await groups.get_entity(decision, "~scheduler")
        await groups.upsert_entity({k: v for k, v in record.items() if k != "members"},
                                   mode=UpdateMode.REPLACE)
        tasks = storage.table("tasks")
        row = await tasks.get_entity(decision, "task")
        assert row["groupMembers"] is True
        await tasks.upsert_entity({k: v for k, v in row.items() if k != "groupMembers"},
                                  mode=UpdateMode.REPLACE)
    await _resolve_decision_then_member(http, server.api, consumer, decision, child)
    [message] = consumer.messages
    assert message.body["taskGroupId"] == decision


async def test_a_member_that_joins_while_its_groups_own_task_is_being_stored_is_known(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        http: aiohttp.ClientSession, amqp_url: str, consume: ConsumerFactory,
        storage: StorageInspector) -> None:
    """The decision task's createTask has found its group without members and is about to
    store the task when a member joins (its insert held back by a proxy meanwhile): the
    task is stored knowing of the member, so its resolution announces nothing while the
    member runs."""
    server = await make_server(amqp_url=amqp_url, storage=StorageSettings(
        proxy.connection_string(), storage_prefix))
    decision = slugid()
    consumer = await consume(f"primary.{decision}.#", exchanges=("task-group-resolved",))
    insert = proxy.hold("POST", "/$batch")  # the decision task's row and first events
    creating = asyncio.create_task(create(http, server.api, definition("prov/race"),
                                          task_id=decision))
    try:
        await asyncio.wait_for(insert.reached.wait(), 30)
        child = await create(http, server.api, definition("prov/race", taskGroupId=decision))
    finally:
        insert.release()
    await creating
    assert (await storage.task(decision)).group_members is True
    await _resolve_decision_then_member(http, server.api, consumer, decision, child)


async def test_a_member_whose_first_createtask_failed_midway_is_still_known(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        http: aiohttp.ClientSession, amqp_url: str, consume: ConsumerFactory,
        storage: StorageInspector) -> None:
    """The first member of a group whose own task is not stored yet records the group's
    schedulerId, then fails before it notes itself for that task (its createTask answers
    500); tried again, it is created: the own task, stored after it, still knows of the
    member, so its resolution announces nothing while the member runs."""
    server = await make_server(amqp_url=amqp_url, storage=StorageSettings(
        proxy.connection_string(), storage_prefix))
    decision = slugid()
    consumer = await consume(f"primary.{decision}.#", exchanges=("task-group-resolved",))
    child_body = definition("prov/midway", taskGroupId=decision)
    child = slugid()
    # The member's note in the own task's partition (its ``members`` row) is refused.
    proxy.once("POST", f"/{storage.table_name('tasks')}", "refused")
    async with http.put(f"{server.api}/task/{child}", json=child_body) as r:
        assert r.status == 500, await r.text()
    assert proxy.counts["table refused"] == 1
    assert "~scheduler" in await storage.row_keys("groups", decision)
    await create(http, server.api, child_body, task_id=child)
    await create(http, server.api, definition("prov/midway"), task_id=decision)
    assert (await storage.task(decision)).group_members is True
    await _resolve_decision_then_member(http, server.api, consumer, decision, child)


async def test_task_group_resolved_fires_once_when_its_last_tasks_resolve_together(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory) -> None:
    """The last tasks of a group resolved at the same moment, on two replicas: still one
    task-group-resolved per group."""
    groups = [slugid() for _ in range(4)]
    consumer = await consume("primary.#", exchanges=("task-group-resolved",))
    replicas = [await make_server(amqp_url=amqp_url), await make_server(amqp_url=amqp_url)]
    api = replicas[0].api
    members = {g: [await create(http, api, definition("prov/race", taskGroupId=g))
                   for _ in range(4)] for g in groups}
    for tasks in members.values():
        for task_id in tasks:
            await _claim(http, api, task_id)
    await asyncio.gather(*(
        sas.post(http, f"{replicas[i % 2].api}/task/{task_id}/runs/0/completed")
        for tasks in members.values() for i, task_id in enumerate(tasks)))
    await consumer.wait_for(lambda m: {x.body["taskGroupId"] for x in m} >= set(groups))
    await stays(lambda: sorted(m.body["taskGroupId"] for m in consumer.messages
                               if m.body["taskGroupId"] in groups),
                lambda announced: announced == sorted(groups), for_=1.0,
                what="each group announced once")


async def test_a_resolved_groups_rows_all_go_once_its_tasks_have_expired(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory, storage: StorageInspector) -> None:
    """The record of which members were announced resolved goes with the group's last
    member: after the tasks' expires and the expiry resolver, no row of it is left."""
    server = await make_server(amqp_url=amqp_url)
    group = slugid()
    consumer = await consume(f"primary.{group}.#", exchanges=("task-group-resolved",))
    now = datetime.now(UTC)
    tasks = [await create(http, server.api, definition(
        "prov/gone", taskGroupId=group, expires=iso(now + timedelta(days=2)))) for _ in range(2)]
    for task_id in tasks:
        await _claim(http, server.api, task_id)
        await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
    await consumer.wait_for(lambda m: len(m) >= 1)

    assert "~announced" in await storage.row_keys("groups", group)
    gone = await server.services.expiry.expire(now + timedelta(days=3))
    assert gone.tasks == 2
    assert await storage.row_keys("groups", group) == []


@pytest.mark.parametrize("announcement", ["the first", "a later one"])
async def test_a_group_is_announced_though_the_answer_to_its_announcement_was_lost(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        http: aiohttp.ClientSession, amqp_url: str, consume: ConsumerFactory,
        storage: StorageInspector, announcement: str) -> None:
    """The record of which members were announced (``~announced``) is written, its answer
    lost, and the write sent again finds it written: it is this resolution's own, so the
    group is announced all the same (the first time, and after a task joined later)."""
    server = await make_server(amqp_url=amqp_url, storage=StorageSettings(
        proxy.connection_string(), storage_prefix))
    decision = await create(http, server.api, definition("prov/lost"))
    child = await create(http, server.api, definition("prov/lost", taskGroupId=decision))
    consumer = await consume(f"primary.{decision}.#", exchanges=("task-group-resolved",))
    if announcement == "a later one":
        await _resolve_decision_then_member(http, server.api, consumer, decision, child)
        child = await create(http, server.api, definition("prov/lost", taskGroupId=decision))
        lost_write = ("PUT", "~announced")  # the record replaced, for the new set
    else:
        await _claim(http, server.api, decision)
        await sas.post(http, f"{server.api}/task/{decision}/runs/0/completed")
        # The only insert into the groups table left: the record of the announcement.
        lost_write = ("POST", f"/{storage.table_name('groups')}")

    async def decision_checked() -> bool:
        return any(r["RowKey"] == decision and r["resolved"]
                   for r in await storage.rows("groups", decision))

    await eventually(decision_checked, what="the decision task resolved in its group")
    before = len(consumer.messages)
    await _claim(http, server.api, child)
    proxy.once(*lost_write, "timed out")
    await sas.post(http, f"{server.api}/task/{child}/runs/0/completed")
    await consumer.wait_for(lambda m: len(m) > before, timeout=10)
    assert proxy.counts["table timed out"] == 1


async def test_a_task_a_sealed_group_refuses_while_its_last_task_resolves_does_not_hide_it(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory) -> None:
    """A createTask into a sealed group whose last task resolves while the group's records
    are read for it: the group is announced resolved all the same (a member row of no task
    would hold the announcement back while it is young), and the task is refused."""
    group = slugid()
    consumer = await consume(f"primary.{group}.#", exchanges=("task-group-resolved",))
    server = await make_server(amqp_url=amqp_url)
    last = await create(http, server.api, definition("prov/sealed-race", taskGroupId=group))
    code, _ = await sas.post(http, f"{server.api}/task-group/{group}/seal")
    assert code == 200
    await _claim(http, server.api, last)
    groups = server.services.definitions.groups  # the one store of the process
    records = groups.records
    held, release = asyncio.Event(), asyncio.Event()

    async def held_up_records(task_group_id: str) -> Any:
        if task_group_id == group and not held.is_set():
            held.set()
            await release.wait()
        return await records(task_group_id)

    groups.records = held_up_records  # type: ignore[method-assign]
    try:
        refused = asyncio.ensure_future(create(
            http, server.api, definition("prov/sealed-race", taskGroupId=group)))
        await asyncio.wait_for(held.wait(), 30)
        code, _ = await sas.post(http, f"{server.api}/task/{last}/runs/0/completed")
        assert code == 200
        await consumer.wait_for(lambda m: len(m) >= 1, timeout=15)
    finally:
        release.set()
        groups.records = records  # type: ignore[method-assign]
    with pytest.raises(AssertionError, match="409"):
        await refused


async def _a_group_resolving_past_a_row_of_no_task(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory, monkeypatch: pytest.MonkeyPatch,
        ) -> tuple[Server, Consumer, str, str]:
    """A group whose one task completes while a member row of no task is young (the row a
    createTask writes before its task): the server, a consumer of the group's
    announcements, the group and the row's taskId. Rows are old after 4 s here."""
    monkeypatch.setattr(outbox, "ORPHAN_AGE", timedelta(seconds=4))
    monkeypatch.setattr(outbox, "LOOK_AGAIN_MARGIN", timedelta(seconds=0.5))
    group = slugid()
    consumer = await consume(f"primary.{group}.#", exchanges=("task-group-resolved",))
    server = await make_server(amqp_url=amqp_url, events_resolver_interval=0.3)
    last = await create(http, server.api, definition("prov/row", taskGroupId=group))
    row = slugid()
    await server.services.definitions.groups.add(group, row,
                                                 await _expires(http, server.api, last), "-")
    await _claim(http, server.api, last)
    code, _ = await sas.post(http, f"{server.api}/task/{last}/runs/0/completed")
    assert code == 200
    return server, consumer, group, row


async def test_a_group_held_back_by_the_row_of_a_create_task_that_died_is_announced_later(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory, storage: StorageInspector,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A createTask writes its member row, then dies before its task is stored, as the
    group's last task resolves: while that row is young it may be a createTask under way
    and holds task-group-resolved back; once it is old enough to be dropped the group is
    looked at again, the row dropped and the group announced, once."""
    _, consumer, group, died = await _a_group_resolving_past_a_row_of_no_task(
        make_server, http, amqp_url, consume, monkeypatch)
    await _announced(consumer, group, 1, timeout=30, for_=1.5)
    assert died not in await storage.row_keys("groups", group)


async def test_a_group_held_back_by_a_create_task_under_way_waits_for_its_task(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same, but the createTask stores its task a moment later: the second look finds
    it pending and announces nothing; the group is announced when that task resolves."""
    server, consumer, group, late = await _a_group_resolving_past_a_row_of_no_task(
        make_server, http, amqp_url, consume, monkeypatch)
    await eventually(server.services.outbox.pending, lambda n: n == 1,
                     what="a second look at the group due")
    await create(http, server.api, definition("prov/row", taskGroupId=group), late)
    await eventually(server.services.outbox.pending, lambda n: n == 0,
                     what="the group looked at again")
    await stays(lambda: consumer.messages, lambda m: m == [], for_=1.0,
                what="no announcement while a member is pending")
    await _claim(http, server.api, late)
    code, _ = await sas.post(http, f"{server.api}/task/{late}/runs/0/completed")
    assert code == 200
    await _announced(consumer, group, 1)
