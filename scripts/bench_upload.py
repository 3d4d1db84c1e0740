#!/usr/bin/env python3
"""Benchmark: uploading a large artifact through an s3 ``putUrl`` versus straight to Blob.

Starts one Azurite (data in a throwaway directory) and `azqueue serve` on it (events
off), claims a task, writes a file of random bytes (100 MB by default) and uploads it,
alternately, ``--rounds`` times each way:

  s3    createArtifact storageType s3, then a plain PUT of the file to its putUrl with only
        Content-Type and Content-Length (docs/workers/artifacts.md): the queue streams the body into a
        block blob (4 MiB blocks, 4 staged at once) and commits it
  blob  createArtifact storageType blob, then a PUT of the file to its SAS putUrl with
        x-ms-blob-type (one Put Blob, straight to Azurite: the queue never sees the bytes)

and prints, per way, the median and best throughput of the PUT (MB/s, 1 MB = 10^6 bytes)
and the server's CPU seconds per upload.

Usage: .venv/bin/python scripts/bench_upload.py [--megabytes 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp

from benchlib import cpu_seconds, create_task, signed_session, start_server

from azqueue.devstorage import Azurite
from azqueue.testing.tasks import call, iso


async def _upload(http: aiohttp.ClientSession, url: str, path: Path,
                  headers: dict[str, str]) -> float:
    """PUT the file to ``url``; the seconds it took."""
    size = path.stat().st_size
    started = time.perf_counter()
    with path.open("rb") as body:
        async with http.put(url, data=body,
                            headers={**headers, "Content-Length": str(size)}) as r:
            if r.status not in (200, 201):
                raise RuntimeError(f"PUT {url.split('?')[0]} answered {r.status}: "
                                   f"{await r.text()}")
    return time.perf_counter() - started


async def main(megabytes: int, rounds: int) -> None:
    azurite = await Azurite.start()
    workdir = Path(tempfile.mkdtemp(prefix="azqueue-bench-upload-"))
    path = workdir / "artifact.bin"
    with path.open("wb") as f:
        for _ in range(megabytes):
            f.write(os.urandom(1_000_000))
    size = path.stat().st_size
    server = await start_server(azurite.connection_string, workdir / "server.log")
    try:
        async with signed_session() as api, aiohttp.ClientSession() as plain:
            task_id = await create_task(api, server.api, "bench/upload")
            await call(api, "POST", f"{server.api}/task/{task_id}/runs/0/claim",
                       {"workerGroup": "bench", "workerId": "upload"})
            expires = iso(datetime.now(UTC) + timedelta(hours=1))
            seconds: dict[str, list[float]] = {"s3": [], "blob": []}
            cpu: dict[str, list[float]] = {"s3": [], "blob": []}
            for n in range(rounds):
                for kind in ("s3", "blob"):
                    made = await call(api, "POST", f"{server.api}/task/{task_id}/runs/0/"
                                      f"artifacts/public/{kind}-{n}.bin", {
                                          "storageType": kind, "expires": expires,
                                          "contentType": "application/octet-stream"})
                    headers = made.get("headers", {"Content-Type": made["contentType"]})
                    before = cpu_seconds(server.process.pid)
                    seconds[kind].append(await _upload(plain, made["putUrl"], path, headers))
                    cpu[kind].append(cpu_seconds(server.process.pid) - before)
                    if kind == "blob":
                        async with api.put(f"{server.api}/task/{task_id}/runs/0/artifacts/"
                                           f"public/{kind}-{n}.bin", json={}) as r:
                            assert r.status == 200, await r.text()
        print(f"upload of {size / 1e6:.0f} MB, {rounds} rounds each, one Azurite "
              f"(pid {azurite.process.pid}), azqueue serve (pid {server.process.pid})")
        print(f"{'way':<6}{'median MB/s':>13}{'best MB/s':>11}{'server CPU s/upload':>21}")
        for kind, label in (("s3", "s3 putUrl via the queue (plain PUT)"),
                            ("blob", "blob SAS straight to Blob (Put Blob)")):
            rates = [size / 1e6 / s for s in seconds[kind]]
            print(f"{kind:<6}{statistics.median(rates):>13.1f}{max(rates):>11.1f}"
                  f"{statistics.median(cpu[kind]):>21.2f}   {label}")
    finally:
        await server.stop()
        await azurite.stop()
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.megabytes, args.rounds))
