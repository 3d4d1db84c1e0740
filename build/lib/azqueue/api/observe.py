"""What each API request leaves behind for the operator: one log line and its metrics;
and ``GET /metrics``, Prometheus' view of the process (``azqueue.metrics``).

The log line (logger ``azqueue.access``, INFO) names the method, the path, the endpoint
(the Taskcluster method name, ``-`` for paths that are none), the status, the time taken
and the caller's clientId; with JSON lines on (``AZQUEUE_LOG_FORMAT=json``) each of these
is also a field of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from azqueue import metrics
from azqueue.api.middleware import Handler
from azqueue.service.wiring import Services

log = logging.getLogger("azqueue.access")

ENDPOINT_KEY = web.RequestKey("endpoint", str)
CLIENT_KEY = web.RequestKey("client", str)
METRICS_PATH = "/metrics"


@web.middleware
async def observe_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    start = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as e:
        status = e.status
        raise
    finally:
        seconds = time.perf_counter() - start
        endpoint = request.get(ENDPOINT_KEY, "-")
        if request.path != METRICS_PATH:
            metrics.count_request(endpoint if endpoint != "-" else "unknown", status, seconds)
        client = request.get(CLIENT_KEY, "-")
        log.info("%s %s %d %.1fms %s client=%s", request.method, request.path, status,
                 seconds * 1000, endpoint, client,
                 extra={"fields": {"method": request.method, "path": request.path,
                                   "endpoint": endpoint, "status": status,
                                   "ms": round(seconds * 1000, 1), "clientId": client}})


def serve_metrics(services: Callable[[], Services | None]) -> Handler:
    """The ``GET /metrics`` handler: Prometheus' text format. Sampled gauges are refreshed
    first when they are old (``metrics.SAMPLE_INTERVAL``), from the counts (pending tips,
    claimed runs) and the outbox of ``services()`` (None until they are open); a failed
    sample leaves the last figures."""

    async def handler(request: web.Request) -> web.StreamResponse:
        opened = services()
        if opened is not None:
            outbox = opened.outbox
            await metrics.PENDING.sample(opened.counts.pending_tips,
                                         outbox.pending if outbox is not None else None,
                                         opened.counts.claimed)
        return web.Response(body=generate_latest(),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    return handler
