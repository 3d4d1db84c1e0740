"""The dashboard's recent lists (``GET /dashboard/recent``) with events off: the changes
this replica stored, unscheduled tasks among them, and a note that says so."""

from __future__ import annotations

import uuid

import aiohttp

from azqueue.testing.tasks import create, definition
from tests.servers import Server


async def test_with_events_off_the_recent_lists_are_this_replicas_and_hold_unscheduled_tasks(
        server: Server, http: aiohttp.ClientSession) -> None:
    queue = f"prov/recent-{uuid.uuid4().hex[:8]}"
    blocker = await create(http, server.api, definition(queue))
    waiting = await create(http, server.api, definition(queue, dependencies=[blocker]))
    async with http.get(f"{server.root_url}/dashboard/recent",
                        params={"taskQueueId": queue}) as r:
        recent = await r.json()
    assert recent["note"] == "recent on this replica"
    assert {t["taskId"]: (t["state"], t["name"]) for t in recent["tasks"]} == {
        blocker: ("pending", "test"), waiting: ("unscheduled", "test")}
