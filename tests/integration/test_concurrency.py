"""Claims racing across workers and server replicas."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp

from azqueue.testing import sas
from azqueue.testing.tasks import create, definition, status
from tests.servers import ServerFactory


async def test_twenty_concurrent_claims_of_one_run_exactly_one_wins(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """Twenty workers claim run 0 at once through three replicas: one 200, nineteen 409."""
    replicas = [await make_server(run_resolvers=False) for _ in range(3)]
    task_id = await create(http, replicas[0].api, definition("prov/race"))

    async def claim(i: int) -> tuple[int, dict]:
        api = replicas[i % len(replicas)].api
        return await sas.post(http, f"{api}/task/{task_id}/runs/0/claim",
                              {"workerGroup": "wg", "workerId": f"w{i}"})

    results = await asyncio.gather(*(claim(i) for i in range(20)))
    codes = Counter(code for code, _ in results)
    assert codes == {200: 1, 409: 19}, codes
    [winner] = [body for code, body in results if code == 200]
    final = await status(http, replicas[1].api, task_id)
    assert final["runs"][0]["state"] == "running"
    assert final["runs"][0]["workerId"] == winner["workerId"]
    assert len(final["runs"]) == 1


async def test_many_sas_workers_many_replicas_each_task_completed_exactly_once(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """Eight SAS workers polling the same queues through three replicas: every task is
    claimed once and completed once, and no run is ever handed to two workers."""
    replicas = [await make_server() for _ in range(3)]
    tasks = [await create(http, replicas[i % 3].api, definition("prov/many"))
             for i in range(40)]
    claimed: Counter[str] = Counter()

    async def worker(i: int) -> None:
        api = replicas[i % 3].api
        urls = await sas.poll_task_urls(http, api, "prov", "many")
        idle = 0
        while idle < 5:
            messages = await sas.poll_once(http, urls, n=4)
            if not messages:
                idle += 1
                await asyncio.sleep(0.2)
                continue
            idle = 0
            for m in messages:
                code, claim = await sas.claim(http, api, m, worker_id=f"w{i}")
                if code == 200:
                    claimed[m.tip["taskId"]] += 1
                    code, _ = await sas.post(
                        http, f"{api}/task/{m.tip['taskId']}/runs/{claim['runId']}/completed")
                    assert code == 200
                else:
                    assert code == 409, claim
                    await sas.delete_message(http, urls["queues"][6]["signedDeleteUrl"], m)

    await asyncio.gather(*(worker(i) for i in range(8)))
    assert claimed == Counter({t: 1 for t in tasks})
    for task_id in tasks:
        s = await status(http, replicas[0].api, task_id)
        assert [r["state"] for r in s["runs"]] == ["completed"]
