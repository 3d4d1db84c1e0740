"""What a handler can get wrong and what Azure routinely does to its requests: a handler
that is no async function is refused, whatever a handler does its run is reported,
artifacts arrive through ServerBusy and lost answers, and the reason a run failed is at
the end of its log."""

from __future__ import annotations

import asyncio
import functools
import gzip
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from azqueue.config import StorageSettings
from azqueue.devstorage import Azurite
from azqueue.testing.faultproxy import FaultProxy, Faults
from azqueue.testing.tasks import create, definition
from azqueue.worker import TaskFailed, TaskRun, Worker, WorkerConfig, retry
from azqueue.worker.shell import run_command
from tests.servers import Server, ServerFactory
from tests.worker.helpers import config, log_of, running, wait_status


async def _proxied_server(make_server: ServerFactory, azurite: Azurite, prefix: str,
                          proxy: FaultProxy) -> Server:
    """A server whose SAS URLs (artifacts' putUrls) reach blob storage through ``proxy``."""
    return await make_server(storage=StorageSettings(
        azurite.connection_string, prefix, public_blob_endpoint=proxy.endpoint("blob")))


async def _artifact(http: aiohttp.ClientSession, server: Server, task_id: str,
                    name: str) -> bytes:
    async with http.get(f"{server.api}/task/{task_id}/runs/0/artifacts/{name}") as r:
        assert r.status == 200, await r.text()
        return await r.read()


def _ended(state: str, reason: str = "") -> Callable[[dict[str, Any]], bool]:
    """Whether the first run was resolved ``state`` (``reason``: by default the same)."""
    def check(status: dict[str, Any]) -> bool:
        run = status["runs"][0] if status.get("runs") else {}
        return bool(run.get("state") == state and run.get("reasonResolved") == (reason or state))
    return check


def _resolved(status: dict[str, Any]) -> bool:
    """Whether the first run was resolved, whatever its outcome."""
    runs = status.get("runs") or [{}]
    return runs[0].get("state") not in (None, "pending", "running")


def test_a_plain_function_handler_is_refused_when_the_worker_is_made() -> None:
    def build(run: TaskRun) -> None:
        pass

    c = config_without_server()
    with pytest.raises(TypeError, match=r"the handler test_a_plain_function_handler_is_refused_"
                                        r"when_the_worker_is_made.<locals>.build is not an async "
                                        r"function: write it as `async def build\(run"):
        Worker(c, build)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="the handler 42 is not callable"):
        Worker(c, 42)  # type: ignore[arg-type]


def config_without_server() -> WorkerConfig:
    return WorkerConfig(root_url="http://127.0.0.1:1", credentials=None,
                        task_queue_id="prov/x", worker_group="g", worker_id="w")


async def test_a_handler_that_raises_before_its_coroutine_exists_has_its_run_reported(
        server: Server, http: aiohttp.ClientSession) -> None:
    async def build(run: TaskRun, *, tool: str) -> None:
        pass

    task_id = await create(http, server.api, definition("prov/early-raise"))
    worker = Worker(config(server, "prov/early-raise", "early"),
                    functools.partial(build))  # no tool: calling it raises TypeError
    async with running(worker):
        await wait_status(http, server, task_id, _ended("exception", "internal-error"))
    log = await log_of(http, server, task_id, 0)
    assert "the run ended exception (internal-error): TypeError: " in log, log
    assert "build() missing 1 required keyword-only argument: 'tool'\n" in log, log


async def test_the_reason_a_run_failed_is_at_the_end_of_its_log(
        server: Server, http: aiohttp.ClientSession) -> None:
    failing = await create(http, server.api, definition("prov/why", payload={"n": 1}))
    crashing = await create(http, server.api, definition("prov/why", payload={"n": 2}))

    async def handler(run: TaskRun) -> None:
        if run.payload["n"] == 1:
            raise TaskFailed("a and b must be numbers")
        raise KeyError("b")

    async with running(Worker(config(server, "prov/why", "why"), handler)):
        await wait_status(http, server, failing, _ended("failed"))
        await wait_status(http, server, crashing, _ended("exception", "internal-error"))
    assert (await log_of(http, server, failing, 0)).endswith(
        "[azqueue] the run ended failed: a and b must be numbers\n")
    assert (await log_of(http, server, crashing, 0)).endswith(
        "[azqueue] the run ended exception (internal-error): KeyError: 'b'\n")


async def test_a_failed_commands_reason_follows_its_output_in_the_live_log(
        server: Server, http: aiohttp.ClientSession) -> None:
    task_id = await create(http, server.api, definition("prov/why-shell", payload={
        "command": ["sh", "-c", "echo working; exit 3"]}))
    async with running(Worker(config(server, "prov/why-shell", "shell"), run_command)):
        await wait_status(http, server, task_id, _ended("failed"))
    log = await log_of(http, server, task_id, 0)
    assert log.index("working\n") < log.index("the run ended failed: the command exited with 3")
    assert log.endswith("exited with 3\n"), log


async def test_artifacts_arrive_whole_through_server_busy_and_a_lost_answer(
        make_server: ServerFactory, azurite: Azurite, storage_prefix: str,
        blob_proxy: FaultProxy, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    """A third of the blob requests answered 503 ServerBusy, and one PUT applied and
    answered 500 OperationTimedOut: every run completes with both its artifacts whole
    (one uploaded from bytes, one streamed from a file)."""
    server = await _proxied_server(make_server, azurite, storage_prefix, blob_proxy)
    ids = [await create(http, server.api, definition("prov/busy-artifacts", payload={"n": n}))
           for n in range(6)]
    big = tmp_path / "big"
    big.write_bytes(bytes(range(256)) * 8192)  # 2 MiB, read in chunks

    async def handler(run: TaskRun) -> None:
        await run.upload_artifact("public/result.txt", f"result {run.payload['n']}".encode(),
                                  "text/plain")
        with open(big, "rb") as f:
            f.read(10)  # uploaded from where the file is at
            await run.upload_artifact("public/big.bin", f, "application/octet-stream")

    blob_proxy.faults = Faults(busy=0.3)
    blob_proxy.once("PUT", "public/result.txt", "timed out")
    async with running(Worker(config(server, "prov/busy-artifacts", "busy"), handler)):
        for task_id in ids:
            await wait_status(http, server, task_id, _ended("completed"))
    blob_proxy.faults = Faults()
    for n, task_id in enumerate(ids):
        assert await _artifact(http, server, task_id, "public/result.txt") == \
            f"result {n}".encode()
        assert await _artifact(http, server, task_id, "public/big.bin") == \
            big.read_bytes()[10:]
    assert blob_proxy.counts["blob busy"] > 0
    assert blob_proxy.counts["blob timed out"] == 1


async def test_an_artifact_uploaded_with_a_content_encoding_is_served_with_it(
        server: Server, http: aiohttp.ClientSession) -> None:
    original = b"a line of a log\n" * 1000
    task_id = await create(http, server.api, definition("prov/gzip-artifacts"))

    async def handler(run: TaskRun) -> None:
        await run.upload_artifact("public/log.txt", gzip.compress(original), "text/plain",
                                  content_encoding="gzip")

    async with running(Worker(config(server, "prov/gzip-artifacts", "gz"), handler)):
        await wait_status(http, server, task_id, _ended("completed"))
    async with aiohttp.ClientSession(auto_decompress=False) as raw:
        async with raw.get(f"{server.api}/task/{task_id}/runs/0/artifacts/public/log.txt") as r:
            assert r.headers.get("Content-Encoding") == "gzip"
            assert gzip.decompress(await r.read()) == original
    assert await _artifact(http, server, task_id, "public/log.txt") == original


async def test_an_upload_rides_out_eight_failures_in_a_row(
        make_server: ServerFactory, azurite: Azurite, storage_prefix: str,
        blob_proxy: FaultProxy, http: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A throttled account: an artifact's PUT applied and answered 500 OperationTimedOut,
    then answered 503 ServerBusy seven times, is sent until it is stored, and its run (the
    first, not one run again after it) completes with the artifact whole."""
    monkeypatch.setattr(retry, "FIRST_PAUSE", 0.05)
    monkeypatch.setattr(retry, "MAX_PAUSE", 0.2)
    server = await _proxied_server(make_server, azurite, storage_prefix, blob_proxy)
    task_id = await create(http, server.api, definition("prov/throttled"))

    async def handler(run: TaskRun) -> None:
        await run.upload_artifact("public/result.txt", b"whole", "text/plain")

    blob_proxy.once("PUT", "public/result.txt", "timed out")
    for _ in range(7):
        blob_proxy.once("PUT", "public/result.txt", "busy")
    async with running(Worker(config(server, "prov/throttled", "throttled"), handler)):
        status = await wait_status(http, server, task_id, _resolved)
    assert [(r["state"], r.get("reasonResolved")) for r in status["runs"]] == [
        ("completed", "completed")], await log_of(http, server, task_id, 0)
    assert await _artifact(http, server, task_id, "public/result.txt") == b"whole"
    assert (blob_proxy.counts["blob timed out"], blob_proxy.counts["blob busy"]) == (1, 7)


async def test_an_upload_that_keeps_failing_ends_the_run_intermittent_saying_what_it_tried(
        make_server: ServerFactory, azurite: Azurite, storage_prefix: str,
        blob_proxy: FaultProxy, http: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "FIRST_PAUSE", 0.05)
    monkeypatch.setattr(retry, "MAX_PAUSE", 0.2)
    server = await _proxied_server(make_server, azurite, storage_prefix, blob_proxy)
    task_id = await create(http, server.api, definition("prov/busy-forever"))

    async def handler(run: TaskRun) -> None:
        await run.upload_artifact("public/result.txt", io.BytesIO(b"never"), "text/plain")

    for _ in range(retry.ATTEMPTS):
        blob_proxy.once("PUT", "public/result.txt", "busy")
    async with running(Worker(config(server, "prov/busy-forever", "busy"), handler)):
        await wait_status(http, server, task_id, _ended("exception", "intermittent-task"))
    log = await log_of(http, server, task_id, 0)
    assert (f"the run ended exception (intermittent-task): uploading "
            f"public/result.txt: {retry.ATTEMPTS} attempts in ") in log, log
    assert "all failed: 503 ServerBusy; 503 ServerBusy" in log, log


async def test_what_a_handler_writes_to_run_log_comes_before_the_reason_it_failed(
        server: Server, http: aiohttp.ClientSession) -> None:
    """`run.log` is the run's public/logs/live.log: what the handler writes there (also
    from another thread, and with print) is in it, then the reason the run failed; a run
    that completes keeps its lines; one that writes nothing has no log."""
    failing = await create(http, server.api, definition("prov/run-log", payload={"n": 1}))
    done = await create(http, server.api, definition("prov/run-log", payload={"n": 2}))
    quiet = await create(http, server.api, definition("prov/run-log", payload={"n": 3}))

    async def handler(run: TaskRun) -> None:
        if run.payload["n"] == 3:
            return
        run.log.write("compiling\n")
        await asyncio.to_thread(print, "linking", file=run.log)
        if run.payload["n"] == 1:
            raise TaskFailed("the linker failed")

    async with running(Worker(config(server, "prov/run-log", "logs"), handler)):
        for task_id, state in ((failing, "failed"), (done, "completed"), (quiet, "completed")):
            await wait_status(http, server, task_id, _ended(state))
    assert await log_of(http, server, failing, 0) == (
        "compiling\nlinking\n\n[azqueue] the run ended failed: the linker failed\n")
    assert await log_of(http, server, done, 0) == "compiling\nlinking\n"
    async with http.get(f"{server.api}/task/{quiet}/runs/0/artifacts") as r:
        assert (await r.json())["artifacts"] == []


async def test_a_handler_cannot_upload_the_runs_log_and_hide_why_it_failed(
        server: Server, http: aiohttp.ClientSession) -> None:
    """public/logs/live.log is the SDK's: upload_artifact refuses it, saying what to use,
    and the run's log says so."""
    task_id = await create(http, server.api, definition("prov/own-log"))

    async def handler(run: TaskRun) -> None:
        await run.upload_artifact("public/logs/live.log", b"my own log\n", "text/plain")

    async with running(Worker(config(server, "prov/own-log", "own"), handler)):
        await wait_status(http, server, task_id, _ended("exception", "internal-error"))
    log = await log_of(http, server, task_id, 0)
    assert "my own log" not in log
    assert log.endswith("the run ended exception (internal-error): ValueError: "
                        "public/logs/live.log is the run's log, which the worker writes (and "
                        "the reason a run failed at its end): write to it with "
                        "run.log.write(...), or upload your own log under another name\n"), log
