"""The dashboard's recent lists (``GET /dashboard/recent``) with events on: a replica
asked for them reads the last hour of every replica's changes from the broker's stream of
task events at once, and hears them on while the dashboard is watched, so whichever
replica answers shows the same tasks, failures and resolutions per minute, unscheduled
tasks among them, from its first answer; unwatched, a replica hears nothing."""

from __future__ import annotations

import uuid
from typing import Any

import aiohttp

from azqueue.api.dashboard import HEARING_KEY, RECENT_KEY, Hearing
from azqueue.api.dashboard.recent import EVERY_REPLICA, THIS_REPLICA, RecentChanges
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
    for server in (a, b):  # the dashboard is open: both hear every replica from now on
        assert (await _recent(http, server, queue))["note"] == EVERY_REPLICA
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
    assert on_b["note"] == EVERY_REPLICA
    on_a = await _recent(http, a, queue)
    assert _lists(on_a) == expected
    assert on_a["note"] == EVERY_REPLICA


async def test_a_replica_first_asked_after_the_work_lists_it_at_once(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str) -> None:
    """Three tasks created through replica A, one completed and one failed, before
    anybody asked replica B (which heard nothing meanwhile) for its dashboard: B's first
    answer lists all three, their failure and their resolutions, and it hears on."""
    a = await make_server(amqp_url=amqp_url)
    b = await make_server(amqp_url=amqp_url)
    queue = f"prov/first-look-{uuid.uuid4().hex[:8]}"
    done, failed, pending = [await create(http, a.api, definition(queue)) for _ in range(3)]
    for task_id, outcome in ((done, "completed"), (failed, "failed")):
        code, body = await sas.post(http, f"{a.api}/task/{task_id}/runs/0/claim",
                                    {"workerGroup": "wg", "workerId": "w1"})
        assert code == 200, body
        code, body = await sas.post(http, f"{a.api}/task/{task_id}/runs/0/{outcome}")
        assert code == 200, body
    assert not b.app[HEARING_KEY].listening()
    first = await _recent(http, b, queue)
    assert _lists(first) == ({done: "completed", failed: "failed", pending: "pending"},
                             {failed: "failed"}, {"completed": 1, "failed": 1, "exception": 0})
    assert first["note"] == EVERY_REPLICA
    later = await create(http, a.api, definition(queue))
    await eventually(lambda: _recent(http, b, queue), lambda r: later in _lists(r)[0],
                     what="replica B hearing A's next task")


async def test_unwatched_a_replica_hears_nothing(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str) -> None:
    a = await make_server(amqp_url=amqp_url)
    b = await make_server(amqp_url=amqp_url)
    queue = f"prov/unwatched-{uuid.uuid4().hex[:8]}"
    on_a = await create(http, a.api, definition(queue))
    on_b = await create(http, b.api, definition(queue))
    assert not a.app[HEARING_KEY].listening()
    assert a.app[RECENT_KEY].view(queue, lambda entry: True)["tasks"][0]["taskId"] == on_a
    assert len(a.app[RECENT_KEY].view(queue, lambda entry: True)["tasks"]) == 1
    # The first look lists the last hour of both, and hears the others from then.
    first = await _recent(http, a, queue)
    assert _lists(first)[0] == {on_a: "pending", on_b: "pending"}


async def test_hearing_stops_once_the_dashboard_is_no_longer_watched(amqp_url: str) -> None:
    changes = RecentChanges()
    # The exchanges of the servers of these tests: nothing new is declared on the broker.
    hearing = Hearing(changes, amqp_url, "exchange/taskcluster-queue/v1/", idle=0.5)
    try:
        await hearing.watched()
        assert hearing.listening() and changes.note == EVERY_REPLICA
        await eventually(lambda: not hearing.listening(), what="hearing stopped when unwatched")
        assert changes.note == THIS_REPLICA
        await hearing.watched()  # watched again: hears again
        assert hearing.listening()
    finally:
        await hearing.close()
