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


# A storage failure is no answer of its own (``errors``): here it becomes one.
STORAGE_UNAVAILABLE = (503, "StorageUnavailable")
STORAGE_FAILED = (500, "InternalServerError")
STORAGE_RETRY_AFTER = 2  # seconds


def _incident(request: web.Request, status: int, code: str, e: errors.AzqueueError
              ) -> web.Response:
    """A failure of ours: logged with its cause under a new incident id, which the answer
    names."""
    incident = uuid.uuid4().hex
    log.error("incident %s: %s %s: %s", incident, request.method, request.path, e.message,
              exc_info=e.__cause__ or e)
    return error_response(request, status, code, f"{e.message} (incident {incident})")


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except errors.StorageUnavailable as e:
        # An outage, not a bug: one line, no incident; the client tries again.
        status, code = STORAGE_UNAVAILABLE
        log.warning("%s %s answered %d: %s", request.method, request.path, status, e.message)
        response = error_response(request, status, code,
                                  f"{e.message}; retry after {STORAGE_RETRY_AFTER}s")
        response.headers["Retry-After"] = str(STORAGE_RETRY_AFTER)
        return response
    except errors.StorageError as e:
        return _incident(request, *STORAGE_FAILED, e)
    except errors.QueueError as e:
        if e.status >= 500 and not isinstance(e, (errors.NotConfigured, errors.Busy)):
            # NotConfigured is the deployment's choice, announced at start-up, and Busy a
            # bound it sets: no incident.
            return _incident(request, e.status, e.code, e)
        response = error_response(request, e.status, e.code, e.message)
        if isinstance(e, errors.Busy):
            response.headers["Retry-After"] = str(e.RETRY_AFTER)
        if isinstance(e, errors.SlowRequest):
            response.force_close()  # the rest of its body is not waited for
        return response
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
