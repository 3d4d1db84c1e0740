"""Routes of the worker metadata part of the Queue API: provisioners, worker types, task
queues, workers (with declareWorker and quarantineWorker), and the counts and listings of
a task queue's pending and claimed tasks. Scopes as the Taskcluster Queue reference
declares them."""

from __future__ import annotations

from typing import Any

from azqueue import errors
from azqueue.api.routes import ANONYMOUS_COUNTS, Call, route
from azqueue.model import timeutil

# Taskcluster's page size for the metadata listings, which read nothing but their rows.
METADATA_PAGE = 1000


def _task_queue(provisioner_id: str, worker_type: str) -> str:
    return f"{provisioner_id}/{worker_type}"


def _date(body: dict[str, Any], field: str) -> str:
    """The date-time ``field`` of the body, checked; InputError saying what it must be."""
    try:
        return timeutil.normalize(str(body[field]))
    except ValueError as e:
        raise errors.InputError(f"`{field}`: {e}") from None


# -- provisioners, worker types, task queues ---------------------------------------------


@route("GET", "/provisioners", "listProvisioners", scopes="queue:list-provisioners")
async def list_provisioners(call: Call) -> Any:
    return await call.services.workers.list_provisioners(call.continuation,
                                                         call.limit() or METADATA_PAGE)


@route("GET", "/provisioners/<provisionerId>", "getProvisioner",
       scopes="queue:get-provisioner:<provisionerId>")
async def get_provisioner(call: Call, provisioner_id: str) -> Any:
    return await call.services.workers.provisioner(provisioner_id)


@route("GET", "/provisioners/<provisionerId>/worker-types", "listWorkerTypes",
       scopes="queue:list-worker-types:<provisionerId>")
async def list_worker_types(call: Call, provisioner_id: str) -> Any:
    return await call.services.workers.list_worker_types(provisioner_id, call.continuation,
                                                         call.limit() or METADATA_PAGE)


@route("GET", "/provisioners/<provisionerId>/worker-types/<workerType>", "getWorkerType",
       scopes="queue:get-worker-type:<provisionerId>/<workerType>")
async def get_worker_type(call: Call, provisioner_id: str, worker_type: str) -> Any:
    return await call.services.workers.worker_type(provisioner_id, worker_type)


@route("GET", "/task-queues", "listTaskQueues", scopes="queue:list-task-queues")
async def list_task_queues(call: Call) -> Any:
    return await call.services.workers.list_task_queues(call.continuation,
                                                        call.limit() or METADATA_PAGE)


@route("GET", "/task-queues/<taskQueueId>", "getTaskQueue",
       scopes="queue:get-task-queue:<taskQueueId>")
async def get_task_queue(call: Call, task_queue_id: str) -> Any:
    return await call.services.workers.task_queue(task_queue_id)


# -- workers ------------------------------------------------------------------------------


@route("GET", "/provisioners/<provisionerId>/worker-types/<workerType>/workers", "listWorkers",
       scopes="queue:list-workers:<provisionerId>/<workerType>")
async def list_workers(call: Call, provisioner_id: str, worker_type: str) -> Any:
    raw = call.request.query.get("quarantined")
    if raw not in (None, "true", "false"):
        raise errors.InputError(f"query parameter `quarantined` is {raw!r}; use true or false "
                                "(or leave it out for every worker)")
    return await call.services.workers.list_workers(
        _task_queue(provisioner_id, worker_type), call.continuation,
        call.limit() or METADATA_PAGE, None if raw is None else raw == "true")


_WORKER = "<provisionerId>/<workerType>/<workerGroup>/<workerId>"


@route("GET", "/provisioners/<provisionerId>/worker-types/<workerType>/workers/<workerGroup>/"
       "<workerId>", "getWorker", scopes=f"queue:get-worker:{_WORKER}")
async def get_worker(call: Call, provisioner_id: str, worker_type: str, worker_group: str,
                     worker_id: str) -> Any:
    return await call.services.workers.worker(_task_queue(provisioner_id, worker_type),
                                              worker_group, worker_id)


@route("PUT", "/provisioners/<provisionerId>/worker-types/<workerType>/workers/<workerGroup>/"
       "<workerId>", "quarantineWorker", body="quarantine-worker-request.json",
       scopes={"AllOf": [f"queue:quarantine-worker:{_WORKER}"]})
async def quarantine_worker(call: Call, provisioner_id: str, worker_type: str,
                            worker_group: str, worker_id: str) -> Any:
    return await call.services.workers.quarantine_worker(
        _task_queue(provisioner_id, worker_type), worker_group, worker_id,
        _date(call.body, "quarantineUntil"), call.body.get("quarantineInfo"),
        call.caller.client_id or "anonymous")


@route("PUT", "/provisioners/<provisionerId>/worker-types/<workerType>/<workerGroup>/<workerId>",
       "declareWorker", body="update-worker-request.json",
       scopes={"AllOf": [{"for": "property", "in": "properties",
                          "each": f"queue:declare-worker:{_WORKER}#<property>"}]})
async def declare_worker(call: Call, provisioner_id: str, worker_type: str, worker_group: str,
                         worker_id: str) -> Any:
    call.authorize(properties=sorted(call.body))
    return await call.services.workers.declare_worker(
        _task_queue(provisioner_id, worker_type), worker_group, worker_id,
        _date(call.body, "expires"))


# -- counts and listings of a task queue's tasks ------------------------------------------


@route("GET", "/pending/<taskQueueId>", "pendingTasks",
       scopes="queue:pending-count:<taskQueueId>")
async def pending_tasks(call: Call, task_queue_id: str) -> Any:
    return await call.services.counts.pending_tasks(task_queue_id)


_COUNTS = {"AllOf": ["queue:pending-count:<taskQueueId>", "queue:claimed-count:<taskQueueId>"]}


@route("GET", "/task-queues/<taskQueueId>/counts", "taskQueueCounts", scopes=_COUNTS)
async def task_queue_counts(call: Call, task_queue_id: str) -> Any:
    return await call.services.counts.counts(task_queue_id)


# At most 1000 taskQueueIds of at most 77 characters each (task-queue-counts-request.json).
COUNTS_BODY = 128 * 1024


@route("POST", "/task-queues/counts", "taskQueueCountsBatch", body="task-queue-counts-request.json",
       max_body=COUNTS_BODY, scopes={"AllOf": [
           {"for": "taskQueueId", "in": "taskQueueIds",
            "each": "queue:pending-count:<taskQueueId>"},
           {"for": "taskQueueId", "in": "taskQueueIds",
            "each": "queue:claimed-count:<taskQueueId>"}]})
async def task_queue_counts_batch(call: Call) -> Any:
    ids = call.body["taskQueueIds"]
    call.authorize(taskQueueIds=ids)
    if call.caller.client_id is None and len(ids) > ANONYMOUS_COUNTS:
        # Each task queue costs 7 to 14 storage requests (service.counts).
        raise errors.InputError(
            f"an anonymous taskQueueCountsBatch counts at most {ANONYMOUS_COUNTS} task queues "
            f"(this one asks for {len(ids)}): ask in several calls, or with credentials "
            "(up to 1000)")
    return {"taskQueueCounts": await call.services.counts.counts_batch(ids)}


@route("GET", "/task-queues/<taskQueueId>/pending", "listPendingTasks",
       scopes="queue:pending-list:<taskQueueId>")
async def list_pending_tasks(call: Call, task_queue_id: str) -> Any:
    return await call.services.counts.list_pending(task_queue_id, call.continuation,
                                                   call.page())


@route("GET", "/task-queues/<taskQueueId>/claimed", "listClaimedTasks",
       scopes="queue:claimed-list:<taskQueueId>")
async def list_claimed_tasks(call: Call, task_queue_id: str) -> Any:
    return await call.services.counts.list_claimed(task_queue_id, call.continuation,
                                                   call.page())
