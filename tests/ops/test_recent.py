"""The dashboard's recent lists (``GET /dashboard/recent``) with events off: the changes
this replica stored, unscheduled tasks among them, and a note that says so."""

from __future__ import annotations

import uuid

import aiohttp

from azqueue import __version__, release
from azqueue.testing.tasks import create, definition
from tests.servers import Server, ServerFactory


async def test_with_events_off_the_recent_lists_are_this_replicas_and_hold_unscheduled_tasks(
        server: Server, http: aiohttp.ClientSession) -> None:
    queue = f"prov/recent-{uuid.uuid4().hex[:8]}"
    blocker = await create(http, server.api, definition(queue))
    waiting = await create(http, server.api, definition(queue, dependencies=[blocker]))
    async with http.get(f"{server.root_url}/dashboard/recent",
                        params={"taskQueueId": queue}) as r:
        recent = await r.json()
    assert recent["note"] == "recent on this replica"
    assert recent["release"] == {"version": __version__, "commit": release.current().commit}
    assert {t["taskId"]: (t["state"], t["name"]) for t in recent["tasks"]} == {
        blocker: ("pending", "test"), waiting: ("unscheduled", "test")}


async def test_two_replicas_in_one_process_each_list_only_the_changes_they_stored(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """A server's recent changes are handed to its own services as an observer: a second
    server in the same process (as the tests start replicas) neither adds to them nor
    hears of them."""
    first, second = await make_server(), await make_server()
    queue = f"prov/recent-{uuid.uuid4().hex[:8]}"
    by_first = await create(http, first.api, definition(queue))
    by_second = await create(http, second.api, definition(queue))
    for replica, own in ((first, by_first), (second, by_second)):
        async with http.get(f"{replica.root_url}/dashboard/recent",
                            params={"taskQueueId": queue}) as r:
            recent = await r.json()
        assert [t["taskId"] for t in recent["tasks"]] == [own]
