"""The live log of `azqueue worker`'s shell handler: readable while the command runs,
whole and byte-exact after, appended in pieces of at most 4 MiB, never doubled when an
append's answer is lost."""

from __future__ import annotations

import contextlib
import math
import os
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import taskcluster.aio
import taskcluster.aio.download
from taskcluster.exceptions import TaskclusterRestFailure

from azqueue.config import StorageSettings
from azqueue.devstorage import Azurite
from azqueue.testing.faultproxy import FaultProxy
from azqueue.testing.tasks import create, definition
from azqueue.worker import WorkerConfig
from azqueue.worker.livelog import CHUNK
from azqueue.worker.shell import LOG_ARTIFACT
from tests.servers import ROOT, Server, ServerFactory
from tests.waiting import eventually
from tests.worker.helpers import running, shell_worker, wait_status

CREDENTIALS = {"clientId": ROOT.client_id, "accessToken": ROOT.access_token}
# Short, so that the tests wait little for each append (the default is 2 s).
INTERVAL = 0.2


def _waits_for(*files: Path) -> str:
    """Shell text that waits until each of ``files`` exists, printing "after NAME" after
    each (words the command line itself, which the log shows, does not hold)."""
    return "".join(f"while [ ! -e {f} ]; do sleep 0.05; done; printf 'after %s\\n' {f.name}; "
                   for f in files)


@contextlib.asynccontextmanager
async def released(*files: Path) -> AsyncIterator[None]:
    """Create ``files`` on the way out, so that a failing test does not leave a command
    waiting for them (and the worker's graceful stop with it)."""
    try:
        yield
    finally:
        for f in files:
            f.touch()


async def _task(http: aiohttp.ClientSession, server: Server, queue: str, script: str) -> str:
    return await create(http, server.api, definition(queue, payload={
        "command": ["sh", "-c", script]}))


async def _log(http: aiohttp.ClientSession, server: Server, task_id: str) -> bytes | None:
    """The log as getArtifact serves it now; None while there is none."""
    async with http.get(f"{server.api}/task/{task_id}/runs/0/artifacts/{LOG_ARTIFACT}") as r:
        if r.status == 404:
            return None
        assert r.status == 200, await r.text()
        return await r.read()


async def _shows(http: aiohttp.ClientSession, server: Server, task_id: str,
                 text: bytes) -> bytes | None:
    log = await _log(http, server, task_id)
    return log if log is not None and text in log else None


async def _block_count(http: aiohttp.ClientSession, server: Server, task_id: str) -> int:
    """How many Append Blocks the log's blob holds (Azure's own count)."""
    async with http.get(f"{server.api}/task/{task_id}/runs/0/artifacts/{LOG_ARTIFACT}",
                        allow_redirects=False) as r:
        assert r.status == 303, await r.text()
        location = r.headers["Location"]
    async with aiohttp.ClientSession() as anonymous, anonymous.head(location) as r:
        assert r.headers["x-ms-blob-type"] == "AppendBlob"
        return int(r.headers["x-ms-blob-committed-block-count"])


async def test_a_running_commands_output_is_readable_while_it_runs_and_whole_after(
        server: Server, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    go = tmp_path / "go"
    task_id = await _task(http, server, "prov/live", f"echo 'first line'; {_waits_for(go)}")
    queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "credentials": CREDENTIALS})

    async def official(text: str) -> str | None:
        """The log through the official client's download helper, once it shows ``text``."""
        try:
            data, _ = await taskcluster.aio.download.downloadArtifactToBuf(
                taskId=task_id, runId=0, name=LOG_ARTIFACT, queueService=queue)
        except TaskclusterRestFailure:
            return None  # no log yet
        log = bytes(data).decode()
        return log if text in log else None

    async with running(shell_worker(server, "prov/live", "live", log_interval=INTERVAL)), \
            released(go):
        while_running = await eventually(lambda: official("first line\n"),
                                         what="the first line while the command runs")
        state = await wait_status(http, server, task_id, lambda s: True)
        assert state["state"] == "running" and "after go" not in while_running
        go.touch()
        await wait_status(http, server, task_id, lambda s: s["state"] == "completed")
    whole = await official("after go")
    assert whole is not None and whole.startswith(f"[azqueue] task {task_id} run 0\n")
    assert whole.index("first line\n") < whole.index("after go\n") < whole.index(
        "[azqueue] exit code 0\n")
    assert whole.count("first line\n") == 1


async def test_a_log_far_larger_than_a_chunk_arrives_whole_in_chunks_of_4_mib_at_most(
        server: Server, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    big = os.urandom(20_000_000)
    (tmp_path / "big").write_bytes(big)
    go = tmp_path / "go"
    task_id = await _task(http, server, "prov/live-big",
                          f"echo started; {_waits_for(go)} cat {tmp_path / 'big'}; echo done")
    async with running(shell_worker(server, "prov/live-big", "big", log_interval=INTERVAL)), \
            released(go):
        await eventually(lambda: _shows(http, server, task_id, b"started\n"),
                         what="the first line")
        before = await _block_count(http, server, task_id)
        go.touch()
        await wait_status(http, server, task_id, lambda s: s["state"] == "completed")
    log = await _log(http, server, task_id)
    assert log is not None
    start = log.index(b"after go\n") + len(b"after go\n")
    assert log[start:start + len(big)] == big  # byte-exact
    assert log[start + len(big):].startswith(b"done\n")
    # Azure counts the appends: 20 MB in pieces of at most 4 MiB takes at least 5.
    assert await _block_count(http, server, task_id) - before >= math.ceil(len(big) / CHUNK) == 5


@pytest.mark.parametrize("first_faults, second_faults", [
    # An append applied and answered 500, then (an answer lost again, the append sent
    # again refused as an expired putUrl is) the doubt stays and the next one settles it.
    (("timed out",), ("dropped", "refused")),
    # The first send applied and its connection dropped: the HTTP client sends it again
    # by itself, and that send is refused. An answer never proves that nothing of an
    # append was applied.
    (("dropped", "refused"), ("dropped",)),
], ids=["lost-then-refused", "resent-by-the-http-client"])
async def test_appends_whose_answers_were_lost_are_not_doubled(
        make_server: ServerFactory, azurite: Azurite, storage_prefix: str,
        blob_proxy: FaultProxy, http: aiohttp.ClientSession, tmp_path: Path,
        first_faults: tuple[str, ...], second_faults: tuple[str, ...]) -> None:
    """The worker reaches blob storage through a proxy that applies appends and loses
    their answers (500 OperationTimedOut, or a closed connection) and refuses some sent
    again with a 403: the append sent again is recognised (412 at that position) and
    every line is in the log once."""
    server = await make_server(storage=StorageSettings(
        azurite.connection_string, storage_prefix,
        public_blob_endpoint=blob_proxy.endpoint("blob")))
    first, second = tmp_path / "first", tmp_path / "second"
    task_id = await _task(http, server, "prov/live-lost",
                          f"echo started; {_waits_for(first, second)}")
    async with running(shell_worker(server, "prov/live-lost", "lost", log_interval=INTERVAL)), \
            released(first, second):
        await eventually(lambda: _shows(http, server, task_id, b"started\n"),
                         what="the first line")
        for fault in first_faults:
            blob_proxy.once("PUT", "live.log", fault)
        first.touch()
        await eventually(lambda: _shows(http, server, task_id, b"after first\n"),
                         what=f"the line whose append got {first_faults}")
        for fault in second_faults:
            blob_proxy.once("PUT", "live.log", fault)
        second.touch()
        await wait_status(http, server, task_id, lambda s: s["state"] == "completed")
    log = await _log(http, server, task_id)
    assert log is not None
    assert (log.count(b"started\n"), log.count(b"after first\n"),
            log.count(b"after second\n"), log.count(b"exit code 0\n")) == (1, 1, 1, 1), log
    injected = Counter(first_faults + second_faults)
    assert {f: blob_proxy.counts[f"blob {f}"] for f in injected} == dict(injected)


def test_the_log_interval_must_be_over_zero() -> None:
    values: dict[str, Any] = {"root_url": "http://127.0.0.1:1", "credentials": None,
                              "task_queue_id": "prov/x", "worker_group": "g", "worker_id": "w"}
    assert WorkerConfig(**values).log_interval == 2.0
    with pytest.raises(ValueError, match="log_interval must be over 0 seconds"):
        WorkerConfig(**values, log_interval=0)


async def test_a_canceled_runs_log_ends_saying_it_was_canceled(
        server: Server, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    task_id = await _task(http, server, "prov/canceled", "echo 'first line'; exec sleep 600")
    async with running(shell_worker(server, "prov/canceled", "canceled", log_interval=INTERVAL,
                                    status_interval=0.5)):
        await eventually(lambda: _shows(http, server, task_id, b"first line\n"),
                         what="the first line while the command runs")
        async with http.post(f"{server.api}/task/{task_id}/cancel") as r:
            assert r.status == 200, await r.text()
        log = await eventually(lambda: _log(http, server, task_id),
                               lambda log: log is not None and b"\n[azqueue] canceled" in log,
                               what="the log saying the run was canceled", timeout=15)
    assert log is not None
    assert log.decode().endswith("first line\n\n[azqueue] killed: the task was canceled\n\n"
                                 "[azqueue] canceled: the task was canceled (cancelTask) and "
                                 "its run stopped\n"), log.decode()
