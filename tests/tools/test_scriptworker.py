"""scriptworker (Mozilla's stock Python worker), unmodified from PyPI, runs tasks from a
test server end to end: claimWork, its reclaims, the exit codes it maps to reports, a
cancel, and the artifacts it uploads gzipped (``Content-Encoding: gzip``), read back byte
for byte with that encoding. Chain of trust is off (it needs Mozilla's services)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any

import aiohttp
import pytest
import taskcluster.aio
import yaml

from azqueue.testing.tasks import definition, slugid
from tests.servers import ROOT, Server, ServerFactory
from tests.waiting import eventually

SCRIPTWORKER = Path(sys.executable).parent / "scriptworker"
CREDENTIALS = {"clientId": ROOT.client_id, "accessToken": ROOT.access_token}

# The task: what its payload says, as a script scriptworker runs for each task (it
# writes the task's definition to work_dir/task.json, and uploads artifact_dir).
TASK_SCRIPT = """\
import json, pathlib, sys, time
work, artifacts = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
payload = json.loads((work / "task.json").read_text())["payload"]
print(payload.get("say", "hello"), flush=True)
if "result" in payload:
    (artifacts / "public").mkdir(parents=True, exist_ok=True)
    (artifacts / "public" / "result.txt").write_text(payload["result"])
time.sleep(payload.get("sleep", 0))
sys.exit(payload.get("exit", 0))
"""


@pytest.fixture
async def scriptworker(tmp_path: Path) -> AsyncIterator[Callable[..., Path]]:
    """Start a scriptworker process on a task queue of a server; stopped (SIGTERM, as
    its operators stop it) at the end of the test."""
    processes: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []

    def start(server: Server, task_queue_id: str, reclaim_interval: int = 300) -> Path:
        """Its log's path."""
        provisioner, worker_type = task_queue_id.split("/")
        home = tmp_path / f"scriptworker-{len(processes)}"
        dirs = {name: home / name for name in ("work", "log", "artifact")}
        for d in dirs.values():
            d.mkdir(parents=True)
        script = home / "task.py"
        script.write_text(TASK_SCRIPT)
        config = {
            "taskcluster_root_url": server.root_url, "credentials": CREDENTIALS,
            "provisioner_id": provisioner, "worker_type": worker_type,
            "worker_group": "sw", "worker_id": f"sw{len(processes)}",
            "work_dir": str(dirs["work"]), "log_dir": str(dirs["log"]),
            "artifact_dir": str(dirs["artifact"]),
            "task_log_dir": str(dirs["artifact"] / "public" / "logs"),
            "task_script": [sys.executable, str(script), str(dirs["work"]),
                            str(dirs["artifact"])],
            "poll_interval": 1, "reclaim_interval": reclaim_interval,
            "sign_chain_of_trust": False, "verify_chain_of_trust": False,
            "verify_cot_signature": False, "ed25519_private_key_path": str(home / "none"),
        }
        (home / "scriptworker.yaml").write_text(yaml.safe_dump(config))
        logs.append(open(home / "scriptworker.log", "wb"))
        processes.append(subprocess.Popen(
            [str(SCRIPTWORKER), str(home / "scriptworker.yaml")], stdout=logs[-1],
            stderr=subprocess.STDOUT, env={k: v for k, v in os.environ.items()
                                           if not k.startswith("TASKCLUSTER_")}))
        return home / "scriptworker.log"

    yield start
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            await asyncio.to_thread(process.wait, 30)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)
    for log in logs:
        log.close()


def _queue(server: Server, credentials: dict[str, str] | None = None) -> taskcluster.aio.Queue:
    return taskcluster.aio.Queue({"rootUrl": server.root_url,
                                  "credentials": credentials or CREDENTIALS})


async def _resolved(server: Server, task_id: str, runs: int = 1) -> list[dict[str, Any]]:
    """The runs of the task once ``runs`` of them are resolved, and none is left open."""
    queue = _queue(server)

    async def probe() -> list[dict[str, Any]]:
        return list((await queue.status(task_id))["status"]["runs"])

    def done(found: list[dict[str, Any]]) -> bool:
        return len(found) >= runs and all(r["state"] not in ("pending", "running")
                                          for r in found[:runs])
    return await eventually(probe, done, what=f"task {task_id} resolved ({runs} runs)",
                            timeout=180)


async def _raw(url: str) -> tuple[bytes, str | None]:
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.get(url) as r:
            assert r.status == 200, await r.text()
            return await r.read(), r.headers.get("Content-Encoding")


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_scriptworker_completes_tasks_in_a_row_with_gzip_artifacts_read_byte_for_byte(
        server: Server, scriptworker: Callable[..., Path]) -> None:
    queue = _queue(server)
    ids = []
    for n in range(20):
        ids.append(slugid())
        await queue.createTask(ids[-1], definition("prov/sw-row", payload={
            "say": f"task {n} ran", "result": f"result {n}\n" * 50}))
    log = scriptworker(server, "prov/sw-row")
    for n, task_id in enumerate(ids):
        runs = await _resolved(server, task_id)
        assert [(r["state"], r["reasonResolved"]) for r in runs] == [
            ("completed", "completed")], log.read_text()[-3000:]
        listed = {a["name"] for a in (await queue.listArtifacts(task_id, 0))["artifacts"]}
        assert {"public/logs/live_backing.log", "public/result.txt",
                "public/chain-of-trust.json"} <= listed
        for name, wanted in (("public/result.txt", f"result {n}\n" * 50),
                             ("public/logs/live_backing.log", f"task {n} ran")):
            url = (await queue.artifact(task_id, 0, name))["url"]
            sent, encoding = await _raw(url)
            assert encoding == "gzip", name
            text = gzip.decompress(sent).decode()
            assert (text == wanted) if name.endswith("result.txt") else (wanted in text)
        cot = json.loads(gzip.decompress((await _raw((await queue.artifact(
            task_id, 0, "public/chain-of-trust.json"))["url"]))[0]))
        assert cot["taskId"] == task_id


# scriptworker's map from a task's exit code to its report, and the reason the queue
# creates a retry for it, if it does (6, `superseded`, is left out: Taskcluster's Queue
# refuses that reason since its release 40, as azqueue does, and scriptworker exits).
EXIT_CODES = {0: ("completed/completed", ""), 1: ("failed/failed", ""),
              2: ("exception/worker-shutdown", "retry"),
              3: ("exception/malformed-payload", ""),
              4: ("exception/resource-unavailable", ""), 5: ("exception/internal-error", ""),
              7: ("exception/intermittent-task", "task-retry"), 9: ("failed/failed", ""),
              245: ("exception/intermittent-task", "task-retry")}


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_each_exit_code_is_reported_as_scriptworker_maps_it(
        server: Server, scriptworker: Callable[..., Path]) -> None:
    queue = _queue(server)
    ids = {}
    for code in EXIT_CODES:
        ids[code] = slugid()
        await queue.createTask(ids[code], definition("prov/sw-exit", payload={"exit": code},
                                                     retries=1))
    log = scriptworker(server, "prov/sw-exit")
    for code, (report, retried) in EXIT_CODES.items():
        runs = await _resolved(server, ids[code], runs=2 if retried else 1)
        assert f"{runs[0]['state']}/{runs[0]['reasonResolved']}" == report, (
            code, log.read_text()[-3000:])
        assert len(runs) == (2 if retried else 1), code
        if retried:
            assert runs[1]["reasonCreated"] == retried


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_scriptworker_reclaims_past_the_claim_timeout_and_stops_a_canceled_task(
        make_server: ServerFactory, scriptworker: Callable[..., Path]) -> None:
    """A claim of 6 s, reclaimed every second: a task of 15 s completes in its first run.
    A canceled task's next reclaim is a 409, upon which scriptworker kills the script and
    goes on to the next task."""
    server = await make_server(claim_timeout=6.0)
    queue = _queue(server)
    long, canceled, after = slugid(), slugid(), slugid()
    await queue.createTask(long, definition("prov/sw-reclaim", payload={"sleep": 15}))
    log = scriptworker(server, "prov/sw-reclaim", reclaim_interval=1)
    runs = await _resolved(server, long)
    assert [(r["state"], r["reasonResolved"]) for r in runs] == [
        ("completed", "completed")], log.read_text()[-3000:]
    took = datetime.fromisoformat(runs[0]["resolved"]) - datetime.fromisoformat(
        runs[0]["started"])
    assert took > timedelta(seconds=6)  # the script sleeps 15 s: it outlived its claim
    await queue.createTask(canceled, definition("prov/sw-reclaim", payload={"sleep": 600}))
    await eventually(lambda: queue.status(canceled),
                     lambda s: s["status"]["state"] == "running", what="the task claimed")
    await queue.cancelTask(canceled)
    await queue.createTask(after, definition("prov/sw-reclaim", payload={"say": "next"}))
    runs = await _resolved(server, after)
    assert runs[0]["state"] == "completed", log.read_text()[-3000:]
    assert "Killing task after receiving 409 status in reclaim_task" in log.read_text()
    runs = (await queue.status(canceled))["status"]["runs"]
    assert [(r["state"], r["reasonResolved"]) for r in runs] == [("exception", "canceled")]
