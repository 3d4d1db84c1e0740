"""With events on, the doorbell is the broker's (``events.bells``): the tests of
tests/integration/test_doorbell.py, rung through RabbitMQ, and what happens while the
broker is away."""

from __future__ import annotations

import asyncio

import aiohttp

from azqueue.testing.tasks import create, definition
from tests.integration.test_claim_work import callers_waiting, claim_work
from tests.integration.test_doorbell import WAIT, quiet, wakes_across_replicas
from tests.servers import ServerFactory


async def test_a_task_created_on_one_replica_wakes_a_caller_waiting_on_another(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str) -> None:
    a = await make_server(**quiet(amqp_url=amqp_url))
    b = await make_server(**quiet(amqp_url=amqp_url))
    await wakes_across_replicas(http, a, b, "prov/brokerbell")


async def test_a_claim_that_expires_on_one_replica_wakes_a_caller_waiting_on_another(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str) -> None:
    a = await make_server(**quiet(amqp_url=amqp_url, claim_timeout=3.0))
    b = await make_server(**quiet(amqp_url=amqp_url, claim_timeout=3.0, run_resolvers=False))
    task_id = await create(http, a.api, definition("prov/brokerexpire"))
    [first] = await claim_work(http, a, "prov/brokerexpire")
    assert first["runId"] == 0
    [retry] = await asyncio.wait_for(
        claim_work(http, b, "prov/brokerexpire", worker_id="next"), WAIT)
    assert retry["status"]["taskId"] == task_id and retry["runId"] == 1


async def test_without_the_broker_the_pollers_look_as_often_as_without_a_doorbell(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """A broker that cannot be reached rings nobody: the doorbell does not cover any task
    queue, and the pollers fall back to ``claim_work_poll_interval``."""
    dead = "amqp://guest:guest@127.0.0.1:1/"
    a = await make_server(**quiet(amqp_url=dead, claim_work_poll_interval=0.3))
    b = await make_server(**quiet(amqp_url=dead, claim_work_poll_interval=0.3))
    assert not b.services.work.doorbell.covers("prov/nobroker")
    waiting = asyncio.create_task(claim_work(http, b, "prov/nobroker"))
    await callers_waiting(b, "prov/nobroker")
    task_id = await create(http, a.api, definition("prov/nobroker"))
    [claim] = await asyncio.wait_for(waiting, WAIT / 2)
    assert claim["status"]["taskId"] == task_id
