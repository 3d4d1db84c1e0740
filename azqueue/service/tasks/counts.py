"""Pending and claimed tasks of a task queue: counts and listings, each at a bounded cost.

Azure queues say little about what they hold: a peek shows at most the first 32 messages
visible now, and the approximate message count includes invisible messages, which here
are mostly the tips held by running claims (a claim keeps its rewritten tip invisible
until ``takenUntil``). So:

* **Pending count**, per priority queue: a peek (1 request). Fewer than 32 visible: the
  count is those visible tips, each run counted once, less the ones this process's copy
  of the task shows to be no longer pending. 32 or more: Azure's approximate count of
  that queue (1 request more), less the claims known to hold one of its messages
  invisible (the claimed runs below); stale tips are still in it, but the tip repair
  adds none for a tip that waits untouched (see ``tips``). So 7 to 14 requests per task
  queue.
* **Claimed count** and **listClaimedTasks**: the claim index (``claimindex``), which has
  a row for runs still running ``min(30 s, claimTimeout / 2)`` after their claim, and the
  claims younger than that as each replica notes them (its own at once, the others' as
  their rows say, written at most once a second): a run is counted within about two
  seconds of its claim and leaves the count when resolved: at once in the replica that
  resolved it, within about two seconds in the others (the rows name the runs a replica
  resolved that another may have noted, ``claimindex``). One scan of the claims table
  for every task queue at once (a request per 1000 running rows) and one read of the
  replicas' notes, kept ``RUNNING_TTL`` seconds and shared by every request meanwhile,
  those that ask while it runs included.
* **listPendingTasks**: the first 32 visible tips of each priority, highest first, with
  each task read (a request per task, fewer with this process's copies) to drop stale ones.

Pending counts are kept ``COUNTS_TTL`` seconds per task queue and process, unless a
claim or resolution made in this process moves its claims meanwhile. The metrics'
gauge of pending tips (``pending_tips``) is Azure's approximate count of each priority
queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from datetime import datetime
from typing import Any

from azqueue import errors
from azqueue.model import timeutil
from azqueue.model.priority import ORDER, Priority
from azqueue.model.task import RunState, Task
from azqueue.model.tip import Tip, TipSigner
from azqueue.service.common import paging
from azqueue.service.common.gathering import gather_limited
from azqueue.service.runs.cache import TaskCache
from azqueue.service.runs.claimindex import ClaimIndex
from azqueue.storage.claims import ClaimRecord, Noted
from azqueue.storage.queues import PendingQueues, Peeked, Queues
from azqueue.storage.tasks import TaskStore

PEEK_LIMIT = 32  # Azure's
COUNTS_TTL = 5.0
RUNNING_TTL = 2.0
MAX_REMEMBERED = 10_000
_Cache = dict[str, tuple[float, int, int]]
Claims = dict[str, list[ClaimRecord]]  # the running claims, by task queue


@dataclass(frozen=True, slots=True)
class TaskQueueCounts:
    """pendingTasks, taskQueueCounts, the pending and claimed listings, and the metrics'
    approximate counts. ``running``: the claim index's runs by task queue."""

    tasks: TaskStore
    queues: Queues
    pending_queues: PendingQueues
    signer: TipSigner
    cache: TaskCache
    running: RunningClaims
    _pending: _Cache = field(default_factory=dict, init=False, repr=False)

    async def pending(self, task_queue_id: str, claims: Claims | None = None) -> int:
        """Pending tasks of ``task_queue_id``; ``claims``: the running claims by task
        queue already read for this request (else read now)."""
        async def count(name: str) -> int:
            return await self._count_pending(
                name, claims if claims is not None else await self.running.by_task_queue())
        return await _cached(self._pending, task_queue_id, count, self.running.index.generation)

    async def claimed(self, task_queue_id: str) -> int:
        return len((await self.running.by_task_queue()).get(task_queue_id, ()))

    async def pending_tasks(self, task_queue_id: str) -> dict[str, Any]:
        """The pendingTasks answer."""
        return {**_split(task_queue_id), "pendingTasks": await self.pending(task_queue_id)}

    async def counts(self, task_queue_id: str, claims: Claims | None = None) -> dict[str, Any]:
        """The taskQueueCounts answer; ``claims`` as for ``pending``."""
        claims = claims if claims is not None else await self.running.by_task_queue()
        pending = await self.pending(task_queue_id, claims)
        return {**_split(task_queue_id), "pendingTasks": pending,
                "claimedTasks": len(claims.get(task_queue_id, ()))}

    async def counts_batch(self, task_queue_ids: list[str]) -> list[dict[str, Any]]:
        """taskQueueCountsBatch: the running claims are read once for the whole batch,
        however long it takes."""
        claims = await self.running.by_task_queue()
        return await gather_limited(self.counts(t, claims) for t in task_queue_ids)

    async def pending_tips(self, task_queue_id: str) -> dict[str, int]:
        """Azure's approximate message count of each priority queue of ``task_queue_id``
        (stale tips included), by priority: seven requests (the metrics' sample)."""
        names = [self.pending_queues.name(task_queue_id, p) for p in ORDER]
        counts = await asyncio.gather(*(self.queues.approximate_count(n) for n in names))
        return {str(p): n for p, n in zip(ORDER, counts)}

    async def _count_pending(self, task_queue_id: str, claims: Claims) -> int:
        running = claims.get(task_queue_id, [])
        counts = await asyncio.gather(*(self._count_priority(task_queue_id, p, running)
                                        for p in ORDER))
        return sum(counts)

    async def _count_priority(self, task_queue_id: str, priority: Priority,
                              running: list[ClaimRecord]) -> int:
        name = self.pending_queues.name(task_queue_id, priority)
        peeked = await self.queues.peek(name, PEEK_LIMIT)
        if len(peeked) >= PEEK_LIMIT:
            held = sum(1 for r in running if r.queue == name)
            return max(len(peeked), await self.queues.approximate_count(name) - held)
        return len({tip for tip in self._tips(task_queue_id, peeked)
                    if not self._surely_stale(*tip)})

    def _tips(self, task_queue_id: str, peeked: list[Peeked]) -> list[tuple[str, int]]:
        """(taskId, runId) of each message that is a tip this queue signed."""
        tips = []
        for message in peeked:
            try:
                tip = Tip.decode(message.text)
            except ValueError:
                continue
            if self.signer.verify(task_queue_id, tip.task_id, tip.run_id, tip.signature):
                tips.append((tip.task_id, tip.run_id))
        return tips

    def _surely_stale(self, task_id: str, run_id: int) -> bool:
        """This process's copy of the task shows the run past pending (runs never return
        to pending, so an old copy is right about that)."""
        stored = self.cache.get(task_id)
        if stored is None or run_id >= len(stored.task.runs):
            return False
        return stored.task.runs[run_id].state is not RunState.PENDING

    # -- listings --------------------------------------------------------------------

    async def list_pending(self, task_queue_id: str, continuation: str | None,
                           limit: int) -> dict[str, Any]:
        """listPendingTasks: ``{taskId, runId, task, inserted}`` of pending runs, in the order
        their tips would be received (priority, then age). A page reads at most ``limit``
        tasks; one may hold fewer tasks than that (stale tips) and still a token."""
        start_rank, after = _pending_position(paging.after(continuation))
        listed: list[dict[str, Any]] = []
        size = 0  # of the entries listed, as JSON
        seen: set[tuple[str, int]] = set()
        for priority in ORDER[start_rank:]:
            peeked = await self.queues.peek(
                self.pending_queues.name(task_queue_id, priority), PEEK_LIMIT)
            if priority.rank == start_rank and after is not None:
                peeked = _after(peeked, *after)
            candidates = []
            for message in peeked:
                for tip in self._tips(task_queue_id, [message]):
                    if tip not in seen and not self._surely_stale(*tip):
                        seen.add(tip)
                        candidates.append((message, tip))
            more = len(candidates) > limit - len(listed)
            candidates = candidates[:limit - len(listed)]
            found, read = await paging.read_fitting(
                candidates, partial(self._pending_entry, task_queue_id),
                paging.MAX_PAGE_BYTES - size)
            listed += found
            size += sum(map(paging.json_size, found))
            if read < len(candidates) or size >= paging.MAX_PAGE_BYTES:
                more, candidates = True, candidates[:read]
            if more or len(listed) >= limit:
                last = candidates[-1][0]
                return {"tasks": listed, "continuationToken": paging.token(
                    f"{priority.rank}|{timeutil.fmt(last.inserted)}|{last.message_id}")}
        return {"tasks": listed}

    async def _pending_entry(self, task_queue_id: str, candidate: tuple[Peeked, tuple[str, int]]
                             ) -> dict[str, Any] | None:
        message, (task_id, run_id) = candidate
        task = await self.tasks.find(task_id)
        if task is None or not _in_state(task, run_id, RunState.PENDING) or \
                task.task_queue_id != task_queue_id:
            return None
        return {"taskId": task_id, "runId": run_id, "task": dict(task.definition),
                "inserted": timeutil.fmt(message.inserted)}

    async def list_claimed(self, task_queue_id: str, continuation: str | None,
                           limit: int) -> dict[str, Any]:
        """listClaimedTasks: ``{taskId, runId, workerGroup, workerId, claimed, task}`` of the
        running runs (``RunningClaims``), by taskId. A page reads at most ``limit`` tasks."""
        after = paging.after(continuation)
        rows = [(r.task_id, r.run_id)
                for r in (await self.running.by_task_queue()).get(task_queue_id, [])]
        if after is not None:
            rows = [r for r in rows if _claim_key(*r) > after]
        page = rows[:limit]

        async def read(row: tuple[str, int]) -> dict[str, Any] | None:
            task_id, run_id = row
            task = await self.tasks.find(task_id)
            if task is None or not _in_state(task, run_id, RunState.RUNNING):
                return None
            run = task.runs[run_id]
            return {"taskId": task_id, "runId": run_id,
                    "workerGroup": run.worker_group or "", "workerId": run.worker_id or "",
                    "claimed": timeutil.fmt(run.started or run.scheduled),
                    "task": dict(task.definition)}

        listed, read_rows = await paging.read_fitting(page, read)
        if len(rows) > read_rows:
            return {"tasks": listed,
                    "continuationToken": paging.token(_claim_key(*page[read_rows - 1]))}
        return {"tasks": listed}


class RunningClaims:
    """The running claims by task queue: the claim index's rows and the other replicas'
    notes from one scan and one read kept ``RUNNING_TTL`` seconds (a request that asks
    while they run waits for them), with this process's notes as they are now; less the
    runs any replica's row, or this process, names as ended."""

    def __init__(self, index: ClaimIndex) -> None:
        self.index = index
        self._taken: tuple[float, Noted] | None = None
        self._scan: asyncio.Future[Noted] | None = None

    async def by_task_queue(self) -> dict[str, list[ClaimRecord]]:
        """The claims of each task queue, each run once, sorted by taskId and runId."""
        now = asyncio.get_running_loop().time()
        if self._taken is not None and now - self._taken[0] < RUNNING_TTL:
            stored = self._taken[1]
        else:
            if self._scan is None:
                self._scan = asyncio.ensure_future(self._read(now))
                self._scan.add_done_callback(self._scanned)
            # Shielded: a waiter that gives up does not cancel the scan the others wait for.
            stored = await asyncio.shield(self._scan)
        ended = stored.ended | self.index.ended_here()
        runs: dict[tuple[str, int], ClaimRecord] = {}
        for record in [*stored.claims, *self.index.local()]:
            key = (record.task_id, record.run_id)
            if record.task_queue_id and key not in ended:
                runs[key] = record
        by_queue: dict[str, list[ClaimRecord]] = {}
        for key in sorted(runs):
            by_queue.setdefault(runs[key].task_queue_id, []).append(runs[key])
        return by_queue

    async def _read(self, now: float) -> Noted:
        at = timeutil.utcnow()
        indexed = [r async for r in self.index.store.running(at)]
        noted = await self.index.notes.read(at, but=self.index.replica)
        self._taken = (now, Noted(indexed + noted.claims, noted.ended))
        return self._taken[1]

    def _scanned(self, scan: asyncio.Future[Noted]) -> None:
        self._scan = None
        if not scan.cancelled():
            scan.exception()  # retrieved: its waiters have it, or nobody waits any more


async def _cached(cache: _Cache, task_queue_id: str,
                  compute: Callable[[str], Awaitable[int]], generation: int) -> int:
    """``compute(task_queue_id)``, kept ``COUNTS_TTL`` seconds while ``generation`` stays."""
    now = asyncio.get_running_loop().time()
    hit = cache.get(task_queue_id)
    if hit is not None and now - hit[0] < COUNTS_TTL and hit[2] == generation:
        return hit[1]
    value = await compute(task_queue_id)
    if len(cache) >= MAX_REMEMBERED:
        for name in [n for n, (when, _, _) in cache.items() if now - when >= COUNTS_TTL]:
            del cache[name]
    cache[task_queue_id] = (now, value, generation)
    return value


def _split(task_queue_id: str) -> dict[str, str]:
    provisioner_id, worker_type = task_queue_id.split("/", 1)
    return {"provisionerId": provisioner_id, "workerType": worker_type,
            "taskQueueId": task_queue_id}


def _in_state(task: Task | None, run_id: int, state: RunState) -> bool:
    return task is not None and run_id < len(task.runs) and task.runs[run_id].state is state


def _after(peeked: list[Peeked], inserted: datetime, message_id: str) -> list[Peeked]:
    """The messages after ``message_id`` in the queue's order; if it is gone, those not
    inserted before it."""
    for i, message in enumerate(peeked):
        if message.message_id == message_id:
            return peeked[i + 1:]
    return [m for m in peeked if m.inserted >= inserted]


def _pending_position(after: str | None) -> tuple[int, tuple[datetime, str] | None]:
    """The priority rank and message (inserted, messageId) a listPendingTasks token
    continues after."""
    if after is None:
        return 0, None
    try:
        rank, inserted, message_id = after.split("|")
        if int(rank) < len(ORDER) and message_id:
            return int(rank), (timeutil.parse(inserted), message_id)
    except ValueError:
        pass
    raise errors.InputError("`continuationToken` is not one this API returned")


def _claim_key(task_id: str, run_id: int) -> str:
    return f"{task_id}/{run_id:04d}"
