"""The aiohttp application and the lifecycles it owns.

The dashboard's recent changes are made with the app and handed to the services as an
observer of the changes they store (``service.wiring``), not reached through a global.
Cleanup contexts run in registration order and are torn down in reverse: the dashboard's
recent changes first (listening to the task exchanges before any change is made), the
storage account and the services on it (``service.wiring``, which also sets the Blob
service's CORS rule for the dashboard's origins), the metrics' background sampling, then
the background resolvers.

The API's route table is the endpoint modules' tables, put together here (``ROUTES``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from azqueue.api.endpoints import artifacts, claims, counts, groups, meta, tasks, workers
from azqueue.api.middleware import budget_middleware, error_middleware
from azqueue.api import dashboard
from azqueue.api.dashboard.recent import RecentChanges
from azqueue.api.auth import Authenticator
from azqueue.api.connections import BODY_TIMEOUT_KEY
from azqueue.api.observe import METRICS_PATH, Scrapes, observe_middleware
from azqueue.api.routing import API, AUTH_KEY, SERVICES_KEY, STARTED_KEY, Route, Router
from azqueue.background import resolvers
from azqueue.config import ConfigError, Settings
from azqueue.events.publisher import EventSink
from azqueue.service.wiring import EVENTS_OFF, allow_browsers, open_services

SETTINGS_KEY = web.AppKey("settings", Settings)
SCRAPES_KEY = web.AppKey("scrapes", Scrapes)
MAX_BODY = 2 * 1024 * 1024
DOCKERFLOW_PATHS = ("/__version__", "/__heartbeat__", "/__lbheartbeat__")
# Every endpoint of the API (a request goes to the first route that has its method and path).
ROUTES: list[Route] = [*meta.ROUTES, *tasks.ROUTES, *groups.ROUTES, *claims.ROUTES,
                       *artifacts.ROUTES, *workers.ROUTES, *counts.ROUTES]


def _under_api(router: Router) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Dockerflow's endpoints at the root, as load balancers and platforms look for them:
    the API's own, answered as under ``/api/queue/v1``."""
    async def handle(request: web.Request) -> web.StreamResponse:
        return await router(request.clone(rel_url=API + request.raw_path))
    return handle


async def _recent_ctx(app: web.Application) -> AsyncIterator[None]:
    """With events on, the broker keeps the task events from the start for the dashboard
    (before this replica changes anything); its hearing of them ends with the app."""
    await app[dashboard.HEARING_KEY].keep()
    yield
    await app[dashboard.HEARING_KEY].close()


def _service_ctx(events: EventSink | None, events_off: str | None
                 ) -> Callable[[web.Application], AsyncIterator[None]]:
    async def services_ctx(app: web.Application) -> AsyncIterator[None]:
        async with open_services(app[SETTINGS_KEY], events, events_off,
                                 observers=(app[dashboard.RECENT_KEY].record,)) as services:
            await allow_browsers(app[SETTINGS_KEY], services)
            app[SERVICES_KEY] = services
            yield
    return services_ctx


async def _sampler_ctx(app: web.Application) -> AsyncIterator[None]:
    """The metrics' background sampling (``observe.Scrapes.run``) runs with the services."""
    sampler = asyncio.create_task(app[SCRAPES_KEY].run(), name="metrics sampler")
    yield
    sampler.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampler


async def _metrics_listener_ctx(app: web.Application) -> AsyncIterator[None]:
    """``GET /metrics`` on ``metrics_host:metrics_port`` (AZQUEUE_METRICS_PORT), apart
    from the API, for a scraper the operator lets reach it."""
    settings = app[SETTINGS_KEY]
    metrics_app = web.Application()
    metrics_app.router.add_get(METRICS_PATH, app[SCRAPES_KEY].handler)
    runner = web.AppRunner(metrics_app, access_log=None)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, settings.metrics_host, settings.metrics_port).start()
        except OSError as e:
            raise ConfigError(f"cannot listen on {settings.metrics_host}:{settings.metrics_port} "
                              f"for /metrics: {e.strerror or e}; check AZQUEUE_METRICS_HOST and "
                              "AZQUEUE_METRICS_PORT") from None
        yield
    finally:
        await runner.cleanup()


async def _resolvers_ctx(app: web.Application) -> AsyncIterator[None]:
    async with resolvers.running(app[SERVICES_KEY], app[SETTINGS_KEY]):
        yield


class MalformedRequests(logging.Filter):
    """aiohttp logs a full traceback at ERROR for every malformed HTTP request it refuses
    (a line too long, a bad header): one line at WARNING says as much, and a client
    cannot flood the log with tracebacks."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = "refused a malformed HTTP request from %s: %s", (
                peer, getattr(error, "message", "") or type(error).__name__)
            record.exc_info, record.exc_text = None, None
        return True


def _quiet_malformed_requests() -> None:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedRequests) for f in server_log.filters):
        server_log.addFilter(MalformedRequests())


def create_app(settings: Settings, *, events: EventSink | None = None,
               events_off: str | None = EVENTS_OFF) -> web.Application:
    """The API on ``settings``; ``events`` and ``events_off`` as ``open_services`` takes
    them (a sink other than the broker, what to log when events are off)."""
    _quiet_malformed_requests()
    router = Router(ROUTES)
    app = web.Application(middlewares=[observe_middleware, error_middleware, budget_middleware(
        settings.request_budget, settings.claim_work_wait, router.long_polls)],
        client_max_size=MAX_BODY)
    app[SETTINGS_KEY] = settings
    app[BODY_TIMEOUT_KEY] = settings.body_timeout
    app[STARTED_KEY] = time.monotonic()
    app[AUTH_KEY] = Authenticator(settings)
    app[dashboard.RECENT_KEY] = recent = RecentChanges()
    app[dashboard.HEARING_KEY] = dashboard.Hearing(recent, settings.amqp_url,
                                                   settings.exchange_prefix)
    app.cleanup_ctx.append(_recent_ctx)
    app.cleanup_ctx.append(_service_ctx(events, events_off))
    app[SCRAPES_KEY] = Scrapes(lambda: app.get(SERVICES_KEY), settings.metrics_token,
                               settings.task_queue_idle_expiry)
    app.cleanup_ctx.append(_sampler_ctx)
    if settings.metrics_port:
        app.cleanup_ctx.append(_metrics_listener_ctx)
    else:
        app.router.add_get(METRICS_PATH, app[SCRAPES_KEY].handler)
    if settings.run_resolvers:
        app.cleanup_ctx.append(_resolvers_ctx)
    dashboard.add_routes(app.router)
    for path in DOCKERFLOW_PATHS:
        app.router.add_get(path, _under_api(router))
    app.router.add_route("*", artifacts.UPLOAD_ROUTE, artifacts.receive_upload)
    # Every path, newlines (%0A) included: `.` would leave those to aiohttp's plain-text 404.
    # aiohttp takes a coroutine function as a handler, not a callable object.
    app.router.add_route("*", r"/{tail:[\s\S]*}", router.__call__)
    return app
