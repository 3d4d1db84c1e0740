"""Workers, task queues and provisioners: who was active, and who is quarantined
(Taskcluster's ``workerinfo``).

What is recorded, and how often (never on a request's path, never a write per claim):

* A **task queue** (and its provisioner) becomes known when a task is created for it or a
  worker asks it for work: one write (a transaction of two rows) at once, then at most one
  every ``TASK_QUEUE_RECORD_INTERVAL`` seconds per task queue and process while tasks are
  created and claimed (``IDLE_RECORD_INTERVAL`` while its workers only wait). Each write sets
  ``lastDateActive`` and ``expires`` (``TASK_QUEUE_EXPIRY`` ahead).
* A **worker** is recorded when it calls claimWork (as the call begins, not once its wait
  is over), claims a task or reclaims one: at once the first time this process sees it
  (and once more at its first claims, when that first sight brought none), then at most
  every ``WORKER_RECORD_INTERVAL``
  seconds while it claims tasks (``IDLE_RECORD_INTERVAL`` while it only waits,
  so that waiting costs next to nothing); the tasks it claimed meanwhile (``recentTasks``, the latest 20) are written
  once that interval has passed (``FLUSH_INTERVAL`` later at most), whether it calls again
  or not. Each write sets ``lastDateActive`` and
  ``expires`` (``WORKER_EXPIRY`` ahead, or later if declareWorker said so).
* **Quarantine**: whether a worker is quarantined is read from a copy of the task queue's
  quarantined workers that is at most ``QUARANTINE_TTL`` seconds old (one query per task
  queue and process per TTL, shared by every claim; claimWork asks only once it has a
  task to hand out, so a waiting worker asks nothing). quarantineWorker drops this process's
  copy, so it takes effect here at once and on other replicas within ``QUARANTINE_TTL``.
  ``quarantineUntil`` is compared with the clock at each check: a quarantine ends on time
  everywhere. If the query fails, claims go on with the last copy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from datetime import datetime, timedelta
from typing import Any

from azqueue import errors
from azqueue.model import timeutil
from azqueue.service.common import paging
from azqueue.storage.workers import QueueRecord, TaskQueueStore, WorkerRecord, WorkerStore

log = logging.getLogger(__name__)

TASK_QUEUE_EXPIRY = timedelta(days=5)
WORKER_EXPIRY = timedelta(days=1)
TASK_QUEUE_RECORD_INTERVAL = 300.0
WORKER_RECORD_INTERVAL = 30.0
# A worker that claims nothing (it waits, at rest), and a task queue whose workers claim
# nothing, are recorded this seldom.
IDLE_RECORD_INTERVAL = 1800.0
QUARANTINE_TTL = 10.0
# How often the claims noted since a worker's last write are looked at.
FLUSH_INTERVAL = 5.0
# Entries this process remembers before it forgets the idle ones.
MAX_REMEMBERED = 100_000
CLOSE_TIMEOUT = 5.0

_DESCRIPTION = ""
_STABILITY = "experimental"

WorkerKey = tuple[str, str, str]  # taskQueueId, workerGroup, workerId


class WorkerInfo:
    """Worker bookkeeping, quarantine checks and the worker metadata listings of one
    process."""

    def __init__(self, workers: WorkerStore, task_queues: TaskQueueStore) -> None:
        self.workers = workers
        self.task_queues = task_queues
        self._queues_written: dict[str, float] = {}  # taskQueueId -> when (loop time)
        # worker -> when last written (loop time), claims noted since
        self._seen: dict[WorkerKey, tuple[float, list[tuple[str, int]]]] = {}
        # taskQueueId -> when read (loop time), {(workerGroup, workerId): quarantineUntil}
        self._quarantined: dict[str, tuple[float, dict[tuple[str, str], datetime]]] = {}
        self._reading: dict[str, asyncio.Future[dict[tuple[str, str], datetime]]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None

    async def setup(self) -> None:
        await self.workers.ensure()
        await self.task_queues.ensure()
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_loop(), name="worker records")

    async def close(self) -> None:
        """Write what is left of the bookkeeping (briefly). What requests still being
        answered note after this is dropped: the storage they would write to closes next."""
        self._stop.set()
        if self._flusher is not None:
            await self._flusher
        for key, (_, pending) in list(self._seen.items()):
            if pending:
                self._spawn(self._write_worker(key, pending))
        self._seen.clear()
        if self._background:
            await asyncio.wait(self._background, timeout=CLOSE_TIMEOUT)

    # -- bookkeeping -----------------------------------------------------------------

    def task_queue_active(self, task_queue_id: str, idle: bool = False) -> None:
        """A task was created for the task queue, or a worker asked it for work (``idle``:
        and got none)."""
        if self._stop.is_set():
            return
        now = asyncio.get_running_loop().time()
        last = self._queues_written.get(task_queue_id, float("-inf"))
        if now - last < (IDLE_RECORD_INTERVAL if idle else TASK_QUEUE_RECORD_INTERVAL):
            return
        if len(self._queues_written) >= MAX_REMEMBERED:
            self._forget(self._queues_written, now - TASK_QUEUE_RECORD_INTERVAL)
        self._queues_written[task_queue_id] = now
        self._spawn(self._write_task_queue(task_queue_id))

    def worker_active(self, task_queue_id: str, worker_group: str, worker_id: str,
                      claimed: Sequence[tuple[str, int]] = ()) -> None:
        """The worker called (claimWork, claimTask, reclaimTask) and claimed ``claimed``."""
        if self._stop.is_set():
            return
        self.task_queue_active(task_queue_id, idle=not claimed)
        key = (task_queue_id, worker_group, worker_id)
        now = asyncio.get_running_loop().time()
        last, pending = self._seen.get(key, (float("-inf"), []))
        pending = pending + list(claimed)
        interval = WORKER_RECORD_INTERVAL if pending else IDLE_RECORD_INTERVAL
        if now - last < interval:
            self._seen[key] = (last, pending)
            return
        if len(self._seen) >= MAX_REMEMBERED:
            self._seen = {k: v for k, v in self._seen.items()
                          if v[1] or now - v[0] < WORKER_RECORD_INTERVAL}
        first = last == float("-inf")
        # A first sight without claims (a claimWork call as it begins) is written at once
        # but holds back none of the claims that follow: they are written as they come.
        self._seen[key] = (now - WORKER_RECORD_INTERVAL if first and not pending else now, [])
        self._spawn(self._write_worker(key, pending, first=first))

    def _spawn(self, job: Awaitable[None]) -> None:
        task = asyncio.ensure_future(job)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @staticmethod
    def _forget(entries: dict[str, float], before: float) -> None:
        for name in [n for n, when in entries.items() if when < before]:
            del entries[name]

    async def _write_task_queue(self, task_queue_id: str) -> None:
        now = timeutil.utcnow()
        try:
            await self.task_queues.seen(task_queue_id, now, now + TASK_QUEUE_EXPIRY)
        except errors.StorageError as e:
            self._queues_written.pop(task_queue_id, None)  # the next sight tries again
            log.warning("could not record task queue %s: %s", task_queue_id, e)
        except Exception:
            self._queues_written.pop(task_queue_id, None)
            log.exception("could not record task queue %s", task_queue_id)

    async def _write_worker(self, key: WorkerKey, claimed: list[tuple[str, int]],
                            first: bool = False) -> None:
        now = timeutil.utcnow()
        try:
            await self.workers.seen(*key, now, claimed, now + WORKER_EXPIRY, first)
        except errors.StorageError as e:
            log.warning("could not record worker %s/%s: %s", key[1], key[2], e)
        except Exception:
            log.exception("could not record worker %s/%s", key[1], key[2])

    async def _flush_loop(self) -> None:
        """Write the claims noted for workers whose last write is old enough."""
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), FLUSH_INTERVAL)
            except TimeoutError:
                pass
            now = asyncio.get_running_loop().time()
            for key, (last, pending) in list(self._seen.items()):
                if pending and now - last >= WORKER_RECORD_INTERVAL:
                    self._seen[key] = (now, [])
                    self._spawn(self._write_worker(key, pending))

    # -- quarantine ------------------------------------------------------------------

    async def quarantined_until(self, task_queue_id: str, worker_group: str,
                                worker_id: str) -> datetime | None:
        """When the worker's quarantine ends, if it is quarantined now (as of a copy at
        most ``QUARANTINE_TTL`` seconds old)."""
        now = asyncio.get_running_loop().time()
        cached = self._quarantined.get(task_queue_id)
        if cached is not None and now - cached[0] < QUARANTINE_TTL:
            quarantined = cached[1]
        else:
            quarantined = await self._read_quarantined(task_queue_id)
        until = quarantined.get((worker_group, worker_id))
        return until if until is not None and until > timeutil.utcnow() else None

    async def _read_quarantined(self, task_queue_id: str) -> dict[tuple[str, str], datetime]:
        """Read the task queue's quarantined workers (callers at the same time share one
        request)."""
        reading = self._reading.get(task_queue_id)
        if reading is None:
            reading = self._reading[task_queue_id] = asyncio.ensure_future(
                self._fetch_quarantined(task_queue_id))
            reading.add_done_callback(lambda _: self._reading.pop(task_queue_id, None))
        return await asyncio.shield(reading)

    async def _fetch_quarantined(self, task_queue_id: str) -> dict[tuple[str, str], datetime]:
        """A storage failure does not stop claims: the last copy (or none) is kept for
        another ``QUARANTINE_TTL``."""
        started = asyncio.get_running_loop().time()
        try:
            found = await self.workers.quarantined(task_queue_id, timeutil.utcnow())
        except errors.StorageError as e:
            log.warning("could not read the quarantined workers of %s (claims go on with "
                        "the last copy): %s", task_queue_id, e)
            found = self._quarantined.get(task_queue_id, (started, {}))[1]
        if len(self._quarantined) >= MAX_REMEMBERED:
            self._quarantined = {k: v for k, v in self._quarantined.items()
                                 if started - v[0] < QUARANTINE_TTL}
        self._quarantined[task_queue_id] = (started, found)
        return found

    async def refuse_quarantined(self, task_queue_id: str, worker_group: str,
                                 worker_id: str) -> None:
        """Quarantined (403) if the worker may not claim work now."""
        until = await self.quarantined_until(task_queue_id, worker_group, worker_id)
        if until is not None:
            raise errors.Quarantined(
                f"worker {worker_group}/{worker_id} of {task_queue_id} is quarantined until "
                f"{timeutil.fmt(until)} and may not claim tasks; leave the message you polled "
                "(another worker will get it), or lift the quarantine with quarantineWorker")

    async def expire(self, now: datetime) -> int:
        """Delete the workers, task queues and provisioners that expired before ``now``
        (quarantined workers stay until their quarantine ends); the number deleted."""
        deleted = await self.workers.delete_expired(now)
        deleted += await self.task_queues.delete_expired(now)
        # A task queue this process recorded may be gone: record it again when next seen.
        self._queues_written.clear()
        return deleted

    # -- the worker metadata API -----------------------------------------------------

    async def quarantine_worker(self, task_queue_id: str, worker_group: str, worker_id: str,
                                until: str, info: str | None, client_id: str) -> dict[str, Any]:
        detail = {"clientId": client_id, "updatedAt": timeutil.fmt(timeutil.utcnow()),
                  "quarantineUntil": timeutil.normalize(until),
                  "quarantineInfo": info or "[unspecified]"}
        record = await self.workers.quarantine(task_queue_id, worker_group, worker_id,
                                               timeutil.parse(until), detail)
        if record is None:
            raise errors.NotFound(f"worker {worker_group}/{worker_id} of {task_queue_id} is not "
                                  "known: it becomes known when it asks for work (or with "
                                  "declareWorker)")
        self._quarantined.pop(task_queue_id, None)  # in effect here at once
        return _worker(record)

    async def declare_worker(self, task_queue_id: str, worker_group: str, worker_id: str,
                             expires: str) -> dict[str, Any]:
        now = timeutil.utcnow()
        await self.task_queues.seen(task_queue_id, now, now + TASK_QUEUE_EXPIRY)
        self._queues_written[task_queue_id] = asyncio.get_running_loop().time()
        record = await self.workers.declare(task_queue_id, worker_group, worker_id, now,
                                            timeutil.parse(expires))
        return _worker(record)

    async def worker(self, task_queue_id: str, worker_group: str, worker_id: str
                     ) -> dict[str, Any]:
        record = await self.workers.get(task_queue_id, worker_group, worker_id)
        now = timeutil.utcnow()
        if record is None or (record.expires < now and not _quarantined(record, now)):
            raise errors.NotFound(f"no worker {worker_group}/{worker_id} in {task_queue_id} "
                                  "(a worker is known once it asked for work, until a day "
                                  "after it last did)")
        return _worker(record)

    async def list_workers(self, task_queue_id: str, continuation: str | None, limit: int,
                           quarantined: bool | None) -> dict[str, Any]:
        records, last = await self.workers.page(task_queue_id, paging.after(continuation), limit)
        now = timeutil.utcnow()
        listed = []
        for r in records:
            q = _quarantined(r, now)
            if (r.expires < now and not q) or (quarantined is not None and q != quarantined):
                continue
            entry: dict[str, Any] = {"workerGroup": r.worker_group, "workerId": r.worker_id,
                                     "firstClaim": timeutil.fmt(r.first_claim)}
            if r.recent_tasks:
                entry["latestTask"] = r.recent_tasks[-1]
            if q and r.quarantine_until is not None:
                entry["quarantineUntil"] = timeutil.fmt(r.quarantine_until)
            listed.append(entry)
        return {"workers": listed, **_token(last)}

    async def task_queue(self, task_queue_id: str) -> dict[str, Any]:
        record = await self.task_queues.get_task_queue(task_queue_id)
        if record is None or record.expires < timeutil.utcnow():
            raise errors.NotFound(f"no task queue {task_queue_id}: a task queue is known once "
                                  "a task was created for it or a worker asked it for work")
        return _task_queue(record)

    async def list_task_queues(self, continuation: str | None, limit: int) -> dict[str, Any]:
        records, last = await self.task_queues.task_queues("", paging.after(continuation),
                                                           limit, timeutil.utcnow())
        return {"taskQueues": [_task_queue(r) for r in records], **_token(last)}

    async def worker_type(self, provisioner_id: str, worker_type: str) -> dict[str, Any]:
        return _worker_type(await self.task_queue(f"{provisioner_id}/{worker_type}"))

    async def list_worker_types(self, provisioner_id: str, continuation: str | None,
                                limit: int) -> dict[str, Any]:
        records, last = await self.task_queues.task_queues(
            f"{provisioner_id}/", paging.after(continuation), limit, timeutil.utcnow())
        return {"workerTypes": [_worker_type(_task_queue(r)) for r in records], **_token(last)}

    async def provisioner(self, provisioner_id: str) -> dict[str, Any]:
        record = await self.task_queues.get_provisioner(provisioner_id)
        if record is None or record.expires < timeutil.utcnow():
            raise errors.NotFound(f"no provisioner {provisioner_id}: a provisioner is known once "
                                  "a task was created for one of its task queues or a worker "
                                  "asked one for work")
        return _provisioner(record)

    async def list_provisioners(self, continuation: str | None, limit: int) -> dict[str, Any]:
        records, last = await self.task_queues.provisioners(paging.after(continuation), limit,
                                                            timeutil.utcnow())
        return {"provisioners": [_provisioner(r) for r in records], **_token(last)}


def _token(last: str | None) -> dict[str, str]:
    return {"continuationToken": paging.token(last)} if last is not None else {}


def _quarantined(record: WorkerRecord, now: datetime) -> bool:
    return record.quarantine_until is not None and record.quarantine_until > now


def _activity(record: QueueRecord) -> dict[str, Any]:
    return {"description": _DESCRIPTION, "stability": _STABILITY,
            "expires": timeutil.fmt(record.expires),
            "lastDateActive": timeutil.fmt(record.last_date_active)}


def _task_queue(record: QueueRecord) -> dict[str, Any]:
    return {"taskQueueId": record.task_queue_id, **_activity(record)}


def _worker_type(task_queue: dict[str, Any]) -> dict[str, Any]:
    provisioner_id, worker_type = str(task_queue["taskQueueId"]).split("/", 1)
    return {"provisionerId": provisioner_id, "workerType": worker_type, **task_queue}


def _provisioner(record: QueueRecord) -> dict[str, Any]:
    return {"provisionerId": record.provisioner_id, **_activity(record)}


def _worker(r: WorkerRecord) -> dict[str, Any]:
    provisioner_id, worker_type = r.task_queue_id.split("/", 1)
    answer: dict[str, Any] = {
        "provisionerId": provisioner_id, "workerType": worker_type,
        "taskQueueId": r.task_queue_id, "workerGroup": r.worker_group, "workerId": r.worker_id,
        "recentTasks": r.recent_tasks, "expires": timeutil.fmt(r.expires),
        "firstClaim": timeutil.fmt(r.first_claim),
        "quarantineDetails": r.quarantine_details,
    }
    if r.last_date_active is not None:
        answer["lastDateActive"] = timeutil.fmt(r.last_date_active)
    if r.quarantine_until is not None:
        answer["quarantineUntil"] = timeutil.fmt(r.quarantine_until)
    return answer
