"""What clients that never read their answers hold of an ``azqueue serve`` process.

On a process capped at CAP connections:

1. A task group of TASKS tasks of about 390 KB each; then CLIENTS connections each ask
   anonymously for listTaskGroup and read nothing.
2. CAP connections each send PIPELINED ``GET /dashboard/app.js`` at once and read
   nothing.

For each: the process's resident memory before, at its highest while the answers lie
unread, once the send timeout dropped them, and a moment after the clients closed; and how long until a fresh client's
ping is answered 200. The same run against a release without the send timeout shows
what it fixed (its unread answers are held until the clients close).

Not a test: the figures depend on the machine, and nothing here asserts them.

Usage: .venv/bin/python scripts/measure_unread.py [--tasks 25] [--clients 20] [--cap 50]
       [--pipelined 200] [--watch 30]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
from benchlib import signed_session
from measuring import serving

from azqueue.testing.processes import ServeProcess
from azqueue.testing.tasks import definition, slugid

MIB = 1024 * 1024
PAYLOAD = "x" * 390_000
CLOSED_FOR = 3.0  # seconds after the clients closed their connections, RSS again


def _rss(server: ServeProcess) -> int:
    with open(f"/proc/{server.process.pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) * 1024


async def _group(http: aiohttp.ClientSession, api: str, tasks: int) -> str:
    group = slugid()
    for _ in range(tasks):
        async with http.put(f"{api}/task/{slugid()}", json=definition(
                "prov/unread", taskGroupId=group, payload={"data": PAYLOAD})) as r:
            assert r.status == 200, await r.text()
    return group


async def _ping_ok(api: str) -> bool:
    try:
        async with aiohttp.ClientSession() as fresh, fresh.get(
                f"{api}/ping", timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def _attack(server: ServeProcess, request: bytes, clients: int, watch: float) -> str:
    """Open ``clients`` connections sending ``request`` and reading nothing; watch the
    process for ``watch`` seconds."""
    before = _rss(server)
    hogs = [await asyncio.open_connection("127.0.0.1", server.port, limit=1024)
            for _ in range(clients)]
    for _, writer in hogs:
        writer.write(request)
    started = time.monotonic()
    peak, answered = before, None
    while time.monotonic() - started < watch:
        peak = max(peak, _rss(server))
        if answered is None and await _ping_ok(server.api):
            answered = time.monotonic() - started
        await asyncio.sleep(0.25)
    after = _rss(server)
    for _, writer in hogs:
        writer.close()
    await asyncio.sleep(CLOSED_FOR)
    closed = _rss(server)
    ping = f"{answered:.1f} s" if answered is not None else f"not within {watch:g} s"
    return (f"RSS before {before / MIB:.0f} MiB, highest {peak / MIB:.0f} MiB (+"
            f"{(peak - before) / MIB:.0f}), after {watch:g} s {after / MIB:.0f} MiB (+"
            f"{(after - before) / MIB:.0f}), {CLOSED_FOR:g} s after the clients closed "
            f"{closed / MIB:.0f} MiB (+{(closed - before) / MIB:.0f}); a fresh ping answered "
            f"200 after {ping}")


async def main(tasks: int, clients: int, cap: int, pipelined: int, watch: float) -> None:
    async with serving(AZQUEUE_MAX_CONNECTIONS=str(cap)) as (_, server):
        async with signed_session() as http:
            group = await _group(http, server.api, tasks)
        host = f"Host: 127.0.0.1:{server.port}\r\n\r\n"
        listing = f"GET /api/queue/v1/task-group/{group}/list HTTP/1.1\r\n{host}"
        print(f"{clients} unread listTaskGroup of {tasks} tasks of 390 KB: "
              + await _attack(server, listing.encode(), clients, watch))
        assets = f"GET /dashboard/app.js HTTP/1.1\r\n{host}" * pipelined
        print(f"{cap} connections of {pipelined} pipelined GET /dashboard/app.js "
              f"never read (cap {cap}): "
              + await _attack(server, assets.encode(), cap, watch))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=25)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--cap", type=int, default=50)
    parser.add_argument("--pipelined", type=int, default=200)
    parser.add_argument("--watch", type=float, default=30.0)
    options = parser.parse_args()
    asyncio.run(main(options.tasks, options.clients, options.cap, options.pipelined,
                     options.watch))
