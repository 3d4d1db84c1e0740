"""How long one tenant's burst of deadlines delays another tenant's deadline.

One ``azqueue serve`` process (the deadline resolver every second). A tenant creates
FLOOD tasks in its own task queue, CLIENTS at a time, all with one deadline; another
tenant creates one task whose deadline is a second later. Nobody claims anything. The
figures: how long after its deadline the other tenant's task was resolved
(``exception/deadline-exceeded``), and how long after theirs the last of the flood was.

Not a test: the figures depend on the machine, and nothing here asserts them.

Usage: .venv/bin/python scripts/measure_deadlines.py [--flood 1700] [--clients 1] [--lead 90]
       [--source DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
from benchlib import signed_session
from measuring import serving

from azqueue.model import timeutil
from azqueue.testing import tasks


async def _create(http: aiohttp.ClientSession, api: str, queue: str, deadline: datetime
                  ) -> str:
    body = tasks.definition(queue, payload={})
    body["deadline"] = timeutil.fmt(deadline)
    return await tasks.create(http, api, body, attempts=5)


async def _resolved_at(http: aiohttp.ClientSession, api: str, task_id: str,
                       give_up: float) -> float | None:
    """When (time.time()) the task was seen resolved, polling every 0.1 s."""
    while time.time() < give_up:
        async with http.get(f"{api}/task/{task_id}/status") as r:
            if (await r.json())["status"]["state"] == "exception":
                return time.time()
        await asyncio.sleep(0.1)
    return None


async def _flood(http: aiohttp.ClientSession, api: str, queue: str, deadline: datetime,
                 count: int, clients: int) -> list[str]:
    ids: list[str] = []
    left = iter(range(count))

    async def client() -> None:
        for _ in left:
            ids.append(await _create(http, api, queue, deadline))

    await asyncio.gather(*(client() for _ in range(clients)))
    return ids


async def main(flood: int, clients: int, lead: float, source: Path | None) -> None:
    async with serving(source, AZQUEUE_DEADLINE_RESOLVER_INTERVAL="1") as (_, server), \
            signed_session() as http:
        deadline = (datetime.now(UTC) + timedelta(seconds=lead)).replace(microsecond=0)
        started = time.monotonic()
        ids = await _flood(http, server.api, f"flood/q{secrets.token_hex(4)}", deadline,
                           flood, clients)
        made = time.monotonic() - started
        if datetime.now(UTC) >= deadline:
            raise SystemExit(f"creating {flood} tasks took {made:.0f} s, past their "
                             f"deadline: give a longer --lead")
        theirs = deadline + timedelta(seconds=1)
        victim = await _create(http, server.api, f"other/q{secrets.token_hex(4)}", theirs)
        give_up = theirs.timestamp() + 600
        seen, last = await asyncio.gather(_resolved_at(http, server.api, victim, give_up),
                                          _resolved_at(http, server.api, ids[-1], give_up))

    def late(at: float | None, due: datetime) -> str:
        return "not within 600 s" if at is None else f"{at - due.timestamp():.1f} s"

    print(f"{flood} tasks of one tenant ({clients} client(s) creating, {made:.0f} s) with "
          f"one deadline: the other tenant's task, due a second later, resolved "
          f"{late(seen, theirs)} after its deadline; the flood's last "
          f"{late(last, deadline)} after theirs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood", type=int, default=1700)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--lead", type=float, default=90.0,
                        help="seconds from the start to the flood's deadline")
    parser.add_argument("--source", type=Path,
                        help="serve the azqueue package of this source tree (another "
                             "revision) instead of this one")
    options = parser.parse_args()
    asyncio.run(main(options.flood, options.clients, options.lead, options.source))
