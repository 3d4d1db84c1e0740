"""What deployers are given under ``deploy/``: the Grafana dashboard and the Prometheus
alert rules graph and alert only on metrics a live server's ``/metrics`` exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from azqueue.testing import sas
from azqueue.testing.tasks import create, definition
from tests.events.consumers import AMQP_URL
from tests.servers import IN_CI, ServerFactory
from tests.waiting import eventually

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# A metric in PromQL: a name of ours, or any name a selector or range follows.
OURS = re.compile(r"\bazqueue_[a-z_]+\b")
SELECTED = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{\[]")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}


def grafana_expressions() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "azqueue.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def alert_expressions() -> dict[str, str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "azqueue-rules.yml").read_text())
    return {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}


def metric_names(expression: str) -> set[str]:
    return set(OURS.findall(expression)) | set(SELECTED.findall(expression))


def test_the_alert_rules_cover_backlog_storage_resolvers_outbox_and_server_errors() -> None:
    rules = alert_expressions()
    assert {"AzqueueTasksWaitLong", "AzqueueBacklogNotClaimed", "AzqueueStorageFailing",
            "AzqueueResolverLagging", "AzqueueOutboxNotDraining",
            "AzqueueServerErrors"} <= set(rules)
    graphed = set().union(*map(metric_names, grafana_expressions()))
    for wanted in ("azqueue_api_requests_total", "azqueue_api_request_duration_seconds_bucket",
                   "azqueue_pending_tips", "azqueue_runs_running", "azqueue_runs_total",
                   "azqueue_task_pending_seconds_bucket", "azqueue_storage_requests_total",
                   "azqueue_resolver_lag_seconds", "azqueue_outbox_pending"):
        assert wanted in graphed, f"the Grafana dashboard graphs no {wanted}"


@pytest.fixture
async def amqp_url() -> str:
    try:
        connection = await aio_pika.connect(AMQP_URL, timeout=5)
    except Exception as e:  # noqa: BLE001 - any failure means "no broker here"
        if IN_CI:
            pytest.fail(f"RabbitMQ is not reachable at {AMQP_URL} ({e})")
        pytest.skip(f"RabbitMQ is not reachable at {AMQP_URL} ({e}): the outbox metrics "
                    "need it")
    await connection.close()
    return AMQP_URL


async def test_grafana_and_alerts_use_only_metrics_a_live_server_exports(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str) -> None:
    server = await make_server(amqp_url=amqp_url)
    ids = [await create(http, server.api, definition("prov/deploy")) for _ in range(3)]
    code, body = await sas.post(http, f"{server.api}/claim-work/prov%2Fdeploy",
                                {"workerGroup": "wg", "workerId": "w1", "tasks": 3})
    assert code == 200 and len(body["tasks"]) == 3
    for task_id, outcome in zip(ids, ("completed", "failed")):
        code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/{outcome}", {})
        assert code == 200
    async with http.get(f"{server.api}/task/{ids[0]}/nonsense") as r:
        assert r.status == 404

    async def exported() -> set[str]:
        async with http.get(f"{server.root_url}/metrics") as r:
            text = await r.text()
        # Each sample's name, and the names of a family declared without samples yet (a
        # counter nothing has counted: azqueue_resolver_items_total on a quiet server).
        names = set()
        for family in text_string_to_metric_families(text):
            names |= {s.name for s in family.samples}
            names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
        return names

    # The sampled gauges come with the background sample the first scrape starts.
    names = await eventually(exported, lambda n: "azqueue_events_published_total" in n
                             and "azqueue_outbox_pending" in n,
                             what="the events published counted and the outbox sampled")
    used: dict[str, set[str]] = {}
    for where, expressions in (("deploy/grafana/azqueue.json", grafana_expressions()),
                               ("deploy/prometheus/azqueue-rules.yml",
                                list(alert_expressions().values()))):
        for expression in expressions:
            for name in metric_names(expression):
                used.setdefault(name, set()).add(where)
    unknown = {name: sorted(where) for name, where in used.items() if name not in names}
    assert not unknown, f"metrics /metrics does not export: {unknown}"
    assert len(used) >= 12
