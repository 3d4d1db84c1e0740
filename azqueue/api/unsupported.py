"""Methods of the Taskcluster Queue API this service does not implement: 501.

``QUEUE_API`` lists every method of the Queue reference (as the official client's
``Queue.funcinfo`` has them: name, HTTP method, route). A request that no declared route
takes (404 or 405 from the dispatcher) but that one of these methods would answers 501
``NotImplemented`` naming the method, unless a route of that name is declared: once a
module implements a method, its route takes the request and the 501 no longer applies.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from functools import cache

from aiohttp import web

from azqueue import errors
from azqueue.api.routing import API

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
    ("declareWorker", "PUT",
     "/provisioners/<provisionerId>/worker-types/<workerType>"
     "/<workerGroup>/<workerId>"),
    ("listWorkers", "GET", "/provisioners/<provisionerId>/worker-types/<workerType>/workers"),
    ("getWorker", "GET",
     "/provisioners/<provisionerId>/worker-types/<workerType>"
     "/workers/<workerGroup>/<workerId>"),
    ("quarantineWorker", "PUT",
     "/provisioners/<provisionerId>/worker-types/<workerType>"
     "/workers/<workerGroup>/<workerId>"),
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


def unimplemented() -> list[str]:
    """The methods of ``QUEUE_API`` that no route implements."""
    from azqueue.api.app import ROUTES  # which imports this module

    implemented = {r.name for r in ROUTES}
    return [name for name, _, _ in QUEUE_API if name not in implemented]


@cache
def _patterns() -> list[tuple[str, str, re.Pattern[str]]]:
    def pattern(path: str) -> re.Pattern[str]:
        regex = re.sub(r"<(\w+)>", lambda m: ".+" if m[1] == "name" else "[^/]+",
                       re.escape(API + path).replace(r"\<", "<").replace(r"\>", ">"))
        return re.compile(f"^{regex}$")
    return [(name, method, pattern(path)) for name, method, path in QUEUE_API]


def method_of(method: str, path: str) -> str | None:
    """The Queue API method a request to ``path`` is, if any."""
    for name, http_method, pattern in _patterns():
        if http_method == method and pattern.match(path):
            return name
    return None


Dispatcher = Callable[[web.Request], Awaitable[web.StreamResponse]]


def refusing_unimplemented(dispatch: Dispatcher) -> Dispatcher:
    """``dispatch``, with 501 for the requests no route takes that are a Queue API method
    no route implements."""
    async def dispatch_or_refuse(request: web.Request) -> web.StreamResponse:
        try:
            return await dispatch(request)
        except (errors.NotFound, errors.MethodNotAllowed):
            name = method_of(request.method, request.raw_path.split("?", 1)[0])
            if name is None or name not in unimplemented():
                raise
            raise errors.Unsupported(
                f"{name} is a method of the Taskcluster Queue API that this service does not "
                "implement (yet); docs/api/index.md lists what is not supported") from None
    return dispatch_or_refuse
