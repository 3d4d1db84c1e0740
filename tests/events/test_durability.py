"""Events are never lost: not when the server dies between a change and its publish,
not when the connection to RabbitMQ is cut."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from azqueue.config import StorageSettings
from azqueue.devstorage import Azurite, free_port
from azqueue.testing import sas
from azqueue.testing.faultproxy import FaultProxy, Faults
from azqueue.testing.tasks import create, definition, slugid
from tests.events.consumers import ConsumerFactory, Received
from tests.servers import ServerFactory
from tests.serving import serve
from tests.waiting import stays


def _kinds(messages: list[Received]) -> list[str]:
    return [m.exchange for m in messages]


@pytest.mark.slow
@pytest.mark.crash
async def test_event_of_a_change_stored_just_before_a_crash_is_delivered_after_restart(
        azurite: Azurite, make_server: ServerFactory, storage_prefix: str, amqp_url: str,
        http: aiohttp.ClientSession, consume: ConsumerFactory) -> None:
    consumer = await consume("primary.#")
    await make_server()  # (drops this test's tables and queues afterwards)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api/queue/v1"
    task_id = slugid()
    async with serve(azurite, storage_prefix, amqp_url, port,
                     AZQUEUE_TEST_CRASH_AFTER_COMMIT="1") as doomed:
        try:
            async with http.put(f"{api}/task/{task_id}", json=definition("prov/crash")) as r:
                raise AssertionError(f"the server answered {r.status} instead of dying")
        except aiohttp.ClientError:
            pass
        assert await asyncio.to_thread(doomed.process.wait, 10) == 70
    await stays(lambda: consumer.about(task_id), lambda m: m == [], for_=1.5,
                what="nothing published before the crash")
    async with serve(azurite, storage_prefix, amqp_url, port):
        await consumer.wait_for(lambda _: "task-pending" in _kinds(consumer.about(task_id)))
        assert _kinds(consumer.about(task_id)) == ["task-defined", "task-pending"]
        async with http.get(f"{api}/task/{task_id}/status") as r:
            assert (await r.json())["status"]["state"] == "pending"


class Proxy:
    """A TCP proxy to RabbitMQ that the test can cut and restore, or freeze: the
    connections stay open and nothing goes through, as in a network partition. It
    listens on any free port, ``port`` once started."""

    def __init__(self, target_port: int = 5672) -> None:
        self.target_port = target_port
        self.port = 0
        self.open = True
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [writer, up_writer]
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def cut(self) -> None:
        self.open = False
        for w in self._writers:
            w.transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        self.open = True

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def test_publishing_resumes_after_the_broker_connection_is_cut_and_nothing_is_lost(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory) -> None:
    consumer = await consume("primary.#")
    proxy = Proxy()
    await proxy.start()
    try:
        user = amqp_url.split("//", 1)[1].split("@", 1)[0]
        server = await make_server(amqp_url=f"amqp://{user}@127.0.0.1:{proxy.port}/",
                                   events_recovery_delay=1.0, events_resolver_interval=0.3)
        before = await create(http, server.api, definition("prov/cut"))
        await consumer.wait_for(lambda _: "task-pending" in _kinds(consumer.about(before)))

        proxy.cut()
        during = await create(http, server.api, definition("prov/cut"))
        code, _ = await sas.post(http, f"{server.api}/task/{during}/runs/0/claim",
                                 {"workerGroup": "wg", "workerId": "w"})
        assert code == 200  # the API keeps working while events wait
        code, _ = await sas.post(http, f"{server.api}/task/{during}/runs/0/completed")
        assert code == 200
        await stays(lambda: consumer.about(during), lambda m: m == [], for_=1.0,
                    what="no event published while the broker is unreachable")

        proxy.restore()
        await consumer.wait_for(
            lambda _: "task-completed" in _kinds(consumer.about(during)), timeout=60)
        first_seen: list[str] = []
        for kind in _kinds(consumer.about(during)):
            if kind not in first_seen:
                first_seen.append(kind)
        assert first_seen == ["task-defined", "task-pending", "task-running", "task-completed"]
        after = await create(http, server.api, definition("prov/cut"))
        await consumer.wait_for(lambda _: "task-pending" in _kinds(consumer.about(after)))
    finally:
        await proxy.close()


async def _until_answered(http: aiohttp.ClientSession, method: str, url: str,
                          body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """Send until the queue answers below 500, as a client with retries does (for a
    minute at most)."""
    last = "no answer"
    for _ in range(300):
        try:
            async with http.request(method, url, json=body,
                                    timeout=aiohttp.ClientTimeout(total=30)) as r:
                if r.status < 500:
                    return r.status, await r.json()
                last = f"{r.status} {await r.text()}"
        except (aiohttp.ClientError, TimeoutError) as e:
            last = repr(e)
        await asyncio.sleep(0.2)
    raise AssertionError(f"{method} {url} still failing after a minute: {last}")


@pytest.mark.slow
async def test_through_throttling_and_lost_answers_every_event_arrives_and_no_group_early(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str, amqp_url: str,
        http: aiohttp.ClientSession, consume: ConsumerFactory) -> None:
    """Two replicas with events on, their storage throttled and losing answers (5% and
    5%): every task's task-defined, task-pending, task-running and task-completed arrive,
    each group of one is announced resolved, and a decision task's group only after its
    last task's task-completed, though the decision task resolved first."""
    consumer = await consume("primary.#")
    replicas = [await make_server(
        amqp_url=amqp_url, events_recovery_delay=2.0, tip_repair_delay=3.0,
        storage=StorageSettings(proxy.connection_string(), storage_prefix))
        for _ in range(2)]
    proxy.faults = Faults(busy=0.05, lost=0.05)
    queue = "prov/faults-events"
    singles = [slugid() for _ in range(40)]
    decision, children = slugid(), [slugid() for _ in range(3)]
    work = [(t, definition(queue)) for t in [*singles, decision]] + \
           [(t, definition(queue, taskGroupId=decision)) for t in children]
    limit = asyncio.Semaphore(8)

    async def make(i: int, task_id: str, body: dict[str, Any]) -> None:
        async with limit:
            code, answer = await _until_answered(
                http, "PUT", f"{replicas[i % 2].api}/task/{task_id}", body)
            assert code == 200, answer

    await asyncio.gather(*(make(i, t, b) for i, (t, b) in enumerate(work)))
    claimed: dict[str, tuple[str, int]] = {}
    while len(claimed) < len(work):
        code, answer = await _until_answered(
            http, "POST", f"{replicas[len(claimed) % 2].api}/claim-work/{quote(queue, safe='')}",
            {"workerGroup": "wg", "workerId": "w", "tasks": 8})
        assert code == 200, answer
        for claim in answer["tasks"]:
            claimed[claim["status"]["taskId"]] = (replicas[len(claimed) % 2].api, claim["runId"])
    # The decision task resolves first, while its tasks still run.
    for task_id in [decision, *children, *singles]:
        api, run_id = claimed[task_id]
        code, answer = await _until_answered(
            http, "POST", f"{api}/task/{task_id}/runs/{run_id}/completed")
        assert code == 200 or answer.get("code") == "RequestConflict", answer
    proxy.faults = Faults()
    counts = proxy.counts  # the faults happened (else this test proves nothing)
    assert sum(v for k, v in counts.items() if k.endswith("busy")) > 0, counts
    assert sum(v for k, v in counts.items() if k.endswith(("dropped", "timed out"))) > 0, counts

    kinds = ("task-defined", "task-pending", "task-running", "task-completed")

    def arrived(messages: list[Received]) -> bool:
        seen = {(m.exchange, m.body.get("status", {}).get("taskId") or m.body["taskGroupId"])
                for m in messages}
        return all((k, t) in seen for k in kinds for t, _ in work) and \
            all(("task-group-resolved", t) in seen for t in [*singles, decision])

    messages = await consumer.wait_for(arrived, timeout=60)
    announced = next(i for i, m in enumerate(messages) if m.exchange == "task-group-resolved"
                     and m.body["taskGroupId"] == decision)
    for child in children:
        completed = next(i for i, m in enumerate(messages) if m.exchange == "task-completed"
                         and m.body["status"]["taskId"] == child)
        assert completed < announced, f"group {decision} announced before {child} completed"
