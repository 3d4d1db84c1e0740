"""The doorbell table: how replicas without a broker tell each other that a task queue's
tips became visible (``service.dispatch.doorbell``, ``service.dispatch.tablebell``).

Table ``<prefix>doorbell``, one partition ``bell``:

* RowKey ``r:<taskQueueId>`` (key-encoded) is the task queue's **ring**: a property
  ``p<rank>`` per priority, the time of the last ring of that priority's queue. A ring
  merges only the priorities it rings, so rings of one task queue by several replicas
  never undo one another.
* RowKey ``e:<taskQueueId>:<replica>`` is an **ear**: the replica has claimWork callers
  or SAS workers waiting on that task queue until ``until`` (it rewrites the row before
  then while they wait). A replica rings a task queue only while another replica's ear
  on it is fresh, so tasks nobody waits for elsewhere cost no ring.

Every replica reads the rows changed since its last read (Azure's ``Timestamp``, with a
margin for writes that commit out of order), one request per read whatever the number
of task queues, and hears the rings whose ETag it has not seen.

Rows nobody wrote for a while are deleted (``sweep``): an ear not rewritten since it
expired (its replica stopped waiting, or stopped), a ring not rung since. Each delete is
conditional on the ETag read, so a row written meanwhile stays.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from azure.core import MatchConditions
from azure.data.tables import UpdateMode

from azqueue.model import timeutil
from azqueue.storage.account import StorageAccount
from azqueue.storage.errors import EntityNotFound, ETagMismatch, translate
from azqueue.storage.keys import decode, encode
from azqueue.storage.tables import TableStore

_PARTITION = "bell"
_RING, _EAR = "r:", "e:"
# Writes may commit out of the order of their Timestamps: each read goes back this far.
MARGIN = timedelta(seconds=5)


@dataclass(frozen=True, slots=True)
class Ring:
    """A task queue's ring row as read: when each priority's queue was last rung."""

    task_queue_id: str
    rung: dict[int, float]  # rank -> time of the ring (seconds since the epoch)


@dataclass(frozen=True, slots=True)
class Ear:
    """A replica waiting on a task queue until ``until``."""

    task_queue_id: str
    replica: str
    until: datetime


@dataclass(frozen=True, slots=True)
class ChangedRows:
    """The rows of the doorbell table changed since a read, and the newest of their
    Timestamps (where the next read starts)."""

    rings: list[tuple[str, Ring]]  # (ETag, ring)
    ears: list[Ear]
    newest: datetime | None  # the newest Timestamp read


class BellTable(TableStore):
    """The doorbell table of one deployment."""

    def __init__(self, account: StorageAccount) -> None:
        super().__init__(account, "doorbell")

    async def ring(self, rings: dict[str, set[int]], now: datetime) -> None:
        """Ring the priorities (ranks) of each task queue: one transaction per 100 task
        queues."""
        stamp = now.timestamp()
        items = sorted(rings.items())
        for i in range(0, len(items), 100):
            operations: list[Any] = [
                ("upsert", {"PartitionKey": _PARTITION, "RowKey": _RING + encode(tq),
                            **{f"p{rank}": stamp for rank in ranks}}, {"mode": UpdateMode.MERGE})
                for tq, ranks in items[i:i + 100]]
            with translate("ringing the doorbell"):
                await self._table.submit_transaction(operations)

    async def listen(self, task_queue_ids: Iterable[str], replica: str, until: datetime) -> None:
        """Note that ``replica`` waits on these task queues until ``until``."""
        items = sorted(task_queue_ids)
        for i in range(0, len(items), 100):
            operations: list[Any] = [
                ("upsert", {"PartitionKey": _PARTITION,
                            "RowKey": f"{_EAR}{encode(tq)}:{replica}", "until": until},
                 {"mode": UpdateMode.REPLACE})
                for tq in items[i:i + 100]]
            with translate("noting the task queues this replica waits on"):
                await self._table.submit_transaction(operations)

    async def changes(self, since: datetime | None) -> ChangedRows:
        """The rows changed since ``since`` (less ``MARGIN``); all rows without it."""
        query = "PartitionKey eq @pk"
        parameters: dict[str, Any] = {"pk": _PARTITION}
        if since is not None:
            query += " and Timestamp ge @since"
            parameters["since"] = since - MARGIN
        rings: list[tuple[str, Ring]] = []
        ears: list[Ear] = []
        newest: datetime | None = None
        with translate("reading the doorbell"):
            async for e in self._table.query_entities(query, parameters=parameters,
                                                      results_per_page=1000):
                stamp = e.metadata.get("timestamp")
                if stamp is not None and (newest is None or stamp > newest):
                    newest = stamp
                key = str(e["RowKey"])
                if key.startswith(_RING):
                    rung = {int(name[1:]): float(value) for name, value in e.items()
                            if name[:1] == "p" and name[1:].isdigit()}
                    rings.append((str(e.metadata.get("etag", "")),
                                  Ring(decode(key[len(_RING):]), rung)))
                elif key.startswith(_EAR):
                    queue, _, replica = key[len(_EAR):].rpartition(":")
                    until = e.get("until")
                    if isinstance(until, datetime):
                        ears.append(Ear(decode(queue), replica, until))
        return ChangedRows(rings, ears, newest)

    async def sweep(self, before: datetime) -> int:
        """Delete the rows last written before ``before``, unless they change meanwhile;
        how many were deleted."""
        query = "PartitionKey eq @pk and Timestamp lt @before"
        parameters: dict[str, Any] = {"pk": _PARTITION, "before": before}
        with translate("reading the doorbell's old rows"):
            old = [(str(e["RowKey"]), str(e.metadata.get("etag", ""))) async for e in
                   self._table.query_entities(query, parameters=parameters,
                                              select=["RowKey"], results_per_page=1000)]
        deleted = 0
        for key, etag in old:
            try:
                with translate("deleting an old row of the doorbell"):
                    await self._table.delete_entity(_PARTITION, key, etag=etag,
                                                    match_condition=MatchConditions.IfNotModified)
                deleted += 1
            except (EntityNotFound, ETagMismatch):
                pass  # another replica's sweep took it, or it was written again
        return deleted

    async def forget(self, task_queue_ids: Iterable[str], replica: str) -> None:
        """Remove ``replica``'s ears (it stops); an ear left behind expires by itself."""
        now = timeutil.utcnow()
        await self.listen(task_queue_ids, replica, now)
