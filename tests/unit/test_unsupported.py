"""The list of Queue API methods behind the 501 answers."""

from __future__ import annotations

import taskcluster

from azqueue.api.unsupported import QUEUE_API, method_of


def test_the_list_is_the_official_clients_queue_api() -> None:
    """Every method of the official client's `Queue.funcinfo`, with its HTTP method and
    route: a method missing here would answer 404 instead of 501."""
    assert sorted(QUEUE_API) == sorted(
        (name, f["method"].upper(), f["route"]) for name, f in taskcluster.Queue.funcinfo.items())


def test_a_request_is_told_apart_by_method_and_path() -> None:
    api = "/api/queue/v1"
    assert method_of("POST", f"{api}/task/abc/rerun") == "rerunTask"
    assert method_of("GET", f"{api}/task/abc/runs/0/artifacts/public/a/b.txt") == "getArtifact"
    assert method_of("POST", f"{api}/task-queues/counts") == "taskQueueCountsBatch"
    assert method_of("DELETE", f"{api}/task/abc") is None
    assert method_of("GET", f"{api}/no/such/thing") is None
