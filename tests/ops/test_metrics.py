"""What an operator scrapes and reads: ``GET /metrics`` and the one access-log line per
request."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from azqueue.cli.parser import RESOLVERS
from azqueue.logs import JsonLines
from azqueue.testing import sas
from azqueue.testing.tasks import create, definition
from tests.servers import Server, ServerFactory
from tests.waiting import eventually

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(http: aiohttp.ClientSession, server: Server) -> Samples:
    async with http.get(f"{server.root_url}/metrics") as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_count_a_lifecycle_requests_storage_and_pending_tips(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        anonymous: aiohttp.ClientSession) -> None:
    """Scraped without credentials, as Prometheus does; counters are the process's, so
    the test compares before and after."""
    server = await make_server()
    before = await scrape(anonymous, server)
    pending_id = await create(http, server.api, definition("prov/metrics-pending"))
    task_id = await create(http, server.api, definition("prov/metrics"))
    urls = await sas.poll_task_urls(http, server.api, "prov", "metrics")
    [message] = await sas.poll_once(http, urls)
    claim_code, claim = await sas.claim(http, server.api, message)
    assert claim_code == 200 and claim["status"]["taskId"] == task_id
    code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed", {})
    assert code == 200
    async with http.get(f"{server.api}/task/{pending_id}/nonsense") as r:
        assert r.status == 404
    after = await scrape(anonymous, server)

    def grew(name: str, by: float = 1, **labels: str) -> bool:
        return value(after, name, **labels) - value(before, name, **labels) >= by

    assert grew("azqueue_api_requests_total", 2, endpoint="createTask", status="200")
    assert grew("azqueue_api_requests_total", endpoint="claimTask", status="200")
    assert grew("azqueue_api_requests_total", endpoint="reportCompleted", status="200")
    assert grew("azqueue_api_requests_total", endpoint="unknown", status="404")
    assert grew("azqueue_api_request_duration_seconds_count", 2, endpoint="createTask")
    assert grew("azqueue_runs_total", 2, state="pending", reason="scheduled")
    assert grew("azqueue_runs_total", state="running", reason="")
    assert grew("azqueue_runs_total", state="completed", reason="completed")
    assert grew("azqueue_storage_requests_total", 2, service="table", operation="PUT") or \
        grew("azqueue_storage_requests_total", 2, service="table", operation="POST")
    assert grew("azqueue_storage_requests_total", 2, service="queue", operation="POST")
    # The unclaimed task's tip, in the last of the seven queues (the default priority),
    # once the background sample that the scrapes started has seen it.
    await eventually(lambda: scrape(anonymous, server), lambda samples: value(
        samples, "azqueue_pending_tips", task_queue="prov/metrics-pending",
        priority="lowest") >= 1, what="the pending tip sampled")
    assert ("azqueue_resolver_lag_seconds", frozenset({("resolver", "claims")})) in after


async def test_every_api_request_is_one_access_log_line_naming_endpoint_status_and_client(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="azqueue.access")
    task_id = await create(http, server.api, definition("prov/logged"))
    async with anonymous.get(f"{server.api}/task/{task_id}/status") as r:
        assert r.status == 200
    lines = [r for r in caplog.records if r.name == "azqueue.access"]
    created = [r.getMessage() for r in lines if f"/task/{task_id} " in r.getMessage() + " "]
    assert len(created) == 1
    assert created[0].startswith(f"PUT /api/queue/v1/task/{task_id} 200 ")
    assert created[0].endswith("createTask client=root")
    [read] = [r for r in lines if r.getMessage().endswith("status client=anonymous")]
    fields = json.loads(JsonLines().format(read))
    assert fields["level"] == "INFO" and fields["logger"] == "azqueue.access"
    assert fields["endpoint"] == "status" and fields["status"] == 200
    assert fields["clientId"] == "anonymous" and fields["method"] == "GET"
    assert isinstance(fields["ms"], float) and fields["message"] == read.getMessage()


async def test_metrics_time_how_long_runs_wait_and_run_and_count_running_runs(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        anonymous: aiohttp.ClientSession) -> None:
    """A claim observes the time pending by task queue, a resolution the run time by resolution, and
    the running gauge counts a run of the claim index (claimTimeout 2 s: indexed after
    1 s) of a task queue this process is active in."""
    server = await make_server(claim_timeout=2)
    before = await scrape(anonymous, server)
    ids = [await create(http, server.api, definition("prov/metrics-runs")) for _ in range(3)]
    code, body = await sas.post(http, f"{server.api}/claim-work/prov%2Fmetrics-runs",
                                {"workerGroup": "wg", "workerId": "w1", "tasks": 3})
    assert code == 200 and len(body["tasks"]) == 3
    for task_id, outcome in zip(ids, ("completed", "failed")):
        code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/{outcome}", {})
        assert code == 200

    async def claimed() -> int:
        async with http.get(f"{server.api}/task-queues/prov%2Fmetrics-runs/counts") as r:
            return int((await r.json())["claimedTasks"])

    # The third run keeps its claim (reclaimed) until the claim index lists it.
    async def reclaimed_and_indexed() -> int:
        await sas.post(http, f"{server.api}/task/{ids[2]}/runs/0/reclaim", {})
        return await claimed()

    await eventually(reclaimed_and_indexed, lambda n: n == 1, what="the running run indexed")
    after = await scrape(anonymous, server)

    def grew(name: str, by: float = 1, **labels: str) -> bool:
        return value(after, name, **labels) - value(before, name, **labels) >= by

    assert grew("azqueue_task_pending_seconds_count", 3, task_queue="prov/metrics-runs")
    assert grew("azqueue_run_seconds_count", resolution="completed")
    assert grew("azqueue_run_seconds_count", resolution="failed")
    assert value(after, "azqueue_run_seconds_bucket", resolution="failed", le="+Inf") >= 1
    await eventually(lambda: scrape(anonymous, server), lambda samples: value(
        samples, "azqueue_runs_running", task_queue="prov/metrics-runs") == 1,
        what="the running run sampled")


async def test_metrics_have_no_created_series_count_the_dashboard_and_name_resolvers_as_the_cli(
        server: Server, anonymous: aiohttp.ClientSession) -> None:
    before = await scrape(anonymous, server)
    for path in ("/", "/dashboard/app.js", "/dashboard/style.css"):
        async with anonymous.get(f"{server.root_url}{path}") as r:
            assert r.status == 200
    async with anonymous.get(f"{server.root_url}/dashboard/recent") as r:
        assert r.status == 200 and (await r.json())["note"] == "recent on this replica"
    async with anonymous.get(f"{server.root_url}/metrics") as r:
        text = await r.text()
    after = await scrape(anonymous, server)
    assert "_created" not in text
    assert value(after, "azqueue_api_requests_total", endpoint="dashboard", status="200") - \
        value(before, "azqueue_api_requests_total", endpoint="dashboard", status="200") == 3
    assert value(after, "azqueue_api_requests_total", endpoint="dashboardRecent",
                 status="200") >= 1
    assert value(after, "azqueue_api_requests_total", endpoint="unknown", status="200") == \
        value(before, "azqueue_api_requests_total", endpoint="unknown", status="200")
    resolvers = {dict(labels)["resolver"] for name, labels in after
                 if name == "azqueue_resolver_lag_seconds"}
    assert {"claims", "deadlines", "dependencies", "expiry", "groups"} <= resolvers
    assert resolvers <= set(RESOLVERS)
