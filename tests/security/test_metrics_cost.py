"""What ``GET /metrics`` costs and whom it answers: a scrape makes no storage request
and writes a bounded text however many task queues a tenant with wildcard scopes named,
the series of a task queue nobody uses any more go, and the operator can require a
bearer token."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from azqueue.config import StorageSettings
from azqueue.metrics import MAX_SAMPLED_QUEUES
from azqueue.testing.faultproxy import FaultProxy
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition
from tests.servers import Server, ServerFactory
from tests.waiting import eventually

TOKEN = "metrics-token-0123456789abcdef"
# Longer than a scrape takes on the busiest machine, far shorter than a storage request
# held by the proxy keeps an old scrape waiting (the SDK gives each attempt 5 s, and
# tries again).
SCRAPE_TIMEOUT = aiohttp.ClientTimeout(total=4.0)


async def _task_queues(http: aiohttp.ClientSession, server: Server, text: str) -> set[str]:
    return {s.labels["task_queue"] for f in text_string_to_metric_families(text)
            for s in f.samples if "task_queue" in s.labels}


async def _claim_in(http: aiohttp.ClientSession, server: Server, task_queue_id: str) -> None:
    await create(http, server.api, definition(task_queue_id))
    async with http.post(f"{server.api}/claim-work/{task_queue_id.replace('/', '%2F')}", json={
            "workerGroup": "wg", "workerId": "w", "tasks": 1}) as r:
        assert r.status == 200 and len((await r.json())["tasks"]) == 1, await r.text()


async def _metrics(session: aiohttp.ClientSession, server: Server, **kwargs: object) -> str:
    async with session.get(f"{server.root_url}/metrics", **kwargs) as r:  # type: ignore[arg-type]
        assert r.status == 200, await r.text()
        return await r.text()


async def test_a_scrape_waits_for_no_storage_request(
        make_server: ServerFactory, proxy: FaultProxy, storage_prefix: str,
        storage: StorageInspector, http: aiohttp.ClientSession,
        anonymous: aiohttp.ClientSession) -> None:
    server = await make_server(storage=StorageSettings(proxy.connection_string(),
                                                       storage_prefix))
    await create(http, server.api, definition("prov/scraped"))
    # Every read of the task queue's pending queue is held until the end of the test:
    # a scrape that sampled it would wait for them.
    name = storage.pending_queue("prov/scraped")
    holds = [proxy.hold("GET", name) for _ in range(20)]
    try:
        for _ in range(3):
            await _metrics(anonymous, server, timeout=SCRAPE_TIMEOUT)
    finally:
        for held in holds:
            held.release()


async def test_the_series_of_a_scrape_are_bounded_however_many_task_queues_are_claimed_from(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        anonymous: aiohttp.ClientSession) -> None:
    server = await make_server()
    names = [f"wild/series-{i}" for i in range(MAX_SAMPLED_QUEUES + 10)]
    for name in names:
        await _claim_in(http, server, name)
    seen = await _task_queues(http, server, await _metrics(anonymous, server))
    assert len(seen & set(names)) <= MAX_SAMPLED_QUEUES
    assert names[-1] in seen  # the latest are kept


async def test_the_series_of_a_task_queue_nobody_uses_go_after_the_idle_expiry(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        anonymous: aiohttp.ClientSession) -> None:
    server = await make_server(task_queue_idle_expiry=1.0)
    await _claim_in(http, server, "wild/gone")
    assert "wild/gone" in await _task_queues(http, server, await _metrics(anonymous, server))

    async def task_queues() -> set[str]:
        return await _task_queues(http, server, await _metrics(anonymous, server))

    await eventually(task_queues, lambda seen: "wild/gone" not in seen,
                     what="the idle task queue's series dropped")


async def test_with_a_metrics_token_a_scrape_must_send_it(
        make_server: ServerFactory, anonymous: aiohttp.ClientSession) -> None:
    server = await make_server(metrics_token=TOKEN)
    for headers in ({}, {"Authorization": "Bearer wrong-token"},
                    {"Authorization": f"Basic {TOKEN}"}):
        async with anonymous.get(f"{server.root_url}/metrics", headers=headers) as r:
            assert r.status == 401, await r.text()
            assert "AZQUEUE_METRICS_TOKEN" in (await r.json())["message"]
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
    text = await _metrics(anonymous, server, headers={"Authorization": f"Bearer {TOKEN}"})
    assert "azqueue_api_requests_total" in text


async def test_with_a_metrics_token_the_storage_request_counts_need_a_signed_in_caller(
        make_server: ServerFactory, anonymous: aiohttp.ClientSession,
        http: aiohttp.ClientSession) -> None:
    """``__metrics__`` (this process's storage requests, as JSON) is the API's: with the
    metrics token set, an anonymous caller gets 401 there too; a signed-in one its
    counts."""
    server = await make_server(metrics_token=TOKEN)
    async with anonymous.get(f"{server.api}/__metrics__") as r:
        assert r.status == 401, await r.text()
        assert "AZQUEUE_METRICS_TOKEN" in (await r.json())["message"]
    async with http.get(f"{server.api}/__metrics__") as r:
        assert r.status == 200, await r.text()
        assert "storageRequests" in await r.json()
    open_ = await make_server()
    async with anonymous.get(f"{open_.api}/__metrics__") as r:
        assert r.status == 200, await r.text()
