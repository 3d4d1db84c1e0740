"""What an operator scrapes and reads: ``GET /metrics`` and the one access-log line per
request."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from azqueue.logs import JsonLines
from tests import sas
from tests.servers import Server, ServerFactory
from tests.tasks import create, definition

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
    # The unclaimed task's tip, in the last of the seven queues (the default priority).
    assert value(after, "azqueue_pending_tips", task_queue="prov/metrics-pending",
                 priority="lowest") >= 1
    assert ("azqueue_resolver_lag_seconds", frozenset({("resolver", "claim")})) in after


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
