"""The endpoints of a task queue's counts and listings: pendingTasks, taskQueueCounts,
taskQueueCountsBatch, listPendingTasks and listClaimedTasks. Scopes as the Taskcluster
Queue reference declares them; the logic is in ``service.tasks.counts``."""

from __future__ import annotations

from typing import Any

from azqueue import errors
from azqueue.api.routing import ANONYMOUS_COUNTS, PAGED, Call, Route, Routes

routes = Routes("Task queue counts")


@routes.declare("GET", "/pending/<taskQueueId>", "pendingTasks",
                title="Count a task queue's pending tasks",
                stability="deprecated",
                output="pending-tasks-response.json", scopes="queue:pending-count:<taskQueueId>")
async def pending_tasks(call: Call, task_queue_id: str) -> Any:
    return await call.services.counts.pending_tasks(task_queue_id)


_COUNTS = {"AllOf": ["queue:pending-count:<taskQueueId>", "queue:claimed-count:<taskQueueId>"]}


@routes.declare("GET", "/task-queues/<taskQueueId>/counts", "taskQueueCounts",
                title="Count a task queue's pending and claimed tasks",
                output="task-queue-counts-response.json", scopes=_COUNTS)
async def task_queue_counts(call: Call, task_queue_id: str) -> Any:
    return await call.services.counts.counts(task_queue_id)


# At most 1000 taskQueueIds of at most 77 characters each (task-queue-counts-request.json).
COUNTS_BODY = 128 * 1024


@routes.declare("POST", "/task-queues/counts", "taskQueueCountsBatch",
                title="Count the pending and claimed tasks of task queues",
                description="`{taskQueueIds}` (≤ 1000; anonymous: ≤ 5, 400 beyond)",
                stability="experimental",
                output="task-queue-counts-list-response.json",
                body="task-queue-counts-request.json",
                max_body=COUNTS_BODY, scopes={"AllOf": [
                    {"for": "taskQueueId", "in": "taskQueueIds",
                     "each": "queue:pending-count:<taskQueueId>"},
                    {"for": "taskQueueId", "in": "taskQueueIds",
                     "each": "queue:claimed-count:<taskQueueId>"}]})
async def task_queue_counts_batch(call: Call) -> Any:
    ids = call.body["taskQueueIds"]
    call.authorize(taskQueueIds=ids)
    if call.caller.client_id is None and len(ids) > ANONYMOUS_COUNTS:
        # Each task queue costs 7 to 14 storage requests (service.tasks.counts).
        raise errors.InputError(
            f"an anonymous taskQueueCountsBatch counts at most {ANONYMOUS_COUNTS} task queues "
            f"(this one asks for {len(ids)}): ask in several calls, or with credentials "
            "(up to 1000)")
    return {"taskQueueCounts": await call.services.counts.counts_batch(ids)}


@routes.declare("GET", "/task-queues/<taskQueueId>/pending", "listPendingTasks",
                title="List a task queue's pending tasks",
                description=("paginated with `limit` (default 100, ≤ 1000) and "
                             "`continuationToken`"),
                stability="experimental",
                output="list-pending-tasks-response.json", query=PAGED,
                scopes="queue:pending-list:<taskQueueId>")
async def list_pending_tasks(call: Call, task_queue_id: str) -> Any:
    return await call.services.counts.list_pending(task_queue_id, call.continuation,
                                                   call.page())


@routes.declare("GET", "/task-queues/<taskQueueId>/claimed", "listClaimedTasks",
                title="List a task queue's claimed tasks",
                description=("paginated with `limit` (default 100, ≤ 1000) and "
                             "`continuationToken`"),
                stability="experimental",
                output="list-claimed-tasks-response.json", query=PAGED,
                scopes="queue:claimed-list:<taskQueueId>")
async def list_claimed_tasks(call: Call, task_queue_id: str) -> Any:
    return await call.services.counts.list_claimed(task_queue_id, call.continuation,
                                                   call.page())


ROUTES: list[Route] = routes.table
