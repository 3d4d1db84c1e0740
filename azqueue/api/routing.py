"""How the Taskcluster Queue v1 API is routed, matched on the raw path: no handlers here.

The handlers are in ``azqueue.api.endpoints``, one module a domain, each with its own
table (``ROUTES``, filled by its own ``Routes``); ``azqueue.api.app`` puts the tables
together and serves them with a ``Router``.

Each route declares its contract where it is registered, as Taskcluster's
``builder.declare`` does: the path, whose ``<parameters>`` are converted and checked by
``PARAMETERS`` (one meaning per name across the API); the query parameters it reads; the
JSON schema of its body; Taskcluster's schema of its answer (``output``, as the Queue
reference names it: the tests check every success answer against Taskcluster's own
schema, nothing does when serving); whether it long-polls (its storage calls then get
the long poll's time on top of a request's budget); what the API reference says of it
(title, description, stability: ``scripts/api_table.py`` writes docs/api/index.md from
them); and the scope expression it needs, a template (``azqueue.model.scopes.Template``) filled from the path parameters. A template that
needs more than the path (the task's queue, the worker named in the body) is filled when
the handler calls ``call.authorize(...)`` with the rest, before it changes anything; a
handler that never does answers 500 (a bug for the tests to catch), never a success, and
so does one that reads a query parameter its route does not declare. Handlers hold only
their own logic.

Taskcluster clients percent-encode every path parameter (``/`` in a taskQueueId becomes
``%2F``), so routes match the raw, still-encoded path and parameters are decoded after.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from azqueue import errors
from azqueue.api import validation
from azqueue.api.auth import Authenticator, Caller, require
from azqueue.api.connections import read_body
from azqueue.api.middleware import PARAMS_KEY, PAYLOAD_KEY
from azqueue.api.observe import CLIENT_KEY, ENDPOINT_KEY
from azqueue.model import jsontext, timeutil
from azqueue.model.identifiers import IDENTIFIER, SLUGID, TASK_QUEUE_ID
from azqueue.model.scopes import Template, Unresolved, render
from azqueue.service.artifacts.artifacts import name_fits as artifact_name_fits
from azqueue.service.wiring import Services

API = "/api/queue/v1"
MAX_RUN_ID = 1000
MAX_ARTIFACT_NAME = 1024
# listTaskGroup and listDependentTasks load each task: a smaller page unless `limit` asks.
LIST_PAGE = 100

# What one anonymous request may cost: at most 100 storage requests. The listings that
# read each task they list (listTaskGroup, listDependentTasks, tasks, statuses,
# listPendingTasks, listClaimedTasks) give anonymous callers at most ANONYMOUS_PAGE
# entries a page, whatever `limit` asks (a smaller page is legal: the continuationToken
# says where to go on), and taskQueueCountsBatch counts at most ANONYMOUS_COUNTS task
# queues for them (7 to 14 requests each). Besides the bound come costs that grow with
# what the deployment holds, not with what a request asks: the scan of the claim index
# that claimed counts and listings share (``service.tasks.counts``: at most one per
# COUNTS_TTL seconds and process, however many requests ask), and the rows of a task
# group not yet sealed (``service.tasks.groups``, read for its first page). Callers with
# credentials get up to 1000 a page and a batch.
ANONYMOUS_PAGE = 50
ANONYMOUS_COUNTS = 5

SERVICES_KEY = web.AppKey("services", Services)
AUTH_KEY = web.AppKey("authenticator", Authenticator)
STARTED_KEY = web.AppKey("started", float)
CALLER_KEY = web.RequestKey("caller", Caller)


# -- path parameters ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Parameter:
    """A path parameter: the handler's keyword for it, and its convertor, which gives the
    value or raises InputError saying what it must be. ``rest`` parameters match the rest
    of the path (artifact names may hold unencoded slashes); others one segment."""

    keyword: str
    convert: Callable[[str, str], Any]
    rest: bool = False


def _matching(pattern: re.Pattern[str], rule: str) -> Callable[[str, str], str]:
    def convert(name: str, value: str) -> str:
        if not pattern.fullmatch(value):  # `$` alone lets a trailing newline through
            raise errors.InputError(f"path parameter `{name}` is {value!r}; it must be {rule}")
        return value
    return convert


def _run_id(name: str, raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_RUN_ID:
        raise errors.InputError(f"path parameter `{name}` is {raw!r}; it must be an integer "
                                f"from 0 to {MAX_RUN_ID}")
    return int(raw)


def _artifact_name(name: str, value: str) -> str:
    if len(value) > MAX_ARTIFACT_NAME or not value.strip("/"):
        raise errors.InputError(f"artifact name {value[:50]!r} must be 1-{MAX_ARTIFACT_NAME} "
                                "characters")
    if "\\" in value:
        raise errors.InputError(f"artifact name {value[:50]!r} contains a backslash, which blob "
                                "storage reads as `/`: use `/` to separate its parts")
    if any(part in (".", "..") for part in value.split("/")):
        raise errors.InputError(f"artifact name {value[:50]!r} has a `.` or `..` part: a blob "
                                "path would resolve it; name the artifact without them")
    if not artifact_name_fits(value):
        raise errors.InputError(
            f"artifact name {value[:50]!r}... is too long once stored: at most about 490 "
            "characters (fewer when some are not ASCII, which take up to 12 each)")
    return value


_SLUGID_RULE = "a slugid (22 characters of URL-safe base64)"
_IDENTIFIER_RULE = "1-38 characters of [a-zA-Z0-9_-]"

PARAMETERS: dict[str, Parameter] = {
    "taskId": Parameter("task_id", _matching(SLUGID, _SLUGID_RULE)),
    "taskGroupId": Parameter("task_group_id", _matching(SLUGID, _SLUGID_RULE)),
    "runId": Parameter("run_id", _run_id),
    "name": Parameter("name", _artifact_name, rest=True),
    "taskQueueId": Parameter("task_queue_id", _matching(
        TASK_QUEUE_ID, f"<provisionerId>/<workerType>, each {_IDENTIFIER_RULE}")),
    "provisionerId": Parameter("provisioner_id", _matching(IDENTIFIER, _IDENTIFIER_RULE)),
    "workerType": Parameter("worker_type", _matching(IDENTIFIER, _IDENTIFIER_RULE)),
    "workerGroup": Parameter("worker_group", _matching(IDENTIFIER, _IDENTIFIER_RULE)),
    "workerId": Parameter("worker_id", _matching(IDENTIFIER, _IDENTIFIER_RULE)),
    "schema": Parameter("schema", lambda name, value: value),
}


# -- declaring routes ---------------------------------------------------------------------


Handler = Callable[..., Awaitable[Any]]


# The query parameters of a listing: where to go on, and how much a page.
PAGED = ("continuationToken", "limit")


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    name: str  # as the Taskcluster Queue reference names the endpoint
    handler: Handler
    pattern: re.Pattern[str]
    params: tuple[str, ...]  # the path parameters, in the order of the path
    query: frozenset[str]  # the query parameters the handler reads; others are ignored
    scopes: Template | None
    body: str | None  # the JSON schema of the request body; None: no body is read
    output: str | None  # Taskcluster's schema of the answer; None: it declares none
    what: str  # the body, in error messages
    fixed: Mapping[str, Any]  # keywords the handler gets from the declaration
    max_body: int | None  # bytes; None: the application's limit (MAX_BODY)
    long_poll: bool  # waits for something to happen before it answers (claimWork)
    # What the API reference says of it (docs/api/index.md is written from these):
    title: str  # what it does, in a few words
    description: str  # what a caller should know beyond the title, "" if nothing
    category: str  # its part of the API: its module's
    stability: str  # as Taskcluster's reference marks it: stable, experimental, deprecated


STABILITIES = ("stable", "experimental", "deprecated")


class Routes:
    """The route table of one module, one category of the API: ``routes =
    Routes("Tasks")``, ``@routes.declare(...)`` on each handler, and ``ROUTES =
    routes.table`` for ``azqueue.api.app`` to serve."""

    def __init__(self, category: str) -> None:
        self.category = category
        self.table: list[Route] = []

    def declare(self, method: str, path: str, name: str, *, title: str,
                description: str = "", stability: str = "stable",
                scopes: Template | None = None,
                query: tuple[str, ...] = (), body: str | None = None, what: str = "",
                output: str | None = None, fixed: Mapping[str, Any] | None = None,
                max_body: int | None = None, long_poll: bool = False
                ) -> Callable[[Handler], Handler]:
        """Declare the endpoint ``name`` at ``path`` (under ``API`` unless it starts with
        ``/schemas``): the handler is called as ``handler(call, **parameters, **fixed)``
        once the parameters are converted, the body (if ``body`` names its schema) is
        validated and the scopes that the path alone determines are checked; it reads
        the ``query`` parameters with ``call.query``. A body longer than ``max_body``
        bytes is refused (413) before it is authenticated or parsed. ``output`` names
        Taskcluster's schema of its answer (e.g. ``task-status-response.json``) where
        the Queue reference declares one. ``title``, ``description`` and ``stability``
        are what the API reference (docs/api/index.md) says of it, under this table's
        category."""
        if stability not in STABILITIES:
            raise ValueError(f"{name}: stability {stability!r} is not one of {STABILITIES}")
        full = path if path.startswith("/schemas/") else f"{API}{path}"
        params = tuple(re.findall(r"<(\w+)>", full))
        for parameter in params:
            if parameter not in PARAMETERS:
                raise ValueError(f"{name}: no convertor for path parameter <{parameter}>")
        regex = re.sub(r"<(\w+)>",
                       lambda m: f"(?P<{m[1]}>{'.+' if PARAMETERS[m[1]].rest else '[^/]+'})",
                       re.escape(full).replace(r"\<", "<").replace(r"\>", ">"))

        def register(handler: Handler) -> Handler:
            self.table.append(Route(
                method, full, name, handler, re.compile(f"^{regex}$"), params,
                frozenset(query), scopes, body, output, what or f"the {name} request",
                fixed or {}, max_body, long_poll, title, description, self.category,
                stability))
            return handler

        return register


@dataclass(slots=True)
class Call:
    """One request to a declared route, as its handler sees it (not frozen: it records
    whether the declared scopes were checked)."""

    request: web.Request
    route: Route
    caller: Caller
    values: dict[str, Any]  # the converted path parameters, by their names in the path
    body: dict[str, Any]
    authorized: bool = False

    @property
    def services(self) -> Services:
        """The process's components (``service.wiring``), the one way to them."""
        return self.request.app[SERVICES_KEY]

    def authorize(self, **values: object) -> None:
        """Check the route's declared scopes, filled with the path parameters and
        ``values``: InsufficientScopes naming what the caller lacks."""
        assert self.route.scopes is not None, f"{self.route.name} declares no scopes"
        expression = render(self.route.scopes, {**self.values, **values})
        if expression is not None:
            require(self.caller, expression)
        self.authorized = True

    def query(self, name: str) -> str | None:
        """The query parameter ``name``, which the route must declare, or None."""
        if name not in self.route.query:
            raise RuntimeError(f"{self.route.name} reads query parameter `{name}` it does "
                               "not declare")
        return self.request.query.get(name)

    def limit(self) -> int | None:
        """The ``limit`` query parameter: 1-1000, or None if absent."""
        raw = self.query("limit")
        if raw is None:
            return None
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 1000:
            raise errors.InputError(f"query parameter `limit` is {raw!r}; use 1-1000")
        return int(raw)

    def page(self, default: int = LIST_PAGE) -> int:
        """The page size of a listing that reads each entry: ``limit`` or ``default``, and
        at most ANONYMOUS_PAGE for an anonymous caller."""
        size = self.limit() or default
        return size if self.caller.client_id else min(size, ANONYMOUS_PAGE)

    @property
    def continuation(self) -> str | None:
        return self.query("continuationToken")


async def _check_size(request: web.Request, r: Route) -> None:
    """TooLarge if the body is longer than the route allows: from Content-Length when
    there is one, else once read (the application's limit bounds that read)."""
    assert r.max_body is not None
    size = request.content_length
    if size is None:
        size = len(await read_body(request))
    if size > r.max_body:
        raise errors.TooLarge(f"{r.what} is {size} bytes; {r.name} takes at most "
                              f"{r.max_body // 1024} KiB")


async def _read_body(request: web.Request, schema: str, what: str) -> dict[str, Any]:
    raw = await read_body(request)
    if not raw.strip():
        body: Any = {}
    else:
        try:
            body = jsontext.loads(raw)
        except ValueError as e:
            raise errors.InvalidJson(f"the request body is not JSON azqueue accepts: {e}") from None
    request[PAYLOAD_KEY] = body
    validation.validate(schema, body, what)
    assert isinstance(body, dict)
    return body


# -- dispatch -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Match:
    """What the route table makes of one request: the route it goes to (None if none),
    that route's raw path parameters, and the methods of the routes that have the path
    but not the method. ``target`` is the method and raw path it was matched for."""

    target: tuple[str, str]
    route: Route | None
    params: dict[str, str]
    allowed: list[str]


MATCH_KEY = web.RequestKey("match", Match)


class Router:
    """The API's aiohttp handler: each request goes to the route of ``table`` that matches
    its method and raw path (404 if none has the path, 405 if none has the method). The
    table is read at each request; a route declared twice is refused when it is built.

    A request is matched once: the storage budget's middleware asks ``long_polls``
    before the handler runs, and the handler serves the match it kept on the request."""

    def __init__(self, table: list[Route]) -> None:
        for kind, keys in (("name", [r.name for r in table]),
                           ("method and path", [f"{r.method} {r.path}" for r in table])):
            twice = sorted({k for k in keys if keys.count(k) > 1})
            if twice:
                raise ValueError(f"routes declared twice (same {kind}): {', '.join(twice)}")
        self.table = table

    def match(self, request: web.Request) -> Match:
        """The match of ``request``: the one kept on it if it was matched already (and is
        still the request it was matched for: a clone with another path keeps its
        original's state), else the table's, kept."""
        target = (request.method, request.raw_path.split("?", 1)[0])
        if MATCH_KEY in request and request[MATCH_KEY].target == target:
            return request[MATCH_KEY]
        request[MATCH_KEY] = found = self._match(*target)
        return found

    def _match(self, method: str, path: str) -> Match:
        allowed = []
        for r in self.table:
            m = r.pattern.match(path)
            if m is None:
                continue
            if r.method != method and not (r.method == "GET" and method == "HEAD"):
                allowed.append(r.method)
                continue
            return Match((method, path), r, {k: unquote(v) for k, v in m.groupdict().items()},
                         allowed)
        return Match((method, path), None, {}, allowed)

    def long_polls(self, request: web.Request) -> bool:
        """Whether the route ``request`` goes to long-polls (False if none)."""
        r = self.match(request).route
        return r is not None and r.long_poll

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        found = self.match(request)
        if found.route is not None:
            return await _call(request, found.route, found.params)
        method, path = found.target
        if found.allowed:
            raise errors.MethodNotAllowed(f"{method} is not allowed on {path}; use "
                                          f"{', '.join(found.allowed)}")
        raise errors.NotFound(f"no such API endpoint: {method} {path}")


async def _call(request: web.Request, r: Route, params: dict[str, str]) -> web.StreamResponse:
    """Authenticate, convert the parameters, read the body, check the scopes the path
    determines, and run the handler; its result is the JSON answer."""
    request[PARAMS_KEY] = params
    request[ENDPOINT_KEY] = r.name
    if r.max_body is not None:
        await _check_size(request, r)
    caller = request[CALLER_KEY] = request.app[AUTH_KEY].authenticate(
        method=request.method, target=request.raw_path, host=request.host,
        content_type=request.headers.get("Content-Type", ""), body=await read_body(request),
        authorization=request.headers.get("Authorization"), now=timeutil.utcnow())
    request[CLIENT_KEY] = caller.client_id or "anonymous"
    values = {name: PARAMETERS[name].convert(name, raw) for name, raw in params.items()}
    body = await _read_body(request, r.body, r.what) if r.body else {}
    call = Call(request, r, caller, values, body)
    if r.scopes is not None:
        try:
            call.authorize()
        except Unresolved:
            pass  # the handler fills in the rest
    result = await r.handler(call, **{PARAMETERS[name].keyword: value
                                      for name, value in values.items()}, **r.fixed)
    if r.scopes is not None and not call.authorized:
        raise RuntimeError(f"{r.name} declares scopes its handler never checked")
    if isinstance(result, web.StreamResponse):
        return result
    return web.json_response(result)
