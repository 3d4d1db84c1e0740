"""What rerunTask, changeTaskPriority and the task-group methods do to tips, claims and
runs, seen by SAS workers and across replicas."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest

from azqueue.model import timeutil
from azqueue.service.tasks import groups as group_service
from azqueue.testing import sas
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition, iso, slugid, status
from tests.servers import Server, ServerFactory
from tests.waiting import eventually


async def _claim_next(http: aiohttp.ClientSession, server: Server, task_queue: str
                      ) -> tuple[int, dict[str, Any]]:
    """What a SAS worker does: poll the queues in order until a tip comes, claim it."""
    provisioner, worker_type = task_queue.split("/")
    urls = await sas.poll_task_urls(http, server.api, provisioner, worker_type)
    messages = await eventually(lambda: sas.poll_once(http, urls), what="a tip to claim")
    return await sas.claim(http, server.api, messages[0])


async def test_a_rerun_task_gets_a_new_run_a_sas_worker_claims(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """rerunTask: 'This method _reruns_ a previously resolved task, even if it was
    _completed_' - the new run is pending with a tip a worker polls and claims."""
    server = await make_server()
    task_id = await create(http, server.api, definition("prov/rerun-sas"))
    code, claim = await _claim_next(http, server, "prov/rerun-sas")
    assert code == 200 and claim["runId"] == 0
    await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")

    code, rerun = await sas.post(http, f"{server.api}/task/{task_id}/rerun")
    assert code == 200, rerun
    assert rerun["status"]["runs"][1]["reasonCreated"] == "rerun"
    code, claim = await _claim_next(http, server, "prov/rerun-sas")
    assert code == 200, claim
    assert claim["runId"] == 1 and claim["status"]["state"] == "running"
    code, done = await sas.post(http, f"{server.api}/task/{task_id}/runs/1/completed")
    assert code == 200 and [r["state"] for r in done["status"]["runs"]] == ["completed"] * 2


async def test_a_rerun_task_nobody_claims_is_resolved_at_its_deadline(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector) -> None:
    """The first run's deadline trigger is dropped once the task is resolved; the rerun
    stores another, so the new run is resolved deadline-exceeded like any other."""
    server = await make_server(tip_repair_delay=1.0, deadline_resolver_interval=0.5)
    task_id = await create(http, server.api, definition("prov/rerun-deadline",
                                                        deadline=timedelta(seconds=6)))
    await sas.post(http, f"{server.api}/task/{task_id}/cancel")
    await eventually(lambda: storage.message_count(storage.queue_name("deadline-batches")),
                     lambda n: n == 0, what="the resolved task's trigger dropped")
    code, rerun = await sas.post(http, f"{server.api}/task/{task_id}/rerun")
    assert code == 200, rerun
    s = await eventually(lambda: status(http, server.api, task_id),
                         lambda s: len(s["runs"]) == 2 and s["state"] == "exception",
                         what="the rerun resolved at the deadline")
    assert s["runs"][1]["reasonResolved"] == "deadline-exceeded"


async def test_a_rerun_past_the_deadline_is_a_conflict(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """Taskcluster's rerunTask: "Task `{{taskId}}` can't be rescheduled past its deadline"
    is a 409 RequestConflict."""
    server = await make_server()
    task_id = await create(http, server.api, definition("prov/rerun-late",
                                                        deadline=timedelta(seconds=2)))
    await sas.post(http, f"{server.api}/task/{task_id}/cancel")
    deadline = timeutil.parse((await status(http, server.api, task_id))["deadline"])

    async def now() -> datetime:
        return datetime.now(UTC)

    await eventually(now, lambda t: t > deadline, what="the task's deadline to pass")
    code, refused = await sas.post(http, f"{server.api}/task/{task_id}/rerun")
    assert code == 409 and "deadline" in refused["message"], refused
    assert len((await status(http, server.api, task_id))["runs"]) == 1


async def test_reruns_racing_on_two_replicas_add_exactly_one_run(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """Twelve reruns of one resolved task through two replicas at once: every call
    answers 200 and the task has exactly one new run."""
    replicas = [await make_server(run_resolvers=False) for _ in range(2)]
    task_id = await create(http, replicas[0].api, definition("prov/rerun-race"))
    await sas.post(http, f"{replicas[0].api}/task/{task_id}/cancel")

    results = await asyncio.gather(*(
        sas.post(http, f"{replicas[i % 2].api}/task/{task_id}/rerun") for i in range(12)))
    assert Counter(code for code, _ in results) == {200: 12}
    final = await status(http, replicas[1].api, task_id)
    assert [(r["state"], r["reasonCreated"]) for r in final["runs"]] == [
        ("exception", "scheduled"), ("pending", "rerun")]


async def test_a_new_priority_moves_the_tip_and_the_old_tip_is_refused_as_stale(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """changeTaskPriority: the pending run is claimed from the new priority's queue; a
    worker holding the old tip gets a 4xx and deletes it (the worker rule of docs/workers/sas.md)."""
    server = await make_server()
    task_id = await create(http, server.api, definition("prov/reprio", priority="lowest"))
    urls = await sas.poll_task_urls(http, server.api, "prov", "reprio")
    lowest, highest = urls["queues"][-1], urls["queues"][0]
    [old] = await sas.get_messages(http, lowest["signedPollUrl"])
    assert old.tip["taskId"] == task_id

    code, _ = await sas.post(http, f"{server.api}/task/{task_id}/priority",
                             {"newPriority": "highest"})
    assert code == 200
    code, refused = await sas.claim(http, server.api, old)
    assert code == 400, refused
    assert await sas.delete_message(http, lowest["signedDeleteUrl"], old) == 204

    [new] = await sas.get_messages(http, highest["signedPollUrl"])
    assert new.tip == {**new.tip, "taskId": task_id, "runId": 0}
    code, claim = await sas.claim(http, server.api, new)
    assert code == 200, claim
    assert claim["task"]["priority"] == "highest"


@pytest.mark.slow
async def test_a_running_task_given_a_new_priority_is_retried_at_it(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'Claimed or running tasks keep their current run priority until they are
    retried': the claim expires, and the retry's tip is in the new priority's queue."""
    server = await make_server(claim_timeout=2.0, claim_resolver_interval=0.5)
    task_id = await create(http, server.api, definition("prov/reprio-run", priority="low"))
    code, claim = await _claim_next(http, server, "prov/reprio-run")
    assert code == 200
    code, _ = await sas.post(http, f"{server.api}/task/{task_id}/priority",
                             {"newPriority": "very-high"})
    assert code == 200
    urls = await sas.poll_task_urls(http, server.api, "prov", "reprio-run")
    very_high = urls["queues"][1]
    [retry] = await eventually(lambda: sas.get_messages(http, very_high["signedPollUrl"]),
                               what="the retry's tip at the new priority")
    assert retry.tip["runId"] == 1
    code, claim = await sas.claim(http, server.api, retry)
    assert code == 200, claim
    assert [r["reasonResolved"] for r in claim["status"]["runs"][:1]] == ["claim-expired"]


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(group_service, "GROUP_BATCH", 3)
    return 3


async def _group(http: aiohttp.ClientSession, server: Server, size: int) -> tuple[str, list[str]]:
    group = slugid()
    members = [await create(http, server.api, definition("prov/big-group", taskGroupId=group))
               for _ in range(size)]
    return group, members


async def test_cancel_task_group_past_one_calls_bound_is_finished_in_the_background(
        make_server: ServerFactory, http: aiohttp.ClientSession, small_batches: int) -> None:
    """cancelTaskGroup 'will cancel all unresolved tasks': a call cancels one batch and
    the group-passes resolver cancels the rest; a running member's worker is told (409)."""
    server = await make_server(group_resolver_interval=0.5)
    group, members = await _group(http, server, 3 * small_batches + 2)
    running = members[-1]
    code, _ = await sas.post(http, f"{server.api}/task/{running}/runs/0/claim",
                             {"workerGroup": "wg", "workerId": "w"})
    assert code == 200
    assert (await sas.post(http, f"{server.api}/task-group/{group}/seal"))[0] == 200

    code, answer = await sas.post(http, f"{server.api}/task-group/{group}/cancel")
    assert code == 200, answer
    assert answer["taskGroupSize"] == len(members)
    # One batch: the group's own task (here there is none) and the first members after it.
    assert answer["cancelledCount"] == len(answer["taskIds"]) == small_batches - 1

    async def states() -> list[tuple[str, str | None]]:
        found = [await status(http, server.api, t) for t in members]
        return [(s["state"], s["runs"][-1].get("reasonResolved")) for s in found]

    await eventually(states, lambda s: s == [("exception", "canceled")] * len(members),
                     what="every member canceled")
    code, _ = await sas.post(http, f"{server.api}/task/{running}/runs/0/reclaim")
    assert code == 409
    code, again = await sas.post(http, f"{server.api}/task-group/{group}/cancel")
    assert code == 200 and again["cancelledCount"] == 0


async def test_change_task_group_priority_past_one_calls_bound_reaches_every_member(
        make_server: ServerFactory, http: aiohttp.ClientSession, small_batches: int) -> None:
    server = await make_server(group_resolver_interval=0.5)
    group, members = await _group(http, server, 2 * small_batches + 1)
    code, answer = await sas.post(http, f"{server.api}/task-group/{group}/priority",
                                  {"newPriority": "medium"})
    assert code == 200, answer
    assert answer["tasksAffected"] == small_batches - 1

    async def priorities() -> list[str]:
        out = []
        for task_id in members:
            async with http.get(f"{server.api}/task/{task_id}") as r:
                out.append((await r.json())["priority"])
        return out

    await eventually(priorities, lambda p: p == ["medium"] * len(members),
                     what="every member at the new priority")
    urls = await sas.poll_task_urls(http, server.api, "prov", "big-group")
    medium = urls["queues"][3]
    tips = await sas.get_messages(http, medium["signedPollUrl"], 32)
    assert sorted(m.tip["taskId"] for m in tips) == sorted(members)


async def test_a_sealed_groups_record_expires_with_its_tasks(
        server: Server, http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    """getTaskGroup's `expires`: 'Date and time after the last expiration of any task in
    the task group' - the expiry resolver deletes the sealed group's record then, with
    the tasks."""
    now = datetime.now(UTC)
    group = slugid()
    task_id = await create(http, server.api, definition("prov/expiring-group", taskGroupId=group))
    await sas.post(http, f"{server.api}/task/{task_id}/cancel")
    code, sealed = await sas.post(http, f"{server.api}/task-group/{group}/seal")
    assert code == 200

    # The group's rows: ~group, its record once sealed; ~scheduler, its schedulerId's.
    await server.services.expiry.expire(now + timedelta(days=2))
    assert {"~group", "~scheduler"} <= set(await storage.row_keys("groups", group))
    await server.services.expiry.expire(timeutil.parse(sealed["expires"]) + timedelta(days=1))
    # The record goes, and the record of the group's schedulerId with its last task.
    assert {"~group", "~scheduler"}.isdisjoint(await storage.row_keys("groups", group))
    async with http.get(f"{server.api}/task-group/{group}") as r:
        assert r.status == 404


async def test_a_members_note_for_a_group_task_never_stored_expires_with_the_group(
        server: Server, http: aiohttp.ClientSession, storage: StorageInspector) -> None:
    """A member joins a group whose own task's createTask was refused after it claimed the
    group (its dependency does not exist): the note the member leaves for that task goes
    with the group's records once the member has expired, and leaves no row behind."""
    now = datetime.now(UTC)
    group = slugid()
    refused = definition("prov/never", dependencies=[slugid()],
                         expires=iso(now + timedelta(days=2)))
    async with http.put(f"{server.api}/task/{group}", json=refused) as r:
        assert r.status == 400, await r.text()
    member = await create(http, server.api, definition(
        "prov/never", taskGroupId=group, expires=iso(now + timedelta(days=2))))
    await sas.post(http, f"{server.api}/task/{member}/cancel")
    assert await storage.row_keys("tasks", group) == ["members"]

    await server.services.expiry.expire(now + timedelta(days=4))
    assert await storage.row_keys("tasks", group) == []
    assert await storage.row_keys("groups", group) == []
