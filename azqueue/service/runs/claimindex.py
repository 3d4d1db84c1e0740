"""Which claims the claim resolver must watch: the claim index, written late.

A claim normally ends through its worker's report, or expires through its tip (the
message reappears at ``takenUntil`` and the next claim resolves the old run). The claim
resolver is for the rest: nobody polling that task queue, a claim made without a tip. It
lists the rows of the claims table (``storage.claims``) whose ``takenUntil`` has passed.

Most runs end within seconds, and their rows would be written and deleted for nothing.
So a claim is only noted here, in the process that made it, and its row is written once
the run is still running ``delay`` seconds later (checked with a read first; at most
half the claim timeout, so the row is there well before ``takenUntil``). A run resolved
before that costs the index nothing; a longer one costs a read, a write and a delete. A
reclaim of an indexed run moves its row; a resolution of a run old enough to have a row
deletes it, and the claim resolver deletes any row whose run it finds resolved.

What a process that dies loses is the notes it had not written yet: those claims still
expire through their tips when any worker polls the task queue, and at the latest with
the task's deadline. A process that stops writes its notes before it closes.

The notes are also what the claimed counts and listings read for runs too young to be
indexed: each process writes its notes to a row of its own (``ClaimNotes``) at most once
a second while they change, and every replica's counts read those rows with the index.
That costs a write per replica per second of changing claims, not a request per run, and
a claim is counted within about two seconds wherever it was made (at once in its own
process). ``generation`` moves whenever this process's notes do, so that its counts
cached a moment ago are not answered after a claim or a resolution made here.

A run resolved here that this process did not note may still be noted by the replica
that claimed it, until that one indexes it (or finds it resolved) ``delay`` seconds after
the claim. So while it may be, this process names it in its own row as ended (``ended``,
kept until ``ENDED_MARGIN`` past that), and every replica's counts leave out the notes
and rows of the runs any replica names so: a run resolved through another replica than
the one that claimed it leaves every count within about two seconds too. That costs no
request per run: the row is written at most once a second while this process's notes or
ended runs change, and refreshed every ``NOTES_REFRESH`` while it names any (until
``delay + ENDED_MARGIN``, 40 s, after the last such run's claim). A run noted by two
replicas (a repeated claim answered by both) and resolved through one of them stays in
the other's notes until that one finds it resolved.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import uuid
from dataclasses import replace
from datetime import datetime, timedelta

from azqueue import errors
from azqueue.model import timeutil
from azqueue.model.task import RunState
from azqueue.service.common.gathering import gather_limited
from azqueue.storage.claims import ClaimNotes, ClaimRecord, ClaimStore
from azqueue.storage.tasks import TaskStore

log = logging.getLogger(__name__)

# How long a run must still be running after its claim before it is indexed.
INDEX_DELAY = timedelta(seconds=30)
# Another replica's clock may run behind ours: a run this much younger than the delay
# may have a row too.
CLOCK_SLACK = timedelta(seconds=5)
CLOSE_TIMEOUT = 10.0
# How often the notes are written while they change; how long readers trust a row (a
# replica rewrites its row at least every NOTES_REFRESH while it has notes).
NOTES_INTERVAL = 1.0
NOTES_REFRESH = timedelta(seconds=5)
NOTES_FRESH = timedelta(seconds=15)
# How long past the moment the claiming replica drops its note (``delay`` after the claim,
# by its clock) a run resolved here stays named as ended: that replica's clock may be
# behind ours, and its row without the note is written a moment after.
ENDED_MARGIN = 2 * CLOCK_SLACK


class ClaimIndex:
    """Notes this process's claims and writes the claim index rows of those still running."""

    def __init__(self, store: ClaimStore, notes: ClaimNotes, tasks: TaskStore,
                 claim_timeout: timedelta) -> None:
        self.store = store
        self.notes = notes
        self.tasks = tasks
        self.delay = min(INDEX_DELAY, claim_timeout / 2)
        self.replica = uuid.uuid4().hex
        self.generation = 0
        # (taskId, runId) -> when this process claimed it, and the run's claim record
        self._notes: dict[tuple[str, int], tuple[datetime, ClaimRecord]] = {}
        # (taskId, runId) -> until when: runs resolved here that another replica may still
        # hold a note of, oldest first
        self._ended: dict[tuple[str, int], datetime] = {}
        # The notes' takenUntil, earliest first (a heap): an entry whose note is gone or
        # holds another takenUntil now is stale, dropped once it comes first
        # (``earliest``), so that no claim costs a look at every note.
        self._ends: list[tuple[datetime, str, int]] = []
        self._published: tuple[int, datetime] | None = None  # generation, when
        self._stop = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        # Set when a claim noted here is due before every other note (the claim resolver
        # sleeps until the earliest takenUntil it knows of; a later one cannot move that).
        self.changed = asyncio.Event()

    def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.create_task(self._run(), name="claim index")

    def claimed(self, task_id: str, run_id: int, taken_until: datetime, task_queue_id: str,
                queue: str = "") -> None:
        """This process claimed the run (or answered a repeated claim of it), holding a
        message of the pending queue ``queue`` (if any)."""
        first = self.earliest()
        self._note((task_id, run_id), timeutil.utcnow(),
                   ClaimRecord(task_id, run_id, taken_until, task_queue_id, queue))
        self.generation += 1
        if first is None or taken_until < first:
            self.changed.set()

    def local(self) -> list[ClaimRecord]:
        """This process's claims not indexed yet."""
        return [record for _, record in self._notes.values()]

    def ended_here(self) -> set[tuple[str, int]]:
        """(taskId, runId) of the runs resolved here that another replica may still note."""
        return set(self._ended)
    def earliest(self) -> datetime | None:
        """The earliest takenUntil of this process's claims not indexed yet (None: none)."""
        ends, notes = self._ends, self._notes
        while ends:
            taken_until, task_id, run_id = ends[0]
            note = notes.get((task_id, run_id))
            if note is not None and note[1].taken_until == taken_until:
                return taken_until
            heapq.heappop(ends)
        return None

    def _note(self, key: tuple[str, int], made: datetime, record: ClaimRecord) -> None:
        self._notes[key] = (made, record)
        if len(self._ends) > 2 * len(self._notes) + 64:  # mostly stale: start again
            self._ends = [(r.taken_until, r.task_id, r.run_id) for _, r in self._notes.values()]
            heapq.heapify(self._ends)
        else:
            heapq.heappush(self._ends, (record.taken_until, *key))

    async def extended(self, task_id: str, run_id: int, started: datetime | None,
                       taken_until: datetime, task_queue_id: str = "", queue: str = "") -> None:
        """The run was reclaimed until ``taken_until``."""
        note = self._notes.get((task_id, run_id))
        if note is not None:
            self._note((task_id, run_id), note[0], replace(note[1], taken_until=taken_until))
        elif self._may_be_indexed(started):
            await self.store.put(ClaimRecord(task_id, run_id, taken_until, task_queue_id, queue))

    async def ended(self, task_id: str, run_id: int, started: datetime | None) -> None:
        """The run was resolved: forget its note, or delete its row if it may have one."""
        if self.forget(task_id, run_id, started):
            await self.unindex(task_id, run_id)

    def forget(self, task_id: str, run_id: int, started: datetime | None) -> bool:
        """The run was resolved: its note is dropped, so this process no longer counts it
        as claimed, at once and at no cost; without a note here, it is named as ended
        while another replica may hold one (claimed there lately). Whether it may have a
        row instead (no note, and claimed long enough ago), for ``unindex`` to delete."""
        self.generation += 1
        if self._notes.pop((task_id, run_id), None) is not None:
            return False
        if started is not None and (until := started + self.delay + ENDED_MARGIN) > \
                timeutil.utcnow():
            self._ended[(task_id, run_id)] = until
        return self._may_be_indexed(started)

    async def unindex(self, task_id: str, run_id: int) -> None:
        """Delete the row of a resolved run that ``forget`` says may have one."""
        await self.store.delete(task_id, run_id)

    def _may_be_indexed(self, started: datetime | None) -> bool:
        return started is None or started <= timeutil.utcnow() - self.delay + CLOCK_SLACK

    async def flush(self, everything: bool = False) -> None:
        """Write the rows of the noted runs that are old enough (all, with ``everything``)
        and still running."""
        due_before = timeutil.utcnow() - self.delay
        due = [key for key, (made, _) in self._notes.items() if everything or made <= due_before]
        notes = {key: self._notes.pop(key) for key in due}
        results = await gather_limited(self._index(notes[key][1]) for key in due)
        for key, ok in zip(due, results):
            if not ok and key not in self._notes:  # try again at the next round
                self._note(key, *notes[key])
        if due:
            self.generation += 1

    async def publish(self, everything: bool = False) -> None:
        """Write this process's notes and ended runs for the other replicas' counts, if
        they changed since they were last written (or are due for a refresh)."""
        now = timeutil.utcnow()
        self._ended = {key: until for key, until in self._ended.items() if until > now}
        last = self._published
        saying = bool(self._notes or self._ended)
        if not everything and last is not None and (
                now - last[1] < timedelta(seconds=NOTES_INTERVAL) or
                (last[0] == self.generation and (not saying or
                                                 now - last[1] < NOTES_REFRESH))):
            return
        if last is None and not saying:
            return  # nothing to say, nothing said before
        generation = self.generation
        await self.notes.publish(self.replica, self.local(), list(self._ended),
                                 now + NOTES_FRESH)
        self._published = (generation, now)

    async def _index(self, note: ClaimRecord) -> bool:
        task_id, run_id = note.task_id, note.run_id
        try:
            task = await self.tasks.find(task_id)
            if task is None or run_id >= len(task.runs):
                return True
            run = task.runs[run_id]
            if run.state is RunState.RUNNING and run.taken_until is not None:
                await self.store.put(ClaimRecord(task_id, run_id, run.taken_until,
                                                 task.task_queue_id, note.queue))
        except errors.StorageError as e:
            log.warning("could not index the claim of %s/%d: %s", task_id, run_id, e)
            return False
        return True

    async def _run(self) -> None:
        interval = min(NOTES_INTERVAL, self.delay.total_seconds() / 2)
        while not self._stop.is_set():
            try:
                await self.flush()
                await self.publish()
            except errors.StorageError as e:
                log.warning("indexing claims failed (%s); trying again in %.1fs", e, interval)
            except Exception:
                log.exception("indexing claims failed; trying again in %.1fs", interval)
            try:
                await asyncio.wait_for(self._stop.wait(), interval)
            except TimeoutError:
                pass

    async def close(self) -> None:
        """Stop the loop and write every note left (briefly)."""
        self._stop.set()
        if self._loop is not None:
            await self._loop
        try:
            await asyncio.wait_for(self.flush(everything=True), CLOSE_TIMEOUT)
            if self._published is not None:
                await asyncio.wait_for(self.notes.remove(self.replica), CLOSE_TIMEOUT)
        except (TimeoutError, errors.StorageError) as e:
            log.warning("could not index %d claim(s) before closing: %s", len(self._notes), e)
