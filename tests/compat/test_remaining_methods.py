"""The methods of the official client that the other compatibility modules do not drive:
the monitoring endpoints, scheduleTask and listDependentTasks; and a check that every one
of the client's 50 Queue methods is driven by some compatibility test."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import taskcluster

from azqueue.testing.tasks import definition, slugid
from tests.compat.reference import assert_matches
from tests.servers import ROOT, Server


def _queue(server: Server) -> Any:
    return taskcluster.Queue({"rootUrl": server.root_url, "maxRetries": 0, "credentials": {
        "clientId": ROOT.client_id, "accessToken": ROOT.access_token}})


async def test_the_monitoring_endpoints_answer_as_taskcluster_services_do(server: Server) -> None:
    q = _queue(server)
    assert (await asyncio.to_thread(q.ping))["alive"] is True
    assert await asyncio.to_thread(q.lbheartbeat) == {}
    assert await asyncio.to_thread(q.heartbeat) == {}
    version = await asyncio.to_thread(q.version)
    assert set(version) >= {"source", "version", "commit", "build"}  # Dockerflow's keys


async def test_schedule_task_and_list_dependent_tasks(server: Server) -> None:
    """A task waiting on another is unscheduled until scheduleTask makes it pending; the
    other lists it as a dependent, each entry a task definition and status."""
    q = _queue(server)
    first, waiting = slugid(), slugid()
    await asyncio.to_thread(q.createTask, first, definition("prov/compat-rest"))
    body = definition("prov/compat-rest")
    body["dependencies"] = [first]
    created = await asyncio.to_thread(q.createTask, waiting, body)
    assert created["status"]["state"] == "unscheduled"

    listed = await asyncio.to_thread(q.listDependentTasks, first)
    assert listed["taskId"] == first and [t["status"]["taskId"] for t in listed["tasks"]] == [
        waiting]
    for entry in listed["tasks"]:
        assert_matches("task-definition-and-status", entry)

    scheduled = await asyncio.to_thread(q.scheduleTask, waiting)
    assert_matches("task-status-response", scheduled)
    assert scheduled["status"]["state"] == "pending"


def test_every_method_of_the_official_client_is_driven_by_a_compatibility_test() -> None:
    """Each name of ``taskcluster.Queue.funcinfo`` is called (``.name(``) in this
    directory's tests: a method the client gains, or a test that is dropped, fails here."""
    sources = "\n".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))
    undriven = [name for name in taskcluster.Queue.funcinfo
                if not re.search(rf"\.{name}\b|\"{name}\"", sources)]
    assert undriven == []


class QueueWithPollTaskUrls(taskcluster.Queue):  # type: ignore[misc]
    """The example of docs/workers/sas.md: the official client, taught pollTaskUrls the
    way it declares every method (a ``funcinfo`` entry, signed by the client like any call)."""

    funcinfo = {**taskcluster.Queue.funcinfo, "pollTaskUrls": {
        "args": ["provisionerId", "workerType"], "method": "get", "name": "pollTaskUrls",
        "route": "/poll-task-url/<provisionerId>/<workerType>", "stability": "stable"}}

    def pollTaskUrls(self, *args: Any, **kwargs: Any) -> Any:
        return self._makeApiCall(self.funcinfo["pollTaskUrls"], *args, **kwargs)


async def test_the_official_client_calls_poll_task_urls_as_readme_shows(server: Server) -> None:
    """pollTaskUrls is not among the modern client's methods; docs/workers/sas.md shows how
    to call it with the client's own signing."""
    assert "pollTaskUrls" not in taskcluster.Queue.funcinfo
    q = QueueWithPollTaskUrls({"rootUrl": server.root_url, "maxRetries": 0, "credentials": {
        "clientId": ROOT.client_id, "accessToken": ROOT.access_token}})
    urls = await asyncio.to_thread(q.pollTaskUrls, "prov", "compat-poll")
    assert len(urls["queues"]) == 7 and "expires" in urls
    assert all({"signedPollUrl", "signedDeleteUrl"} <= set(u) for u in urls["queues"])
