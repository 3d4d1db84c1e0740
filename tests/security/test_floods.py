"""What one request may cost: an anonymous request makes a bounded number of storage
requests whatever it asks for, and the batch methods refuse more ids than they read."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp

from azqueue.testing.tasks import definition, slugid
from tests.servers import Server, ServerFactory

# The most storage requests one anonymous request may cost (docs/api/limits.md).
ANONYMOUS_BOUND = 100


async def _cost(server: Server, call: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
    """The storage requests the server made while ``call`` ran, and its result."""
    before = sum(server.services.health.storage_requests().values())
    result = await call()
    return sum(server.services.health.storage_requests().values()) - before, result


async def _quiet_server(make_server: ServerFactory) -> Server:
    # Resolvers off, and the doorbell's reads an hour apart: what the server counts is the
    # requests' own cost, however long they take.
    return await make_server(run_resolvers=False, doorbell_interval=3600.0)


async def _group_of(http: aiohttp.ClientSession, server: Server, size: int) -> tuple[str, list[str]]:
    group = slugid()
    ids = [slugid() for _ in range(size)]
    limit = asyncio.Semaphore(8)

    async def create(task_id: str) -> None:
        async with limit, http.put(f"{server.api}/task/{task_id}",
                                   json=definition(taskGroupId=group)) as r:
            assert r.status == 200, await r.text()

    await asyncio.gather(*(create(t) for t in ids))
    return group, ids


async def test_an_anonymous_taskQueueCountsBatch_of_many_task_queues_is_refused_naming_the_maximum(
        make_server: ServerFactory, anonymous: aiohttp.ClientSession) -> None:
    server = await _quiet_server(make_server)
    ids = [f"prov/wt-{i}" for i in range(50)]
    spent, (status, answer) = await _cost(server, lambda: _post(
        anonymous, f"{server.api}/task-queues/counts", {"taskQueueIds": ids}))
    assert status == 400, answer
    assert answer["code"] == "InputValidationError"
    assert "at most 5" in answer["message"], answer["message"]
    assert spent == 0


async def test_an_anonymous_taskQueueCountsBatch_at_the_maximum_stays_within_the_bound(
        make_server: ServerFactory, anonymous: aiohttp.ClientSession) -> None:
    server = await _quiet_server(make_server)
    ids = [f"prov/wt-{i}" for i in range(5)]
    spent, (status, answer) = await _cost(server, lambda: _post(
        anonymous, f"{server.api}/task-queues/counts", {"taskQueueIds": ids}))
    assert status == 200, answer
    assert len(answer["taskQueueCounts"]) == 5
    assert spent <= ANONYMOUS_BOUND, spent


async def test_task_queue_counts_read_the_claim_index_once_for_every_task_queue_of_a_batch(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    # 7 peeks a task queue, and one scan of the claim index and one read of the replicas'
    # claim notes for all of them.
    server = await _quiet_server(make_server)
    ids = [f"prov/wt-{i}" for i in range(40)]
    spent, (status, answer) = await _cost(server, lambda: _post(
        http, f"{server.api}/task-queues/counts", {"taskQueueIds": ids}))
    assert status == 200, answer
    assert [c["taskQueueId"] for c in answer["taskQueueCounts"]] == ids
    assert spent <= 7 * len(ids) + 2, spent


async def test_an_anonymous_listTaskGroup_reads_a_bounded_page_whatever_limit_asks(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        anonymous: aiohttp.ClientSession) -> None:
    server = await _quiet_server(make_server)
    group, ids = await _group_of(http, server, 120)
    listed: list[str] = []
    token: str | None = None
    while True:
        query = {"limit": "1000", **({"continuationToken": token} if token else {})}
        spent, (status, answer) = await _cost(server, lambda: _get(
            anonymous, f"{server.api}/task-group/{group}/list", query))
        assert status == 200, answer
        assert spent <= ANONYMOUS_BOUND, spent
        listed += [t["status"]["taskId"] for t in answer["tasks"]]
        token = answer.get("continuationToken")
        if token is None:
            break
    assert sorted(listed) == sorted(ids)  # all of them, page after page


async def test_an_anonymous_tasks_or_statuses_call_reads_a_bounded_page_and_says_where_to_go_on(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        anonymous: aiohttp.ClientSession) -> None:
    server = await _quiet_server(make_server)
    _, created = await _group_of(http, server, 10)
    asked = created + [slugid() for _ in range(990)]
    for path, key in (("tasks", "tasks"), ("tasks/status", "statuses")):
        found: list[str] = []
        token: str | None = None
        while True:
            query = {"limit": "1000", **({"continuationToken": token} if token else {})}
            spent, (status, answer) = await _cost(server, lambda: _post(
                anonymous, f"{server.api}/{path}", {"taskIds": asked}, query))
            assert status == 200, answer
            assert spent <= ANONYMOUS_BOUND, (path, spent)
            found += [t["taskId"] for t in answer[key]]
            token = answer.get("continuationToken")
            if token is None:
                break
        assert sorted(found) == sorted(created), path


async def test_tasks_and_statuses_refuse_more_than_1000_taskIds_naming_the_maximum(
        server: Server, http: aiohttp.ClientSession) -> None:
    for path in ("tasks", "tasks/status"):
        status, answer = await _post(http, f"{server.api}/{path}",
                                     {"taskIds": [slugid() for _ in range(1001)]})
        assert status == 400, (path, answer)
        assert answer["code"] == "InputValidationError"
        assert "1000" in answer["message"], answer["message"]


async def test_tasks_and_statuses_refuse_a_huge_body_before_reading_its_ids(
        server: Server, anonymous: aiohttp.ClientSession) -> None:
    body = json.dumps({"taskIds": [slugid() for _ in range(80_000)]}).encode()  # about 2 MB

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the size shows once read
        for start in range(0, len(body), 65536):
            yield body[start:start + 65536]

    for path in ("tasks", "tasks/status"):
        for data in (io.BytesIO(body), chunked()):
            async with anonymous.post(f"{server.api}/{path}", data=data,
                                      headers={"Content-Type": "application/json"}) as r:
                answer = await r.json()
                assert r.status == 413, (path, r.status, answer)
            assert answer["code"] == "InputTooLarge"
            assert "at most 64 KiB" in answer["message"], answer["message"]


async def _post(session: aiohttp.ClientSession, url: str, body: Any,
                query: dict[str, str] | None = None) -> tuple[int, Any]:
    async with session.post(url, json=body, params=query or {}) as r:
        return r.status, await r.json()


async def _get(session: aiohttp.ClientSession, url: str,
               query: dict[str, str] | None = None) -> tuple[int, Any]:
    async with session.get(url, params=query or {}) as r:
        return r.status, await r.json()
