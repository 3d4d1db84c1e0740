"""The endpoints about the service itself: ping, the heartbeats, version, metrics, and
our JSON schemas. They need no scopes."""

from __future__ import annotations

import time
from typing import Any

from azqueue import __version__, errors
from azqueue.api import validation
from azqueue.api.routing import STARTED_KEY, Call, Route, Routes

routes = Routes()


@routes.declare("GET", "/ping", "ping")
async def ping(call: Call) -> Any:
    return {"alive": True, "uptime": time.monotonic() - call.request.app[STARTED_KEY]}


@routes.declare("GET", "/__lbheartbeat__", "lbheartbeat")
async def lbheartbeat(call: Call) -> Any:
    return {}


@routes.declare("GET", "/__heartbeat__", "heartbeat")
async def heartbeat(call: Call) -> Any:
    await call.services.health.check_storage()
    return {}


@routes.declare("GET", "/__version__", "version")
async def version(call: Call) -> Any:
    return {"source": "https://github.com/azqueue/azqueue", "version": __version__,
            "commit": "", "build": ""}


@routes.declare("GET", "/__metrics__", "metrics")
async def metrics(call: Call) -> Any:
    return {"storageRequests": call.services.health.storage_requests()}


@routes.declare("GET", "/schemas/queue/v1/<schema>", "schema")
async def get_schema(call: Call, schema: str) -> Any:
    if schema not in validation.schema_names():
        raise errors.NotFound(f"no schema {schema!r}; there are: "
                              f"{', '.join(validation.schema_names())}")
    return validation.schema(schema)


ROUTES: list[Route] = routes.table
