"""taskcluster-taskgraph (Mozilla's decision-task library), unmodified from PyPI, against
a test server: a decision task claimed through claimWork submits a graph with its claim's
credentials through taskgraph's own ``optimize_task_graph`` and ``create_tasks``, and
reads it back with taskgraph's helpers, as a decision task (or an action) does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import taskcluster.aio
from taskgraph.create import create_tasks
from taskgraph.graph import Graph
from taskgraph.optimize.base import optimize_task_graph
from taskgraph.task import Task
from taskgraph.taskgraph import TaskGraph
from taskgraph.util import taskcluster as tc

from azqueue.testing.tasks import definition, slugid
from tests.servers import ROOT, Server

TRUST_DOMAIN = "tgtest"
SCHEDULER = f"{TRUST_DOMAIN}-level-1"


@pytest.fixture
def as_decision_task(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, dict[str, str]],
                                                                          None]]:
    """Set the environment taskgraph reads its root URL and credentials from, as a
    worker sets it for a decision task (its caches emptied)."""
    def use(root_url: str, credentials: dict[str, str]) -> None:
        monkeypatch.delenv("TASKCLUSTER_PROXY_URL", raising=False)
        monkeypatch.setenv("TASKCLUSTER_ROOT_URL", root_url)
        monkeypatch.setenv("TASKCLUSTER_CLIENT_ID", credentials["clientId"])
        monkeypatch.setenv("TASKCLUSTER_ACCESS_TOKEN", credentials["accessToken"])
        monkeypatch.setenv("TASKCLUSTER_CERTIFICATE", credentials["certificate"])
        _forget()

    def _forget() -> None:
        tc.get_root_url.cache_clear()
        tc.get_taskcluster_client.cache_clear()
        tc._task_definitions_cache.cache.clear()

    yield use
    _forget()


def _task(label: str, queue: str, deps: dict[str, str], **fields: Any) -> Task:
    body: dict[str, Any] = {
        "taskQueueId": f"prov/{queue}", "priority": "low",
        "created": {"relative-datestamp": "0 seconds"},
        "deadline": {"relative-datestamp": "1 day"},
        "expires": {"relative-datestamp": "2 days"},
        "payload": {"command": ["true"]},
        "metadata": {"name": label, "description": label, "owner": "tg@example.com",
                     "source": "https://example.com/taskgraph"},
        **fields}
    return Task(kind=label.split("-")[0], label=label, attributes={}, task=body,
                dependencies=deps)


def _graph() -> TaskGraph:
    """A diamond (build → test-a, test-b → report), a fan-out sent twice, a failing lint
    whose dependents wait on all-resolved and all-completed, an artifact reference,
    relative datestamps, routes, scopes and priorities."""
    tasks = [
        _task("build", "tg-build", {}, routes=["tg-test.build"], scopes=["tg:build"],
              priority="high"),
        _task("test-a", "tg-test", {"build": "build"}, payload={"installer": {
            "artifact-reference": "<build/public/build/target.tar.gz>"}}),
        _task("test-b", "tg-test", {"build": "build"}),
        _task("report", "tg-test", {"a": "test-a", "b": "test-b"}, priority="lowest"),
        _task("fanout", "tg-test", {"build": "build"}),
        _task("lint", "tg-lint", {}),
        _task("summary-resolved", "tg-test", {"lint": "lint"}, requires="all-resolved"),
        _task("summary-completed", "tg-test", {"lint": "lint"}),
    ]
    tasks[4].attributes["task_duplicates"] = 2
    edges = {(t.label, dep, name) for t in tasks for name, dep in t.dependencies.items()}
    return TaskGraph({t.label: t for t in tasks}, Graph({t.label for t in tasks}, edges))


async def test_a_decision_task_submits_and_reads_back_a_graph_with_its_claim_credentials(
        server: Server, as_decision_task: Callable[[str, dict[str, str]], None]) -> None:
    root = taskcluster.aio.Queue({"rootUrl": server.root_url, "credentials": {
        "clientId": ROOT.client_id, "accessToken": ROOT.access_token}})
    decision = slugid()
    await root.createTask(decision, definition(
        "prov/tg-decision", schedulerId=SCHEDULER, taskGroupId=decision,
        scopes=["queue:create-task:*", f"queue:scheduler-id:{SCHEDULER}",
                "queue:route:tg-test.*", "tg:*"]))
    claimed = await root.claimWork("prov/tg-decision", {
        "workerGroup": "tg", "workerId": "decider", "tasks": 1})
    (claim,) = claimed["tasks"]
    as_decision_task(server.root_url, claim["credentials"])

    target = _graph()
    params = {"level": "1"}

    def submit() -> dict[str, str]:
        optimized, label_to_taskid = optimize_task_graph(
            target, set(target.tasks), params, set(), decision)
        create_tasks({"trust-domain": TRUST_DOMAIN}, optimized, label_to_taskid, params,
                     decision)
        return dict(label_to_taskid)

    ids = await asyncio.to_thread(submit)
    assert set(ids) == set(target.tasks)

    def read_back() -> None:
        definitions = tc.get_task_definitions(list(ids.values()))
        assert set(definitions) == set(ids.values())
        build = tc.get_task_definition(ids["build"])
        assert build == definitions[ids["build"]]
        assert (build["schedulerId"], build["taskGroupId"]) == (SCHEDULER, decision)
        assert (build["priority"], build["routes"], build["scopes"]) == (
            "high", ["tg-test.build"], ["tg:build"])
        assert build["dependencies"] == [decision]
        installer = definitions[ids["test-a"]]["payload"]["installer"]
        assert installer.endswith(f"/task/{ids['build']}/artifacts/public/build/target.tar.gz")
        assert sorted(definitions[ids["report"]]["dependencies"]) == sorted(
            [ids["test-a"], ids["test-b"]])
        assert definitions[ids["summary-resolved"]]["requires"] == "all-resolved"

        assert tc.state_task(ids["build"]) == "unscheduled"
        assert tc.status_task(decision)["state"] == "running"
        batched = tc.status_task_batched([ids["build"], decision])
        assert {t: s["state"] for t, s in batched.items()} == {
            ids["build"]: "unscheduled", decision: "running"}
        ancestors = tc.get_ancestors(ids["report"])
        assert {ancestors[ids[label]] for label in ("test-a", "test-b", "build")} == {
            "test-a", "test-b", "build"}
        incomplete = tc.list_task_group_incomplete_tasks(decision)
        # the graph, the second fan-out task, and the decision task itself
        assert set(ids.values()) | {decision} <= set(incomplete)
        assert len(incomplete) == len(ids) + 2
        assert tc.list_artifacts(decision) == []

    await asyncio.to_thread(read_back)
    await taskcluster.aio.Queue({"rootUrl": server.root_url, "credentials": claim[
        "credentials"]}).reportCompleted(decision, claim["runId"])
    states = await asyncio.to_thread(lambda: {
        label: tc.state_task(ids[label]) for label in ("build", "lint", "test-a")})
    assert states == {"build": "pending", "lint": "pending", "test-a": "unscheduled"}
