"""The endpoints of task groups: listTaskGroup, getTaskGroup, sealTaskGroup,
cancelTaskGroup and changeTaskGroupPriority, with the scopes of Taskcluster's Queue
reference; the logic is in ``service.groups``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from azqueue.api.routing import PAGED, Call, Route, Routes
from azqueue.model.priority import Priority

routes = Routes()


def _on_group(call: Call) -> Callable[[str], None]:
    def authorize(scheduler_id: str) -> None:
        call.authorize(schedulerId=scheduler_id)
    return authorize


@routes.declare("GET", "/task-group/<taskGroupId>/list", "listTaskGroup",
                output="list-task-group-response.json", query=PAGED,
                scopes="queue:list-task-group:<taskGroupId>")
async def list_task_group(call: Call, task_group_id: str) -> Any:
    return await call.services.groups.list_tasks(task_group_id, call.continuation,
                                                 call.page())


@routes.declare("GET", "/task-group/<taskGroupId>", "getTaskGroup",
                output="task-group-response.json", scopes="queue:list-task-group:<taskGroupId>")
async def get_task_group(call: Call, task_group_id: str) -> Any:
    return await call.services.groups.get(task_group_id)


@routes.declare("POST", "/task-group/<taskGroupId>/seal", "sealTaskGroup",
                output="task-group-response.json", body="empty-request.json",
                scopes="queue:seal-task-group:<schedulerId>/<taskGroupId>")
async def seal_task_group(call: Call, task_group_id: str) -> Any:
    return await call.services.groups.seal(task_group_id, _on_group(call))


@routes.declare("POST", "/task-group/<taskGroupId>/cancel", "cancelTaskGroup",
                output="cancel-task-group-response.json", body="empty-request.json",
                scopes="queue:cancel-task-group:<schedulerId>/<taskGroupId>")
async def cancel_task_group(call: Call, task_group_id: str) -> Any:
    return await call.services.groups.cancel(task_group_id, _on_group(call))


@routes.declare("POST", "/task-group/<taskGroupId>/priority", "changeTaskGroupPriority",
                output="task-group-priority-change-response.json",
                body="change-task-priority-request.json",
                scopes="queue:change-task-group-priority:<schedulerId>/<taskGroupId>")
async def change_task_group_priority(call: Call, task_group_id: str) -> Any:
    return await call.services.groups.change_priority(
        task_group_id, Priority(call.body["newPriority"]), _on_group(call))


ROUTES: list[Route] = routes.table
