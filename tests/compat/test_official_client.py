"""The unmodified official `taskcluster` client (PyPI) drives the queue, with the root
client's credentials."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import taskcluster
import taskcluster.aio
from taskcluster.exceptions import TaskclusterRestFailure

from azqueue.testing.tasks import definition, slugid
from tests.servers import ROOT, Server

CREDENTIALS = {"clientId": ROOT.client_id, "accessToken": ROOT.access_token}


def _lifecycle_sync(root_url: str) -> dict[str, Any]:
    queue = taskcluster.Queue({"rootUrl": root_url, "maxRetries": 0, "credentials": CREDENTIALS})
    task_id = slugid()
    body = definition("prov/compat-sync")
    created = queue.createTask(task_id, body)
    assert created["status"]["state"] == "pending"
    assert queue.createTask(task_id, body) == created
    assert queue.task(task_id)["taskQueueId"] == "prov/compat-sync"
    assert queue.status(task_id)["status"]["state"] == "pending"
    claim = queue.claimTask(task_id, 0, {"workerGroup": "wg", "workerId": "sync"})
    assert claim["status"]["state"] == "running" and claim["workerId"] == "sync"
    reclaim = queue.reclaimTask(task_id, 0)
    assert reclaim["takenUntil"] >= claim["takenUntil"]
    done = queue.reportCompleted(task_id, 0)
    assert done["status"]["state"] == "completed"

    failed_id = slugid()
    queue.createTask(failed_id, definition("prov/compat-sync"))
    queue.claimTask(failed_id, 0, {"workerGroup": "wg", "workerId": "sync"})
    assert queue.reportFailed(failed_id, 0)["status"]["state"] == "failed"

    exc_id = slugid()
    queue.createTask(exc_id, definition("prov/compat-sync"))
    queue.claimTask(exc_id, 0, {"workerGroup": "wg", "workerId": "sync"})
    exc = queue.reportException(exc_id, 0, {"reason": "worker-shutdown"})
    assert [r["state"] for r in exc["status"]["runs"]] == ["exception", "pending"]

    with pytest.raises(TaskclusterRestFailure) as info:
        queue.reportCompleted(failed_id, 0)
    assert info.value.status_code == 409
    with pytest.raises(TaskclusterRestFailure) as info:
        queue.status(slugid())
    assert info.value.status_code == 404
    return queue.status(task_id)["status"]


async def test_sync_client_drives_the_whole_lifecycle(server: Server) -> None:
    final = await asyncio.to_thread(_lifecycle_sync, server.root_url)
    assert final["runs"][0]["reasonResolved"] == "completed"


async def test_aio_client_drives_the_whole_lifecycle(server: Server) -> None:
    async with taskcluster.aio.createSession() as session:
        queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "maxRetries": 0,
                                       "credentials": CREDENTIALS}, session=session)
        assert (await queue.ping())["alive"] is True
        task_id = slugid()
        created = await queue.createTask(task_id, definition("prov/compat-aio", priority="high"))
        assert created["status"]["taskQueueId"] == "prov/compat-aio"
        assert (await queue.task(task_id))["priority"] == "high"
        assert (await queue.status(task_id))["status"]["state"] == "pending"
        claim = await queue.claimTask(task_id, 0, {"workerGroup": "wg", "workerId": "aio"})
        assert claim["runId"] == 0 and claim["task"]["priority"] == "high"
        await queue.reclaimTask(task_id, 0)
        assert (await queue.reportCompleted(task_id, 0))["status"]["state"] == "completed"

        other = slugid()
        await queue.createTask(other, definition("prov/compat-aio"))
        await queue.claimTask(other, 0, {"workerGroup": "wg", "workerId": "aio"})
        assert (await queue.reportFailed(other, 0))["status"]["state"] == "failed"

        third = slugid()
        await queue.createTask(third, definition("prov/compat-aio", retries=0))
        await queue.claimTask(third, 0, {"workerGroup": "wg", "workerId": "aio"})
        exc = await queue.reportException(third, 0, {"reason": "intermittent-task"})
        assert exc["status"]["state"] == "exception"  # no retries left

        with pytest.raises(TaskclusterRestFailure) as info:
            await queue.createTask(slugid(), {**definition(), "retries": 99})
        assert info.value.status_code == 400 and "retries" in str(info.value)
