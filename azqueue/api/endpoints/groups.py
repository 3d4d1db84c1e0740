"""The endpoints of task groups: listTaskGroup, getTaskGroup, sealTaskGroup,
cancelTaskGroup and changeTaskGroupPriority, with the scopes of Taskcluster's Queue
reference; the logic is in ``service.tasks.groups``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from azqueue.api.routing import PAGED, Call, Route, Routes
from azqueue.model.priority import Priority

routes = Routes("Task groups")


def _on_group(call: Call) -> Callable[[str], None]:
    def authorize(scheduler_id: str) -> None:
        call.authorize(schedulerId=scheduler_id)
    return authorize


@routes.declare("GET", "/task-group/<taskGroupId>/list", "listTaskGroup",
                title="List a task group",
                description=("`{taskGroupId, schedulerId, expires, sealed?, tasks: [{status, "
                             "task}]}` (404 for a group with no tasks), paginated with `limit`"
                             " (default 100, ≤ 1000) and `continuationToken`; anonymous by "
                             "default"),
                output="list-task-group-response.json", query=PAGED,
                scopes="queue:list-task-group:<taskGroupId>")
async def list_task_group(call: Call, task_group_id: str) -> Any:
    return await call.services.groups.list_tasks(task_group_id, call.continuation,
                                                 call.page())


@routes.declare("GET", "/task-group/<taskGroupId>", "getTaskGroup",
                title="Get a task group",
                description=("`{taskGroupId, schedulerId, expires, sealed?}`, 404 for a group "
                             "with no tasks"),
                output="task-group-response.json", scopes="queue:list-task-group:<taskGroupId>")
async def get_task_group(call: Call, task_group_id: str) -> Any:
    return await call.services.groups.get(task_group_id)


@routes.declare("POST", "/task-group/<taskGroupId>/seal", "sealTaskGroup",
                title="Seal a task group",
                description=("the group takes no new tasks (createTask into it is 409); "
                             "sealing again answers the first seal"),
                stability="experimental",
                output="task-group-response.json", body="empty-request.json",
                scopes="queue:seal-task-group:<schedulerId>/<taskGroupId>")
async def seal_task_group(call: Call, task_group_id: str) -> Any:
    return await call.services.groups.seal(task_group_id, _on_group(call))


@routes.declare("POST", "/task-group/<taskGroupId>/cancel", "cancelTaskGroup",
                title="Cancel a task group",
                description=("a sealed group's unresolved tasks resolve exception `canceled` "
                             "(409 if not sealed): `{taskGroupId, taskGroupSize, "
                             "cancelledCount, taskIds}`, a batch of 100 per call, the rest in "
                             "the background (see [Task groups](../concepts.md#task-groups))"),
                stability="experimental",
                output="cancel-task-group-response.json", body="empty-request.json",
                scopes="queue:cancel-task-group:<schedulerId>/<taskGroupId>")
async def cancel_task_group(call: Call, task_group_id: str) -> Any:
    return await call.services.groups.cancel(task_group_id, _on_group(call))


@routes.declare("POST", "/task-group/<taskGroupId>/priority", "changeTaskGroupPriority",
                title="Change a task group's priority",
                description=("`{newPriority}` for every unresolved task of the group: "
                             "`{taskGroupId, schedulerId, newPriority, tasksAffected, "
                             "taskIds}`, a batch of 100 per call, the rest in the background "
                             "(see [Task groups](../concepts.md#task-groups))"),
                stability="experimental",
                output="task-group-priority-change-response.json",
                body="change-task-priority-request.json",
                scopes="queue:change-task-group-priority:<schedulerId>/<taskGroupId>")
async def change_task_group_priority(call: Call, task_group_id: str) -> Any:
    return await call.services.groups.change_priority(
        task_group_id, Priority(call.body["newPriority"]), _on_group(call))


ROUTES: list[Route] = routes.table
