"""What PUTs that trickle into ``s3`` putUrls hold of an ``azqueue serve`` process's
upload buffers, and whether another worker's uploads get through meanwhile.

One run (a worker holding its claim) opens PUTS PUTs of bodies over 4 MiB to as many
putUrls of its own, each sending one byte every EVERY seconds (never pausing for the
60 s read timeout); with ``--reconnect`` each PUT that is answered starts again at once
(half a second after a 503).
Meanwhile a worker of another run PUTs 5 MiB every PROBE seconds. Printed: what the
trickling PUTs were answered and when, and how many of the other worker's uploads were
stored or refused 503. The same run against a release without the minimum rate and the
run's share shows what they fixed (its trickling PUTs hold 240 of the 256 MiB, and the
other worker is refused, for as long as the trickle lasts).

Not a test: the figures depend on the machine, and nothing here asserts them.

Usage: .venv/bin/python scripts/measure_trickle.py [--puts 12] [--every 40] [--watch 150]
       [--probe 5] [--reconnect]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import aiohttp
from measuring import dev_server

from azqueue.testing.tasks import definition, iso, slugid

MIB = 1024 * 1024
TYPE = "application/octet-stream"


async def _run(http: aiohttp.ClientSession, api: str) -> str:
    """A task, created and its run 0 claimed: its taskId."""
    task_id = slugid()
    async with http.put(f"{api}/task/{task_id}", json=definition("prov/trickle")) as r:
        assert r.status == 200, await r.text()
    async with http.post(f"{api}/task/{task_id}/runs/0/claim",
                         json={"workerGroup": "wg", "workerId": "w"}) as r:
        assert r.status == 200, await r.text()
    return task_id


async def _put_url(http: aiohttp.ClientSession, api: str, task_id: str, name: str) -> str:
    expires = iso(datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1))
    async with http.post(f"{api}/task/{task_id}/runs/0/artifacts/{name}",
                         json={"storageType": "s3", "expires": expires,
                               "contentType": TYPE}) as r:
        assert r.status == 200, await r.text()
        return str((await r.json())["putUrl"])


async def _trickle(put_url: str, every: float) -> int:
    """A PUT announcing 10 MiB that sends a byte every ``every`` seconds: the status of
    its answer."""
    url = urlsplit(put_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write((f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                  f"Content-Type: {TYPE}\r\nContent-Length: {10 * MIB}\r\n\r\n").encode())

    async def send() -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(every)

    sending = asyncio.create_task(send())
    try:
        line = await reader.readline()
        return int(line.split()[1]) if line else 0
    finally:
        sending.cancel()
        writer.close()


async def _trickler(put_url: str, every: float, reconnect: bool, started: float,
                    answers: list[tuple[float, int]]) -> None:
    while True:
        status = await _trickle(put_url, every)
        answers.append((time.monotonic() - started, status))
        if not reconnect:
            return
        if status == 503:
            await asyncio.sleep(0.5)  # the run's share is taken: try again soon


async def main(puts: int, every: float, watch: float, probe: float, reconnect: bool) -> None:
    async with dev_server() as (api, http):
        greedy, other = await _run(http, api), await _run(http, api)
        urls = [await _put_url(http, api, greedy, f"public/trickle-{i}.bin")
                for i in range(puts)]
        fair = await _put_url(http, api, other, "public/fair.bin")
        started = time.monotonic()
        answers: list[tuple[float, int]] = []
        tricklers = [asyncio.create_task(_trickler(u, every, reconnect, started, answers))
                     for u in urls]
        await asyncio.sleep(1)  # the trickles under way
        probes: Counter[int] = Counter()
        first_stored: float | None = None
        async with aiohttp.ClientSession() as plain:
            while time.monotonic() - started < watch:
                async with plain.put(fair, data=b"y" * (5 * MIB),
                                     headers={"Content-Type": TYPE}) as r:
                    probes[r.status] += 1
                    if r.status == 200 and first_stored is None:
                        first_stored = time.monotonic() - started
                await asyncio.sleep(probe)
        for t in tricklers:
            t.cancel()
        await asyncio.gather(*tricklers, return_exceptions=True)
        by_status: dict[int, list[float]] = {}
        for at, status in answers:
            by_status.setdefault(status, []).append(at)
        print(f"{puts} PUTs of one run trickling a byte every {every:g} s"
              f"{', reconnecting when answered' if reconnect else ''}, watched {watch:g} s:")
        for status, times in sorted(by_status.items()):
            print(f"  answered {status}: {len(times)} times, after {min(times):.1f} to "
                  f"{max(times):.1f} s")
        unanswered = puts - sum(1 for _ in answers) if not reconnect else None
        if unanswered:
            print(f"  never answered: {unanswered}")
        stored = f", the first after {first_stored:.1f} s" if first_stored is not None else ""
        print(f"another run's 5 MiB PUT every {probe:g} s: "
              + ", ".join(f"{n} answered {s}" for s, n in sorted(probes.items())) + stored)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--puts", type=int, default=12)
    parser.add_argument("--every", type=float, default=40.0)
    parser.add_argument("--watch", type=float, default=150.0)
    parser.add_argument("--probe", type=float, default=5.0)
    parser.add_argument("--reconnect", action="store_true")
    options = parser.parse_args()
    asyncio.run(main(options.puts, options.every, options.watch, options.probe,
                     options.reconnect))
