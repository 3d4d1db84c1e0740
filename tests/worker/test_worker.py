"""The worker SDK and `azqueue worker`, following docs/workers/sas.md and docs/workers/sdk.md."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import signal
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import taskcluster

from azqueue.model.priority import Priority
from azqueue.testing import sas
from azqueue.testing.processes import alive
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition, status
from azqueue.worker import Credentials, Worker, WorkerState
from azqueue.worker.sas import POLL_TASK_URLS, SasSource
from tests.servers import ROOT, Server, ServerFactory
from tests.waiting import eventually
from tests.worker.helpers import (
    AZQUEUE,
    CREDENTIALS,
    cli_env,
    config,
    does_nothing,
    finish,
    log_of,
    running,
    shell_worker,
    spawn,
    wait_status,
)


def command(*argv: str, **payload: object) -> dict:
    return {"command": list(argv), **payload}


async def test_fifty_tasks_three_sas_and_two_claim_work_workers_each_completed_once(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'if the worker received multiple <QueueMessage> entries ... it must also claim these
    tasks. This is worker that has capacity to run multiple tasks in parallel' (docs/workers/sas.md)."""
    server = await make_server(claim_work_wait=1.0, claim_work_poll_interval=0.3)
    tasks = [await create(http, server.api, definition(
        "prov/fifty", payload=command("sh", "-c", "echo done $TASK_ID")))
        for _ in range(50)]
    workers = [shell_worker(server, "prov/fifty", f"sas{i}", mode="sas", capacity=4)
               for i in range(3)]
    workers += [shell_worker(server, "prov/fifty", f"cw{i}", mode="claim-work", capacity=4)
                for i in range(2)]
    async with running(*workers):
        for task_id in tasks:
            await wait_status(http, server, task_id, lambda s: s["state"] != "pending"
                              and s["state"] != "running", timeout=90)
    assert sum(w.completed for w in workers) == 50
    assert all(w.state is WorkerState.STOPPED for w in workers)
    for task_id in tasks:
        s = await status(http, server.api, task_id)
        assert [r["state"] for r in s["runs"]] == ["completed"], s
        assert f"done {task_id}" in await log_of(http, server, task_id, 0)


@pytest.mark.crash
async def test_a_worker_killed_mid_task_is_replaced_after_its_claim_expires(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'If a worker fails to reclaimTask the run will be resolved exception, and a new
    pending run will be created if retries haven't be exhausted' (docs/workers/sdk.md)."""
    server = await make_server(claim_timeout=3.0, claim_resolver_interval=0.5)
    task_id = await create(http, server.api, definition(
        "prov/killed", payload=command("sh", "-c", '[ "$RUN_ID" != 0 ] || sleep 60')))
    doomed = spawn(server, "prov/killed", "doomed", "--reclaim-margin", "1")
    try:
        await wait_status(http, server, task_id, lambda s: s["state"] == "running")
    finally:
        finish(doomed, signal.SIGKILL)
    async with running(shell_worker(server, "prov/killed", "survivor")):
        s = await wait_status(http, server, task_id, lambda s: s["state"] == "completed")
    r0, r1 = s["runs"]
    assert (r0["state"], r0["reasonResolved"], r0["workerId"]) == (
        "exception", "claim-expired", "doomed")
    assert (r1["state"], r1["reasonCreated"], r1["workerId"]) == ("completed", "retry", "survivor")


async def test_sigterm_reports_worker_shutdown_and_the_retry_completes_elsewhere(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'If the worker finds itself having to terminate early ... the worker should report an
    exception with the reason worker-shutdown' (docs/workers/sas.md)."""
    server = await make_server()
    task_id = await create(http, server.api, definition(
        "prov/sigterm", payload=command("sh", "-c", '[ "$RUN_ID" != 0 ] || sleep 60')))
    leaving = spawn(server, "prov/sigterm", "leaving", "--mode", "sas")
    try:
        await wait_status(http, server, task_id, lambda s: s["state"] == "running")
    finally:
        output = await asyncio.to_thread(finish, leaving, signal.SIGTERM)
    assert leaving.returncode == 0, output
    s = await status(http, server.api, task_id)
    assert (s["runs"][0]["state"], s["runs"][0]["reasonResolved"]) == ("exception", "worker-shutdown")
    async with running(shell_worker(server, "prov/sigterm", "next", mode="sas")):
        s = await wait_status(http, server, task_id, lambda s: s["state"] == "completed")
    assert [r["state"] for r in s["runs"]] == ["exception", "completed"]


async def test_a_reclaim_answered_409_stops_the_subprocess_and_forgets_the_task(
        make_server: ServerFactory, http: aiohttp.ClientSession, tmp_path) -> None:
    """'If an attempt to call reclaimTask returns 409 ... the worker should halt execution,
    cleanup, and forget all about the task' (docs/workers/sdk.md)."""
    server = await make_server(claim_timeout=3.0, run_resolvers=False)
    pid_file = tmp_path / "pid"
    task_id = await create(http, server.api, definition(
        "prov/reclaim409", payload=_sleeper(pid_file)))
    worker = shell_worker(server, "prov/reclaim409", "loser", reclaim_margin=1.5)
    async with running(worker):
        pid = await _pid_once_running(http, server, task_id, pid_file)
        # Somebody else resolves the run: the next reclaim (1.5 s before takenUntil) gets 409,
        # and the subprocess must be stopped, not waited for.
        code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/exception",
                                 {"reason": "malformed-payload"})
        assert code == 200
        # The command sleeps a minute: gone well before that means it was stopped.
        await eventually(lambda: not alive(pid), timeout=30,
                         what="the subprocess to be stopped after the reclaim's 409")
    s = await status(http, server.api, task_id)
    assert s["runs"][0]["reasonResolved"] == "malformed-payload"  # no report of ours on top
    async with http.get(f"{server.api}/task/{task_id}/runs/0/artifacts") as r:
        # Only the live log, there since the run started: nothing was added at the end.
        assert [a["name"] for a in (await r.json())["artifacts"]] == ["public/logs/live.log"]


async def test_task_cancel_stops_the_running_subprocess_at_its_next_reclaim(
        make_server: ServerFactory, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    """`azqueue task cancel`: the run resolves exception canceled, and the worker, told by
    its next reclaim (409), 'should halt execution ... and forget all about the task' (docs/workers/sdk.md)."""
    # Reclaims every 4 s, each due 4 s before the claim expires: a slow machine delays a
    # reclaim, but not by that much, so the run is not resolved claim-expired first.
    server = await make_server(claim_timeout=8.0)
    pid_file = tmp_path / "pid"
    task_id = await create(http, server.api, definition(
        "prov/cancel", payload=_sleeper(pid_file)))
    worker = shell_worker(server, "prov/cancel", "canceled", reclaim_margin=4.0)
    async with running(worker):
        pid = await _pid_once_running(http, server, task_id, pid_file)
        canceled = await asyncio.to_thread(
            subprocess.run, [AZQUEUE, "task", "cancel", task_id], env=cli_env(server),
            capture_output=True, text=True, timeout=30)
        assert canceled.returncode == 0, canceled.stderr
        assert canceled.stdout.strip() == f"{task_id} exception: run 0 exception (canceled)"
        # The command sleeps a minute: gone well before that means it was stopped.
        await eventually(lambda: not alive(pid), timeout=30,
                         what="the subprocess to be stopped after the run was canceled")
    s = await status(http, server.api, task_id)
    assert [(r["state"], r["reasonResolved"]) for r in s["runs"]] == [("exception", "canceled")]
    assert worker.completed == 0


def _sleeper(pid_file: Path) -> dict:
    """A payload that writes its process id to ``pid_file`` and sleeps a minute."""
    return command("sh", "-c", f"echo $$ > {pid_file}; exec sleep 60")


async def _pid_once_running(http: aiohttp.ClientSession, server: Server, task_id: str,
                            pid_file: Path) -> int:
    await wait_status(http, server, task_id, lambda s: s["state"] == "running")
    written = await eventually(lambda: pid_file.exists() and pid_file.read_text().strip(),
                               what=f"the task's command to write its pid to {pid_file}")
    return int(written)


async def test_outcomes_malformed_payload_exit_code_and_overrun(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'If the worker is unable execute the task specific payload ... report exception with
    the reason malformed-payload' and 'it is still important to write a detailed explanation
    ... to the task log'; 'If ... the code crashes or exists non-zero, then the task is said
    to be failed' (docs/workers/sdk.md)."""
    server = await make_server()
    bad = await create(http, server.api, definition("prov/outcomes", payload={"command": "ls"}))
    exit3 = await create(http, server.api, definition(
        "prov/outcomes", payload=command("sh", "-c", "echo failing; exit 3")))
    slow = await create(http, server.api, definition(
        "prov/outcomes", payload=command("sleep", "30", maxRunTime=1)))
    async with running(shell_worker(server, "prov/outcomes", "w", capacity=3)):
        done = lambda s: s["state"] in ("completed", "failed", "exception")  # noqa: E731
        s_bad = await wait_status(http, server, bad, done)
        s_exit3 = await wait_status(http, server, exit3, done)
        s_slow = await wait_status(http, server, slow, done)
    assert (s_bad["state"], s_bad["runs"][0]["reasonResolved"]) == ("exception", "malformed-payload")
    assert len(s_bad["runs"]) == 1  # never retried
    assert "`command` must be a non-empty list of strings" in await log_of(http, server, bad, 0)
    assert s_exit3["state"] == "failed"
    log = await log_of(http, server, exit3, 0)
    assert "failing" in log and "exit code 3" in log
    assert s_slow["state"] == "failed"
    assert "ran longer than maxRunTime (1s)" in await log_of(http, server, slow, 0)


async def test_a_much_dequeued_tip_warns_the_operator_and_failed_deletes_are_logged(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector, caplog: pytest.LogCaptureFixture) -> None:
    """'workers reads the value of the <DequeueCount> and logs messages that alerts the
    operator if a message has been dequeued a significant number of times. For example
    more than 10' and 'workers logs failures to delete messages from Azure queues' (docs/workers/sas.md)."""
    server = await make_server()
    task_id = await create(http, server.api, definition("prov/dequeue"))
    urls = await sas.poll_task_urls(http, server.api, "prov", "dequeue")
    poll = urls["queues"][6]["signedPollUrl"]
    qclient = storage.queue(storage.pending_queue("prov/dequeue", Priority.LOWEST))
    for _ in range(11):  # dequeue it 11 times, making it visible again each time
        [m] = await sas.get_messages(http, poll)
        await qclient.update_message(m.message_id, pop_receipt=m.pop_receipt, visibility_timeout=0)
    # A tip for a task that does not exist: its claim is a 4xx, and its delete will fail
    # because the delete URL's signature is broken.
    await qclient.send_message(base64.b64encode(json.dumps(
        {"taskId": "fakefakefakeQfakefake", "runId": 0, "signature": "x"}).encode()).decode())
    caplog.set_level(logging.INFO)
    async with aiohttp.ClientSession() as session:
        source = SasSource(session, server.root_url, CREDENTIALS, "prov/dequeue", "g", "w",
                           idle_sleep=0.1, hints=False)  # keeps the URLs broken below
        queues = await source._queues()
        for q in queues:
            q["signedDeleteUrl"] = q["signedDeleteUrl"].replace("sig=", "sig=broken")
        claims: list[dict] = []

        async def claimed_and_delete_failed() -> bool:
            claims.extend(await source.get(2, asyncio.Event()))
            return bool(claims) and any("could not delete" in r.message for r in caplog.records)

        await eventually(claimed_and_delete_failed,
                         what="the task claimed and the fake tip's failed delete logged")
    assert [c["status"]["taskId"] for c in claims] == [task_id]
    assert any("OPERATOR" in r.message and "dequeued 12 times" in r.message
               for r in caplog.records if r.levelno == logging.WARNING)
    assert any("could not delete message" in r.message for r in caplog.records
               if r.levelno == logging.WARNING)


@pytest.mark.parametrize("mode", ["sas", "claim-work"])
async def test_stop_returns_promptly_while_the_queue_is_empty(
        make_server: ServerFactory, mode: str) -> None:
    """The SDK's worker (docs/workers/sdk.md): 'an event loop whose blocking lease has a timeout so stop is
    prompt'; here every wait is bounded, even claimWork's 20-second long poll."""
    server = await make_server()
    worker = Worker(config(server, "prov/idle", "idle", mode=mode), does_nothing)
    started = asyncio.ensure_future(worker.start())
    # Waiting: a claimWork call is under way, or a pass found nothing (the second pass
    # asks the queue for its sample after the first one's sleep).
    await eventually(lambda: worker.requests["claimWork"] or worker.requests[POLL_TASK_URLS] >= 2,
                     what="the worker to be waiting for work")
    assert worker.state is WorkerState.RUNNING
    # claimWork waits 20 s for work and an idle SAS worker sleeps seconds: a stop that
    # waited for either would take longer than this.
    await asyncio.wait_for(worker.stop(), 10)
    assert worker.state is WorkerState.STOPPED
    await started


async def test_claims_that_arrive_during_a_forced_stop_are_handed_back(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """SIGTERM while a poll pass is claiming: 'every running task is reported exception
    worker-shutdown', including those claimed after the signal, and the worker does not
    wait for their handlers."""
    server = await make_server()
    tasks = [await create(http, server.api, definition("prov/late")) for _ in range(3)]

    class StoppedMidPass(Worker):
        def _source(self, session: aiohttp.ClientSession) -> Any:
            get = super()._source(session)

            async def source(n: int) -> list[Any]:
                claims = []
                while len(claims) < len(tasks):
                    claims += await get(n)
                self.stopping = asyncio.ensure_future(self.stop(graceful=False))
                await asyncio.sleep(0)  # the stop is under way when the claims come back
                return claims
            return source

    async def sleeps_30_s(run: object) -> None:
        await asyncio.sleep(30)

    worker = StoppedMidPass(config(server, "prov/late", "late", mode="sas", capacity=3),
                            sleeps_30_s)
    await asyncio.wait_for(worker.start(), 10)
    for task_id in tasks:
        s = await status(http, server.api, task_id)
        assert s["runs"][0]["reasonResolved"] == "worker-shutdown", s
        assert s["runs"][1]["state"] == "pending"  # retried elsewhere


async def test_a_sas_worker_refused_for_its_own_credentials_keeps_the_tip(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector) -> None:
    """docs/workers/sas.md deletes a tip after a 4xx because the task 'wasn't created, not
    scheduled or already claimed'; a 403 says the worker's credentials are wrong, not the
    task, so the tip must stay for a worker that may claim it."""
    server = await make_server()
    task_id = await create(http, server.api, definition("prov/noclaim"))
    now = datetime.now(UTC)
    poll_only = taskcluster.createTemporaryCredentials(
        ROOT.client_id, ROOT.access_token, now - timedelta(minutes=1), now + timedelta(hours=1),
        ["queue:poll-task-urls:prov/noclaim"])
    creds = Credentials(poll_only["clientId"], poll_only["accessToken"],
                        poll_only["certificate"])
    async with aiohttp.ClientSession() as session:
        source = SasSource(session, server.root_url, creds, "prov/noclaim", "g", "w",
                           idle_sleep=0.1)
        assert await source.get(1, asyncio.Event()) == []
    assert await storage.pending_count("prov/noclaim") == 1
    assert (await status(http, server.api, task_id))["state"] == "pending"


async def test_expected_failures_are_logged_in_a_line_and_others_with_their_traceback(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    """A dropped connection is retried after one line of log; an exception nobody expects
    (a bug) is logged with its traceback, so that it cannot repeat silently, and the
    worker goes on."""
    server = await make_server()
    task_id = await create(http, server.api, definition("prov/flaky"))
    failures: list[Exception] = [aiohttp.ClientConnectionError("connection dropped"),
                                 ZeroDivisionError("a bug")]

    class Flaky(Worker):
        def _source(self, session: aiohttp.ClientSession) -> Any:
            get = super()._source(session)

            async def source(n: int) -> list[Any]:
                if failures:
                    raise failures.pop(0)
                return await get(n)
            return source

    caplog.set_level(logging.WARNING, logger="azqueue.worker")
    worker = Flaky(config(server, "prov/flaky", "w", mode="sas", idle_sleep=0.05),
                   does_nothing)
    async with running(worker):
        await wait_status(http, server, task_id, lambda s: s["state"] == "completed")
    logged = [r for r in caplog.records if "getting work failed" in r.getMessage()]
    assert [(r.levelno, r.exc_info is not None) for r in logged] == [
        (logging.WARNING, False), (logging.ERROR, True)]
    assert "connection dropped" in logged[0].getMessage()
    assert logged[1].exc_info is not None and logged[1].exc_info[0] is ZeroDivisionError


def test_azqueue_worker_refuses_options_that_do_not_fit() -> None:
    """Bad input: a clear message saying what is wrong, not a traceback."""
    refused = subprocess.run(
        [AZQUEUE, "worker", "--task-queue", "prov/options", "--idle-sleep", "2",
         "--max-idle-sleep", "1"],
        env={**os.environ, "TASKCLUSTER_ROOT_URL": "http://127.0.0.1:9"},
        capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "azqueue: worker: idle_sleep (2.0) must be over 0 and at most max_idle_sleep (1.0)")
