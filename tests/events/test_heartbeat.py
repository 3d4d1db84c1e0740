"""``__heartbeat__`` with events on checks the broker besides storage: 500 naming what
failed while the server has no connection to it (Dockerflow's convention), 200 with one."""

from __future__ import annotations

import aiohttp

from tests.servers import ServerFactory


async def test_the_heartbeat_fails_without_the_broker_and_passes_with_it(
        make_server: ServerFactory, amqp_url: str,
        anonymous: aiohttp.ClientSession, refused_port: int) -> None:
    away = await make_server(amqp_url=f"amqp://guest:guest@127.0.0.1:{refused_port}/")
    async with anonymous.get(f"{away.root_url}/api/queue/v1/__heartbeat__") as r:
        assert r.status == 500, await r.text()
        body = await r.json()
    assert body["checks"]["storage"] == "ok"
    assert "broker" in body["checks"]["broker"]
    there = await make_server(amqp_url=amqp_url)
    async with anonymous.get(f"{there.root_url}/api/queue/v1/__heartbeat__") as r:
        assert (r.status, await r.json()) == (200, {})
