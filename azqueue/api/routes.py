"""Routes of the Taskcluster Queue v1 API, matched on the raw path.

Taskcluster clients percent-encode every path parameter (``/`` in a taskQueueId becomes
``%2F``), so routes match the raw, still-encoded path and parameters are decoded after.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from azqueue import __version__, errors
from azqueue.api import validation
from azqueue.api.auth import Authenticator, Caller, require
from azqueue.api.middleware import PARAMS_KEY, PAYLOAD_KEY
from azqueue.model import jsontext, timeutil
from azqueue.model.priority import ORDER, Priority
from azqueue.model.scopes import Expression
from azqueue.model.task import ReasonResolved, RunState, Task
from azqueue.service.artifacts import ArtifactService
from azqueue.service.queue import QueueService, TipClaim

API = "/api/queue/v1"
SLUGID = re.compile(r"^[A-Za-z0-9_-]{8}[Q-T][A-Za-z0-9_-][CGKOSWaeimquy26-][A-Za-z0-9_-]{10}[AQgw]$")
IDENTIFIER = re.compile(r"^[a-zA-Z0-9_-]{1,38}$")
TASK_QUEUE_ID = re.compile(r"^[a-zA-Z0-9_-]{1,38}/[a-zA-Z0-9_-]{1,38}$")
MAX_RUN_ID = 1000
# listTaskGroup and listDependentTasks load each task: a smaller page unless `limit` asks.
LIST_PAGE = 100

SERVICE_KEY = web.AppKey("service", QueueService)
ARTIFACTS_KEY = web.AppKey("artifacts", ArtifactService)
AUTH_KEY = web.AppKey("authenticator", Authenticator)
STARTED_KEY = web.AppKey("started", float)
CALLER_KEY = web.RequestKey("caller", Caller)

RouteHandler = Callable[[web.Request, dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    handler: RouteHandler


ROUTES: list[Route] = []


def route(method: str, path: str) -> Callable[[RouteHandler], RouteHandler]:
    """Register ``handler`` for ``path``, whose ``<name>`` parts match one raw segment and
    ``<name*>`` parts the rest of the path (artifact names may hold unencoded slashes)."""
    regex = re.sub(r"<(\w+)(\*?)>",
                   lambda m: f"(?P<{m[1]}>{'.+' if m[2] else '[^/]+'})",
                   re.escape(path).replace(r"\*", "*"))

    def register(handler: RouteHandler) -> RouteHandler:
        ROUTES.append(Route(method, re.compile(f"^{regex}$"), handler))
        return handler

    return register


def _param(params: dict[str, str], name: str, pattern: re.Pattern[str], rule: str) -> str:
    value = params[name]
    if not pattern.match(value):
        raise errors.InputError(f"path parameter `{name}` is {value!r}; it must be {rule}")
    return value


def _task_id(params: dict[str, str]) -> str:
    return _param(params, "taskId", SLUGID, "a slugid (22 characters of URL-safe base64)")


def _run_id(params: dict[str, str]) -> int:
    raw = params["runId"]
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_RUN_ID:
        raise errors.InputError(f"path parameter `runId` is {raw!r}; it must be an integer "
                                f"from 0 to {MAX_RUN_ID}")
    return int(raw)


def _identifier(params: dict[str, str], name: str) -> str:
    return _param(params, name, IDENTIFIER, "1-38 characters of [a-zA-Z0-9_-]")


async def _body(request: web.Request, schema: str, what: str) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        body: Any = {}
    else:
        try:
            body = jsontext.loads(raw)
        except ValueError as e:
            raise errors.InvalidJson(f"the request body is not valid JSON: {e}") from None
    request[PAYLOAD_KEY] = body
    validation.validate(schema, body, what)
    assert isinstance(body, dict)
    return body


def _service(request: web.Request) -> QueueService:
    return request.app[SERVICE_KEY]


def _require(request: web.Request, expression: Expression) -> None:
    require(request[CALLER_KEY], expression)


def create_task_scopes(definition: dict[str, Any]) -> Expression:
    """The task's own scopes, its routes, its schedulerId, and create-task at its priority
    (a scope for a higher priority also allows lower ones)."""
    priority = Priority.from_definition(definition["priority"])
    queue = definition["taskQueueId"]
    return {"AllOf": [
        *definition["scopes"],
        *(f"queue:route:{route}" for route in definition["routes"]),
        f"queue:scheduler-id:{definition['schedulerId']}",
        {"AnyOf": [f"queue:create-task:{p}:{queue}" for p in ORDER[:priority.rank + 1]]},
    ]}


# -- meta -------------------------------------------------------------------------------


@route("GET", f"{API}/ping")
async def ping(request: web.Request, params: dict[str, str]) -> Any:
    return {"alive": True, "uptime": time.monotonic() - request.app[STARTED_KEY]}


@route("GET", f"{API}/__lbheartbeat__")
async def lbheartbeat(request: web.Request, params: dict[str, str]) -> Any:
    return {}


@route("GET", f"{API}/__heartbeat__")
async def heartbeat(request: web.Request, params: dict[str, str]) -> Any:
    await _service(request).check_storage()
    return {}


@route("GET", f"{API}/__version__")
async def version(request: web.Request, params: dict[str, str]) -> Any:
    return {"source": "https://github.com/azqueue/azqueue", "version": __version__,
            "commit": "", "build": ""}


@route("GET", f"{API}/__metrics__")
async def metrics(request: web.Request, params: dict[str, str]) -> Any:
    return {"storageRequests": _service(request).storage_requests()}


@route("GET", "/schemas/queue/v1/<name>")
async def get_schema(request: web.Request, params: dict[str, str]) -> Any:
    name = params["name"]
    if name not in validation.schema_names():
        raise errors.NotFound(f"no schema {name!r}; there are: {', '.join(validation.schema_names())}")
    return validation.schema(name)


# -- tasks ------------------------------------------------------------------------------


@route("PUT", f"{API}/task/<taskId>")
async def create_task(request: web.Request, params: dict[str, str]) -> Any:
    task_id = _task_id(params)
    body = await _body(request, "task-definition-request.json", "the task definition")
    return {"status": await _service(request).create_task(
        task_id, body, lambda definition: _require(request, create_task_scopes(definition)))}


@route("GET", f"{API}/task/<taskId>")
async def task(request: web.Request, params: dict[str, str]) -> Any:
    task_id = _task_id(params)
    _require(request, f"queue:get-task:{task_id}")
    return await _service(request).definition(task_id)


@route("GET", f"{API}/task/<taskId>/status")
async def status(request: web.Request, params: dict[str, str]) -> Any:
    task_id = _task_id(params)
    _require(request, f"queue:status:{task_id}")
    return {"status": await _service(request).status(task_id)}


# -- workers ----------------------------------------------------------------------------


@route("GET", f"{API}/poll-task-url/<provisionerId>/<workerType>")
async def poll_task_urls(request: web.Request, params: dict[str, str]) -> Any:
    provisioner_id = _identifier(params, "provisionerId")
    worker_type = _identifier(params, "workerType")
    _require(request, f"queue:poll-task-urls:{provisioner_id}/{worker_type}")
    return await _service(request).poll_task_urls(provisioner_id, worker_type)


@route("POST", f"{API}/task/<taskId>/runs/<runId>/claim")
async def claim_task(request: web.Request, params: dict[str, str]) -> Any:
    task_id, run_id = _task_id(params), _run_id(params)
    body = await _body(request, "task-claim-request.json", "the claimTask request")
    tip = TipClaim(body["messageId"], body["receipt"], body["signature"]) if "messageId" in body else None
    worker_group, worker_id = body["workerGroup"], body["workerId"]

    def authorize(task: Task) -> None:
        _require(request, {"AllOf": [f"queue:claim-task:{task.task_queue_id}",
                                     f"queue:worker-id:{worker_group}/{worker_id}"]})

    return await _service(request).claim_task(task_id, run_id, worker_group, worker_id, tip,
                                              authorize)


@route("POST", f"{API}/claim-work/<taskQueueId>")
async def claim_work(request: web.Request, params: dict[str, str]) -> Any:
    task_queue_id = params["taskQueueId"]
    if not TASK_QUEUE_ID.match(task_queue_id):
        raise errors.InputError(f"path parameter `taskQueueId` is {task_queue_id!r}; it must be "
                                "<provisionerId>/<workerType>, each 1-38 characters of [a-zA-Z0-9_-]")
    body = await _body(request, "claim-work-request.json", "the claimWork request")
    worker_group, worker_id = body["workerGroup"], body["workerId"]
    _require(request, {"AllOf": [f"queue:claim-work:{task_queue_id}",
                                 f"queue:worker-id:{worker_group}/{worker_id}"]})

    def connected() -> bool:
        return request.transport is not None and not request.transport.is_closing()

    tasks = await _service(request).claim_work(task_queue_id, worker_group, worker_id,
                                               body["tasks"], connected)
    return {"tasks": tasks}


@route("POST", f"{API}/task/<taskId>/runs/<runId>/reclaim")
async def reclaim_task(request: web.Request, params: dict[str, str]) -> Any:
    task_id, run_id = _task_id(params), _run_id(params)
    await _body(request, "empty-request.json", "the reclaimTask request")
    _require(request, f"queue:reclaim-task:{task_id}/{run_id}")
    return await _service(request).reclaim_task(task_id, run_id)


@route("POST", f"{API}/task/<taskId>/runs/<runId>/completed")
async def report_completed(request: web.Request, params: dict[str, str]) -> Any:
    task_id, run_id = _task_id(params), _run_id(params)
    await _body(request, "empty-request.json", "the reportCompleted request")
    _require(request, f"queue:resolve-task:{task_id}/{run_id}")
    return {"status": await _service(request).report(task_id, run_id, RunState.COMPLETED,
                                                     ReasonResolved.COMPLETED)}


@route("POST", f"{API}/task/<taskId>/runs/<runId>/failed")
async def report_failed(request: web.Request, params: dict[str, str]) -> Any:
    task_id, run_id = _task_id(params), _run_id(params)
    await _body(request, "empty-request.json", "the reportFailed request")
    _require(request, f"queue:resolve-task:{task_id}/{run_id}")
    return {"status": await _service(request).report(task_id, run_id, RunState.FAILED,
                                                     ReasonResolved.FAILED)}


@route("POST", f"{API}/task/<taskId>/runs/<runId>/exception")
async def report_exception(request: web.Request, params: dict[str, str]) -> Any:
    task_id, run_id = _task_id(params), _run_id(params)
    body = await _body(request, "task-exception-request.json", "the reportException request")
    _require(request, f"queue:resolve-task:{task_id}/{run_id}")
    return {"status": await _service(request).report(task_id, run_id, RunState.EXCEPTION,
                                                     ReasonResolved(body["reason"]))}


def _on_task_scope(request: web.Request, action: str) -> Callable[[Task], None]:
    """The check of scheduleTask and cancelTask, which need the task to name the scope:
    ``queue:<action>:<schedulerId>/<taskGroupId>/<taskId>``."""
    def authorize(task: Task) -> None:
        d = task.definition
        _require(request, f"queue:{action}:{d['schedulerId']}/{d['taskGroupId']}/{task.task_id}")
    return authorize


@route("POST", f"{API}/task/<taskId>/schedule")
async def schedule_task(request: web.Request, params: dict[str, str]) -> Any:
    task_id = _task_id(params)
    await _body(request, "empty-request.json", "the scheduleTask request")
    return {"status": await _service(request).schedule_task(
        task_id, _on_task_scope(request, "schedule-task"))}


@route("GET", f"{API}/task-group/<taskGroupId>/list")
async def list_task_group(request: web.Request, params: dict[str, str]) -> Any:
    group = _param(params, "taskGroupId", SLUGID, "a slugid (22 characters of URL-safe base64)")
    _require(request, f"queue:list-task-group:{group}")
    return await _service(request).list_task_group(
        group, request.query.get("continuationToken"), _limit(request) or LIST_PAGE)


@route("GET", f"{API}/task/<taskId>/dependents")
async def list_dependent_tasks(request: web.Request, params: dict[str, str]) -> Any:
    task_id = _task_id(params)
    _require(request, f"queue:list-dependent-tasks:{task_id}")
    return await _service(request).list_dependents(
        task_id, request.query.get("continuationToken"), _limit(request) or LIST_PAGE)


@route("POST", f"{API}/task/<taskId>/cancel")
async def cancel_task(request: web.Request, params: dict[str, str]) -> Any:
    task_id = _task_id(params)
    await _body(request, "empty-request.json", "the cancelTask request")
    return {"status": await _service(request).cancel_task(
        task_id, _on_task_scope(request, "cancel-task"))}


# -- artifacts --------------------------------------------------------------------------


def _artifacts(request: web.Request) -> ArtifactService:
    return request.app[ARTIFACTS_KEY]


def _artifact_name(params: dict[str, str]) -> str:
    name = params["name"]
    if len(name) > 1024 or not name.strip("/"):
        raise errors.InputError(f"artifact name {name[:50]!r} must be 1-1024 characters")
    return name


def _require_read(request: web.Request, name: str) -> None:
    """Names under public/ are readable by anyone; others need queue:get-artifact:<name>."""
    if not name.startswith("public/"):
        _require(request, f"queue:get-artifact:{name}")


@route("POST", f"{API}/task/<taskId>/runs/<runId>/artifacts/<name*>")
async def create_artifact(request: web.Request, params: dict[str, str]) -> Any:
    task_id, run_id, name = _task_id(params), _run_id(params), _artifact_name(params)
    body = await _body(request, "post-artifact-request.json", "the createArtifact request")
    _require(request, f"queue:create-artifact:{task_id}/{run_id}")
    return await _artifacts(request).create(task_id, run_id, name, body)


@route("PUT", f"{API}/task/<taskId>/runs/<runId>/artifacts/<name*>")
async def finish_artifact(request: web.Request, params: dict[str, str]) -> Any:
    task_id, run_id, name = _task_id(params), _run_id(params), _artifact_name(params)
    await _body(request, "finish-artifact-request.json", "the finishArtifact request")
    _require(request, f"queue:create-artifact:{task_id}/{run_id}")
    await _artifacts(request).finish(task_id, run_id, name)
    return {}


async def _redirect(request: web.Request, task_id: str, run_id: int | None,
                    name: str) -> web.StreamResponse:
    _require_read(request, name)
    service = _artifacts(request)
    if run_id is None:
        run_id = await service.latest_run(task_id)
    target = await service.target(task_id, run_id, name)
    if not target.url:
        a = target.artifact
        raise errors.ArtifactFailed(f"artifact {a.name!r} is an error artifact: {a.reason}: "
                                    f"{a.message}")
    return web.json_response({"storageType": target.artifact.storage_type, "url": target.url},
                             status=303, headers={"Location": target.url})


@route("GET", f"{API}/task/<taskId>/runs/<runId>/artifacts/<name*>")
async def get_artifact(request: web.Request, params: dict[str, str]) -> Any:
    return await _redirect(request, _task_id(params), _run_id(params), _artifact_name(params))


@route("GET", f"{API}/task/<taskId>/artifacts/<name*>")
async def get_latest_artifact(request: web.Request, params: dict[str, str]) -> Any:
    return await _redirect(request, _task_id(params), None, _artifact_name(params))


async def _info(request: web.Request, task_id: str, run_id: int | None, name: str) -> Any:
    _require_read(request, name)
    service = _artifacts(request)
    if run_id is None:
        run_id = await service.latest_run(task_id)
    return (await service.find(task_id, run_id, name)).info()


@route("GET", f"{API}/task/<taskId>/runs/<runId>/artifact-info/<name*>")
async def artifact_info(request: web.Request, params: dict[str, str]) -> Any:
    return await _info(request, _task_id(params), _run_id(params), _artifact_name(params))


@route("GET", f"{API}/task/<taskId>/artifact-info/<name*>")
async def latest_artifact_info(request: web.Request, params: dict[str, str]) -> Any:
    return await _info(request, _task_id(params), None, _artifact_name(params))


async def _content(request: web.Request, task_id: str, run_id: int | None, name: str) -> Any:
    """The artifact-content shapes the official client's download helpers understand: a
    blob is served as storageType `s3` (a plain URL to GET), which is what a SAS URL is."""
    _require_read(request, name)
    service = _artifacts(request)
    if run_id is None:
        run_id = await service.latest_run(task_id)
    target = await service.target(task_id, run_id, name)
    a = target.artifact
    if a.storage_type == "error":
        return {"storageType": "error", "reason": a.reason, "message": a.message}
    return {"storageType": "s3" if a.storage_type == "blob" else "reference", "url": target.url}


@route("GET", f"{API}/task/<taskId>/runs/<runId>/artifact-content/<name*>")
async def artifact(request: web.Request, params: dict[str, str]) -> Any:
    return await _content(request, _task_id(params), _run_id(params), _artifact_name(params))


@route("GET", f"{API}/task/<taskId>/artifact-content/<name*>")
async def latest_artifact(request: web.Request, params: dict[str, str]) -> Any:
    return await _content(request, _task_id(params), None, _artifact_name(params))


def _limit(request: web.Request) -> int | None:
    raw = request.query.get("limit")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 1000:
        raise errors.InputError(f"query parameter `limit` is {raw!r}; use 1-1000")
    return int(raw)


@route("GET", f"{API}/task/<taskId>/runs/<runId>/artifacts")
async def list_artifacts(request: web.Request, params: dict[str, str]) -> Any:
    task_id, run_id = _task_id(params), _run_id(params)
    _require(request, f"queue:list-artifacts:{task_id}:{run_id}")
    return await _artifacts(request).list(task_id, run_id, request.query.get("continuationToken"),
                                          _limit(request))


@route("GET", f"{API}/task/<taskId>/artifacts")
async def list_latest_artifacts(request: web.Request, params: dict[str, str]) -> Any:
    task_id = _task_id(params)
    service = _artifacts(request)
    run_id = await service.latest_run(task_id)
    _require(request, f"queue:list-artifacts:{task_id}:{run_id}")
    return await service.list(task_id, run_id, request.query.get("continuationToken"),
                              _limit(request))


# -- dispatch ---------------------------------------------------------------------------


async def dispatch(request: web.Request) -> web.StreamResponse:
    path = request.raw_path.split("?", 1)[0]
    allowed = []
    for r in ROUTES:
        m = r.pattern.match(path)
        if m is None:
            continue
        if r.method != request.method and not (r.method == "GET" and request.method == "HEAD"):
            allowed.append(r.method)
            continue
        params = {k: unquote(v) for k, v in m.groupdict().items()}
        request[PARAMS_KEY] = params
        request[CALLER_KEY] = request.app[AUTH_KEY].authenticate(
            method=request.method, target=request.raw_path, host=request.host,
            content_type=request.headers.get("Content-Type", ""), body=await request.read(),
            authorization=request.headers.get("Authorization"), now=timeutil.utcnow())
        result = await r.handler(request, params)
        if isinstance(result, web.StreamResponse):
            return result
        return web.json_response(result)
    if allowed:
        raise errors.MethodNotAllowed(f"{request.method} is not allowed on {path}; use {', '.join(allowed)}")
    raise errors.NotFound(f"no such API endpoint: {request.method} {path}")
