"""The doorbell: how the replicas of a deployment learn, at almost no storage request,
that a task queue's tips became visible, so that a waiting worker is woken within a
second wherever the tip was put, and nobody polls an empty queue for it.

Whatever makes a tip visible in this process (a createTask, a retry, a rerun, a
scheduled dependent, a priority change, a tip repair, a tip given back) calls
``visible``. That wakes this process's waiters at once (the claimWork pollers of
``waiting``, the SAS workers' sample of ``hints``) and rings the other replicas:

* **events on**: a transient message on the broker's doorbell exchange
  (``events.bells``); every replica hears it within milliseconds, at no storage request.
* **events off**: a merge into the task queue's row of the doorbell table
  (``storage.bells``), which every replica reads once per ``interval`` (one request,
  whatever the number of task queues). Only task queues that another replica waits on
  are rung: a replica with waiters notes an *ear* on the task queue in the same table,
  rewritten rarely while they wait, and every reader learns of it.

Rings are batched: the first after a quiet moment goes out at once, the next ones at
most every ``RING_PAUSE``, so a burst of createTasks costs a ring or two, not one each.
A ring that cannot be sent is tried again with the next batch.

What a replica keeps of a task queue is reclaimed once nobody uses it: an ear is
rewritten only while its waiters keep asking, and forgotten (here, and by every reader)
once it expires, ``ear_life`` after it was last written; the rows nobody wrote for
``ear_life`` are deleted (``BellTable.sweep``, by every replica every half of it), and
so is what readers remember of them.

A ring is a hint, never a decision, and the doorbell is trusted only while it works:
``covers`` says whether a waiter may rely on it for a task queue. While it does not
(broker away, doorbell table unreadable, an ear not yet known to every replica) the
pollers look at their queues every ``claim_work_poll_interval`` as they always did;
while it does, they look only when rung, plus once per ``claim_work_fallback_interval``
to catch what no ring announced (a process that died between its put and its ring, a
replica of an earlier release). A claim that expires is rung by the replica that
resolves it (``background.claims`` wakes at the earliest ``takenUntil`` it knows).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterable
from datetime import datetime, timedelta

from azqueue import errors
from azqueue.events.bells import BrokerBells
from azqueue.model import timeutil
from azqueue.model.priority import ORDER, Priority
from azqueue.service.hints import PendingHints
from azqueue.service.waiting import Waiting
from azqueue.storage.bells import MARGIN, BellTable, Ear

log = logging.getLogger(__name__)

ALL = frozenset(p.rank for p in ORDER)
# After a ring, the next batch waits this long, so bursts cost a ring per batch.
RING_PAUSE = 0.2
# How long an ear holds; it is rewritten when less than half of it is left, if its
# waiters asked since it was last written.
EAR_LIFE = timedelta(hours=1)
# A ring that failed is tried again after this long (with the next batch).
RETRY_PAUSE = 1.0
# How many reads of the doorbell table may fail in a row before it is not trusted.
MISSED_READS = 3


class Doorbell:
    """This process's side of the doorbell (see the module's docstring).

    ``broker``: the broker's doorbell (events on); ``table``: the doorbell table (events
    off); neither: no doorbell, the pollers poll. ``interval``: how often the doorbell
    table is read. ``ear_life``: how long an ear holds once written, and how long the
    table keeps a row nobody writes."""

    def __init__(self, waiting: Waiting, hints: PendingHints, replica: str,
                 broker: BrokerBells | None, table: BellTable | None, interval: float,
                 ear_life: timedelta = EAR_LIFE) -> None:
        self.waiting = waiting
        self.hints = hints
        self.replica = replica
        self.broker = broker
        self.table = table if broker is None else None
        self.interval = interval
        self.ear_life = ear_life
        self._to_ring: dict[str, set[int]] = {}
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        # Doorbell table: what was read, and the ears.
        self._since: datetime | None = None
        self._seen: dict[str, tuple[str, dict[int, float]]] = {}
        self._read_at = float("-inf")  # the event loop's clock at the last good read
        self._others: dict[str, dict[str, datetime]] = {}  # task queue -> replica -> until
        self._ears: dict[str, tuple[float, datetime]] = {}  # task queue -> known from, until
        self._asked: set[str] = set()  # ears to write (again): their waiters asked
        self._ears_wanted = asyncio.Event()

    # -- what this process sees ----------------------------------------------------

    def put(self, task_queue_id: str, priority: Priority) -> None:
        """A tip was just put (not yet recorded or handed over): the SAS workers' sample
        shows it at once."""
        self.hints.tip_visible(task_queue_id, priority)

    def visible(self, task_queue_id: str, priority: Priority | None) -> None:
        """A tip of ``task_queue_id`` at ``priority`` (None: at any) became visible here
        and nobody here took it: wake this process's waiters and ring the others."""
        ranks = ALL if priority is None else frozenset((priority.rank,))
        self._wake(task_queue_id, ranks)
        if self.broker is None and self.table is None:
            return
        if self.table is not None and not self._someone_else_waits(task_queue_id):
            return
        self._to_ring.setdefault(task_queue_id, set()).update(ranks)
        self._kick.set()

    def _wake(self, task_queue_id: str, ranks: frozenset[int] | set[int]) -> None:
        """Tips became visible at these ranks (all: at some, or maybe none)."""
        self.waiting.rung(task_queue_id, ranks)
        if ranks == ALL:
            self.hints.look_again(task_queue_id)
        else:
            for rank in ranks:
                self.hints.tip_visible(task_queue_id, ORDER[rank])

    def heard(self, rings: dict[str, set[int]]) -> None:
        """Rings of other replicas."""
        for task_queue_id, ranks in rings.items():
            self._wake(task_queue_id, {r for r in ranks if r in ALL})

    # -- whether waiters may rely on it --------------------------------------------

    def covers(self, task_queue_id: str) -> bool:
        """Whether a tip made visible by another replica for ``task_queue_id`` now would
        be rung to this process: the doorbell works, and (without a broker) every replica
        knows this one waits on it. Asking notes that it waits (an ear)."""
        if self.broker is not None:
            return self.broker.listening
        if self.table is None:
            return False
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

    def _someone_else_waits(self, task_queue_id: str) -> bool:
        now = timeutil.utcnow()
        return any(until > now for until in self._others.get(task_queue_id, {}).values())

    # -- running -------------------------------------------------------------------

    async def start(self) -> None:
        if self.broker is not None:
            await self.broker.start(self.heard)
            self.broker.on_reconnect(self._everything_may_have_changed)
        elif self.table is not None:
            await self.table.ensure()
            with contextlib.suppress(errors.StorageError):
                await self._read(hear=False)
            self._tasks.append(asyncio.create_task(self._reader(), name="doorbell reader"))
            self._tasks.append(asyncio.create_task(self._listener(), name="doorbell ears"))
        self._tasks.append(asyncio.create_task(self._sweeper(), name="doorbell sweeper"))
        if self.broker is not None or self.table is not None:
            self._tasks.append(asyncio.create_task(self._ringer(), name="doorbell ringer"))

    def _everything_may_have_changed(self) -> None:
        """Rings may have been lost while the broker was away: every waiter looks again,
        and so does the next caller of a task queue nobody waits on now."""
        self.waiting.rung_everywhere()
        for task_queue_id in self.hints.sampled():
            self.hints.look_again(task_queue_id)

    async def _ringer(self) -> None:
        while not self._stopping:
            await self._kick.wait()
            self._kick.clear()
            rings, self._to_ring = self._to_ring, {}
            if rings:
                try:
                    if self.broker is not None:
                        await self.broker.ring(rings)
                    elif self.table is not None:
                        await self.table.ring(rings, timeutil.utcnow())
                except (errors.StorageError, errors.BrokerError) as e:
                    log.warning("doorbell: could not ring %d task queue(s) (%s); trying again",
                                len(rings), e)
                    for task_queue_id, ranks in rings.items():
                        self._to_ring.setdefault(task_queue_id, set()).update(ranks)
                    self._kick.set()
                    await asyncio.sleep(RETRY_PAUSE)
                    continue
            await asyncio.sleep(RING_PAUSE)

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
        changes = await self.table.changes(self._since) if self.table is not None else None
        if changes is None:
            return
        self._read_at = time.monotonic()
        if changes.newest is not None:
            self._since = changes.newest
        heard: dict[str, set[int]] = {}
        for etag, ring in changes.rings:
            seen = self._seen.get(ring.task_queue_id)
            if seen is not None and seen[0] == etag:
                continue
            before = seen[1] if seen is not None else {}
            # Changed, not later: the clocks of the replicas that rang may differ.
            rung = {rank for rank, at in ring.rung.items() if at != before.get(rank)}
            self._seen[ring.task_queue_id] = (etag, dict(ring.rung))
            if rung and hear:
                heard[ring.task_queue_id] = rung
        self._note_ears(changes.ears)
        if hear and heard:
            self.heard(heard)

    def _note_ears(self, ears: Iterable[Ear]) -> None:
        for ear in ears:
            if ear.replica != self.replica:
                self._others.setdefault(ear.task_queue_id, {})[ear.replica] = ear.until

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

    async def _sweeper(self) -> None:
        """Every half of ``ear_life`` (jittered): forget what expired, the samples of
        task queues nobody asked about for ``ear_life`` included, and delete the rows
        nobody wrote for ``ear_life``."""
        while not self._stopping:
            await asyncio.sleep(self.ear_life.total_seconds() / 2 * random.uniform(0.8, 1.2))
            self.hints.drop_older(self.ear_life.total_seconds())
            if self.table is None:
                continue
            self.drop_expired()
            try:
                swept = await self.table.sweep(timeutil.utcnow() - self.ear_life - MARGIN)
            except errors.StorageError as e:
                log.warning("doorbell: could not delete the table's old rows: %s", e)
                continue
            if swept:
                log.info("doorbell: deleted %d row(s) nobody wrote for %s", swept, self.ear_life)

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
                assert self.table is not None
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
                        self._wake, tq, ALL)

    async def close(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.table is not None and self._ears:
            with contextlib.suppress(errors.StorageError):
                await asyncio.wait_for(self.table.forget(list(self._ears), self.replica), 5.0)
        if self.broker is not None:
            await self.broker.close()
