"""Methods of the Taskcluster Queue API this service does not implement: 501.

``QUEUE_API`` lists every method of the Queue reference (as the official client's
``Queue.funcinfo`` has them: name, HTTP method, route). ``declare_unimplemented`` gives
each one that no module declared a route for a route of its own, after all the others,
that answers 501 ``NotImplemented`` naming the method. Once a module implements a
method, its route matches first and the 501 simply stops applying.
"""

from __future__ import annotations

import re
from typing import Any

from azqueue import errors
from azqueue.api.routes import API, ROUTES, Call, Route

QUEUE_API: tuple[tuple[str, str, str], ...] = (
    ("heartbeat", "GET", "/__heartbeat__"),
    ("lbheartbeat", "GET", "/__lbheartbeat__"),
    ("version", "GET", "/__version__"),
    ("claimWork", "POST", "/claim-work/<taskQueueId>"),
    ("pendingTasks", "GET", "/pending/<taskQueueId>"),
    ("ping", "GET", "/ping"),
    ("listProvisioners", "GET", "/provisioners"),
    ("getProvisioner", "GET", "/provisioners/<provisionerId>"),
    ("listWorkerTypes", "GET", "/provisioners/<provisionerId>/worker-types"),
    ("getWorkerType", "GET", "/provisioners/<provisionerId>/worker-types/<workerType>"),
    ("declareWorker", "PUT", "/provisioners/<provisionerId>/worker-types/<workerType>/<workerGroup>/<workerId>"),
    ("listWorkers", "GET", "/provisioners/<provisionerId>/worker-types/<workerType>/workers"),
    ("getWorker", "GET", "/provisioners/<provisionerId>/worker-types/<workerType>/workers/<workerGroup>/<workerId>"),
    ("quarantineWorker", "PUT", "/provisioners/<provisionerId>/worker-types/<workerType>/workers/<workerGroup>/<workerId>"),
    ("getTaskGroup", "GET", "/task-group/<taskGroupId>"),
    ("cancelTaskGroup", "POST", "/task-group/<taskGroupId>/cancel"),
    ("listTaskGroup", "GET", "/task-group/<taskGroupId>/list"),
    ("changeTaskGroupPriority", "POST", "/task-group/<taskGroupId>/priority"),
    ("sealTaskGroup", "POST", "/task-group/<taskGroupId>/seal"),
    ("listTaskQueues", "GET", "/task-queues"),
    ("getTaskQueue", "GET", "/task-queues/<taskQueueId>"),
    ("listClaimedTasks", "GET", "/task-queues/<taskQueueId>/claimed"),
    ("taskQueueCounts", "GET", "/task-queues/<taskQueueId>/counts"),
    ("listPendingTasks", "GET", "/task-queues/<taskQueueId>/pending"),
    ("taskQueueCountsBatch", "POST", "/task-queues/counts"),
    ("createTask", "PUT", "/task/<taskId>"),
    ("task", "GET", "/task/<taskId>"),
    ("latestArtifact", "GET", "/task/<taskId>/artifact-content/<name>"),
    ("latestArtifactInfo", "GET", "/task/<taskId>/artifact-info/<name>"),
    ("listLatestArtifacts", "GET", "/task/<taskId>/artifacts"),
    ("getLatestArtifact", "GET", "/task/<taskId>/artifacts/<name>"),
    ("cancelTask", "POST", "/task/<taskId>/cancel"),
    ("listDependentTasks", "GET", "/task/<taskId>/dependents"),
    ("changeTaskPriority", "POST", "/task/<taskId>/priority"),
    ("rerunTask", "POST", "/task/<taskId>/rerun"),
    ("artifact", "GET", "/task/<taskId>/runs/<runId>/artifact-content/<name>"),
    ("artifactInfo", "GET", "/task/<taskId>/runs/<runId>/artifact-info/<name>"),
    ("listArtifacts", "GET", "/task/<taskId>/runs/<runId>/artifacts"),
    ("createArtifact", "POST", "/task/<taskId>/runs/<runId>/artifacts/<name>"),
    ("finishArtifact", "PUT", "/task/<taskId>/runs/<runId>/artifacts/<name>"),
    ("getArtifact", "GET", "/task/<taskId>/runs/<runId>/artifacts/<name>"),
    ("claimTask", "POST", "/task/<taskId>/runs/<runId>/claim"),
    ("reportCompleted", "POST", "/task/<taskId>/runs/<runId>/completed"),
    ("reportException", "POST", "/task/<taskId>/runs/<runId>/exception"),
    ("reportFailed", "POST", "/task/<taskId>/runs/<runId>/failed"),
    ("reclaimTask", "POST", "/task/<taskId>/runs/<runId>/reclaim"),
    ("scheduleTask", "POST", "/task/<taskId>/schedule"),
    ("status", "GET", "/task/<taskId>/status"),
    ("tasks", "POST", "/tasks"),
    ("statuses", "POST", "/tasks/status"),
)


def unimplemented() -> list[tuple[str, str, str]]:
    """The methods of ``QUEUE_API`` that no module implements."""
    implemented = {r.name for r in ROUTES if r.handler is not _refuse}
    return [m for m in QUEUE_API if m[0] not in implemented]


def declare_unimplemented() -> None:
    """Append a 501 route for each method no module implements (idempotent)."""
    refused = {r.name for r in ROUTES if r.handler is _refuse}
    for name, method, path in unimplemented():
        if name in refused:
            continue
        regex = re.sub(r"<(\w+)>", lambda m: ".+" if m[1] == "name" else "[^/]+",
                       re.escape(API + path).replace(r"\<", "<").replace(r"\>", ">"))
        ROUTES.append(Route(method, API + path, name, _refuse, re.compile(f"^{regex}$"),
                            scopes=None, body=None, what=name, fixed={"method": name}))


async def _refuse(call: Call, method: str) -> Any:
    raise errors.Unsupported(
        f"{method} is a method of the Taskcluster Queue API that this service does not "
        "implement (yet); the README lists what is not supported")
