"""The endpoints about the service itself: ping, the heartbeats, version, metrics, and
our JSON schemas. They need no scopes."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from azqueue import errors, release
from azqueue.api import validation
from azqueue.api.routing import STARTED_KEY, Call, Route, Routes

routes = Routes("Service")


@routes.declare("GET", "/ping", "ping",
                title="Ping the server",
                description="answers at once, whatever storage does")
async def ping(call: Call) -> Any:
    return {"alive": True, "uptime": time.monotonic() - call.request.app[STARTED_KEY]}


@routes.declare("GET", "/__lbheartbeat__", "lbheartbeat",
                title="Load balancer heartbeat",
                description="answers at once, whatever storage does")
async def lbheartbeat(call: Call) -> Any:
    return {}


@routes.declare("GET", "/__heartbeat__", "heartbeat",
                title="Heartbeat",
                description=("checks that storage answers and, with events on, that the "
                             "broker is reachable: 200, or 500 naming what failed"))
async def heartbeat(call: Call) -> Any:
    checks = await call.services.health.checks()
    if all(state in ("ok", "off") for state in checks.values()):
        return {}
    return web.json_response({"status": "error", "checks": checks}, status=500)


@routes.declare("GET", "/__version__", "version",
                title="Version",
                description="the release this replica runs")
async def version(call: Call) -> Any:
    return release.current().as_json()


@routes.declare("GET", "/__metrics__", "metrics",
                title="Metrics",
                description=("the Azure Storage requests made by this process, by service and "
                             "method, as JSON (the queue's metrics for Prometheus are at "
                             "`/metrics`); with `AZQUEUE_METRICS_TOKEN` set, to signed-in "
                             "callers only"))
async def metrics(call: Call) -> Any:
    health = call.services.health
    if health.private_metrics and call.caller.client_id is None:
        raise errors.AuthenticationFailed(
            "this deployment keeps its metrics from anonymous callers "
            "(AZQUEUE_METRICS_TOKEN is set): sign the request with Taskcluster credentials")
    return {"storageRequests": health.storage_requests()}


@routes.declare("GET", "/schemas/queue/v1/<schema>", "schema",
                title="JSON schema",
                description="the JSON schemas request bodies are validated against")
async def get_schema(call: Call, schema: str) -> Any:
    if schema not in validation.schema_names():
        raise errors.NotFound(f"no schema {schema!r}; there are: "
                              f"{', '.join(validation.schema_names())}")
    return validation.schema(schema)


ROUTES: list[Route] = routes.table
