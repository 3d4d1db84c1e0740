"""Every success answer a test gets from the API, checked against Taskcluster's schema of
the method that gave it: the ``output`` its route declares (``azqueue.api.routing``),
vendored unedited in ``tests/compat/schemas/``.

The test servers (``tests/conftest.py``) put a ``ReplyCheck`` inside the application's
own middlewares: it reads the JSON body of each answer below 400 (getArtifact's 303
carries its output too) of a route that declares an output, and keeps where it departs
from the schema (``extension`` names the answers that are azqueue's, by design). The
test that got such an answer fails, naming the method and the field; one that arrives
after the test's body (a worker's last call while its server stops) fails the test's
teardown. Nothing of this runs when azqueue serves for real.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from azqueue.api.app import ROUTES
from azqueue.api.observe import ENDPOINT_KEY
from tests.compat import reference

# What a route declares as its output, by the name of its method.
OUTPUTS = {r.name: r.output for r in ROUTES}
# How many departures a failure lists (the same answer may be given many times).
SHOWN = 5


def extension(method: str, body: Any) -> bool:
    """Whether ``body`` is one of azqueue's documented extensions of ``method``, which
    Taskcluster's schema does not describe: createArtifact's answer for storageType
    ``blob``, the direct-to-Blob upload (docs/workers/artifacts.md)."""
    return method == "createArtifact" and isinstance(body, dict) and \
        body.get("storageType") == "blob"


@dataclass
class ReplyCheck:
    """The departures of the answers seen since the last ``take()``."""

    departures: list[str] = field(default_factory=list)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        method = request.get(ENDPOINT_KEY)
        output = OUTPUTS.get(method or "")
        if (method is not None and output is not None and response.status < 400
                and isinstance(response, web.Response)
                and response.content_type == "application/json"):
            assert isinstance(response.body, bytes)
            schema = output.removesuffix(".json")
            body = json.loads(response.body)
            found = [] if extension(method, body) else reference.problems(schema, body)
            for problem in found:
                self.departures.append(
                    f"{method} ({request.method} {request.path}) answered {response.status} "
                    f"not as Taskcluster's {schema} says: {problem}")
        return response

    def install(self, app: web.Application) -> web.Application:
        """``app``, with the check after its own middlewares (nearest the handlers)."""
        app.middlewares.append(self.middleware)
        return app

    def take(self) -> str:
        """What departed since the last call, as a failure message ("" if nothing)."""
        found = list(dict.fromkeys(self.departures))
        self.departures.clear()
        if not found:
            return ""
        more = f" (and {len(found) - SHOWN} more)" if len(found) > SHOWN else ""
        return ("answers not valid against Taskcluster's output schema of their method: "
                + "; ".join(found[:SHOWN]) + more)
