"""createTask: idempotency, the conflicting redefinition, and every schema rule."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest

from azqueue.testing import sas
from azqueue.testing.tasks import definition, iso, slugid
from tests.servers import Server


async def _put(http: aiohttp.ClientSession, server: Server, task_id: str,
               body: Any) -> tuple[int, dict[str, Any]]:
    kwargs = {"data": body} if isinstance(body, (str, io.BytesIO)) else {"json": body}
    async with http.put(f"{server.api}/task/{task_id}", **kwargs) as r:
        assert r.content_type == "application/json"
        return r.status, await r.json()


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with http.get(url) as r:
        return r.status, await r.json()


async def test_same_definition_is_idempotent_and_a_different_one_conflicts(
        server: Server, http: aiohttp.ClientSession) -> None:
    task_id = slugid()
    body = definition("prov/idem")
    code, first = await _put(http, server, task_id, body)
    assert code == 200
    code, second = await _put(http, server, task_id, body)
    assert code == 200 and second == first
    code, err = await _put(http, server, task_id, {**body, "retries": 2})
    assert code == 409 and err["code"] == "RequestConflict"
    assert "different definition" in err["message"]
    code, stored = await _get(http, f"{server.api}/task/{task_id}")
    assert code == 200 and stored["retries"] == 5


async def test_definition_answers_with_both_task_queue_forms_and_defaults(
        server: Server, http: aiohttp.ClientSession) -> None:
    task_id = slugid()
    body = definition()
    del body["taskQueueId"]
    body.update(provisionerId="prov", workerType="both")
    code, created = await _put(http, server, task_id, body)
    assert code == 200
    status = created["status"]
    assert (status["taskQueueId"], status["provisionerId"], status["workerType"]) == (
        "prov/both", "prov", "both")
    code, task = await _get(http, f"{server.api}/task/{task_id}")
    assert task["taskQueueId"] == "prov/both" and task["provisionerId"] == "prov"
    assert task["retries"] == 5 and task["priority"] == "lowest"
    assert task["schedulerId"] == "-" and task["taskGroupId"] == task_id
    deadline = datetime.fromisoformat(task["deadline"].replace("Z", "+00:00"))
    expires = datetime.fromisoformat(task["expires"].replace("Z", "+00:00"))
    assert expires - deadline == timedelta(days=365)


async def test_normal_priority_is_lowest(server: Server, http: aiohttp.ClientSession) -> None:
    task_id = slugid()
    body = definition("prov/normal", priority="normal")
    code, status = await _put(http, server, task_id, body)
    assert code == 200
    urls = await sas.poll_task_urls(http, server.api, "prov", "normal")
    assert len(await sas.get_messages(http, urls["queues"][6]["signedPollUrl"], 32)) == 1
    # It is stored as what it means, as Taskcluster stored it (before release 102, which
    # refuses the word), and the same definition sent again is the same task.
    code, task = await _get(http, f"{server.api}/task/{task_id}")
    assert task["priority"] == "lowest"
    assert await _put(http, server, task_id, body) == (200, status)


# A timedelta stands for that long from the moment the test runs.
BAD_BODIES: list[tuple[str, dict[str, Any], str]] = [
    ("created too old", {"created": -timedelta(minutes=16)}, "created"),
    ("created in the future", {"created": timedelta(minutes=16)}, "created"),
    ("deadline in the past", {"deadline": -timedelta(seconds=1)}, "deadline"),
    ("deadline beyond 5 days", {"deadline": timedelta(days=5, minutes=1)}, "deadline"),
    ("expires before deadline", {"expires": timedelta(minutes=30)}, "expires"),
    ("retries above 49", {"retries": 50}, "retries"),
    ("retries below 0", {"retries": -1}, "retries"),
    ("identifier too long", {"schedulerId": "s" * 39}, "schedulerId"),
    ("identifier with a bad character", {"projectId": "a.b"}, "projectId"),
    ("task queue too long", {"taskQueueId": "p/" + "w" * 39}, "taskQueueId"),
    # A task's workerType: lowercase, digits and `-`, as Taskcluster's task.json says.
    ("worker type in capitals", {"taskQueueId": "prov/Schema"}, "taskQueueId"),
    ("worker type with an underscore", {"provisionerId": "prov", "workerType": "sche_ma"},
     "workerType"),
    ("metadata with a field of its own", {"metadata": {
        "name": "t", "description": "d", "owner": "o@example.com",
        "source": "https://example.com", "colour": "blue"}}, "colour"),
    ("metadata source not a URL", {"metadata": {
        "name": "t", "description": "d", "owner": "o@example.com", "source": "here"}},
     "source"),
    ("unknown priority", {"priority": "urgent"}, "priority"),
    ("bad timestamp", {"deadline": "tomorrow"}, "deadline"),
    ("unknown field", {"colour": "blue"}, "colour"),
    ("task queue forms disagree", {"provisionerId": "other"}, "provisionerId"),
    ("bad taskGroupId", {"taskGroupId": "not-a-slugid"}, "taskGroupId"),
    ("expires beyond year 9999 in UTC", {"expires": "9999-12-31T23:59:59.000-01:00"}, "expires"),
    ("created before year 1 in UTC", {"created": "0001-01-01T00:00:00.000+01:00"}, "created"),
]


@pytest.mark.parametrize("change,field", [(c, f) for _, c, f in BAD_BODIES],
                         ids=[name for name, _, _ in BAD_BODIES])
async def test_schema_errors_name_the_field_and_write_nothing(
        server: Server, http: aiohttp.ClientSession, change: dict[str, Any], field: str) -> None:
    task_id = slugid()
    now = datetime.now(UTC)
    body = {**definition("prov/schema"),
            **{k: iso(now + v) if isinstance(v, timedelta) else v for k, v in change.items()}}
    code, err = await _put(http, server, task_id, body)
    assert code == 400, err
    assert err["code"] == "InputValidationError"
    assert field in err["message"]
    assert err["requestInfo"]["method"] == "PUT"
    code, _ = await _get(http, f"{server.api}/task/{task_id}/status")
    assert code == 404
    urls = await sas.poll_task_urls(http, server.api, "prov", "schema")
    for q in urls["queues"]:
        assert await sas.get_messages(http, q["signedPollUrl"], 32) == []


async def test_missing_required_fields_and_malformed_json(
        server: Server, http: aiohttp.ClientSession) -> None:
    body = definition()
    del body["metadata"]
    code, err = await _put(http, server, slugid(), body)
    assert code == 400 and "metadata" in err["message"]
    code, err = await _put(http, server, slugid(), "{not json")
    assert code == 400 and err["code"] == "MalformedPayload"
    code, err = await _put(http, server, slugid(), "[" * 100_000)
    assert code == 400 and err["code"] == "MalformedPayload" and "nested" in err["message"]
    nan = json.dumps({**definition(), "payload": {"x": float("nan")}})
    code, err = await _put(http, server, slugid(), nan)
    assert code == 400 and err["code"] == "MalformedPayload" and "NaN" in err["message"]
    code, err = await _put(http, server, "not-a-slug", definition())
    assert code == 400 and "taskId" in err["message"]
    code, err = await _put(http, server, slugid(), {**definition(), "payload": {"x": "x" * 500_000}})
    assert code == 413 and err["code"] == "InputTooLarge" and "definition" in err["message"]
    huge = json.dumps({**definition(), "payload": {"x": "x" * 3_000_000}}).encode()
    code, err = await _put(http, server, slugid(), io.BytesIO(huge))
    assert code == 413 and err["code"] == "InputTooLarge"
    code, err = await _get(http, f"{server.api}/task/{slugid()}")
    assert code == 404 and err["code"] == "ResourceNotFound"
    code, err = await _get(http, f"{server.api}/no/such/endpoint")
    assert code == 404


async def test_claim_and_report_input_errors(server: Server, http: aiohttp.ClientSession) -> None:
    task_id = slugid()
    await _put(http, server, task_id, definition())
    code, err = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/claim", {"workerGroup": "g"})
    assert code == 400 and "workerId" in err["message"]
    code, err = await sas.post(http, f"{server.api}/task/{task_id}/runs/x/claim",
                               {"workerGroup": "g", "workerId": "w"})
    assert code == 400 and "runId" in err["message"]
    code, err = await sas.post(http, f"{server.api}/task/{task_id}/runs/%C2%B2/claim",
                               {"workerGroup": "g", "workerId": "w"})  # a digit, not ASCII
    assert code == 400 and "runId" in err["message"]
    async with http.get(f"{server.api}/task/{task_id}/dependents?limit=%C2%B2") as r:
        assert r.status == 400 and "limit" in (await r.json())["message"]
    code, err = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/claim",
                               {"workerGroup": "g", "workerId": "w", "messageId": "m"})
    assert code == 400 and "receipt" in err["message"]
    code, err = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/exception",
                               {"reason": "canceled"})
    assert code == 400 and "reason" in err["message"]
    code, err = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed")
    assert code == 409 and "pending" in err["message"]
    code, err = await sas.post(http, f"{server.api}/task/{task_id}/runs/3/reclaim")
    assert code == 409
