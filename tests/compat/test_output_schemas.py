"""Each route declares the output schema Taskcluster's Queue reference declares for its
method (the official client's ``funcinfo``), and that schema is vendored, so that every
answer the tests get is checked (``tests/replies.py``). A route without one is listed
here with the reason."""

from __future__ import annotations

from typing import Any

import taskcluster
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from azqueue.api.app import ROUTES
from azqueue.api.observe import ENDPOINT_KEY
from tests.compat.reference import SCHEMAS
from tests.replies import ReplyCheck

# The routes that answer JSON no Taskcluster output schema describes, and why.
UNCHECKED = {
    "ping": "Taskcluster's reference declares no output for it",
    "lbheartbeat": "Taskcluster's reference declares no output for it",
    "heartbeat": "Taskcluster's reference declares no output for it",
    "version": "Taskcluster's reference declares no output for it",
    "finishArtifact": "Taskcluster's reference declares no output for it",
    "pollTaskUrls": "azqueue's: the Queue API has no such method any more; its leftover "
                    "poll-task-urls-response wants https URLs (Azurite's are http) and "
                    "has no `pending` (the answer to ?pending=true)",
    "metrics": "azqueue's: its own count of storage requests",
    "schema": "azqueue's: serves azqueue's JSON schemas, each of its own shape",
}


def _taskcluster_output(name: str) -> str | None:
    output: str | None = taskcluster.Queue.funcinfo[name].get("output")
    return output.removeprefix("v1/").removesuffix("#") if output else None


def test_each_route_declares_the_output_taskcluster_declares_for_its_method() -> None:
    for r in ROUTES:
        if r.name in taskcluster.Queue.funcinfo:
            assert r.output == _taskcluster_output(r.name), r.name
        else:
            assert r.name in UNCHECKED, f"{r.name} is azqueue's: say in UNCHECKED why"


def test_every_route_answering_json_is_checked_or_listed_with_its_reason() -> None:
    assert sorted(r.name for r in ROUTES if r.output is None) == sorted(UNCHECKED)


def test_every_declared_output_is_vendored() -> None:
    missing = sorted({r.output for r in ROUTES
                      if r.output is not None and not (SCHEMAS / r.output).is_file()})
    assert missing == [], f"vendor these from Taskcluster's references.json: {missing}"


async def _served(body: Any, status: int) -> str:
    """What a ReplyCheck says of ``body`` answered with ``status`` by the status method."""
    async def answer(request: web.Request) -> web.Response:
        request[ENDPOINT_KEY] = "status"
        return web.json_response(body, status=status)

    check = ReplyCheck()
    app = check.install(web.Application())
    app.router.add_get("/api/queue/v1/task/{taskId}/status", answer)
    async with TestClient(TestServer(app)) as client:
        async with client.get("/api/queue/v1/task/nope/status") as r:
            assert r.status == status
    return check.take()


async def test_an_answer_that_departs_is_named_with_its_method_and_field() -> None:
    found = await _served({"state": "pending"}, 200)
    assert found.startswith("answers not valid against Taskcluster's output schema of their "
                            "method: status (GET /api/queue/v1/task/nope/status) answered 200 "
                            "not as Taskcluster's task-status-response says: ")
    assert "says: body: 'status' is a required property" in found
    assert "says: body: Additional properties are not allowed ('state' was unexpected)" in found


async def test_errors_are_not_checked_against_the_output_schema() -> None:
    assert await _served({"code": "ResourceNotFound"}, 404) == ""
