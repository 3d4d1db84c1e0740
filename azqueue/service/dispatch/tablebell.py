"""The doorbell's transport with events off (``doorbell``): a ring is a merge into the
task queue's row of the doorbell table (``storage.bells``), which every replica reads
once per ``interval`` (one request, whatever the number of task queues).

Only task queues that another replica waits on are rung: a replica with waiters notes an
*ear* on the task queue in the same table, rewritten rarely while they wait, and every
reader learns of it. A waiter relies on the doorbell only once its ear is known to every
replica (a tip put before that was not rung to it, so its waiters are woken then), and
only while the table reads well (``MISSED_READS`` reads in a row may fail).

What a replica keeps of a task queue is reclaimed once nobody uses it: an ear is
rewritten only while its waiters keep asking, and forgotten (here, and by every reader)
once it expires, ``ear_life`` after it was last written; the rows nobody wrote for
``ear_life`` are deleted (``BellTable.sweep``, by every replica every half of it), and
so is what readers remember of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from azqueue import errors
from azqueue.model import timeutil
from azqueue.service.common.gathering import cancel_all
from azqueue.service.dispatch.doorbell import ALL, RETRY_PAUSE, Heard
from azqueue.storage.bells import MARGIN, BellTable, Ear

log = logging.getLogger(__name__)

# Seconds a stopping replica spends removing its ears from the table (a courtesy: an ear
# left behind expires by itself).
FORGET_WITHIN = 5.0

# How long an ear holds; it is rewritten when less than half of it is left, if its
# waiters asked since it was last written.
EAR_LIFE = timedelta(hours=1)
# How many reads of the doorbell table may fail in a row before it is not trusted.
MISSED_READS = 3


def _ignore(rings: dict[str, set[int]]) -> None:
    pass


class TableTransport:
    """Rings and hears the other replicas through ``table``, the doorbell table.

    ``replica``: this replica's name in its ears. ``interval``: how often the table is
    read. ``ear_life``: how long an ear holds once written, and how long the table keeps
    a row nobody writes."""

    def __init__(self, table: BellTable, replica: str, interval: float,
                 ear_life: timedelta = EAR_LIFE) -> None:
        self.table = table
        self.replica = replica
        self.interval = interval
        self.ear_life = ear_life
        self._heard: Heard = _ignore
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._since: datetime | None = None
        self._seen: dict[str, tuple[str, dict[int, float]]] = {}
        self._read_at = float("-inf")  # the event loop's clock at the last good read
        self._others: dict[str, dict[str, datetime]] = {}  # task queue -> replica -> until
        self._ears: dict[str, tuple[float, datetime]] = {}  # task queue -> known from, until
        self._asked: set[str] = set()  # ears to write (again): their waiters asked
        self._ears_wanted = asyncio.Event()

    # -- whether waiters may rely on it, and whom to ring --------------------------

    def covers(self, task_queue_id: str) -> bool:
        """Whether the table reads well and every replica knows this one waits on
        ``task_queue_id``. Asking notes that it waits (an ear)."""
        now, utcnow = time.monotonic(), timeutil.utcnow()
        ear = self._ears.get(task_queue_id)
        if ear is not None and ear[1] <= utcnow:  # expired: the others forget it
            ear = None
        if ear is None or ear[1] - utcnow < self.ear_life / 2:
            if ear is None:  # new, or as good as new: not known from a ring until written
                self._ears[task_queue_id] = (float("inf"), utcnow)
            self._asked.add(task_queue_id)
            self._ears_wanted.set()
        return (now - self._read_at < MISSED_READS * self.interval and ear is not None
                and ear[0] <= now)

    def worth_ringing(self, task_queue_id: str) -> bool:
        """Whether another replica waits on ``task_queue_id``."""
        now = timeutil.utcnow()
        return any(until > now for until in self._others.get(task_queue_id, {}).values())

    async def ring(self, rings: dict[str, set[int]]) -> None:
        await self.table.ring(rings, timeutil.utcnow())

    # -- running -------------------------------------------------------------------

    async def start(self, heard: Heard, lost: Callable[[], None]) -> None:
        self._heard = heard
        await self.table.ensure()
        with contextlib.suppress(errors.StorageError):
            await self._read(hear=False)
        self._tasks.append(asyncio.create_task(self._reader(), name="doorbell reader"))
        self._tasks.append(asyncio.create_task(self._listener(), name="doorbell ears"))

    async def _reader(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.interval)
            try:
                await self._read(hear=True)
            except errors.StorageError as e:
                log.warning("doorbell: could not read the doorbell table: %s", e)
            except Exception:
                log.exception("doorbell: could not read the doorbell table")

    async def _read(self, hear: bool) -> None:
        changed = await self.table.changes(self._since)
        self._read_at = time.monotonic()
        if changed.newest is not None:
            self._since = changed.newest
        heard: dict[str, set[int]] = {}
        for etag, ring in changed.rings:
            seen = self._seen.get(ring.task_queue_id)
            if seen is not None and seen[0] == etag:
                continue
            before = seen[1] if seen is not None else {}
            # Changed, not later: the clocks of the replicas that rang may differ.
            rung = {rank for rank, at in ring.rung.items() if at != before.get(rank)}
            self._seen[ring.task_queue_id] = (etag, dict(ring.rung))
            if rung and hear:
                heard[ring.task_queue_id] = rung
        self._note_ears(changed.ears)
        if hear and heard:
            self._heard(heard)

    def _note_ears(self, ears: Iterable[Ear]) -> None:
        for ear in ears:
            if ear.replica != self.replica:
                self._others.setdefault(ear.task_queue_id, {})[ear.replica] = ear.until

    async def _listener(self) -> None:
        """Write the ears this process's waiters need, and wake them once every replica
        has read them (a tip put before that was not rung to them)."""
        while not self._stopping:
            await self._ears_wanted.wait()
            self._ears_wanted.clear()
            now = timeutil.utcnow()
            due = [tq for tq in self._asked
                   if tq in self._ears and self._ears[tq][1] - now < self.ear_life / 2]
            self._asked.clear()
            if not due:
                continue
            until = now + self.ear_life
            try:
                await self.table.listen(due, self.replica, until)
            except errors.StorageError as e:
                log.warning("doorbell: could not note %d ear(s): %s", len(due), e)
                self._asked.update(due)
                await asyncio.sleep(RETRY_PAUSE)
                self._ears_wanted.set()
                continue
            known = time.monotonic() + 2 * self.interval + 1.0
            for tq in due:
                known_from = self._ears.get(tq, (float("inf"), until))[0]
                first = known_from == float("inf")
                self._ears[tq] = (min(known_from, known), until)
                if first:
                    asyncio.get_running_loop().call_at(
                        asyncio.get_running_loop().time() + 2 * self.interval + 1.0,
                        self._heard, {tq: set(ALL)})

    # -- forgetting ----------------------------------------------------------------

    def drop_expired(self) -> None:
        """Forget the ears that expired, this process's and the others', and the rings
        not rung for ``ear_life``."""
        now = timeutil.utcnow()
        for tq in [tq for tq, (_, until) in self._ears.items()
                   if until <= now and tq not in self._asked]:
            del self._ears[tq]
        for tq in list(self._others):
            alive = {r: until for r, until in self._others[tq].items() if until > now}
            if alive:
                self._others[tq] = alive
            else:
                del self._others[tq]
        old = now.timestamp() - self.ear_life.total_seconds()
        for tq in [tq for tq, (_, rung) in self._seen.items() if max(rung.values(), default=0) < old]:
            del self._seen[tq]

    async def sweep(self) -> None:
        """Forget what expired, and delete the rows nobody wrote for ``ear_life``."""
        self.drop_expired()
        try:
            swept = await self.table.sweep(timeutil.utcnow() - self.ear_life - MARGIN)
        except errors.StorageError as e:
            log.warning("doorbell: could not delete the table's old rows: %s", e)
            return
        if swept:
            log.info("doorbell: deleted %d row(s) nobody wrote for %s", swept, self.ear_life)

    async def close(self) -> None:
        self._stopping = True
        await cancel_all(self._tasks)
        if self._ears:
            try:
                await asyncio.wait_for(self.table.forget(list(self._ears), self.replica),
                                       FORGET_WITHIN)
            except (errors.StorageError, TimeoutError) as e:
                log.info("doorbell: this replica's ears on %d task queue(s) were left in the "
                         "table (%s); they expire by themselves", len(self._ears),
                         e or f"not removed within {FORGET_WITHIN:g} s")
