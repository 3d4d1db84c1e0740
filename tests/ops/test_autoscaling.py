"""The autoscaling files of ``deploy/`` (a KEDA ScaledObject, a Container App's custom
scale rule) parse, and every metrics-api trigger in them reads an endpoint of this server's
route table, for the task queue its workers take tasks from, and finds a count where its
``valueLocation`` says: asked of a live server as KEDA asks (no credentials), after
tasks were created and one claimed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
import yaml

from azqueue.api.app import ROUTES
from azqueue.testing import sas
from azqueue.testing.tasks import create, definition
from tests.servers import ServerFactory

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
FILES = (DEPLOY / "keda" / "worker-scaledobject.yaml", DEPLOY / "container-apps" / "worker.yaml")
API = "/api/queue/v1"


def documents() -> list[tuple[str, Any]]:
    return [(path.name, doc) for path in FILES for doc in yaml.safe_load_all(path.read_text())]


def triggers(doc: Any) -> list[dict[str, Any]]:
    """The metrics-api triggers of a ScaledObject or of a Container App's scale rules."""
    if doc.get("kind") == "ScaledObject":
        found = doc["spec"]["triggers"]
    elif "properties" in doc:
        found = [rule["custom"] for rule in doc["properties"]["template"]["scale"]["rules"]]
    else:
        return []
    return [t for t in found if t["type"] == "metrics-api"]


def worker_task_queues(doc: Any) -> set[str]:
    """The --task-queue of every `azqueue worker` container of a document."""
    if doc.get("kind") == "Deployment":
        containers = doc["spec"]["template"]["spec"]["containers"]
    elif "properties" in doc:
        containers = doc["properties"]["template"]["containers"]
    else:
        return set()
    return {c["command"][c["command"].index("--task-queue") + 1] for c in containers}


def route_of(path: str) -> str:
    """The name of the route of this server that ``path`` (under the API) reaches."""
    names = [r.name for r in ROUTES if r.method == "GET" and r.pattern.match(path)]
    assert len(names) == 1, f"{path} reaches no GET route of the server ({names})"
    return names[0]


def test_each_file_scales_the_workers_of_the_task_queue_it_counts() -> None:
    """Every file has a metrics-api trigger, each reads pendingTasks or taskQueueCounts of
    the task queue that file's workers claim from, and the ScaledObject's formula adds the
    triggers it names."""
    for path in FILES:
        docs = list(yaml.safe_load_all(path.read_text()))
        found = [t for doc in docs for t in triggers(doc)]
        assert found, f"{path.name} has no metrics-api trigger"
        queues = set().union(*map(worker_task_queues, docs))
        for trigger in found:
            url = urlsplit(trigger["metadata"]["url"])
            assert url.path.startswith(API + "/"), url
            assert route_of(url.path) in ("pendingTasks", "taskQueueCounts"), url
            assert queues == {unquote(url.path.split("/")[5])}, (queues, url.path)
        for doc in docs:
            formula = doc.get("spec", {}).get("advanced", {}).get("scalingModifiers", {})
            if formula:
                names = {t["name"] for t in doc["spec"]["triggers"]}
                assert set(re.findall(r"[a-z]\w*", formula["formula"])) <= names, formula


async def test_each_trigger_finds_its_count_where_keda_looks(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    server = await make_server()
    counted = {}
    for name, doc in documents():
        for trigger in triggers(doc):
            meta = trigger["metadata"]
            url = urlsplit(meta["url"])
            task_queue = unquote(url.path.split("/")[5])
            if task_queue not in counted:
                for _ in range(3):
                    await create(http, server.api, definition(task_queue))
                code, body = await sas.post(
                    http, f"{server.api}/claim-work/{url.path.split('/')[5]}",
                    {"workerGroup": "wg", "workerId": "w1", "tasks": 1})
                assert code == 200 and len(body["tasks"]) == 1, body
                counted[task_queue] = {"pendingTasks": 2, "claimedTasks": 1}
            assert meta.get("format", "json") == "json"
            async with aiohttp.ClientSession() as anonymous, \
                    anonymous.get(server.root_url + url.path) as r:
                assert r.status == 200, (name, url.path, await r.text())
                answer = await r.json()
            value = answer
            for key in meta["valueLocation"].split("."):
                value = value[key]
            assert value == counted[task_queue][meta["valueLocation"]], (name, answer)
