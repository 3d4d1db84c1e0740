"""The doorbell: how the replicas of a deployment learn, at almost no storage request,
that a task queue's tips became visible, so that a waiting worker is woken within a
second wherever the tip was put, and nobody polls an empty queue for it.

Whatever makes a tip visible in this process (a createTask, a retry, a rerun, a
scheduled dependent, a priority change, a tip repair, a tip given back) calls
``visible``. That wakes this process's waiters at once (the claimWork pollers of
``waiting``, the SAS workers' sample of ``hints``) and rings the other replicas through
the doorbell's transport, chosen once by ``wiring``:

* **events on**: a transient message on the broker (``brokerbell``); every replica hears
  it within milliseconds, at no storage request.
* **events off**: a row of the doorbell table every replica reads once per interval
  (``tablebell``); only task queues that another replica waits on are rung.
* **no doorbell** (``Nowhere``): nothing is rung, nothing heard; the pollers poll.

Rings are batched: the first after a quiet moment goes out at once, the next ones at
most every ``RING_PAUSE``, so a burst of createTasks costs a ring or two, not one each.
A ring that cannot be sent is tried again with the next batch.

A ring is a hint, never a decision, and the doorbell is trusted only while it works:
``covers`` says whether a waiter may rely on it for a task queue. While it does not
(broker away, doorbell table unreadable, an ear not yet known to every replica, no
doorbell) the pollers look at their queues every ``claim_work_poll_interval`` as they
always did; while it does, they look only when rung, plus once per
``claim_work_fallback_interval`` to catch what no ring announced (a process that died
between its put and its ring, a replica of an earlier release). A claim that expires is
rung by the replica that resolves it (``background.claims`` wakes at the earliest
``takenUntil`` it knows).

What this process keeps of a task queue is reclaimed once nobody uses it: every half of
the idle expiry (jittered), the SAS workers' samples of task queues nobody asked about
for that long are dropped, and the transport forgets what expired of its own.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

from azqueue import errors
from azqueue.model.priority import ORDER, Priority
from azqueue.service.common.gathering import cancel_all
from azqueue.service.dispatch.hints import PendingHints
from azqueue.service.dispatch.waiting import Waiting

log = logging.getLogger(__name__)

ALL = frozenset(p.rank for p in ORDER)
# After a ring, the next batch waits this long, so bursts cost a ring per batch.
RING_PAUSE = 0.2
# A ring that failed is tried again after this long (with the next batch).
RETRY_PAUSE = 1.0

# Rings heard: the priorities (ranks) rung of each task queue.
Heard = Callable[[dict[str, set[int]]], None]


class Transport(Protocol):
    """How this replica rings the others and hears them (``brokerbell``, ``tablebell``,
    ``Nowhere``)."""

    async def start(self, heard: Heard, lost: Callable[[], None]) -> None:
        """Start hearing the other replicas: their rings go to ``heard``; ``lost`` is
        called when rings may have been lost everywhere (every waiter looks again)."""

    def covers(self, task_queue_id: str) -> bool:
        """Whether a ring of ``task_queue_id`` by another replica would reach this one
        now (asking may note that this replica waits on it)."""

    def worth_ringing(self, task_queue_id: str) -> bool:
        """Whether a ring of ``task_queue_id`` may reach a replica that waits on it."""

    async def ring(self, rings: dict[str, set[int]]) -> None:
        """Ring the priorities (ranks) of each task queue for the other replicas; raises
        ``StorageError`` or ``BrokerError`` if it could not."""

    async def sweep(self) -> None:
        """Forget what expired (called every half of the idle expiry); never raises."""

    async def close(self) -> None:
        """Stop hearing, and withdraw what this replica noted for the others."""


class Nowhere:
    """No doorbell: nothing is rung, nothing heard, nothing covered; the pollers poll."""

    async def start(self, heard: Heard, lost: Callable[[], None]) -> None:
        pass

    def covers(self, task_queue_id: str) -> bool:
        return False

    def worth_ringing(self, task_queue_id: str) -> bool:
        return False

    async def ring(self, rings: dict[str, set[int]]) -> None:
        pass

    async def sweep(self) -> None:
        pass

    async def close(self) -> None:
        pass


class Doorbell:
    """This process's side of the doorbell (see the module's docstring).

    ``transport``: how the other replicas are rung and heard (``Nowhere``: not at all).
    ``idle_expiry``: what this process keeps of a task queue nobody asked about for this
    long is forgotten, looked for every half of it."""

    def __init__(self, waiting: Waiting, hints: PendingHints, transport: Transport,
                 idle_expiry: timedelta) -> None:
        self.waiting = waiting
        self.hints = hints
        self.transport = transport
        self.idle_expiry = idle_expiry
        self._to_ring: dict[str, set[int]] = {}
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

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
        if not self.transport.worth_ringing(task_queue_id):
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

    def _everything_may_have_changed(self) -> None:
        """Rings may have been lost: every waiter looks again, and so does the next
        caller of a task queue nobody waits on now."""
        self.waiting.rung_everywhere()
        for task_queue_id in self.hints.sampled():
            self.hints.look_again(task_queue_id)

    # -- whether waiters may rely on it --------------------------------------------

    def covers(self, task_queue_id: str) -> bool:
        """Whether a tip made visible by another replica for ``task_queue_id`` now would
        be rung to this process. Asking notes that it waits (with the doorbell table, an
        ear)."""
        return self.transport.covers(task_queue_id)

    # -- running -------------------------------------------------------------------

    async def start(self) -> None:
        await self.transport.start(self.heard, self._everything_may_have_changed)
        self._tasks.append(asyncio.create_task(self._sweeper(), name="doorbell sweeper"))
        self._tasks.append(asyncio.create_task(self._ringer(), name="doorbell ringer"))

    async def _ringer(self) -> None:
        while not self._stopping:
            await self._kick.wait()
            self._kick.clear()
            rings, self._to_ring = self._to_ring, {}
            if rings:
                try:
                    await self.transport.ring(rings)
                except (errors.StorageError, errors.BrokerError) as e:
                    log.warning("doorbell: could not ring %d task queue(s) (%s); trying again",
                                len(rings), e)
                    for task_queue_id, ranks in rings.items():
                        self._to_ring.setdefault(task_queue_id, set()).update(ranks)
                    self._kick.set()
                    await asyncio.sleep(RETRY_PAUSE)
                    continue
            await asyncio.sleep(RING_PAUSE)

    async def _sweeper(self) -> None:
        """Every half of ``idle_expiry`` (jittered): forget the samples of task queues
        nobody asked about for ``idle_expiry``, and what expired of the transport's."""
        while not self._stopping:
            await asyncio.sleep(self.idle_expiry.total_seconds() / 2 * random.uniform(0.8, 1.2))
            self.hints.drop_older(self.idle_expiry.total_seconds())
            await self.transport.sweep()

    async def close(self) -> None:
        self._stopping = True
        await cancel_all(self._tasks)
        await self.transport.close()
