"""The endpoints of the worker metadata: provisioners, worker types, task queues, workers
(with declareWorker and quarantineWorker). Scopes as the Taskcluster Queue reference
declares them; the logic is in ``service.workers.workers``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from azqueue import errors
from azqueue.api.routing import PAGED, Call, Route, Routes
from azqueue.model import timeutil
from azqueue.model.identifiers import WORKER_TYPE_OF_TASK
from azqueue.service.workers.workers import WorkerInfo

# Taskcluster's page size for the metadata listings, which read nothing but their rows.
METADATA_PAGE = 1000
# A listing of every row of a kind (provisioners, task queues): continuation, page size.
Listing = Callable[[WorkerInfo, str | None, int], Awaitable[dict[str, Any]]]

routes = Routes("Worker metadata")


def _task_queue(provisioner_id: str, worker_type: str) -> str:
    return f"{provisioner_id}/{worker_type}"


def _page(call: Call) -> tuple[str | None, int]:
    """Where a metadata listing goes on, and how many rows a page."""
    return call.continuation, call.limit() or METADATA_PAGE


def _date(body: dict[str, Any], field: str) -> str:
    """The date-time ``field`` of the body, checked; InputError saying what it must be."""
    try:
        return timeutil.normalize(str(body[field]))
    except ValueError as e:
        raise errors.InputError(f"`{field}`: {e}") from None


# -- provisioners, worker types, task queues ---------------------------------------------


@routes.declare("GET", "/provisioners", "listProvisioners",
                title="List provisioners",
                stability="deprecated",
                output="list-provisioners-response.json", query=PAGED,
                scopes="queue:list-provisioners", fixed={"rows": WorkerInfo.list_provisioners})
@routes.declare("GET", "/task-queues", "listTaskQueues",
                title="List task queues",
                output="list-taskqueues-response.json", query=PAGED,
                scopes="queue:list-task-queues", fixed={"rows": WorkerInfo.list_task_queues})
async def list_all(call: Call, rows: Listing) -> Any:
    """listProvisioners and listTaskQueues: every row there is, a page at a time."""
    return await rows(call.services.workers, *_page(call))


@routes.declare("GET", "/provisioners/<provisionerId>", "getProvisioner",
                title="Get a provisioner",
                stability="deprecated",
                output="provisioner-response.json", scopes="queue:get-provisioner:<provisionerId>")
async def get_provisioner(call: Call, provisioner_id: str) -> Any:
    return await call.services.workers.provisioner(provisioner_id)


@routes.declare("GET", "/provisioners/<provisionerId>/worker-types", "listWorkerTypes",
                title="List a provisioner's worker types",
                stability="deprecated",
                output="list-workertypes-response.json", query=PAGED,
                scopes="queue:list-worker-types:<provisionerId>")
async def list_worker_types(call: Call, provisioner_id: str) -> Any:
    return await call.services.workers.list_worker_types(provisioner_id, *_page(call))


@routes.declare("GET", "/provisioners/<provisionerId>/worker-types/<workerType>", "getWorkerType",
                title="Get a worker type",
                stability="deprecated",
                output="workertype-response.json",
                scopes="queue:get-worker-type:<provisionerId>/<workerType>")
async def get_worker_type(call: Call, provisioner_id: str, worker_type: str) -> Any:
    return await call.services.workers.worker_type(provisioner_id, worker_type)


@routes.declare("GET", "/task-queues/<taskQueueId>", "getTaskQueue",
                title="Get a task queue",
                output="taskqueue-response.json", scopes="queue:get-task-queue:<taskQueueId>")
async def get_task_queue(call: Call, task_queue_id: str) -> Any:
    return await call.services.workers.task_queue(task_queue_id)


# -- workers ------------------------------------------------------------------------------


@routes.declare("GET", "/provisioners/<provisionerId>/worker-types/<workerType>/workers",
                "listWorkers", title="List a worker type's workers", stability="deprecated",
                description="`quarantined=true` or `false` to filter",
                output="list-workers-response.json", query=(*PAGED, "quarantined"),
                scopes="queue:list-workers:<provisionerId>/<workerType>")
async def list_workers(call: Call, provisioner_id: str, worker_type: str) -> Any:
    raw = call.query("quarantined")
    if raw not in (None, "true", "false"):
        raise errors.InputError(f"query parameter `quarantined` is {raw!r}; use true or false "
                                "(or leave it out for every worker)")
    return await call.services.workers.list_workers(
        _task_queue(provisioner_id, worker_type), *_page(call),
        None if raw is None else raw == "true")


_WORKER = "<provisionerId>/<workerType>/<workerGroup>/<workerId>"


@routes.declare("GET", "/provisioners/<provisionerId>/worker-types/<workerType>/workers/"
                "<workerGroup>/<workerId>", "getWorker",
                title="Get a worker", stability="deprecated",
                output="worker-response.json", scopes=f"queue:get-worker:{_WORKER}")
async def get_worker(call: Call, provisioner_id: str, worker_type: str, worker_group: str,
                     worker_id: str) -> Any:
    return await call.services.workers.worker(_task_queue(provisioner_id, worker_type),
                                              worker_group, worker_id)


@routes.declare("PUT", "/provisioners/<provisionerId>/worker-types/<workerType>/workers/"
                "<workerGroup>/<workerId>", "quarantineWorker",
                title="Quarantine a worker", stability="experimental",
                description="`{quarantineUntil, quarantineInfo}`; 404 for a worker never seen",
                output="worker-response.json", body="quarantine-worker-request.json",
                scopes={"AllOf": [f"queue:quarantine-worker:{_WORKER}"]})
async def quarantine_worker(call: Call, provisioner_id: str, worker_type: str,
                            worker_group: str, worker_id: str) -> Any:
    return await call.services.workers.quarantine_worker(
        _task_queue(provisioner_id, worker_type), worker_group, worker_id,
        _date(call.body, "quarantineUntil"), call.body.get("quarantineInfo"),
        call.caller.client_id or "anonymous")


@routes.declare("PUT", "/provisioners/<provisionerId>/worker-types/<workerType>/<workerGroup>/"
                "<workerId>", "declareWorker",
                title="Declare a worker", stability="experimental",
                description="`{expires}`; its workerType is a task's (lowercase; 400 otherwise)",
                output="worker-response.json", body="update-worker-request.json",
                scopes={"AllOf": [{"for": "property", "in": "properties",
                                   "each": f"queue:declare-worker:{_WORKER}#<property>"}]})
async def declare_worker(call: Call, provisioner_id: str, worker_type: str, worker_group: str,
                         worker_id: str) -> Any:
    call.authorize(properties=sorted(call.body))
    if not WORKER_TYPE_OF_TASK.fullmatch(worker_type):
        # A worker's answer carries its workerType, which Taskcluster's schema gives a
        # task's pattern: a worker of another could never be answered.
        raise errors.InputError(
            f"path parameter `workerType` is {worker_type!r}; a worker's must be 1-38 "
            "lowercase letters, digits and `-`, starting with a letter and not ending with "
            "`-` (as a task's)")
    return await call.services.workers.declare_worker(
        _task_queue(provisioner_id, worker_type), worker_group, worker_id,
        _date(call.body, "expires"))


ROUTES: list[Route] = routes.table
