"""Long polls whose callers went away: the server stops waiting for them.

An attacker with a task queue's poll scope asks pollTaskUrls to wait for a tip and
hangs up at once, many times over; each wait ends when its caller is gone, as claimWork's
does, instead of lasting its 20 seconds.
"""

from __future__ import annotations

import asyncio
import logging
import re

import aiohttp
import pytest

from azqueue.testing.tasks import slugid
from tests.servers import ServerFactory
from tests.waiting import eventually

WAIT = 20  # seconds the polls ask to wait
# What a poll whose caller hung up after HANG_UP seconds may still take, at most.
HANG_UP = 2.0
ENDED_WITHIN = 12.0


def _poll_times(caplog: pytest.LogCaptureFixture, path: str) -> list[float]:
    """The milliseconds of each request to ``path`` the access log has seen end."""
    return [float(m[1]) for record in caplog.records if record.name == "azqueue.access"
            and (m := re.search(rf"GET {re.escape(path)} \d+ ([0-9.]+)ms",
                                record.getMessage()))]


async def test_a_poll_task_urls_wait_ends_once_its_caller_hung_up(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "azqueue.access")
    server = await make_server(claim_work_wait=float(WAIT))
    path = f"/api/queue/v1/poll-task-url/prov/gone-{slugid()[:8]}"
    url = f"{server.root_url}{path}?pending=true&wait={WAIT}"
    # The first poll of a task queue sets up how this replica hears of its tips, and ends
    # once it has; the polls after it wait their whole time for a tip.
    async with http.get(url) as r:
        assert r.status == 200, await r.text()
    caplog.clear()
    polls = [asyncio.create_task(http.get(url)) for _ in range(10)]
    await asyncio.sleep(HANG_UP)  # the callers hang up while the server waits for a tip
    for poll in polls:
        poll.cancel()
    await asyncio.gather(*polls, return_exceptions=True)
    times = await eventually(lambda: _poll_times(caplog, path), lambda t: len(t) == len(polls),
                             what="every hung-up poll ended", timeout=ENDED_WITHIN)
    assert max(times) < ENDED_WITHIN * 1000, times
