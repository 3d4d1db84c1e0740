"""The aiohttp application and the lifecycles it owns.

Cleanup contexts run in registration order and are torn down in reverse: the storage
account first, then the queue service on it, then the background resolvers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from aiohttp import web

from azqueue.api.middleware import error_middleware
from azqueue.api.auth import Authenticator
from azqueue.api.routes import ARTIFACTS_KEY, AUTH_KEY, SERVICE_KEY, STARTED_KEY, dispatch
from azqueue.background import claims, deadlines, dependencies, expiry
from azqueue.background import events as events_resolver
from azqueue.config import Settings
from azqueue.events.outbox import Outbox
from azqueue.service.queue import QueueService
from azqueue.service.wiring import open_services

log = logging.getLogger(__name__)

SETTINGS_KEY = web.AppKey("settings", Settings)
OUTBOX_KEY: web.AppKey[Outbox | None] = web.AppKey("outbox")
MAX_BODY = 2 * 1024 * 1024
STOP_TIMEOUT = 10.0


async def _service_ctx(app: web.Application) -> AsyncIterator[None]:
    async with open_services(app[SETTINGS_KEY]) as services:
        app[SERVICE_KEY] = services.queue
        app[ARTIFACTS_KEY] = services.artifacts
        app[OUTBOX_KEY] = services.outbox
        yield


def _background(name: str, start: Callable[[web.Application, asyncio.Event],
                                           Coroutine[Any, Any, None] | None]
                ) -> Callable[[web.Application], AsyncIterator[None]]:
    """A background loop as a cleanup context: ``start(app, stop)`` gives the loop (or
    None: not configured), which must end soon after ``stop`` is set."""
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        stop = asyncio.Event()
        loop = start(app, stop)
        if loop is None:
            yield
            return
        task = asyncio.create_task(loop, name=name)
        log.info("%s started", name)
        yield
        stop.set()
        try:
            await asyncio.wait_for(task, STOP_TIMEOUT)
        except TimeoutError:
            log.warning("%s did not stop within %.0fs; cancelled", name, STOP_TIMEOUT)
    return ctx


def _events(app: web.Application, stop: asyncio.Event) -> Coroutine[Any, Any, None] | None:
    outbox = app[OUTBOX_KEY]
    if outbox is None:
        return None
    return events_resolver.run(outbox, app[SETTINGS_KEY].events_resolver_interval, stop)


def create_app(settings: Settings) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=MAX_BODY)
    app[SETTINGS_KEY] = settings
    app[STARTED_KEY] = time.monotonic()
    app[AUTH_KEY] = Authenticator(settings)
    app.cleanup_ctx.append(_service_ctx)
    if settings.run_resolvers:
        for name, start in (
                ("claim resolver", lambda app, stop: claims.run(
                    app[SERVICE_KEY], app[SETTINGS_KEY].claim_resolver_interval, stop)),
                ("deadline resolver", lambda app, stop: deadlines.run(
                    app[SERVICE_KEY], app[SETTINGS_KEY].deadline_resolver_interval, stop)),
                ("dependency resolver", lambda app, stop: dependencies.run(
                    app[SERVICE_KEY], app[SETTINGS_KEY].dependency_resolver_interval, stop)),
                ("expiry resolver", lambda app, stop: expiry.run(
                    app[SERVICE_KEY], app[ARTIFACTS_KEY], app[SETTINGS_KEY].expiry_interval,
                    stop)),
                ("events resolver", _events)):
            app.cleanup_ctx.append(_background(name, start))
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app
