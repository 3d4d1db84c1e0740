"""The aiohttp application and the lifecycles it owns.

Cleanup contexts run in registration order and are torn down in reverse: the storage
account first, then the queue service on it, then the background resolvers.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from aiohttp import web

from azqueue.api.middleware import error_middleware
from azqueue.api.auth import Authenticator
from azqueue.api.routes import ARTIFACTS_KEY, AUTH_KEY, SERVICE_KEY, STARTED_KEY, dispatch
from azqueue.background import resolvers
from azqueue.config import Settings
from azqueue.service.wiring import Services, open_services

SETTINGS_KEY = web.AppKey("settings", Settings)
SERVICES_KEY = web.AppKey("services", Services)
MAX_BODY = 2 * 1024 * 1024


async def _service_ctx(app: web.Application) -> AsyncIterator[None]:
    async with open_services(app[SETTINGS_KEY]) as services:
        app[SERVICES_KEY] = services
        app[SERVICE_KEY] = services.queue
        app[ARTIFACTS_KEY] = services.artifacts
        yield


async def _resolvers_ctx(app: web.Application) -> AsyncIterator[None]:
    async with resolvers.running(app[SERVICES_KEY], app[SETTINGS_KEY]):
        yield


def create_app(settings: Settings) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=MAX_BODY)
    app[SETTINGS_KEY] = settings
    app[STARTED_KEY] = time.monotonic()
    app[AUTH_KEY] = Authenticator(settings)
    app.cleanup_ctx.append(_service_ctx)
    if settings.run_resolvers:
        app.cleanup_ctx.append(_resolvers_ctx)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app
