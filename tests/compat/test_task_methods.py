"""The task and task-group methods, driven by the unmodified official client: rerunTask,
changeTaskPriority, tasks, statuses, getTaskGroup, sealTaskGroup, cancelTaskGroup,
changeTaskGroupPriority and listTaskGroup. Every answer is checked against Taskcluster's
own output schema (``reference.assert_matches``), so every key it requires is there."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import taskcluster
import taskcluster.aio
from taskcluster.exceptions import TaskclusterRestFailure

from azqueue.testing.tasks import definition, slugid
from tests.compat.reference import assert_matches
from tests.servers import ROOT, Server, ServerFactory

CREDENTIALS = {"clientId": ROOT.client_id, "accessToken": ROOT.access_token}


def _queue(root_url: str, scopes: list[str] | None = None) -> Any:
    options: dict[str, Any] = {"rootUrl": root_url, "maxRetries": 0, "credentials": CREDENTIALS}
    if scopes is not None:
        options["authorizedScopes"] = scopes
    return taskcluster.Queue(options)


def _status_code(call: Callable[[], object]) -> int:
    with pytest.raises(TaskclusterRestFailure) as info:
        call()
    return int(info.value.status_code)


def _resolved(queue: Any, task_id: str, worker: str = "compat") -> None:
    queue.claimTask(task_id, len(queue.status(task_id)["status"]["runs"]) - 1,
                    {"workerGroup": "wg", "workerId": worker})
    queue.reportCompleted(task_id, len(queue.status(task_id)["status"]["runs"]) - 1)


def _rerun(root_url: str) -> None:
    queue = _queue(root_url)
    task_id = slugid()
    queue.createTask(task_id, definition("prov/compat-rerun", retries=3))
    # "if it is invoked for a task that is `pending` or `running`, it will just return
    # the current task status"
    pending = queue.rerunTask(task_id)
    assert_matches("task-status-response", pending)
    assert pending == queue.status(task_id)
    _resolved(queue, task_id)

    rerun = queue.rerunTask(task_id)
    assert_matches("task-status-response", rerun)
    status = rerun["status"]
    assert status["state"] == "pending" and status["retriesLeft"] == 3
    assert [(r["state"], r["reasonCreated"]) for r in status["runs"]] == [
        ("completed", "scheduled"), ("pending", "rerun")]
    claim = queue.claimTask(task_id, 1, {"workerGroup": "wg", "workerId": "compat"})
    assert claim["runId"] == 1
    assert queue.rerunTask(task_id)["status"]["state"] == "running"
    assert len(queue.status(task_id)["status"]["runs"]) == 2

    assert _status_code(lambda: queue.rerunTask(slugid())) == 404
    # 'queue:rerun-task:<schedulerId>/<taskGroupId>/<taskId>' (or the project's scope)
    narrow = _queue(root_url, ["queue:rerun-task:-/other/*"])
    assert _status_code(lambda: narrow.rerunTask(task_id)) == 403
    allowed = _queue(root_url, [f"queue:rerun-task:-/{task_id}/{task_id}"])
    assert allowed.rerunTask(task_id)["status"]["state"] == "running"


async def test_rerun_task_gives_a_resolved_task_a_new_run_and_leaves_others_alone(
        server: Server) -> None:
    """'This method _reruns_ a previously resolved task, even if it was _completed_ ...
    This will also reset the number of `retries` allowed.'"""
    await asyncio.to_thread(_rerun, server.root_url)


def _rerun_limits(root_url: str) -> None:
    queue = _queue(root_url)
    task_id = slugid()
    queue.createTask(task_id, definition("prov/compat-rerun", retries=5))
    for run_id in range(49):
        queue.cancelTask(task_id)
        assert queue.rerunTask(task_id)["status"]["runs"][-1]["runId"] == run_id + 1
    status = queue.status(task_id)["status"]
    assert status["retriesLeft"] == 0  # run 49 is the last one a task may have
    queue.cancelTask(task_id)
    assert _status_code(lambda: queue.rerunTask(task_id)) == 409


async def test_rerun_task_is_refused_once_a_task_has_fifty_runs(server: Server) -> None:
    """Taskcluster's rerun: 'Maximum number of runs reached (50)' is a RequestConflict,
    and the retries a rerun grants stop at that limit."""
    await asyncio.to_thread(_rerun_limits, server.root_url)


def _priority(root_url: str) -> None:
    queue = _queue(root_url)
    task_id = slugid()
    queue.createTask(task_id, definition("prov/compat-prio", priority="low"))
    changed = queue.changeTaskPriority(task_id, {"newPriority": "very-high"})
    assert_matches("task-status-response", changed)
    assert changed["status"]["state"] == "pending"
    assert queue.task(task_id)["priority"] == "very-high"
    assert queue.changeTaskPriority(task_id, {"newPriority": "very-high"}) == changed
    assert _status_code(lambda: queue.changeTaskPriority(task_id, {"newPriority": "urgent"})) == 400

    # 'queue:change-task-priority:<taskId>' or '...-in-queue:<taskQueueId>'
    by_queue = _queue(root_url, ["queue:change-task-priority-in-queue:prov/compat-prio"])
    assert by_queue.changeTaskPriority(task_id, {"newPriority": "high"})["status"]["taskId"] == task_id
    other = _queue(root_url, ["queue:change-task-priority-in-queue:prov/elsewhere"])
    assert _status_code(lambda: other.changeTaskPriority(task_id, {"newPriority": "low"})) == 403

    _resolved(queue, task_id)
    # "This method updates the priority of a single unresolved task."
    assert _status_code(lambda: queue.changeTaskPriority(task_id, {"newPriority": "low"})) == 409
    assert _status_code(lambda: queue.changeTaskPriority(slugid(), {"newPriority": "low"})) == 404


async def test_change_task_priority_changes_an_unresolved_task(server: Server) -> None:
    await asyncio.to_thread(_priority, server.root_url)


def _batch_reads(root_url: str) -> None:
    queue = _queue(root_url)
    ids = [slugid() for _ in range(3)]
    for task_id in ids:
        queue.createTask(task_id, definition("prov/compat-batch"))
    missing = slugid()
    asked = {"taskIds": [ids[0], missing, ids[1], ids[2], ids[0], "not-a-task-id"]}

    answer = queue.tasks(asked)
    assert_matches("tasks-response", answer)
    assert [t["taskId"] for t in answer["tasks"]] == ids
    assert answer["tasks"][1]["task"] == queue.task(ids[1])
    assert "continuationToken" not in answer

    statuses = queue.statuses(asked)
    assert_matches("tasks-statuses-response", statuses)
    assert [s["status"]["taskId"] for s in statuses["statuses"]] == ids

    # Paged: at most `limit` of the taskIds asked for a call, and a token for the rest.
    first = queue.statuses(payload=asked, query={"limit": 2})
    assert_matches("tasks-statuses-response", first)
    assert [s["taskId"] for s in first["statuses"]] == [ids[0]]  # the second is missing
    rest = queue.statuses(payload=asked,
                          query={"limit": 2, "continuationToken": first["continuationToken"]})
    assert [s["taskId"] for s in rest["statuses"]] == ids[1:]
    seen: list[str] = []
    queue.tasks(payload=asked, query={"limit": 1},
                paginationHandler=lambda page: seen.extend(t["taskId"] for t in page["tasks"]))
    assert seen == ids
    assert queue.tasks({"taskIds": []}) == {"tasks": []}

    # 'queue:get-task:<taskId>' / 'queue:status:<taskId>' for each taskId asked
    narrow = _queue(root_url, [f"queue:status:{ids[0]}"])
    assert narrow.statuses({"taskIds": [ids[0]]})["statuses"][0]["taskId"] == ids[0]
    assert _status_code(lambda: narrow.statuses({"taskIds": ids})) == 403
    assert _status_code(lambda: narrow.tasks({"taskIds": [ids[0]]})) == 403


async def test_tasks_and_statuses_read_many_tasks_and_leave_out_missing_ones(
        make_server: ServerFactory) -> None:
    """'If a given taskId does not match a task, it will be ignored, and callers will
    need to handle the difference.' (No anonymous scopes, which every caller holds.)"""
    server = await make_server(anonymous_scopes=())
    await asyncio.to_thread(_batch_reads, server.root_url)


def _groups(root_url: str) -> None:
    queue = _queue(root_url)
    group = slugid()
    queue.createTask(group, definition("prov/compat-group", taskGroupId=group))
    members = [slugid() for _ in range(3)]
    for task_id in members:
        queue.createTask(task_id, definition("prov/compat-group", taskGroupId=group))
    running = members[0]
    queue.claimTask(running, 0, {"workerGroup": "wg", "workerId": "compat"})
    done = members[1]
    _resolved(queue, done)

    info = queue.getTaskGroup(group)
    assert_matches("task-group-response", info)
    expires = max(queue.task(t)["expires"] for t in [group, *members])
    assert info == {"taskGroupId": group, "schedulerId": "-", "expires": expires}
    listed = queue.listTaskGroup(group)
    assert_matches("list-task-group-response", listed)
    assert (listed["schedulerId"], listed["expires"]) == ("-", expires)
    assert sorted(t["status"]["taskId"] for t in listed["tasks"]) == sorted([group, *members])
    assert _status_code(lambda: queue.getTaskGroup(slugid())) == 404
    pages: list[dict[str, Any]] = []
    queue.listTaskGroup(group, query={"limit": 1}, paginationHandler=pages.append)
    assert sorted(t["status"]["taskId"] for p in pages for t in p["tasks"]) == sorted(
        [group, *members])
    for page in pages:
        assert_matches("list-task-group-response", page)
        assert (page["schedulerId"], page["expires"]) == ("-", expires)

    # "It is only possible to cancel a task group if it has been sealed"
    assert _status_code(lambda: queue.cancelTaskGroup(group)) == 409
    narrow = _queue(root_url, [f"queue:seal-task-group:other/{group}"])
    assert _status_code(lambda: narrow.sealTaskGroup(group)) == 403

    sealed = queue.sealTaskGroup(group)
    assert_matches("task-group-response", sealed)
    assert sealed["expires"] == expires and sealed["sealed"]
    # "Calling it multiple times will return same result and will not update it again."
    assert queue.sealTaskGroup(group) == sealed == queue.getTaskGroup(group)
    assert queue.listTaskGroup(group)["sealed"] == sealed["sealed"]
    # "If the task group was sealed, this end-point will return `409`"
    late = slugid()
    assert _status_code(
        lambda: queue.createTask(late, definition("prov/compat-group", taskGroupId=group))) == 409
    assert _status_code(lambda: queue.status(late)) == 404
    assert queue.createTask(done, queue.task(done))["status"]["state"] == "completed"

    canceled = queue.cancelTaskGroup(group)
    assert_matches("cancel-task-group-response", canceled)
    unresolved = [group, members[0], members[2]]
    assert canceled["taskGroupId"] == group and canceled["taskGroupSize"] == 4
    assert canceled["cancelledCount"] == 3 and sorted(canceled["taskIds"]) == sorted(unresolved)
    for task_id in unresolved:
        last = queue.status(task_id)["status"]["runs"][-1]
        assert (last["state"], last["reasonResolved"]) == ("exception", "canceled")
    assert queue.status(done)["status"]["state"] == "completed"
    # "Calling `cancelTaskGroup` again in this case will only cancel the new run."
    queue.rerunTask(done)
    again = queue.cancelTaskGroup(group)
    assert (again["cancelledCount"], again["taskIds"]) == (1, [done])

    reprioritized = queue.changeTaskGroupPriority(group, {"newPriority": "high"})
    assert_matches("task-group-priority-change-response", reprioritized)
    assert reprioritized == {"taskGroupId": group, "schedulerId": "-", "newPriority": "high",
                             "tasksAffected": 0, "taskIds": []}


async def test_task_group_methods_answer_as_taskcluster_documents_them(server: Server) -> None:
    await asyncio.to_thread(_groups, server.root_url)


def _group_priority(root_url: str) -> None:
    queue = _queue(root_url)
    group = slugid()
    members = [slugid() for _ in range(3)]
    for task_id in members:
        queue.createTask(task_id, definition("prov/compat-group", taskGroupId=group,
                                             priority="low"))
    _resolved(queue, members[2])
    changed = queue.changeTaskGroupPriority(group, {"newPriority": "very-high"})
    assert_matches("task-group-priority-change-response", changed)
    assert changed["tasksAffected"] == 2 and sorted(changed["taskIds"]) == sorted(members[:2])
    assert [queue.task(t)["priority"] for t in members] == ["very-high", "very-high", "low"]
    # 'queue:change-task-group-priority:<schedulerId>/<taskGroupId>'
    narrow = _queue(root_url, [f"queue:change-task-group-priority:-/{members[0]}"])
    assert _status_code(
        lambda: narrow.changeTaskGroupPriority(group, {"newPriority": "low"})) == 403
    assert _status_code(
        lambda: queue.changeTaskGroupPriority(slugid(), {"newPriority": "low"})) == 404


async def test_change_task_group_priority_changes_the_unresolved_tasks_only(
        server: Server) -> None:
    """'This method applies a new priority to unresolved tasks within a task group.'"""
    await asyncio.to_thread(_group_priority, server.root_url)


async def test_aio_client_reruns_reads_and_seals(server: Server) -> None:
    async with taskcluster.aio.createSession() as session:
        queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "maxRetries": 0,
                                       "credentials": CREDENTIALS}, session=session)
        group = slugid()
        task_id = slugid()
        await queue.createTask(task_id, definition("prov/compat-aio", taskGroupId=group))
        await queue.cancelTask(task_id)
        rerun = await queue.rerunTask(task_id)
        assert_matches("task-status-response", rerun)
        assert rerun["status"]["runs"][-1]["reasonCreated"] == "rerun"
        statuses = await queue.statuses({"taskIds": [task_id]})
        assert statuses["statuses"] == [{"taskId": task_id, "status": rerun["status"]}]
        changed = await queue.changeTaskPriority(task_id, {"newPriority": "highest"})
        assert_matches("task-status-response", changed)
        sealed = await queue.sealTaskGroup(group)
        assert_matches("task-group-response", sealed)
        canceled = await queue.cancelTaskGroup(group)
        assert_matches("cancel-task-group-response", canceled)
        assert canceled["taskIds"] == [task_id]
