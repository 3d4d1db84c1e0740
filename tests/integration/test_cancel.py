"""cancelTask, through the official client: "resolve the current run as exception with
reasonResolved set to canceled" (Taskcluster Queue reference), never retried."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
import taskcluster.aio
from taskcluster.exceptions import TaskclusterRestFailure

from azqueue.config import Client
from azqueue.testing import sas
from azqueue.testing.tasks import definition, slugid
from tests.servers import ROOT, Server, ServerFactory
from tests.waiting import stays

CANCELER = Client("canceler", "canceler-access-token-0123456789", (
    "queue:create-task:*", "queue:scheduler-id:*", "queue:cancel-task:-/*"))


def _queue(server: Server, client: Client = ROOT) -> taskcluster.aio.Queue:
    return taskcluster.aio.Queue({"rootUrl": server.root_url, "maxRetries": 0, "credentials": {
        "clientId": client.client_id, "accessToken": client.access_token}})


def _runs(status: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(r["state"], r["reasonCreated"], r.get("reasonResolved")) for r in status["runs"]]


async def test_a_canceled_pending_task_is_resolved_and_its_tip_refused(
        server: Server, http: aiohttp.ClientSession) -> None:
    queue = _queue(server)
    task_id = slugid()
    await queue.createTask(task_id, definition("prov/cancelpending", retries=3))
    status = (await queue.cancelTask(task_id))["status"]
    assert status["state"] == "exception" and status["retriesLeft"] == 3
    assert _runs(status) == [("exception", "scheduled", "canceled")]
    assert (await queue.cancelTask(task_id))["status"] == status  # idempotent
    assert (await queue.status(task_id))["status"] == status

    # The tip is still queued; a worker that finds it is refused and deletes it.
    urls = await sas.poll_task_urls(http, server.api, "prov", "cancelpending")
    [message] = await sas.poll_once(http, urls)
    code, err = await sas.claim(http, server.api, message)
    assert code == 409 and "exception" in err["message"]
    assert await sas.delete_message(http, urls["queues"][6]["signedDeleteUrl"], message) == 204
    assert (await queue.status(task_id))["status"] == status


async def test_a_canceled_running_task_loses_its_claim_and_its_tip(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    server = await make_server(claim_timeout=2.0, run_resolvers=False)  # cancel alone
    queue = _queue(server)
    task_id = slugid()
    await queue.createTask(task_id, definition("prov/cancelrunning"))
    urls = await sas.poll_task_urls(http, server.api, "prov", "cancelrunning")
    [message] = await sas.poll_once(http, urls)
    code, claim = await sas.claim(http, server.api, message)
    assert code == 200
    as_worker = taskcluster.aio.Queue({"rootUrl": server.root_url, "maxRetries": 0,
                                       "credentials": claim["credentials"]})

    status = (await queue.cancelTask(task_id))["status"]
    assert _runs(status) == [("exception", "scheduled", "canceled")]
    assert status["runs"][0]["workerId"] == "w1"
    with pytest.raises(TaskclusterRestFailure) as info:  # the worker's next reclaim
        await as_worker.reclaimTask(task_id, 0)
    assert info.value.status_code == 409
    with pytest.raises(TaskclusterRestFailure) as info:
        await as_worker.reportCompleted(task_id, 0)
    assert info.value.status_code == 409

    # The tip was deleted with the claim's receipt: past takenUntil nothing reappears,
    # and nothing retries the task.
    async def tips_and_status() -> tuple[list[Any], dict[str, Any]]:
        return await sas.poll_once(http, urls), (await queue.status(task_id))["status"]

    await stays(tips_and_status, lambda seen: seen == ([], status), for_=3.0, interval=0.5,
                what="no tip and no retry for the canceled task")


async def test_cancel_task_needs_its_scope_and_a_refusal_changes_nothing(
        make_server: ServerFactory) -> None:
    server = await make_server(clients=(CANCELER,), anonymous_scopes=())
    root, canceler = _queue(server), _queue(server, CANCELER)
    group, elsewhere = slugid(), slugid()
    mine, other = slugid(), slugid()
    await root.createTask(mine, definition(taskGroupId=group))
    await root.createTask(other, definition(taskGroupId=elsewhere, schedulerId="elsewhere"))
    with pytest.raises(TaskclusterRestFailure) as info:
        await canceler.cancelTask(other)
    assert info.value.status_code == 403
    assert f"queue:cancel-task:elsewhere/{elsewhere}/{other}" in info.value.body["message"]
    assert (await root.status(other))["status"]["state"] == "pending"
    assert (await canceler.cancelTask(mine))["status"]["state"] == "exception"
    with pytest.raises(TaskclusterRestFailure) as info:
        await canceler.cancelTask(slugid())
    assert info.value.status_code == 404
