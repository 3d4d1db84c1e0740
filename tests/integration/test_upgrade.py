"""A rolling upgrade loses nothing: the previous release serves a deployment, then this one
takes over its storage; and while both serve, each claims what the other created.

The previous release runs from its source in git (``PREVIOUS``, the release before this
one; move it forward when a release changes what is stored, so that this test always
starts from what the release before wrote). It creates tasks, a worker claims two of them
through it (one with claimWork, one through its SAS URLs) and makes an artifact; then it
stops and this release serves the same storage: the claims made before are reclaimed and
completed with the credentials the previous release issued, the tasks still pending are
claimed through the tips the previous release put, the artifact is read, and a task it
created that nobody claims is resolved at its deadline by the trigger it put. Then both
serve one storage prefix at once, this release with no rollout setting: a task created on
either is claimed through the other by the first claimWork call, long before any tip
repair, a claim made through one is reclaimed and reported through the other, and a task
of a group made on one waits for its dependency made on the other.
"""

from __future__ import annotations

import asyncio
import io
import subprocess
import tarfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import taskcluster.aio

from azqueue.devstorage import Azurite, free_port
from azqueue.testing import sas
from azqueue.testing.hawk import hawk_signer
from azqueue.testing.tasks import definition, slugid
from tests.servers import IN_CI, ROOT, ServerFactory
from tests.integration.test_doorbell import settled
from tests.serving import serve
from tests.waiting import eventually

PREVIOUS = "de8430f"  # 0.3.0 (CHANGELOG.md)
REPOSITORY = Path(__file__).resolve().parents[2]
SECRET = "test-secret-0123456789abcdef"  # the tip secret of tests/serving.py and make_server


@pytest.fixture
def previous_release(tmp_path: Path) -> Path:
    """The ``azqueue`` package of ``PREVIOUS``, extracted under ``tmp_path``."""
    into = tmp_path
    try:
        archive = subprocess.run(["git", "-C", str(REPOSITORY), "archive", PREVIOUS, "azqueue"],
                                 check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        reason = f"the previous release {PREVIOUS} is not in this checkout's history ({e})"
        if IN_CI:
            pytest.fail(reason + ": CI clones the whole history")
        pytest.skip(reason)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def _queue(root_url: str, credentials: dict[str, Any] | None = None) -> taskcluster.aio.Queue:
    return taskcluster.aio.Queue({"rootUrl": root_url, "maxRetries": 0, "credentials": credentials
                                  or {"clientId": ROOT.client_id, "accessToken": ROOT.access_token}})


@pytest.mark.slow
async def test_the_previous_releases_tasks_claims_and_artifacts_carry_over(
        azurite: Azurite, storage_prefix: str, make_server: ServerFactory,
        previous_release: Path) -> None:
    port = free_port()
    old_url = f"http://127.0.0.1:{port}"
    ids = {name: slugid() for name in ("claimed", "polled", "pending", "sas_pending", "doomed")}
    async with serve(azurite, storage_prefix, "", port, release=previous_release):
        old = _queue(old_url)
        for name, task_id in ids.items():
            queue = "prov/sas" if name in ("polled", "sas_pending") else "prov/upgrade"
            if name == "doomed":  # nobody claims it: its deadline resolves it, after the upgrade
                await old.createTask(task_id, definition("prov/doomed",
                                                         deadline=timedelta(seconds=3)))
            else:
                await old.createTask(task_id, definition(queue))
        got = await old.claimWork("prov/upgrade", {"tasks": 1, "workerGroup": "g",
                                                   "workerId": "before"})
        [claim] = got["tasks"]
        ids["claimed"], ids["pending"] = sorted(
            [ids["claimed"], ids["pending"]], key=lambda t: t != claim["status"]["taskId"])
        as_run = _queue(old_url, claim["credentials"])
        made = await as_run.createArtifact(ids["claimed"], "0", "public/out.txt", {
            "storageType": "s3", "contentType": "text/plain", "expires": claim["task"]["expires"]})
        async with aiohttp.ClientSession() as anonymous:
            async with anonymous.put(made["putUrl"], data=b"made before the upgrade\n",
                                     headers={"Content-Type": "text/plain"}) as r:
                assert r.status < 300, await r.text()
        async with aiohttp.ClientSession(
                middlewares=(hawk_signer(ROOT.client_id, ROOT.access_token),)) as http:
            queues = (await sas.poll_task_urls(http, f"{old_url}/api/queue/v1", "prov",
                                               "sas"))["queues"]
            [message] = await sas.get_messages(http, queues[-1]["signedPollUrl"], 1)
            ids["polled"], ids["sas_pending"] = sorted(
                [ids["polled"], ids["sas_pending"]], key=lambda t: t != message.tip["taskId"])
            code, polled = await sas.claim(http, f"{old_url}/api/queue/v1", message,
                                           worker_id="before")
            assert code == 200, polled

    # The deadline resolver reads the previous release's deadline queue every 12th pass.
    new = await make_server(tip_secrets=(SECRET,), deadline_resolver_interval=0.5)
    queue = _queue(new.root_url)
    # Claims made before the upgrade are reclaimed and resolved with the credentials then
    # issued.
    for task_id, before in ((ids["claimed"], claim), (ids["polled"], polled)):
        again = await _queue(new.root_url, before["credentials"]).reclaimTask(task_id, "0")
        done = await _queue(new.root_url, again["credentials"]).reportCompleted(task_id, "0")
        assert done["status"]["state"] == "completed"
    # Pending tasks are claimed with the tips the previous release put.
    got = await queue.claimWork("prov/upgrade", {"tasks": 2, "workerGroup": "g",
                                                 "workerId": "after"})
    assert [(c["status"]["taskId"], c["runId"]) for c in got["tasks"]] == [(ids["pending"], 0)]
    async with aiohttp.ClientSession(
            middlewares=(hawk_signer(ROOT.client_id, ROOT.access_token),)) as http:
        queues = (await sas.poll_task_urls(http, new.api, "prov", "sas"))["queues"]
        [message] = await sas.get_messages(http, queues[-1]["signedPollUrl"], 32)
        assert message.tip["taskId"] == ids["sas_pending"]
        code, answer = await sas.claim(http, new.api, message, worker_id="after")
        assert code == 200, answer
    # The artifact made before is read.
    async with aiohttp.ClientSession() as anonymous:
        async with anonymous.get(f"{new.api}/task/{ids['claimed']}/runs/0/artifacts/public/out.txt")\
                as r:
            assert r.status == 200 and await r.read() == b"made before the upgrade\n"
    # The deadline trigger the previous release put is handled.
    doomed = await eventually(lambda: queue.status(ids["doomed"]),
                              lambda s: s["status"]["state"] == "exception",
                              what="the task created before the upgrade resolved at its deadline")
    assert doomed["status"]["runs"][0]["reasonResolved"] == "deadline-exceeded"


async def _claim_one(through: taskcluster.aio.Queue, task_queue_id: str,
                     worker_id: str) -> dict[str, Any]:
    """The one task the first claimWork call through ``through`` hands out (it waits at most
    its 20 s; a tip it cannot use would leave the run to tip repair, minutes later)."""
    got = await through.claimWork(task_queue_id, {"tasks": 1, "workerGroup": "both",
                                                  "workerId": worker_id})
    assert got["tasks"], f"{task_queue_id}: claimWork handed out nothing"
    [claim] = got["tasks"]
    return claim


@pytest.mark.slow
async def test_both_releases_serving_at_once_claim_what_the_other_created(
        azurite: Azurite, storage_prefix: str, make_server: ServerFactory,
        previous_release: Path) -> None:
    port = free_port()
    # No rollout settings (docs/operating/upgrades.md): the previous release reads the tips
    # this one puts and rings the doorbell.
    new_server = await make_server(tip_secrets=(SECRET,), claim_work_wait=20.0)
    async with serve(azurite, storage_prefix, "", port, release=previous_release):
        old, new = _queue(f"http://127.0.0.1:{port}"), _queue(new_server.root_url)
        made_old, made_new, dependency, dependent = (slugid() for _ in range(4))
        await old.createTask(made_old, definition("prov/made-old"))
        await new.createTask(made_new, definition("prov/made-new"))
        await old.createTask(dependency, definition("prov/dependency", taskGroupId=dependency))
        await new.createTask(dependent, definition("prov/dependent", taskGroupId=dependency,
                                                   dependencies=[dependency]))
        # Each task is claimed through the release that did not create it, reclaimed
        # through the one that did, and completed through the other again.
        waits = {}
        for task_id, task_queue_id, claimer, other in (
                (made_old, "prov/made-old", new, old), (made_new, "prov/made-new", old, new)):
            began = time.monotonic()
            claim = await _claim_one(claimer, task_queue_id, "cross")
            waits[task_queue_id] = time.monotonic() - began
            assert claim["status"]["taskId"] == task_id
            again = await _queue(other.options["rootUrl"], claim["credentials"]).reclaimTask(
                task_id, "0")
            done = await _queue(claimer.options["rootUrl"], again["credentials"]).reportCompleted(
                task_id, "0")
            assert done["status"]["state"] == "completed"
        # The group made on the previous release holds this release's task, which waits for
        # its dependency there; completing that through this release schedules it, and the
        # previous release claims it.
        listed = {t["status"]["taskId"] for t in (await old.listTaskGroup(dependency))["tasks"]}
        assert listed == {dependency, dependent}
        assert (await old.status(dependent))["status"]["state"] == "unscheduled"
        claim = await _claim_one(old, "prov/dependency", "dependency")
        await _queue(new.options["rootUrl"], claim["credentials"]).reportCompleted(dependency, "0")
        began = time.monotonic()
        claim = await _claim_one(old, "prov/dependent", "dependent")
        waits["prov/dependent"] = time.monotonic() - began
        assert claim["status"]["taskId"] == dependent
        done = await _queue(new.options["rootUrl"], claim["credentials"]).reportCompleted(
            dependent, "0")
        assert done["status"]["state"] == "completed"
        # A call already waiting on this release gets a task the previous release creates.
        waiting = asyncio.create_task(_claim_one(new, "prov/waiting", "waiting"))
        await settled(new_server, "prov/waiting")  # relying on the doorbell
        assert not waiting.done()
        late = slugid()
        await old.createTask(late, definition("prov/waiting"))
        assert (await waiting)["status"]["taskId"] == late
        print("claimed through the other release after (s):",
              {q: round(w, 2) for q, w in waits.items()})
