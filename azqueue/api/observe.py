"""What each API request leaves behind for the operator: one log line and its metrics;
and ``GET /metrics``, Prometheus' view of the process (``azqueue.metrics``).

A scrape costs little, and the same whatever came before (``Scrapes``): it makes no
storage request (the sampled gauges are refreshed in the background, while scrapes
come), and what it writes is bounded (``azqueue.metrics`` keeps no more than a bounded
number of series per task queue, of the task queues seen lately). With
``AZQUEUE_METRICS_TOKEN`` it answers only a caller that sends the token as a bearer token
(``Authorization: Bearer <token>``), as Prometheus' ``authorization`` setting does.

The log line (logger ``azqueue.access``, INFO) names the method, the path, the endpoint
(the Taskcluster method name, ``-`` for paths that are none), the status, the time taken
and the caller's clientId; with JSON lines on (``AZQUEUE_LOG_FORMAT=json``) each of these
is also a field of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from azqueue import metrics
from azqueue.api.middleware import Handler
from azqueue.service.wiring import Services

log = logging.getLogger("azqueue.access")
_log = logging.getLogger(__name__)

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


# The sampler looks for task queues not sampled yet this often while scraped...
SAMPLE_TICK = 5.0
# ... and stops sampling once no scrape came for this long.
SCRAPED_LATELY = 3 * metrics.SAMPLE_INTERVAL


class Scrapes:
    """``GET /metrics`` (``handler``) and the background sampling of its gauges (``run``).

    ``services()``: the services whose counts and outbox are sampled (None until they are
    open); ``token``: the bearer token a scrape must send (empty: none); ``idle``: the
    seconds after which the metrics drop a task queue nobody used
    (``metrics.forget_idle``)."""

    def __init__(self, services: Callable[[], Services | None], token: str,
                 idle: float) -> None:
        self._services = services
        self._token = token.encode()
        self._idle = idle
        self._scraped_at = float("-inf")
        self._scraped = asyncio.Event()

    async def handler(self, request: web.Request) -> web.StreamResponse:
        if self._token and not self._authorized(request.headers.get("Authorization", "")):
            return web.json_response({
                "code": "AuthenticationFailed",
                "message": "GET /metrics needs this deployment's metrics token: send "
                           "`Authorization: Bearer <AZQUEUE_METRICS_TOKEN>` (Prometheus: "
                           "the scrape config's `authorization` credentials)"},
                status=401, headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
        self._scraped_at = time.monotonic()
        self._scraped.set()
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _authorized(self, authorization: str) -> bool:
        scheme, _, credentials = authorization.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            credentials.strip().encode(), self._token)

    async def run(self) -> None:
        """Until cancelled: drop what the metrics keep of idle task queues, and sample the
        gauges while scrapes come (the first at once after a quiet while); a failed
        sample leaves the last figures."""
        while True:
            metrics.forget_idle(self._idle)
            opened = self._services()
            if opened is not None and time.monotonic() - self._scraped_at < SCRAPED_LATELY:
                outbox = opened.outbox
                try:
                    await metrics.PENDING.sample(
                        opened.counts.pending_tips, outbox.pending if outbox.on else None,
                        opened.counts.claimed)
                except Exception:  # noqa: BLE001 - the next tick samples again
                    _log.warning("could not sample the metrics' gauges", exc_info=True)
            self._scraped.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._scraped.wait(), min(SAMPLE_TICK, self._idle))
