"""Workers, task queues and provisioners, in Azure Tables (the worker metadata API).

Table ``<prefix>workers``: PartitionKey = taskQueueId, RowKey = ``<workerGroup>/<workerId>``
(both key-encoded: Azure refuses ``/ \\ # ?`` in keys). ``firstClaim`` is when the worker
was first seen, ``lastDateActive`` when it was last recorded, ``expires`` when it stops
being listed (a day after its last recorded activity, or ``declaredExpires`` if that is
later), ``recentTasks`` its last 20 claims (JSON), ``quarantineUntil`` and
``quarantineDetails`` (JSON) what quarantineWorker set.

Table ``<prefix>taskqueues``, one partition ``meta``: RowKey ``q:<taskQueueId>`` for a task
queue (a worker type), ``p:<provisionerId>`` for a provisioner; ``expires`` and
``lastDateActive`` each. A task queue and its provisioner are written together, in one
transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from azure.core import MatchConditions
from azure.data.tables import UpdateMode

from azqueue.storage.account import StorageAccount
from azqueue.storage.errors import EntityExists, EntityNotFound, ETagMismatch, translate
from azqueue.storage.keys import decode
from azqueue.storage.keys import encode as key
from azqueue.storage.rows import delete_rows
from azqueue.storage.tables import TableStore

RECENT_TASKS = 20
QUARANTINE_DETAILS = 20  # the latest changes kept, as far as they fit in:
MAX_PROPERTY_CHARS = 30_000  # Azure's limit for a string property is 32K characters
_META = "meta"
_QUEUE, _PROVISIONER = "q:", "p:"
# Above every character a key-encoded identifier or taskQueueId holds.
_END = "~"


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """One worker of one task queue, as stored."""

    task_queue_id: str
    worker_group: str
    worker_id: str
    first_claim: datetime
    last_date_active: datetime | None
    expires: datetime
    recent_tasks: list[dict[str, Any]]
    quarantine_until: datetime | None
    quarantine_details: list[dict[str, Any]]

    @classmethod
    def from_entity(cls, e: Mapping[str, Any]) -> WorkerRecord:
        # Rows of earlier versions have lastDateActive and no expires (firstClaim only
        # after a claim).
        last = e.get("lastDateActive")
        first: datetime = e.get("firstClaim") or last or e["expires"]
        expires = max(e.get("expires") or first + timedelta(days=1),
                      e.get("declaredExpires") or first)
        return cls(task_queue_id=str(e["taskQueueId"]), worker_group=str(e["workerGroup"]),
                   worker_id=str(e["workerId"]), first_claim=first, last_date_active=last,
                   expires=expires,
                   recent_tasks=json.loads(e.get("recentTasks") or "[]"),
                   quarantine_until=e.get("quarantineUntil"),
                   quarantine_details=json.loads(e.get("quarantineDetails") or "[]"))


def _identity(pk: str, rk: str, task_queue_id: str, worker_group: str,
              worker_id: str) -> dict[str, Any]:
    return {"PartitionKey": pk, "RowKey": rk, "taskQueueId": task_queue_id,
            "workerGroup": worker_group, "workerId": worker_id}


@dataclass(frozen=True, slots=True)
class QueueRecord:
    """A task queue (``task_queue_id`` set) or a provisioner (``provisioner_id`` only)."""

    provisioner_id: str
    task_queue_id: str | None
    expires: datetime
    last_date_active: datetime


class WorkerStore(TableStore):
    """The workers table."""

    def __init__(self, account: StorageAccount) -> None:
        super().__init__(account, "workers")

    async def seen(self, task_queue_id: str, worker_group: str, worker_id: str, now: datetime,
                   claimed: list[tuple[str, int]], expires: datetime, first: bool) -> None:
        """Record that the worker was active at ``now`` (and claimed ``claimed``) and expires
        at ``expires``: one write, plus a read before it when there are claims to add to
        ``recentTasks``. ``first``: the caller has not recorded the worker before, so it may
        be new (an insert is tried first, to set ``firstClaim`` once)."""
        pk, rk = key(task_queue_id), key(f"{worker_group}/{worker_id}")
        entity = _identity(pk, rk, task_queue_id, worker_group, worker_id)
        entity.update(lastDateActive=now, expires=expires)
        old: Mapping[str, Any] | None = None
        if claimed:
            old = await self._entity(pk, rk, worker_group, worker_id)
            recent = json.loads((old or {}).get("recentTasks") or "[]")
            recent += [{"taskId": t, "runId": r} for t, r in claimed]
            entity["recentTasks"] = json.dumps(recent[-RECENT_TASKS:])
            first = old is None
            if old is not None and "firstClaim" not in old:  # a row of an earlier version
                entity["firstClaim"] = now
        if first:
            try:
                with translate(f"recording worker {worker_group}/{worker_id}"):
                    await self._table.create_entity({**entity, "firstClaim": now})
                return
            except EntityExists:
                pass
        with translate(f"recording worker {worker_group}/{worker_id}"):
            await self._table.upsert_entity(entity, mode=UpdateMode.MERGE)

    async def declare(self, task_queue_id: str, worker_group: str, worker_id: str,
                      now: datetime, expires: datetime) -> WorkerRecord:
        """declareWorker: the worker exists, active now, listed at least until ``expires``
        (kept apart from the ``expires`` its activity moves, so neither shortens the
        other): a read and a write."""
        pk, rk = key(task_queue_id), key(f"{worker_group}/{worker_id}")
        old = await self._entity(pk, rk, worker_group, worker_id) or {}
        entity = _identity(pk, rk, task_queue_id, worker_group, worker_id)
        entity.update(lastDateActive=now, declaredExpires=max(expires, old.get(
            "declaredExpires") or expires))
        if "expires" not in old:
            entity["expires"] = now
        if "firstClaim" not in old:
            entity["firstClaim"] = now
        with translate(f"declaring worker {worker_group}/{worker_id}"):
            await self._table.upsert_entity(entity, mode=UpdateMode.MERGE)
        return WorkerRecord.from_entity({**old, **entity})

    async def quarantine(self, task_queue_id: str, worker_group: str, worker_id: str,
                         until: datetime, detail: dict[str, Any]) -> WorkerRecord | None:
        """Set ``quarantineUntil`` and append ``detail`` to the worker's quarantine history;
        None if the worker is not known (or was deleted between the read and the write).
        A read and a write conditional on it (again if another write came between)."""
        pk, rk = key(task_queue_id), key(f"{worker_group}/{worker_id}")
        while True:
            old = await self._entity(pk, rk, worker_group, worker_id)
            if old is None:
                return None
            details = (json.loads(old.get("quarantineDetails") or "[]") + [detail])[
                -QUARANTINE_DETAILS:]
            while len(json.dumps(details)) > MAX_PROPERTY_CHARS and len(details) > 1:
                details.pop(0)  # the oldest first
            change = {"PartitionKey": pk, "RowKey": rk, "quarantineUntil": until,
                      "quarantineDetails": json.dumps(details)}
            try:
                with translate(f"quarantining worker {worker_group}/{worker_id}"):
                    await self._table.update_entity(
                        change, mode=UpdateMode.MERGE, etag=old.metadata["etag"],
                        match_condition=MatchConditions.IfNotModified)
            except ETagMismatch:
                continue
            except EntityNotFound:  # deleted since the read (it expired): not known
                return None
            return WorkerRecord.from_entity({**old, **change})

    async def get(self, task_queue_id: str, worker_group: str,
                  worker_id: str) -> WorkerRecord | None:
        entity = await self._entity(key(task_queue_id), key(f"{worker_group}/{worker_id}"),
                                    worker_group, worker_id)
        return WorkerRecord.from_entity(entity) if entity is not None else None

    async def _entity(self, pk: str, rk: str, worker_group: str, worker_id: str) -> Any:
        try:
            with translate(f"reading worker {worker_group}/{worker_id}"):
                return await self._table.get_entity(pk, rk)
        except EntityNotFound:
            return None

    async def page(self, task_queue_id: str, after: str | None, limit: int,
                   ) -> tuple[list[WorkerRecord], str | None]:
        """Up to ``limit`` workers of the task queue after the RowKey ``after``; the key to
        continue after, if there may be more. One request per ``limit`` rows."""
        rows, last = await _page(self._table, "PartitionKey eq @pk and RowKey gt @after",
                                 {"pk": key(task_queue_id), "after": after or ""}, limit,
                                 f"listing the workers of {task_queue_id}")
        return [WorkerRecord.from_entity(r) for r in rows], last

    async def quarantined(self, task_queue_id: str,
                          now: datetime) -> dict[tuple[str, str], datetime]:
        """The workers of the task queue quarantined beyond ``now``: one query of the
        task queue's partition."""
        found: dict[tuple[str, str], datetime] = {}
        with translate(f"listing the quarantined workers of {task_queue_id}"):
            async for e in self._table.query_entities(
                    "PartitionKey eq @pk and quarantineUntil gt @now",
                    parameters={"pk": key(task_queue_id), "now": now},
                    select=["workerGroup", "workerId", "quarantineUntil"],
                    results_per_page=1000):
                found[(str(e["workerGroup"]), str(e["workerId"]))] = e["quarantineUntil"]
        return found


    async def delete_expired(self, now: datetime) -> int:
        """Delete the workers that expired before ``now`` and are not quarantined beyond
        it (a scan of the table); each delete is conditional on the row read, so a worker
        recorded meanwhile stays. The number deleted."""
        deleted = 0
        with translate("listing expired workers"):
            rows = [e async for e in self._table.query_entities(
                "expires lt @now", parameters={"now": now}, results_per_page=1000)]
        for e in rows:
            record = WorkerRecord.from_entity(e)
            if record.expires >= now or (record.quarantine_until or now) > now:
                continue
            try:
                with translate(f"deleting worker {record.worker_group}/{record.worker_id}"):
                    await self._table.delete_entity(
                        e["PartitionKey"], e["RowKey"], etag=e.metadata["etag"],
                        match_condition=MatchConditions.IfNotModified)
                deleted += 1
            except (ETagMismatch, EntityNotFound):
                pass
        return deleted


class TaskQueueStore(TableStore):
    """The task queues and provisioners ever seen, with when they expire."""

    def __init__(self, account: StorageAccount) -> None:
        super().__init__(account, "taskqueues")

    async def seen(self, task_queue_id: str, now: datetime, expires: datetime) -> None:
        """Record the task queue and its provisioner as active now, until ``expires``:
        one request (a transaction of two upserts)."""
        provisioner_id = task_queue_id.split("/", 1)[0]
        common = {"PartitionKey": _META, "lastDateActive": now, "expires": expires,
                  "provisionerId": provisioner_id}
        with translate(f"recording task queue {task_queue_id}"):
            await self._table.submit_transaction([
                ("upsert", {**common, "RowKey": _QUEUE + key(task_queue_id),
                            "taskQueueId": task_queue_id}, {"mode": UpdateMode.REPLACE}),
                ("upsert", {**common, "RowKey": _PROVISIONER + provisioner_id},
                 {"mode": UpdateMode.REPLACE}),
            ])

    async def get_task_queue(self, task_queue_id: str) -> QueueRecord | None:
        return await self._get(_QUEUE + key(task_queue_id))

    async def get_provisioner(self, provisioner_id: str) -> QueueRecord | None:
        return await self._get(_PROVISIONER + provisioner_id)

    async def _get(self, row_key: str) -> QueueRecord | None:
        try:
            with translate(f"reading {row_key}"):
                return _queue_record(await self._table.get_entity(_META, row_key))
        except EntityNotFound:
            return None

    async def task_queues(self, prefix: str, after: str | None, limit: int, now: datetime,
                          ) -> tuple[list[QueueRecord], str | None]:
        """Task queues whose id starts with ``prefix`` (all: ``""``; a provisioner's:
        ``"<provisionerId>/"``), unexpired, after the key ``after``, a page at a time."""
        start = _QUEUE + key(prefix)
        return await self._range(start, after, limit, now)

    async def provisioners(self, after: str | None, limit: int, now: datetime,
                           ) -> tuple[list[QueueRecord], str | None]:
        return await self._range(_PROVISIONER, after, limit, now)

    async def _range(self, start: str, after: str | None, limit: int, now: datetime,
                     ) -> tuple[list[QueueRecord], str | None]:
        rows, last = await _page(
            self._table,
            "PartitionKey eq @pk and RowKey gt @after and RowKey lt @below and expires ge @now",
            {"pk": _META, "after": max(after or "", start), "below": start + _END, "now": now},
            limit, "listing task queues")
        return [_queue_record(r) for r in rows], last


    async def live_task_queues(self, now: datetime) -> set[str]:
        """The taskQueueIds of every task queue whose record has not expired by ``now``:
        one request per 1,000."""
        with translate("listing the live task queues"):
            return {decode(str(e["RowKey"])[len(_QUEUE):]) async for e in
                    self._table.query_entities(
                        "PartitionKey eq @pk and RowKey ge @start and RowKey lt @below and "
                        "expires ge @now", parameters={"pk": _META, "start": _QUEUE,
                                                        "below": _QUEUE + _END, "now": now},
                        select=["RowKey"], results_per_page=1000)}

    async def delete_expired(self, now: datetime) -> int:
        """Delete the task queues and provisioners that expired before ``now``; the number
        deleted. (One seen again meanwhile is written again by its next record.)"""
        with translate("listing expired task queues"):
            keys = [str(e["RowKey"]) async for e in self._table.query_entities(
                "PartitionKey eq @pk and expires lt @now", parameters={"pk": _META, "now": now},
                select=["RowKey"])]
        await delete_rows(self._table, _META, keys, "deleting expired task queues")
        return len(keys)


def _queue_record(e: Mapping[str, Any]) -> QueueRecord:
    return QueueRecord(provisioner_id=str(e["provisionerId"]),
                       task_queue_id=e.get("taskQueueId"), expires=e["expires"],
                       last_date_active=e["lastDateActive"])


async def _page(table: Any, query: str, parameters: dict[str, Any], limit: int,
                what: str) -> tuple[list[Mapping[str, Any]], str | None]:
    found: list[Mapping[str, Any]] = []
    with translate(what):
        pages = table.query_entities(query, parameters=parameters,
                                     results_per_page=limit).by_page()
        async for page in pages:
            async for row in page:
                found.append(row)
                if len(found) >= limit:
                    return found, str(row["RowKey"])
    return found, None
