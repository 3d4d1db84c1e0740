"""The dashboard's recent lists (``GET /dashboard/recent``) with events on: every replica
hears every replica's changes from the task exchanges, so whichever replica answers shows
the same tasks, failures and resolutions per minute, unscheduled tasks among them."""

from __future__ import annotations

import uuid
from typing import Any

import aiohttp

from azqueue.testing import sas
from azqueue.testing.tasks import create, definition
from tests.servers import Server, ServerFactory
from tests.waiting import eventually


async def _recent(http: aiohttp.ClientSession, server: Server, task_queue_id: str
                  ) -> dict[str, Any]:
    async with http.get(f"{server.root_url}/dashboard/recent",
                        params={"taskQueueId": task_queue_id}) as r:
        assert r.status == 200, await r.text()
        answer: dict[str, Any] = await r.json()
        return answer


def _lists(recent: dict[str, Any]) -> tuple[dict[str, str], dict[str, str], dict[str, int]]:
    """The tasks and failures (task -> state) and the resolutions by state it shows."""
    resolved: dict[str, int] = {}
    for minute in recent["throughput"]:
        for state in ("completed", "failed", "exception"):
            resolved[state] = resolved.get(state, 0) + minute[state]
    return ({t["taskId"]: t["state"] for t in recent["tasks"]},
            {t["taskId"]: t["state"] for t in recent["failures"]}, resolved)


async def test_two_replicas_show_the_same_recent_lists(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str) -> None:
    a = await make_server(amqp_url=amqp_url)
    b = await make_server(amqp_url=amqp_url)
    queue = f"prov/recent-{uuid.uuid4().hex[:8]}"
    done = [await create(http, a.api, definition(queue)) for _ in range(5)]
    failed = await create(http, a.api, definition(queue))
    blocker = await create(http, a.api, definition(queue))
    waiting = await create(http, a.api, definition(queue, dependencies=[blocker]))
    for task_id, outcome in [*((t, "completed") for t in done), (failed, "failed")]:
        code, body = await sas.post(http, f"{a.api}/task/{task_id}/runs/0/claim",
                                    {"workerGroup": "wg", "workerId": "w1"})
        assert code == 200, body
        code, body = await sas.post(http, f"{a.api}/task/{task_id}/runs/0/{outcome}")
        assert code == 200, body

    expected = ({**{t: "completed" for t in done}, failed: "failed", blocker: "pending",
                 waiting: "unscheduled"}, {failed: "failed"}, {"completed": 5, "failed": 1,
                                                               "exception": 0})
    on_b = await eventually(lambda: _recent(http, b, queue), lambda r: _lists(r) == expected,
                            what="replica B listing what was done through replica A")
    assert on_b["note"] == "recent on every replica"
    on_a = await _recent(http, a, queue)
    assert _lists(on_a) == expected
    assert on_a["note"] == "recent on every replica"
