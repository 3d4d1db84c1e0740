"""The claim index in Azure Tables: which running runs are claimed until when.

PartitionKey = taskId, RowKey = runId, ``takenUntil``, ``taskQueueId`` (for the
claimed-task listings and counts of a task queue) and ``queue``, the pending queue whose
message the claim holds invisible (so that the pending count of a long queue, read from
Azure's message count, leaves it out); both absent from rows of earlier versions.
The claim resolver lists the rows
whose ``takenUntil`` has passed and expires those runs. A row is written only for a claim
that is still running some seconds after it was made (see ``service.runs.claimindex``), so
the table holds about the long-running runs and a short task costs it nothing. What the
claim holds (message, pop receipt) is on the task itself (``TaskStore``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from azure.data.tables import UpdateMode

from azqueue.model import timeutil
from azqueue.storage.account import StorageAccount
from azqueue.storage.errors import EntityNotFound, translate
from azqueue.storage.rows import delete_rows
from azqueue.storage.tables import TableStore


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    task_id: str
    run_id: int
    taken_until: datetime
    task_queue_id: str = ""
    queue: str = ""  # the pending queue holding the claim's message; "" if none or unknown

    def to_entity(self) -> dict[str, Any]:
        entity = {"PartitionKey": self.task_id, "RowKey": str(self.run_id),
                  "takenUntil": self.taken_until}
        if self.task_queue_id:
            entity["taskQueueId"] = self.task_queue_id
        if self.queue:
            entity["queue"] = self.queue
        return entity

    @classmethod
    def from_entity(cls, e: Any) -> ClaimRecord:
        return cls(task_id=e["PartitionKey"], run_id=int(e["RowKey"]),
                   taken_until=e["takenUntil"], task_queue_id=e.get("taskQueueId", ""),
                   queue=e.get("queue", ""))

    def to_list(self) -> list[Any]:
        return [self.task_id, self.run_id, timeutil.fmt(self.taken_until), self.task_queue_id,
                self.queue]

    @classmethod
    def from_list(cls, item: list[Any]) -> ClaimRecord:
        return cls(str(item[0]), int(item[1]), timeutil.parse(str(item[2])), str(item[3]),
                   str(item[4]))


class ClaimStore(TableStore):
    """The claim index table."""

    def __init__(self, account: StorageAccount) -> None:
        super().__init__(account, "claims")

    async def put(self, record: ClaimRecord) -> None:
        with translate(f"indexing the claim of {record.task_id}/{record.run_id}"):
            await self._table.upsert_entity(record.to_entity(), mode=UpdateMode.REPLACE)

    async def get(self, task_id: str, run_id: int) -> ClaimRecord | None:
        try:
            with translate(f"reading the claim of {task_id}/{run_id}"):
                entity = await self._table.get_entity(task_id, str(run_id))
        except EntityNotFound:
            return None
        return ClaimRecord.from_entity(entity)

    async def delete(self, task_id: str, run_id: int) -> None:
        """Delete the row; nothing if it is gone already."""
        try:
            with translate(f"deleting the claim of {task_id}/{run_id}"):
                await self._table.delete_entity(task_id, str(run_id))
        except EntityNotFound:
            pass

    async def delete_task(self, task_id: str) -> None:
        """Delete the rows of all of a task's runs."""
        with translate(f"listing the claims of task {task_id}"):
            runs = [str(e["RowKey"]) async for e in self._table.query_entities(
                "PartitionKey eq @pk", parameters={"pk": task_id}, select=["RowKey"])]
        await delete_rows(self._table, task_id, runs, f"deleting the claims of task {task_id}")

    async def running(self, now: datetime) -> AsyncIterator[ClaimRecord]:
        """The rows of the runs claimed beyond ``now``, of every task queue: a scan of the
        table (as ``expired`` is), a request per 1000 rows."""
        with translate("listing the running claims"):
            pages = self._table.query_entities(
                "takenUntil ge @now", parameters={"now": now}, results_per_page=1000)
            async for entity in pages:
                yield ClaimRecord.from_entity(entity)

    async def every(self) -> AsyncIterator[ClaimRecord]:
        """Every row, expired or not: a scan of the table, a request per 1000 rows."""
        with translate("listing the claims"):
            pages = self._table.query_entities("", results_per_page=1000)
            async for entity in pages:
                yield ClaimRecord.from_entity(entity)

    async def expired(self, now: datetime) -> AsyncIterator[ClaimRecord]:
        with translate("listing expired claims"):
            pages = self._table.query_entities("takenUntil lt @now", parameters={"now": now},
                                               results_per_page=1000)
            async for entity in pages:
                yield ClaimRecord.from_entity(entity)


# Notes of one replica are written in properties of at most this many characters (Azure
# allows 32K per string property), at most this many notes a replica, and at most this
# many runs it resolved that others may have noted (the last ones given: the newest).
NOTES_CHUNK = 30_000
MAX_NOTES = 3_000
MAX_ENDED = 1_000


@dataclass(frozen=True, slots=True)
class Noted:
    """What the other replicas' rows say: the claims they noted, and the runs they
    resolved that a replica may still hold a note of (``ClaimNotes``)."""

    claims: list[ClaimRecord]
    ended: set[tuple[str, int]]


class ClaimNotes(TableStore):
    """The claims each replica made and has not indexed yet (``service.runs.claimindex``): one
    row per replica, PartitionKey ``notes``, RowKey the replica's id, written at most once a
    second while its claims change and read by every replica's claimed counts, so a claim
    is counted within seconds wherever it was made. ``freshUntil`` lets readers ignore the
    row of a replica that stopped writing it (it died: its claims are then counted once
    indexed by the claim resolver's means, as before).

    The row also names the runs its replica resolved but did not claim while they were
    young (``ended``, ``endedChunks``): another replica may still hold a note of them,
    which every reader leaves out. A row without them (an earlier release's) names none,
    and an earlier release reads the notes alone."""

    def __init__(self, account: StorageAccount) -> None:
        super().__init__(account, "claimnotes")

    async def publish(self, replica: str, notes: list[ClaimRecord],
                      ended: list[tuple[str, int]], fresh_until: datetime) -> None:
        entity: dict[str, Any] = {"PartitionKey": "notes", "RowKey": replica,
                                  "freshUntil": fresh_until}
        entity.update(_chunked("notes", "chunks", [n.to_list() for n in notes[:MAX_NOTES]]))
        entity.update(_chunked("ended", "endedChunks", [list(e) for e in ended[-MAX_ENDED:]]))
        with translate("writing this replica's claim notes"):
            await self._table.upsert_entity(entity, mode=UpdateMode.REPLACE)

    async def read(self, now: datetime, but: str = "") -> Noted:
        """The notes of every replica whose row is fresh, except ``but``'s."""
        noted = Noted([], set())
        with translate("reading the replicas' claim notes"):
            async for e in self._table.query_entities(
                    "PartitionKey eq 'notes' and freshUntil ge @now", parameters={"now": now}):
                if e["RowKey"] == but:
                    continue
                try:
                    claims = [ClaimRecord.from_list(item)
                              for item in _joined(e, "notes", "chunks")]
                    ended = {(str(item[0]), int(item[1]))
                             for item in _joined(e, "ended", "endedChunks")}
                except (ValueError, TypeError, IndexError, KeyError):
                    continue  # a row being rewritten by a newer release
                noted.claims.extend(claims)
                noted.ended.update(ended)
        return noted

    async def remove(self, replica: str) -> None:
        try:
            with translate("removing this replica's claim notes"):
                await self._table.delete_entity("notes", replica)
        except EntityNotFound:
            pass


def _chunked(name: str, count: str, items: list[list[Any]]) -> dict[str, Any]:
    """``items`` as JSON in properties ``name0``, ``name1``, … of at most ``NOTES_CHUNK``
    characters, and how many there are in ``count``."""
    text = json.dumps(items, separators=(",", ":"))
    chunks = [text[i:i + NOTES_CHUNK] for i in range(0, len(text), NOTES_CHUNK)]
    return {count: len(chunks), **{f"{name}{i}": chunk for i, chunk in enumerate(chunks)}}


def _joined(entity: Any, name: str, count: str) -> list[Any]:
    """What ``_chunked`` wrote; nothing if the row has no ``count``."""
    text = "".join(str(entity.get(f"{name}{i}", "")) for i in range(int(entity.get(count, 0))))
    items = json.loads(text or "[]")
    if not isinstance(items, list):
        raise ValueError("not a list")
    return items
