"""The endpoints of tasks: createTask, task, status, scheduleTask, cancelTask, rerunTask,
changeTaskPriority, listDependentTasks, and the batch reads tasks and statuses.

Scopes as Taskcluster's Queue reference declares them; the logic is in
``service.tasks.definitions``, ``service.runs.resolution``, ``service.runs.rerun``,
``service.runs.priority`` and ``service.tasks.batch``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from azqueue.api.routing import PAGED, Call, Route, Routes
from azqueue.model.identifiers import SLUGID
from azqueue.model.priority import ORDER, Priority
from azqueue.model.task import Task

routes = Routes("Tasks")


@routes.declare("PUT", "/task/<taskId>", "createTask",
                title="Create a task",
                description=("define a task and schedule it (unless it waits for its "
                             "dependencies); idempotent for an identical definition, 409 "
                             "otherwise"),
                output="task-status-response.json", body="task-definition-request.json",
                what="the task definition", scopes={"AllOf": [
                    {"for": "scope", "in": "scopes", "each": "<scope>"},
                    {"for": "route", "in": "routes", "each": "queue:route:<route>"},
                    "queue:create-task:project:<projectId>",
                    "queue:scheduler-id:<schedulerId>",
                    # A scope for a higher priority also allows lower ones.
                    {"AnyOf": [{"for": "priority", "in": "priorities",
                                "each": "queue:create-task:<priority>:<taskQueueId>"}]},
                ]})
async def create_task(call: Call, task_id: str) -> Any:
    def authorize(definition: dict[str, Any]) -> None:
        rank = Priority.from_definition(definition["priority"]).rank
        call.authorize(scopes=definition["scopes"], routes=definition["routes"],
                       projectId=definition["projectId"], schedulerId=definition["schedulerId"],
                       priorities=ORDER[:rank + 1], taskQueueId=definition["taskQueueId"])

    return {"status": await call.services.definitions.create_task(task_id, call.body, authorize)}


@routes.declare("GET", "/task/<taskId>", "task",
                title="Get the task definition",
                description="with `taskQueueId` and `provisionerId`/`workerType`",
                output="task.json", scopes="queue:get-task:<taskId>")
async def task(call: Call, task_id: str) -> Any:
    return await call.services.definitions.definition(task_id)


@routes.declare("GET", "/task/<taskId>/status", "status",
                title="Get the task status",
                output="task-status-response.json", scopes="queue:status:<taskId>")
async def status(call: Call, task_id: str) -> Any:
    return {"status": await call.services.definitions.status(task_id)}


# The check of scheduleTask, cancelTask and rerunTask, whose scopes name the task's
# scheduler, group and project.
def _on_task(call: Call) -> Callable[[Task], None]:
    def authorize(task: Task) -> None:
        d = task.definition
        call.authorize(schedulerId=d["schedulerId"], taskGroupId=d["taskGroupId"],
                       projectId=d["projectId"])
    return authorize


def _any_of(verb: str) -> dict[str, list[Any]]:
    """Taskcluster's three ways to be allowed ``verb`` (``schedule-task``, ...) on a task:
    by its scheduler, group and id; by its project; or the bare verb with the scheduler's
    role for the group."""
    return {"AnyOf": [
        f"queue:{verb}:<schedulerId>/<taskGroupId>/<taskId>",
        f"queue:{verb}-in-project:<projectId>",
        {"AllOf": [f"queue:{verb}", "assume:scheduler-id:<schedulerId>/<taskGroupId>"]},
    ]}


@routes.declare("POST", "/task/<taskId>/schedule", "scheduleTask",
                title="Schedule a task",
                description=("an unscheduled task gets its pending run 0 whatever its "
                             "dependencies say"),
                output="task-status-response.json", body="empty-request.json",
                scopes=_any_of("schedule-task"))
async def schedule_task(call: Call, task_id: str) -> Any:
    return {"status": await call.services.definitions.schedule_task(task_id, _on_task(call))}


@routes.declare("POST", "/task/<taskId>/cancel", "cancelTask",
                title="Cancel a task",
                description=("the unresolved run resolves exception `canceled`, never retried;"
                             " a running run's tip is deleted and its worker's next reclaim is"
                             " a 409; a resolved task answers its status unchanged"),
                output="task-status-response.json", body="empty-request.json",
                scopes=_any_of("cancel-task"))
async def cancel_task(call: Call, task_id: str) -> Any:
    return {"status": await call.services.resolution.cancel_task(task_id, _on_task(call))}


@routes.declare("POST", "/task/<taskId>/rerun", "rerunTask",
                title="Rerun a task",
                description=("a resolved (or unscheduled) task gets a new pending run `rerun` "
                             "and its `retries` back; a pending or running task answers its "
                             "status unchanged; 409 past the deadline or once the task has 50 "
                             "runs (Taskcluster's limit; the retries a rerun grants stop there"
                             " too)"),
                output="task-status-response.json", body="empty-request.json",
                scopes=_any_of("rerun-task"))
async def rerun_task(call: Call, task_id: str) -> Any:
    return {"status": await call.services.rerun.rerun_task(task_id, _on_task(call))}


@routes.declare("POST", "/task/<taskId>/priority", "changeTaskPriority",
                title="Change a task's priority",
                description=("`{newPriority}`: an unresolved task's priority; a pending run is"
                             " then claimed from the new priority's queue (see [Reruns and "
                             "priorities](../concepts.md#reruns-and-priorities)); 409 for a "
                             "resolved task or past the deadline; the same priority again "
                             "answers the status"),
                stability="experimental",
                output="task-status-response.json",
                body="change-task-priority-request.json", scopes={"AnyOf": [
                    "queue:change-task-priority:<taskId>",
                    "queue:change-task-priority-in-queue:<taskQueueId>"]})
async def change_task_priority(call: Call, task_id: str) -> Any:
    def authorize(task: Task) -> None:
        call.authorize(taskQueueId=task.task_queue_id)

    change = await call.services.priority.change(task_id, Priority(call.body["newPriority"]),
                                                 authorize)
    return {"status": change.after.status()}


@routes.declare("GET", "/task/<taskId>/dependents", "listDependentTasks",
                title="List the dependent tasks",
                description=("`{taskId, tasks: [{status, task}]}` (every task defined with "
                             "this one among its dependencies), paginated with `limit` "
                             "(default 100, ≤ 1000) and `continuationToken`; anonymous by "
                             "default"),
                output="list-dependent-tasks-response.json", query=PAGED,
                scopes="queue:list-dependent-tasks:<taskId>")
async def list_dependent_tasks(call: Call, task_id: str) -> Any:
    return await call.services.definitions.list_dependents(task_id, call.continuation,
                                                           call.page())


# -- batch reads --------------------------------------------------------------------------

# At most 1000 taskIds (tasks-request.json): 22-character slugids, quoted and separated,
# fit in 32 KiB; twice that leaves room for spacing.
TASKS_BODY = 64 * 1024


def _page(call: Call) -> tuple[list[str], str | None, int]:
    task_ids = [str(t) for t in call.body.get("taskIds", [])]
    call.authorize(taskIds=task_ids)
    return task_ids, call.continuation, call.page()


def _valid(task_id: str) -> bool:
    return bool(SLUGID.fullmatch(task_id))


@routes.declare(
    "POST", "/tasks", "tasks", title="Get tasks", stability="experimental",
    description=("`{taskIds}` (at most 1000, 400 beyond; a body of at most 64 KiB, 413 "
                 "beyond): `{tasks: [{taskId, task}]}`; taskIds that name no task are left "
                 "out, repeated ones answered once; paginated over the taskIds given with "
                 "`limit` (default 100, ≤ 1000; anonymous: ≤ 50) and `continuationToken` "
                 "(send the same body again)"),
    output="tasks-response.json", body="tasks-request.json",
    max_body=TASKS_BODY, query=PAGED,
    scopes={"AllOf": [{"for": "taskId", "in": "taskIds", "each": "queue:get-task:<taskId>"}]})
async def tasks(call: Call) -> Any:
    found, token = await call.services.batch.read_many(
        *_page(call), _valid, lambda t: {"taskId": t.task_id, "task": dict(t.definition)})
    return {"tasks": found, **({"continuationToken": token} if token else {})}


@routes.declare(
    "POST", "/tasks/status", "statuses", title="Get task statuses", stability="experimental",
    description="`{taskIds}`, as tasks: `{statuses: [{taskId, status}]}`",
    output="tasks-statuses-response.json",
    body="tasks-request.json", max_body=TASKS_BODY, query=PAGED,
    scopes={"AllOf": [{"for": "taskId", "in": "taskIds", "each": "queue:status:<taskId>"}]})
async def statuses(call: Call) -> Any:
    found, token = await call.services.batch.read_many(
        *_page(call), _valid, lambda t: {"taskId": t.task_id, "status": t.status()})
    return {"statuses": found, **({"continuationToken": token} if token else {})}


ROUTES: list[Route] = routes.table
