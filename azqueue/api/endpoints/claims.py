"""The endpoints a worker calls about its work: pollTaskUrls, claimWork (which
long-polls), claimTask, reclaimTask, and the reports that resolve a run
(reportCompleted, reportFailed, reportException). Scopes as Taskcluster's Queue reference
declares them; the logic is in ``service.dispatch.taskurls``, ``service.runs.workclaimer``,
``service.runs.claims`` and ``service.runs.resolution``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from azqueue import errors
from azqueue.api.auth import require
from azqueue.api.routing import Call, Route, Routes
from azqueue.model import scopes
from azqueue.model.identifiers import IDENTIFIER
from azqueue.model.task import ReasonResolved, RunState, Task
from azqueue.service.dispatch.taskurls import MAX_WAIT
from azqueue.service.runs.claims import TipClaim

routes = Routes("Worker interface")


def _connected(call: Call) -> Callable[[], bool]:
    """Whether the caller of a long poll is still connected, to read its answer."""
    def connected() -> bool:
        transport = call.request.transport
        return transport is not None and not transport.is_closing()
    return connected


@routes.declare("GET", "/poll-task-url/<provisionerId>/<workerType>", "pollTaskUrls",
                title="Get the task queue's poll URLs",
                description=("SAS URLs of the task queue's Azure queues, for workers that poll"
                             " Azure directly (see [the SAS protocol](../workers/sas.md)); "
                             "`pending=true&wait=<s>` waits for a visible tip; "
                             "`workerGroup=<g>&workerId=<w>` makes the worker known at once"),
                query=("pending", "wait", "workerGroup", "workerId"), long_poll=True,
                scopes="queue:poll-task-urls:<provisionerId>/<workerType>")
async def poll_task_urls(call: Call, provisioner_id: str, worker_type: str) -> Any:
    _polling_worker(call, f"{provisioner_id}/{worker_type}")
    pending = call.query("pending") or "false"
    if pending not in ("true", "false"):
        raise errors.InputError(f"query parameter `pending` is {pending!r}; use true (also say "
                                "which queues hold visible tips) or false")
    wait_text = call.query("wait") or "0"
    try:
        wait = float(wait_text)
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= MAX_WAIT or (wait and pending != "true"):
        raise errors.InputError(f"query parameter `wait` is {wait_text!r}; give the seconds "
                                f"(0 to {MAX_WAIT:.0f}) to wait for a visible tip, together "
                                "with pending=true")
    return await call.services.task_urls.poll_task_urls(provisioner_id, worker_type,
                                                        pending == "true", wait,
                                                        _connected(call))


def _polling_worker(call: Call, task_queue_id: str) -> None:
    """A worker that names itself (``workerGroup`` and ``workerId``) is recorded as asking
    the task queue for work, as claimWork's callers are, so listWorkers shows it before its
    first claim; only if it may act as that worker (its worker-id scope). Without that
    scope it is served its URLs all the same and recorded by nothing: a poll-only client
    polls as before, and the claims it cannot make say what it lacks."""
    worker_group, worker_id = call.query("workerGroup"), call.query("workerId")
    if worker_group is None and worker_id is None:
        return
    if not (worker_group and worker_id and IDENTIFIER.match(worker_group)
            and IDENTIFIER.match(worker_id)):
        raise errors.InputError(f"query parameters `workerGroup` ({worker_group!r}) and "
                                f"`workerId` ({worker_id!r}) go together, each 1-38 letters, "
                                "digits, - or _; or leave both out")
    if scopes.satisfies(call.caller.scopes, f"queue:worker-id:{worker_group}/{worker_id}"):
        call.services.workers.worker_active(task_queue_id, worker_group, worker_id)


@routes.declare("POST", "/task/<taskId>/runs/<runId>/claim", "claimTask",
                title="Claim a run",
                description=("with or without the `messageId`, `receipt` and `signature` of "
                             "the tip a SAS worker received"),
                stability="deprecated",
                output="task-claim-response.json", body="task-claim-request.json",
                scopes={"AllOf": ["queue:claim-task:<taskQueueId>",
                                  "queue:worker-id:<workerGroup>/<workerId>"]})
async def claim_task(call: Call, task_id: str, run_id: int) -> Any:
    body = call.body
    tip = TipClaim(body["messageId"], body["receipt"], body["signature"]) if "messageId" in body else None
    worker_group, worker_id = body["workerGroup"], body["workerId"]
    # The part of the scopes the body alone decides, before any storage request: a caller
    # that may not act as this worker learns nothing and costs nothing.
    require(call.caller, f"queue:worker-id:{worker_group}/{worker_id}")

    def authorize(task: Task) -> None:
        call.authorize(taskQueueId=task.task_queue_id, workerGroup=worker_group,
                       workerId=worker_id)

    return await call.services.claims.claim_task(task_id, run_id, worker_group, worker_id, tip,
                                                 authorize)


@routes.declare("POST", "/claim-work/<taskQueueId>", "claimWork",
                title="Claim work",
                description=("`{workerGroup, workerId, tasks}` long-polls up to "
                             "`AZQUEUE_CLAIM_WORK_WAIT` seconds and answers `{tasks: [claim, "
                             "…]}`"),
                output="claim-work-response.json", body="claim-work-request.json",
                long_poll=True,
                scopes={"AllOf": ["queue:claim-work:<taskQueueId>",
                                  "queue:worker-id:<workerGroup>/<workerId>"]})
async def claim_work(call: Call, task_queue_id: str) -> Any:
    worker_group, worker_id = call.body["workerGroup"], call.body["workerId"]
    call.authorize(workerGroup=worker_group, workerId=worker_id)
    return {"tasks": await call.services.work.claim_work(task_queue_id, worker_group, worker_id,
                                                        call.body["tasks"], _connected(call))}


@routes.declare("POST", "/task/<taskId>/runs/<runId>/reclaim", "reclaimTask",
                title="Reclaim a run",
                description="pushes its `takenUntil` out",
                output="task-reclaim-response.json",
                body="empty-request.json", scopes="queue:reclaim-task:<taskId>/<runId>")
async def reclaim_task(call: Call, task_id: str, run_id: int) -> Any:
    return await call.services.claims.reclaim_task(task_id, run_id)


_RESOLVE = "queue:resolve-task:<taskId>/<runId>"


@routes.declare("POST", "/task/<taskId>/runs/<runId>/completed", "reportCompleted",
                title="Report a run completed",
                output="task-status-response.json",
                scopes=_RESOLVE, body="empty-request.json", fixed={"state": RunState.COMPLETED})
@routes.declare("POST", "/task/<taskId>/runs/<runId>/failed", "reportFailed",
                title="Report a run failed",
                output="task-status-response.json", scopes=_RESOLVE,
                body="empty-request.json", fixed={"state": RunState.FAILED})
@routes.declare("POST", "/task/<taskId>/runs/<runId>/exception", "reportException",
                title="Report a run's exception",
                description=("`worker-shutdown` and `intermittent-task` retry while retries "
                             "are left; `malformed-payload`, `resource-unavailable`, "
                             "`internal-error` never do"),
                output="task-status-response.json",
                scopes=_RESOLVE, body="task-exception-request.json",
                fixed={"state": RunState.EXCEPTION})
async def report(call: Call, task_id: str, run_id: int, state: RunState) -> Any:
    reason = ReasonResolved(call.body["reason"] if state is RunState.EXCEPTION else state.value)
    return {"status": await call.services.resolution.report(task_id, run_id, state, reason)}


ROUTES: list[Route] = routes.table
