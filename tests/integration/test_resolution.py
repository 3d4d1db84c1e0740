"""Claim expiry, retries, deadlines and the background resolvers."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import aiohttp

from azqueue.model import timeutil
from azqueue.testing import sas
from azqueue.testing.tasks import create, definition, status
from tests.servers import ServerFactory
from tests.waiting import eventually, stays


async def _claim(http: aiohttp.ClientSession, api: str, task_id: str, run_id: int,
                 worker_id: str = "w1") -> dict[str, Any]:
    code, body = await sas.post(http, f"{api}/task/{task_id}/runs/{run_id}/claim",
                                {"workerGroup": "wg", "workerId": worker_id})
    assert code == 200, body
    return body


async def test_claim_of_expired_run_with_no_retries_left_resolves_the_task_and_answers_409(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'with no retries left the task resolves exception and the claim answers 409'."""
    server = await make_server(claim_timeout=1.0, run_resolvers=False)
    task_id = await create(http, server.api, definition("prov/noretry", retries=0))
    urls = await sas.poll_task_urls(http, server.api, "prov", "noretry")
    poll_url, delete_url = urls["queues"][6]["signedPollUrl"], urls["queues"][6]["signedDeleteUrl"]
    [m] = await sas.get_messages(http, poll_url)
    code, _ = await sas.claim(http, server.api, m)
    assert code == 200
    again = await eventually(lambda: sas.get_messages(http, poll_url),
                             what="the tip reappearing once the claim expired")
    assert again[0].tip["runId"] == 1
    code, err = await sas.claim(http, server.api, again[0], worker_id="w2")
    assert code == 409, err
    assert "no retries" in err["message"]
    s = await status(http, server.api, task_id)
    assert s["state"] == "exception"
    assert [(r["state"], r.get("reasonResolved")) for r in s["runs"]] == [("exception", "claim-expired")]
    # The worker's 4xx delete: the server has already removed the useless tip.
    assert await sas.delete_message(http, delete_url, again[0]) in (204, 400, 404)
    assert await sas.get_messages(http, poll_url, 32) == []


async def test_retries_are_used_up_then_the_task_resolves_exception(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """worker-shutdown and intermittent-task 'will trigger an automatic retry' (docs/concepts.md) while
    retries are left; malformed-payload never retries."""
    server = await make_server(run_resolvers=False)
    task_id = await create(http, server.api, definition("prov/retries", retries=1))
    await _claim(http, server.api, task_id, 0)
    code, body = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/exception",
                                {"reason": "worker-shutdown"})
    assert code == 200
    assert body["status"]["runs"][1] == {**body["status"]["runs"][1], "state": "pending",
                                         "reasonCreated": "retry"}
    assert body["status"]["retriesLeft"] == 0
    await _claim(http, server.api, task_id, 1)
    code, body = await sas.post(http, f"{server.api}/task/{task_id}/runs/1/exception",
                                {"reason": "intermittent-task"})
    assert code == 200
    assert body["status"]["state"] == "exception" and len(body["status"]["runs"]) == 2

    other = await create(http, server.api, definition("prov/retries", retries=5))
    await _claim(http, server.api, other, 0)
    code, body = await sas.post(http, f"{server.api}/task/{other}/runs/0/exception",
                                {"reason": "malformed-payload"})
    assert code == 200
    assert body["status"]["state"] == "exception" and body["status"]["retriesLeft"] == 5
    # Repeating a report that took effect is safe; a different one is a conflict.
    code, again = await sas.post(http, f"{server.api}/task/{other}/runs/0/exception",
                                 {"reason": "malformed-payload"})
    assert code == 200 and again["status"] == body["status"]
    code, _ = await sas.post(http, f"{server.api}/task/{other}/runs/0/completed")
    assert code == 409


async def test_intermittent_task_retry_is_a_task_retry_and_its_tip_is_visible_at_once(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    server = await make_server(run_resolvers=False)
    task_id = await create(http, server.api, definition("prov/intermittent"))
    urls = await sas.poll_task_urls(http, server.api, "prov", "intermittent")
    poll_url = urls["queues"][6]["signedPollUrl"]
    [m] = await sas.get_messages(http, poll_url)
    code, _ = await sas.claim(http, server.api, m)
    assert code == 200
    code, body = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/exception",
                                {"reason": "intermittent-task"})
    assert body["status"]["runs"][1]["reasonCreated"] == "task-retry"
    [m1] = await sas.get_messages(http, poll_url)
    assert m1.tip == {**m1.tip, "taskId": task_id, "runId": 1}
    code, claim = await sas.claim(http, server.api, m1, worker_id="w2")
    assert code == 200 and claim["runId"] == 1


async def test_deadline_resolves_pending_and_running_runs_deadline_exceeded(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'pending and running runs are resolved as exception if not resolved by other means
    before the deadline' (docs/concepts.md)."""
    server = await make_server(deadline_resolver_interval=0.5)
    pending = await create(http, server.api, definition("prov/deadline", deadline=timedelta(seconds=3)))
    running = await create(http, server.api, definition("prov/deadline", deadline=timedelta(seconds=3)))
    await _claim(http, server.api, running, 0)
    for task_id in (pending, running):
        s = await eventually(lambda: status(http, server.api, task_id),
                             lambda s: s["state"] == "exception", what="the task resolving")
        [run] = s["runs"]
        assert run["reasonResolved"] == "deadline-exceeded"
        assert timeutil.parse(run["resolved"]) >= timeutil.parse(s["deadline"])
    code, err = await sas.post(http, f"{server.api}/task/{running}/runs/0/completed")
    assert code == 409


async def test_background_resolver_expires_unpolled_claims_once_within_its_lag(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """An expired claim with no worker polling is resolved by the claim resolver, with a
    lag of about its interval, exactly once although three replicas run it."""
    interval = 0.5
    replicas = [await make_server(claim_timeout=2.0, claim_resolver_interval=interval)
                for _ in range(3)]
    api = replicas[0].api
    task_ids = [await create(http, api, definition("prov/resolver")) for _ in range(5)]
    urls = await sas.poll_task_urls(http, api, "prov", "resolver")
    poll_url = urls["queues"][6]["signedPollUrl"]
    # Half claimed with their tip, half without.
    for i, task_id in enumerate(task_ids):
        if i % 2:
            await _claim(http, api, task_id, 0)
    for m in await sas.get_messages(http, poll_url, 32):
        if m.tip["taskId"] in task_ids[::2]:
            code, _ = await sas.claim(http, api, m)
            assert code == 200
        else:
            assert await sas.delete_message(http, urls["queues"][6]["signedDeleteUrl"], m) == 204

    for task_id in task_ids:
        s = await eventually(lambda: status(http, api, task_id), lambda s: len(s["runs"]) == 2,
                             what="a retry run after the claim expired")
        r0, r1 = s["runs"]
        assert (r0["state"], r0["reasonResolved"]) == ("exception", "claim-expired")
        assert (r1["state"], r1["reasonCreated"]) == ("pending", "retry")
        lag = (timeutil.parse(r0["resolved"]) - timeutil.parse(r0["takenUntil"])).total_seconds()
        assert 0 <= lag <= interval * 1.2 + 2.0, lag
        assert s["retriesLeft"] == 4
    async def runs_and_retries() -> list[tuple[int, int]]:
        return [(len(s["runs"]), s["retriesLeft"])
                for s in [await status(http, api, task_id) for task_id in task_ids]]

    await stays(runs_and_retries, lambda seen: seen == [(2, 4)] * len(task_ids),
                for_=interval * 4, interval=0.5,
                what="each expired claim retried once, never twice")
    # Every retry has a visible tip a worker can claim right away.
    seen = {m.tip["taskId"]: m for m in await sas.get_messages(http, poll_url, 32)}
    assert set(seen) == set(task_ids)
    for m in seen.values():
        assert m.tip["runId"] == 1
        code, claim = await sas.claim(http, api, m, worker_id="w2")
        assert code == 200 and claim["runId"] == 1


async def test_a_resolver_that_lost_the_race_to_a_late_reclaim_leaves_its_receipt_alone(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """The claim resolver lists a claim just expired; a late reclaim lands before the
    resolver acts on it. The resolver must not put the listed (stale) pop receipt back,
    or the next reclaim of the still-running run would be refused 409."""
    server = await make_server(claim_timeout=2.0, run_resolvers=False)
    task_id = await create(http, server.api, definition("prov/stale"))
    urls = await sas.poll_task_urls(http, server.api, "prov", "stale")
    [message] = await sas.get_messages(http, urls["queues"][6]["signedPollUrl"])
    code, _ = await sas.claim(http, server.api, message)
    assert code == 200
    async def expired() -> list[Any]:
        return (await server.services.resolution.expired_claims())[0]

    [listed] = await eventually(expired, what="the claim listed expired")
    code, body = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/reclaim")
    assert code == 200, body
    assert await server.services.resolution.expire_claim(listed) is False
    code, body = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/reclaim")
    assert code == 200, body
    assert (await status(http, server.api, task_id))["runs"][0]["state"] == "running"
