"""claimWork long-polling (see docs/workers/sdk.md), sharing the tips with the SAS flow."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp

from azqueue.testing import sas
from azqueue.testing.tasks import create, definition, status
from tests.servers import Server, ServerFactory
from tests.waiting import eventually, stays


async def recorded_worker(http: aiohttp.ClientSession, server: Server, task_queue_id: str,
                          worker_id: str, task_id: str | None = None) -> dict[str, Any]:
    """The worker as getWorker answers it, once recorded (as its first claimWork call
    begins), and with ``task_id`` among its recent tasks if given (written as claimWork
    answers)."""
    provisioner_id, worker_type = task_queue_id.split("/", 1)
    url = (f"{server.api}/provisioners/{provisioner_id}/worker-types/{worker_type}/workers/"
           f"wg/{worker_id}")

    async def get() -> dict[str, Any] | None:
        async with http.get(url) as r:
            if r.status == 404:
                return None
            assert r.status == 200, await r.text()
            found: dict[str, Any] = await r.json()
            if task_id is not None and {"taskId": task_id, "runId": 0} not in found[
                    "recentTasks"]:
                return None
            return found

    worker = await eventually(get, lambda found: found is not None,
                              what=f"worker {worker_id} recorded", interval=0.1)
    assert worker is not None
    return worker


async def claim_work(http: aiohttp.ClientSession, server: Server, task_queue_id: str,
                     tasks: int = 1, worker_id: str = "cw") -> list[dict[str, Any]]:
    code, body = await sas.post(http, f"{server.api}/claim-work/{task_queue_id.replace('/', '%2F')}",
                                {"workerGroup": "wg", "workerId": worker_id, "tasks": tasks})
    assert code == 200, body
    return list(body["tasks"])


async def callers_waiting(server: Server, task_queue_id: str, count: int = 1) -> None:
    """Until ``count`` claimWork callers wait on ``server`` for work of ``task_queue_id``
    (connected ones: a caller that left may still be on the list)."""
    entry = server.services.work.waiting.entry(task_queue_id)
    await eventually(lambda: sum(w.connected() for w in entry.waiters), lambda n: n >= count,
                     interval=0.05,
                     what=f"{count} claimWork caller(s) waiting on {task_queue_id}")


async def test_a_waiting_claim_work_gets_a_task_created_while_it_waits(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """'This end-point is long-polling' (docs/workers/sdk.md): with polling effectively off (60 s), only the
    in-process wake-up can deliver a task created 0.5 s into a 20 s wait."""
    server = await make_server(claim_work_poll_interval=60.0)
    waiting = asyncio.create_task(claim_work(http, server, "prov/wake"))
    await stays(waiting.done, lambda done: not done, what="claimWork waiting for work",
                for_=0.5)
    task_id = await create(http, server.api, definition("prov/wake"))
    [claim] = await asyncio.wait_for(waiting, 15)
    assert claim["status"]["taskId"] == task_id and claim["runId"] == 0
    assert set(claim) >= {"status", "runId", "workerGroup", "workerId", "takenUntil", "task",
                          "credentials"}


async def test_claims_up_to_tasks_distinct_and_highest_priority_first(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    server = await make_server()
    by_priority = {p: await create(http, server.api, definition("prov/three", priority=p))
                   for p in ("lowest", "low", "medium", "high", "highest")}
    claims = await claim_work(http, server, "prov/three", tasks=3)
    assert [c["status"]["taskId"] for c in claims] == [
        by_priority["highest"], by_priority["high"], by_priority["medium"]]
    rest = await claim_work(http, server, "prov/three", tasks=3, worker_id="cw2")
    assert [c["status"]["taskId"] for c in rest] == [by_priority["low"], by_priority["lowest"]]


async def test_an_empty_queue_answers_no_tasks_after_the_long_poll(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    server = await make_server(claim_work_wait=1.0, claim_work_poll_interval=0.3)
    assert await claim_work(http, server, "prov/empty", tasks=4) == []
    worker = await recorded_worker(http, server, "prov/empty", "cw")
    assert worker["lastDateActive"] and worker["recentTasks"] == []


async def test_workers_are_recorded_with_their_recent_tasks(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    server = await make_server()
    task_id = await create(http, server.api, definition("prov/record"))
    await claim_work(http, server, "prov/record", worker_id="rec")
    worker = await recorded_worker(http, server, "prov/record", "rec", task_id)
    assert worker["firstClaim"]
    assert {"taskId": task_id, "runId": 0} in worker["recentTasks"]


async def test_a_claim_work_claim_left_alone_expires_and_is_retried(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    server = await make_server(claim_timeout=2.0, run_resolvers=False, claim_work_wait=20.0)
    task_id = await create(http, server.api, definition("prov/cwexpiry"))
    [first] = await claim_work(http, server, "prov/cwexpiry", worker_id="gone")
    assert first["runId"] == 0
    [second] = await claim_work(http, server, "prov/cwexpiry", worker_id="next")
    assert second["runId"] == 1 and second["status"]["taskId"] == task_id
    runs = second["status"]["runs"]
    assert (runs[0]["state"], runs[0]["reasonResolved"]) == ("exception", "claim-expired")
    assert (runs[1]["reasonCreated"], runs[1]["workerId"]) == ("retry", "next")


async def test_a_caller_that_disconnects_loses_no_task(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    server = await make_server(claim_work_poll_interval=60.0)
    url = f"{server.api}/claim-work/prov%2Fleave"
    body = {"workerGroup": "wg", "workerId": "leaver", "tasks": 1}
    try:
        async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=0.5)):
            pass
    except TimeoutError:
        pass
    waiting = asyncio.create_task(claim_work(http, server, "prov/leave", worker_id="stayer"))
    await callers_waiting(server, "prov/leave")
    task_id = await create(http, server.api, definition("prov/leave"))
    [claim] = await asyncio.wait_for(waiting, 15)
    assert claim["status"]["taskId"] == task_id and claim["workerId"] == "stayer"


async def test_claim_work_and_sas_workers_never_share_a_run(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """Four claimWork workers and four SAS workers on two replicas drain 60 tasks: every run
    is completed exactly once."""
    replicas = [await make_server(claim_work_wait=2.0) for _ in range(2)]
    tasks = [await create(http, replicas[i % 2].api, definition("prov/mixed"))
             for i in range(60)]
    completed: Counter[str] = Counter()

    async def complete(api: str, task_id: str, run_id: int) -> None:
        code, body = await sas.post(http, f"{api}/task/{task_id}/runs/{run_id}/completed")
        assert code == 200, body
        completed[task_id] += 1

    async def claim_work_worker(i: int) -> None:
        server = replicas[i % 2]
        while sum(completed.values()) < len(tasks):
            for c in await claim_work(http, server, "prov/mixed", tasks=3, worker_id=f"cw{i}"):
                await complete(server.api, c["status"]["taskId"], c["runId"])

    async def sas_worker(i: int) -> None:
        server = replicas[i % 2]
        urls = await sas.poll_task_urls(http, server.api, "prov", "mixed")
        while sum(completed.values()) < len(tasks):
            messages = await sas.poll_once(http, urls, n=3)
            if not messages:
                await asyncio.sleep(0.1)
            for m in messages:
                code, claim = await sas.claim(http, server.api, m, worker_id=f"sas{i}")
                if code == 200:
                    await complete(server.api, m.tip["taskId"], claim["runId"])
                else:
                    assert code == 409, claim
                    await sas.delete_message(http, urls["queues"][6]["signedDeleteUrl"], m)

    await asyncio.wait_for(asyncio.gather(*(claim_work_worker(i) for i in range(4)),
                                          *(sas_worker(i) for i in range(4))), 90)
    assert completed == Counter({t: 1 for t in tasks})
    for task_id in tasks[:10]:
        assert [r["state"] for r in (await status(http, replicas[0].api, task_id))["runs"]] == [
            "completed"]


async def test_a_duplicate_tip_never_hands_a_run_out_twice(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """A createTask retried with the same definition queues a second tip for run 0 (the
    first attempt may have died before queuing one). Neither claimWork nor a SAS worker
    may get run 0 twice from it, even the worker that already holds it; the duplicate
    is deleted."""
    server = await make_server(claim_work_wait=1.0)
    body = definition("prov/dup")
    task_id = await create(http, server.api, body)
    assert await create(http, server.api, body, task_id=task_id) == task_id
    claims = await claim_work(http, server, "prov/dup", tasks=4)
    assert [(c["status"]["taskId"], c["runId"]) for c in claims] == [(task_id, 0)]
    assert await claim_work(http, server, "prov/dup", tasks=4) == []  # after the long poll
    urls = await sas.poll_task_urls(http, server.api, "prov", "dup")
    for q in urls["queues"]:
        assert await sas.get_messages(http, q["signedPollUrl"], 32) == []

    # The SAS flow: the worker holding run 0 presents the duplicate and is told to drop it.
    other_body = definition("prov/dup")
    other = await create(http, server.api, other_body)
    assert await create(http, server.api, other_body, task_id=other) == other
    queue = urls["queues"][6]
    first, second = (await sas.get_messages(http, queue["signedPollUrl"], 1),
                     await sas.get_messages(http, queue["signedPollUrl"], 1))
    code, _ = await sas.claim(http, server.api, first[0], worker_id="w1")
    assert code == 200
    code, err = await sas.claim(http, server.api, second[0], worker_id="w1")
    assert code == 409 and "duplicate" in err["message"], err
    assert await sas.delete_message(http, queue["signedDeleteUrl"], second[0]) in (200, 204)
    # Repeating the first claim as it was sent (a client retry) answers it again.
    code, again = await sas.claim(http, server.api, first[0], worker_id="w1")
    assert code == 200 and again["runId"] == 0


async def test_claim_work_claims_what_comes_after_a_requests_storage_budget_is_spent(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """claimWork's route long-polls, so its storage calls get the long poll's time on top
    of a request's budget: a task created once that budget is spent is still claimed."""
    server = await make_server(request_budget=2.0, claim_work_wait=10.0)
    loop = asyncio.get_running_loop()
    budget_spent = loop.time() + 3.0
    waiting = asyncio.create_task(claim_work(http, server, "prov/long-poll"))

    async def now() -> float:
        return loop.time()

    await eventually(now, lambda t: t > budget_spent, what="the request's budget spent")
    task_id = await create(http, server.api, definition("prov/long-poll"))
    assert [c["status"]["taskId"] for c in await waiting] == [task_id]
