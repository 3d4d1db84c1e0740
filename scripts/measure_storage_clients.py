"""The CPU one storage request costs the server through ``storage.rest`` and through the SDK.

Starts an Azurite of its own and one ``StorageAccount`` (the clients the server makes:
the SDK's on the shared session and the retrying transport, and ``storage.rest``), then
makes the requests of the hot path one after another, each way, in alternating blocks:
for queues a put, a receive, an update and a delete of one message (a tip's life), for
tables an insert, a read and a replace of a task-sized entity, a two-entity transaction
(a change with its outbox row) and the first page of a one-partition query. It prints
this process's CPU (``time.process_time``) and the wall time per request of each; Azurite
runs in a process of its own, so its CPU is not counted.

    .venv/bin/python scripts/measure_storage_clients.py [--requests 2000] [--block 250]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from azure.core import MatchConditions
from azure.data.tables import EdmType, EntityProperty, UpdateMode
from azure.data.tables.aio import TableClient
from azure.storage.queue.aio import QueueClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from azqueue.config import StorageSettings  # noqa: E402
from azqueue.devstorage import Azurite  # noqa: E402
from azqueue.storage.account import StorageAccount  # noqa: E402
from azqueue.storage.queues import encode_json  # noqa: E402
from azqueue.storage.rest import RestClient, odata_string  # noqa: E402

QUEUE_OPS = ("put", "receive", "update", "delete")
TABLE_OPS = ("insert", "read", "replace", "transaction", "query first page")
HIDDEN = 300
# A tip as the hot path puts it (base64 JSON), and a task entity's kinds of properties.
TIP = encode_json({"taskId": "x" * 22, "runId": 0, "deadline": "2026-01-01T00:00:00.000Z",
                   "priority": "lowest", "taskQueueId": "measure/clients"})
DEFINITION = "{" + ",".join(f'"k{i}":"{"v" * 40}"' for i in range(30)) + "}"

# One cycle of requests of one way: each request's name, timed around its await.
Timer = Callable[[str, Awaitable[Any]], Awaitable[Any]]


def entity(partition: str, row: str, version: int) -> dict[str, Any]:
    return {"PartitionKey": partition, "RowKey": row, "definition": DEFINITION,
            "state": "pending", "version": version, "writeId": secrets.token_hex(8),
            "created": datetime.now(UTC), "deadline": datetime.now(UTC),
            "retriesLeft": 5, "size": EntityProperty(2 ** 40 + version, EdmType.INT64)}


async def rest_queue(rest: RestClient, name: str, timed: Timer) -> None:
    await timed("put", rest.put_message(name, TIP, None, None))
    got, _ = await timed("receive", rest.receive_messages(name, 1, HIDDEN))
    [message] = got
    receipt = await timed("update", rest.update_message(
        name, message.message_id, message.pop_receipt, HIDDEN, None))
    await timed("delete", rest.delete_message(name, message.message_id, receipt))


async def sdk_queue(queue: QueueClient, timed: Timer) -> None:
    await timed("put", queue.send_message(TIP))
    message = await timed("receive", queue.receive_message(visibility_timeout=HIDDEN))
    updated = await timed("update", queue.update_message(
        message.id, message.pop_receipt, visibility_timeout=HIDDEN))
    await timed("delete", queue.delete_message(message.id, updated.pop_receipt))


async def rest_table(rest: RestClient, table: str, timed: Timer) -> None:
    partition = secrets.token_hex(11)
    await timed("insert", rest.create_entity(table, entity(partition, "task", 0)))
    row = await timed("read", rest.get_entity(table, partition, "task"))
    await timed("replace", rest.update_entity(table, entity(partition, "task", 1),
                                              row.metadata["etag"]))
    other = secrets.token_hex(11)
    await timed("transaction", rest.transaction(table, [
        ("create", entity(other, "task", 0), ""), ("create", {"PartitionKey": other,
                                                              "RowKey": "outbox-1"}, "")]))
    await timed("query first page", rest.query_first(
        table, f"PartitionKey eq {odata_string(other)}", ["RowKey"], 1))


async def first_page(table: TableClient, partition: str) -> list[Any]:
    pages = table.query_entities("PartitionKey eq @pk", parameters={"pk": partition},
                                 select=["RowKey"], results_per_page=1).by_page()
    async for page in pages:
        return [row async for row in page]
    return []


async def sdk_table(table: TableClient, timed: Timer) -> None:
    partition = secrets.token_hex(11)
    await timed("insert", table.create_entity(entity(partition, "task", 0)))
    row = await timed("read", table.get_entity(partition, "task"))
    await timed("replace", table.update_entity(
        entity(partition, "task", 1), mode=UpdateMode.REPLACE, etag=row.metadata["etag"],
        match_condition=MatchConditions.IfNotModified))
    other = secrets.token_hex(11)
    await timed("transaction", table.submit_transaction([
        ("create", entity(other, "task", 0)), ("create", {"PartitionKey": other,
                                                          "RowKey": "outbox-1"})]))
    await timed("query first page", first_page(table, other))


class Totals:
    """CPU and wall seconds, and counts, per (way, request)."""

    def __init__(self) -> None:
        self.cpu: dict[tuple[str, str], float] = defaultdict(float)
        self.wall: dict[tuple[str, str], float] = defaultdict(float)
        self.count: dict[tuple[str, str], int] = defaultdict(int)

    def timer(self, way: str, counting: bool) -> Timer:
        async def timed(op: str, call: Awaitable[Any]) -> Any:
            cpu, wall = time.process_time(), time.perf_counter()
            result = await call
            if counting:
                self.cpu[way, op] += time.process_time() - cpu
                self.wall[way, op] += time.perf_counter() - wall
                self.count[way, op] += 1
            return result
        return timed

    def print(self, ops: tuple[str, ...]) -> None:
        print("| request | rest.py CPU ms | SDK CPU ms | SDK / rest.py | rest.py wall ms "
              "| SDK wall ms |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for op in ops:
            cpu = {w: self.cpu[w, op] / max(1, self.count[w, op]) * 1000 for w in ("rest", "sdk")}
            wall = {w: self.wall[w, op] / max(1, self.count[w, op]) * 1000 for w in ("rest", "sdk")}
            print(f"| {op} | {cpu['rest']:.3f} | {cpu['sdk']:.3f} | "
                  f"{cpu['sdk'] / cpu['rest']:.1f} | {wall['rest']:.2f} | {wall['sdk']:.2f} |")


async def run(account: StorageAccount, requests: int, block: int, totals: Totals) -> None:
    """Warm both ways up, then ``requests`` cycles each way, in alternating blocks."""
    queue, table = account.queue_name("clients"), account.table_name("clients")
    await account.queues.create_queue(queue)
    await account.tables.create_table(table)
    sdk_q, sdk_t = account.queues.get_queue_client(queue), account.tables.get_table_client(table)

    async def cycles(way: str, count: int, counting: bool) -> None:
        timed = totals.timer(way, counting)
        for _ in range(count):
            if way == "rest":
                await rest_queue(account.rest, queue, timed)
                await rest_table(account.rest, table, timed)
            else:
                await sdk_queue(sdk_q, timed)
                await sdk_table(sdk_t, timed)

    for way in ("rest", "sdk"):
        await cycles(way, 50, False)
    done = 0
    while done < requests:
        step = min(block, requests - done)
        for way in ("rest", "sdk") if (done // block) % 2 == 0 else ("sdk", "rest"):
            await cycles(way, step, True)
        done += step


async def main(requests: int, block: int) -> None:
    azurite = await Azurite.start()
    try:
        account = StorageAccount(StorageSettings(azurite.connection_string, "measure"))
        totals = Totals()
        try:
            await run(account, requests, block, totals)
        finally:
            await account.close()
        print(f"{requests} requests of each kind each way; this process's CPU and the wall "
              "time per request, Azurite's CPU aside\n")
        totals.print(QUEUE_OPS)
        print()
        totals.print(TABLE_OPS)
    finally:
        await azurite.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000,
                        help="requests of each kind each way")
    parser.add_argument("--block", type=int, default=250,
                        help="cycles of one way before the other's")
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.block))
