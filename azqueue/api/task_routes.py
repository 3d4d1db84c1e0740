"""Routes of the task and task-group methods: rerunTask, changeTaskPriority, tasks,
statuses, getTaskGroup, sealTaskGroup, cancelTaskGroup, changeTaskGroupPriority.

Declared as ``routes`` declares every route, with the scopes of Taskcluster's Queue
reference; the logic is in ``service.rerun``, ``service.priority``, ``service.batch``
and ``service.groups``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from azqueue.api.routes import SLUGID, Call, route
from azqueue.model.priority import Priority
from azqueue.model.task import Task

# -- tasks --------------------------------------------------------------------------------


@route("POST", "/task/<taskId>/rerun", "rerunTask", body="empty-request.json", scopes={
    "AnyOf": [
        "queue:rerun-task:<schedulerId>/<taskGroupId>/<taskId>",
        "queue:rerun-task-in-project:<projectId>",
        {"AllOf": ["queue:rerun-task", "assume:scheduler-id:<schedulerId>/<taskGroupId>"]},
    ]})
async def rerun_task(call: Call, task_id: str) -> Any:
    def authorize(task: Task) -> None:
        d = task.definition
        call.authorize(schedulerId=d["schedulerId"], taskGroupId=d["taskGroupId"],
                       projectId=d["projectId"])

    return {"status": await call.services.rerun.rerun_task(task_id, authorize)}


@route("POST", "/task/<taskId>/priority", "changeTaskPriority",
       body="change-task-priority-request.json", scopes={"AnyOf": [
           "queue:change-task-priority:<taskId>",
           "queue:change-task-priority-in-queue:<taskQueueId>"]})
async def change_task_priority(call: Call, task_id: str) -> Any:
    def authorize(task: Task) -> None:
        call.authorize(taskQueueId=task.task_queue_id)

    change = await call.services.priority.change(task_id, Priority(call.body["newPriority"]),
                                                 authorize)
    return {"status": change.after.status()}


# At most 1000 taskIds (tasks-request.json): 22-character slugids, quoted and separated,
# fit in 32 KiB; twice that leaves room for spacing.
TASKS_BODY = 64 * 1024


def _page(call: Call) -> tuple[list[str], str | None, int]:
    task_ids = [str(t) for t in call.body.get("taskIds", [])]
    call.authorize(taskIds=task_ids)
    return task_ids, call.continuation, call.page()


def _valid(task_id: str) -> bool:
    return bool(SLUGID.match(task_id))


@route("POST", "/tasks", "tasks", body="tasks-request.json", max_body=TASKS_BODY,
       scopes={"AllOf": [{"for": "taskId", "in": "taskIds", "each": "queue:get-task:<taskId>"}]})
async def tasks(call: Call) -> Any:
    found, token = await call.services.batch.read_many(
        *_page(call), _valid, lambda t: {"taskId": t.task_id, "task": dict(t.definition)})
    return {"tasks": found, **({"continuationToken": token} if token else {})}


@route("POST", "/tasks/status", "statuses", body="tasks-request.json", max_body=TASKS_BODY,
       scopes={"AllOf": [{"for": "taskId", "in": "taskIds", "each": "queue:status:<taskId>"}]})
async def statuses(call: Call) -> Any:
    found, token = await call.services.batch.read_many(
        *_page(call), _valid, lambda t: {"taskId": t.task_id, "status": t.status()})
    return {"statuses": found, **({"continuationToken": token} if token else {})}


# -- task groups --------------------------------------------------------------------------


def _on_group(call: Call) -> Callable[[str], None]:
    def authorize(scheduler_id: str) -> None:
        call.authorize(schedulerId=scheduler_id)
    return authorize


@route("GET", "/task-group/<taskGroupId>", "getTaskGroup",
       scopes="queue:list-task-group:<taskGroupId>")
async def get_task_group(call: Call, task_group_id: str) -> Any:
    return await call.services.groups.get(task_group_id)


@route("POST", "/task-group/<taskGroupId>/seal", "sealTaskGroup", body="empty-request.json",
       scopes="queue:seal-task-group:<schedulerId>/<taskGroupId>")
async def seal_task_group(call: Call, task_group_id: str) -> Any:
    return await call.services.groups.seal(task_group_id, _on_group(call))


@route("POST", "/task-group/<taskGroupId>/cancel", "cancelTaskGroup", body="empty-request.json",
       scopes="queue:cancel-task-group:<schedulerId>/<taskGroupId>")
async def cancel_task_group(call: Call, task_group_id: str) -> Any:
    return await call.services.groups.cancel(task_group_id, _on_group(call))


@route("POST", "/task-group/<taskGroupId>/priority", "changeTaskGroupPriority",
       body="change-task-priority-request.json",
       scopes="queue:change-task-group-priority:<schedulerId>/<taskGroupId>")
async def change_task_group_priority(call: Call, task_group_id: str) -> Any:
    return await call.services.groups.change_priority(
        task_group_id, Priority(call.body["newPriority"]), _on_group(call))
