"""The web dashboard: static files served at ``/`` that read the queue's own API in the
browser, anonymously (the server's anonymous scopes) or, once the operator signs in, with
Hawk-signed requests and the scopes of the client they signed in as; and
``GET /dashboard/recent``, which also names the release of the replica that answers (the
page lists those it met lately, so a rollout's two releases show), the changes heard of
lately (``recent``: this process's, and
with events on the last hour of every replica's, read from the broker's stream of task
events once the dashboard is watched, ``Hearing``), which the API has no listing of.

The page carries the model's names it shows (``MODEL``: the priorities, the task states,
those that are resolved) as data, in a ``<script type="application/json">`` block the
server writes into it: the browser never runs it, so the CSP below allows it, and
``app.js`` reads it instead of stating the lists again.

Requests for the page and its files are counted as the endpoint ``dashboard``, those for
the recent changes as ``dashboardRecent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from importlib import resources

from aiohttp import web

from azqueue import errors, release
from azqueue.api.dashboard.recent import TASK_EXCHANGES, Entry, RecentChanges
from azqueue.api.auth import require
from azqueue.api.observe import CLIENT_KEY, ENDPOINT_KEY
from azqueue.api.routing import AUTH_KEY
from azqueue.events import history
from azqueue.events.listener import Listener
from azqueue.model import scopes, timeutil
from azqueue.model.identifiers import TASK_QUEUE_ID
from azqueue.model.priority import ORDER
from azqueue.model.task import RESOLVED_STATES, TaskState

log = logging.getLogger(__name__)

FILES = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
# Scripts only from here (nothing the API returns can run), data from anywhere (artifacts
# redirect to blob storage), never framed.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src *; img-src 'self' data:; "
                               "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
RECENT_KEY = web.AppKey("recent", RecentChanges)
# How long a replica goes on hearing every replica's changes after the dashboard last
# asked it for its recent lists (an open page asks every 3 s).
WATCH_IDLE = 300.0
# How long the first ask waits for the last hour to be read (the lists fill on after).
CATCH_UP = 10.0
# What index.html's data block holds, highest priority first.
MODEL = {"priorities": [p.value for p in ORDER], "states": [s.value for s in TaskState],
         "resolved": [s.value for s in RESOLVED_STATES]}
MODEL_SLOT = b"{{model}}"


def _read(name: str) -> bytes:
    content = (resources.files(__package__) / name).read_bytes()
    if name == "index.html":  # `<` escaped: nothing in the block can end it
        content = content.replace(MODEL_SLOT, json.dumps(MODEL).replace("<", "\\u003c").encode())
    return content


async def recent(request: web.Request) -> web.Response:
    """What this process changed lately, to a caller that may list the task queues
    (``queue:list-task-queues``; with ``?taskQueueId=``, read that one:
    ``queue:get-task-queue:<taskQueueId>``): each task only if the caller may read its
    status (``queue:status:<taskId>``), its name only if it may read its definition."""
    request[ENDPOINT_KEY] = "dashboardRecent"
    caller = request.app[AUTH_KEY].authenticate(
        method=request.method, target=request.raw_path, host=request.host,
        content_type=request.headers.get("Content-Type", ""), body=b"",
        authorization=request.headers.get("Authorization"), now=timeutil.utcnow())
    request[CLIENT_KEY] = caller.client_id or "anonymous"
    task_queue_id = request.query.get("taskQueueId")
    if task_queue_id is not None and not TASK_QUEUE_ID.match(task_queue_id):
        raise errors.InputError(f"query parameter `taskQueueId` is {task_queue_id!r}; it must "
                                "be <provisionerId>/<workerType>")
    # Which task queues had changes, and their resolutions per minute, are what
    # listTaskQueues and getTaskQueue tell: the same scopes.
    require(caller, "queue:list-task-queues" if task_queue_id is None
            else f"queue:get-task-queue:{task_queue_id}")

    def visible(entry: Entry) -> bool:
        return scopes.satisfies(caller.scopes, f"queue:status:{entry['taskId']}")

    await request.app[HEARING_KEY].watched()
    changes = request.app[RECENT_KEY]
    view = changes.view(task_queue_id, visible)
    view["tasks"], view["failures"] = (
        [_named(caller.scopes, e) for e in view[kind]] for kind in ("tasks", "failures"))
    running = release.current()
    return web.json_response({"note": changes.note, **view, "release": {
        "version": running.version, "commit": running.commit}},
                             headers={"Cache-Control": "no-store"})


def _named(held: tuple[str, ...], entry: Entry) -> Entry:
    if entry["name"] and not scopes.satisfies(held, f"queue:get-task:{entry['taskId']}"):
        return {**entry, "name": ""}
    return entry


class Hearing:
    """Every replica's changes in ``changes``, with events on (``amqp_url``), while the
    dashboard is watched: from the first ``GET /dashboard/recent`` (``watched``) until
    ``idle`` seconds pass without another, this process reads the broker's stream of the
    task events (``events.history``, which every replica declares as it starts, ``keep``):
    the last hour first, which the first ask waits for (up to ``CATCH_UP``), then each
    event as it comes. Hearing costs the replica, and the broker, a delivered message per
    task event of the whole deployment, its own included (four per lifecycle), and the
    hour's once per watch: unwatched, nobody pays that, and the lists hold the changes
    this replica stores itself (which reach ``changes.record`` as an observer of its
    services, ``api.app``)."""

    def __init__(self, changes: RecentChanges, amqp_url: str | None, exchange_prefix: str,
                 idle: float = WATCH_IDLE) -> None:
        self._changes = changes
        self._url = amqp_url or None  # unset or empty: events are off
        self._prefix = exchange_prefix
        self._idle = idle
        self._listener: Listener | None = None
        self._last = 0.0
        self._unwatched: asyncio.Task[None] | None = None
        changes.listening = self.listening

    def listening(self) -> bool:
        return self._listener is not None and self._listener.bound

    async def keep(self) -> None:
        """With events on, have the broker keep the task events from now on (as a
        replica starts: ``events.history.keep``)."""
        if self._url is not None:
            await history.keep(self._url, self._prefix, TASK_EXCHANGES)

    async def watched(self) -> None:
        """The dashboard asked: hear the task exchanges from now (once bound: the first
        call waits for that, or for the broker to refuse) until ``idle`` seconds after
        the last call."""
        self._last = time.monotonic()
        if self._url is None or self._listener is not None:
            return
        listener = self._listener = Listener(self._url, self._prefix, TASK_EXCHANGES,
                                             self._changes.hear, history=True)
        self._unwatched = asyncio.create_task(self._close_when_unwatched(listener))
        try:
            await listener.start()
        except BaseException:  # the next call tries again
            self._listener = None
            self._unwatched.cancel()
            await listener.close()
            raise
        if listener.bound and not await listener.caught_up(CATCH_UP):
            log.warning("the dashboard's last hour of task events was not read within %g s; "
                        "its lists fill on as it is", CATCH_UP)

    async def _close_when_unwatched(self, listener: Listener) -> None:
        await listener.caught_up(CATCH_UP)  # idle counts from the first answer on
        self._last = max(self._last, time.monotonic())
        while (left := self._last + self._idle - time.monotonic()) > 0:
            await asyncio.sleep(left)
        if self._listener is listener:
            self._listener = None
        await listener.close()

    async def close(self) -> None:
        if self._unwatched is not None:
            self._unwatched.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._unwatched
        if self._listener is not None:
            await self._listener.close()
            self._listener = None


HEARING_KEY = web.AppKey("hearing", Hearing)


def add_routes(router: web.UrlDispatcher) -> None:
    """``GET /`` (the page), ``GET /dashboard/recent`` and ``GET /dashboard/<file>``."""
    contents = {name: _read(name) for name in FILES}

    def serve(request: web.Request, name: str) -> web.Response:
        request[ENDPOINT_KEY] = "dashboard"
        return web.Response(body=contents[name], content_type=FILES[name], charset="utf-8",
                            headers=HEADERS)

    async def page(request: web.Request) -> web.Response:
        return serve(request, "index.html")

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in FILES:
            request[ENDPOINT_KEY] = "dashboard"
            raise web.HTTPNotFound(text=f"no dashboard file {name!r}")
        return serve(request, name)

    router.add_get("/", page)
    router.add_get("/dashboard/recent", recent)
    router.add_get("/dashboard/{name}", asset)
