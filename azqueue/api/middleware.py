"""Errors rendered at the boundary: ours as Taskcluster's ``{code, message, requestInfo}``,
anything unexpected as a 500 with an incident id that is also in the log; and the time
budget of each request's storage calls (``storage.retry``): when Azure Storage stays
busy or silent through it, the answer is a prompt 503 with ``Retry-After``."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from azqueue import errors
from azqueue.model import timeutil
from azqueue.storage.retry import budget

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PARAMS_KEY = web.RequestKey("params", dict)
PAYLOAD_KEY = web.RequestKey("payload", object)


def error_response(request: web.Request, status: int, code: str, message: str) -> web.Response:
    body: dict[str, Any] = {
        "code": code,
        "message": message,
        "requestInfo": {
            "method": request.method,
            "params": request.get(PARAMS_KEY, {}),
            "payload": request.get(PAYLOAD_KEY, {}),
            "time": timeutil.fmt(timeutil.utcnow()),
        },
    }
    return web.json_response(body, status=status)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except errors.StorageUnavailable as e:
        # An outage, not a bug: one line, no incident; the client tries again.
        log.warning("%s %s answered 503: %s", request.method, request.path, e.message)
        response = error_response(request, e.status, e.code,
                                  f"{e.message}; retry after {e.retry_after}s")
        response.headers["Retry-After"] = str(e.retry_after)
        return response
    except errors.QueueError as e:
        if e.status >= 500 and not isinstance(e, errors.NotConfigured):
            # NotConfigured is the deployment's choice, announced at start-up: no incident.
            incident = uuid.uuid4().hex
            log.error("incident %s: %s %s: %s", incident, request.method, request.path, e.message,
                      exc_info=e.__cause__ or e)
            return error_response(request, e.status, e.code,
                                  f"{e.message} (incident {incident})")
        return error_response(request, e.status, e.code, e.message)
    except web.HTTPRequestEntityTooLarge as e:
        return error_response(request, 413, "InputTooLarge",
                              f"the request body is too large: {e.text}")
    except web.HTTPException:
        raise
    except Exception:
        incident = uuid.uuid4().hex
        log.exception("incident %s: %s %s failed", incident, request.method, request.path)
        return error_response(request, 500, "InternalServerError",
                              f"the server failed on this request; the operators can find it in "
                              f"the log as incident {incident}")


def budget_middleware(seconds: float, long_poll: float,
                      long_polls: Callable[[web.Request], bool]) -> Any:
    """A middleware giving each request's storage calls ``seconds`` in all (a request to a
    route that long-polls, as claimWork first waits for work up to ``long_poll`` seconds,
    that much more); ``long_polls`` reads that flag from the route the request matches."""

    @web.middleware
    async def storage_budget(request: web.Request, handler: Handler) -> web.StreamResponse:
        extra = long_poll if long_polls(request) else 0.0
        with budget(seconds + extra):
            return await handler(request)

    return storage_budget
