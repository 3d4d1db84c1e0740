"""The claimWork callers waiting in this process, by task queue.

``workclaimer`` registers each claimWork call here while it waits, and keeps its task
queue's poller state here. Whatever else puts a tip in this process (``tips``) offers
the message to a caller waiting for its task queue, with its pop receipt, so that the
caller claims it without a poll; whatever makes a tip visible and is not taken here
rings the doorbell (``doorbell``), which marks the priorities rung as worth a look
(``rung``) here and in the other replicas. Neither needs to know about claimWork beyond
this. A createTask that finds a caller here with room holds that room (``reserve``)
while it puts the tip already claimed for it (``tips.Prewritten``); tips handed over or
polled meanwhile fill only the room nobody holds.

An entry is kept when its callers leave (it remembers when its queues were found
empty), but at most ``MAX_TASK_QUEUES`` idle ones.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable

from azqueue.model.task import Task
from azqueue.storage.queues import Message

MAX_TASK_QUEUES = 10_000
RANKS = frozenset(range(7))


class Waiter:
    """One claimWork call waiting for tips."""

    def __init__(self, wanted: int, connected: Callable[[], bool]) -> None:
        self.wanted = wanted
        self.connected = connected
        self.busy = False  # claiming what it was handed: wants nothing more meanwhile
        self.inbox: list[Message] = []
        self.arrived = asyncio.Event()

    @property
    def room(self) -> int:
        if self.busy or not self.connected():
            return 0
        return max(0, self.wanted - len(self.inbox))

    def give(self, message: Message) -> None:
        self.inbox.append(message)
        self.arrived.set()

    async def take(self, timeout: float) -> list[Message]:
        try:
            await asyncio.wait_for(self.arrived.wait(), timeout)
        except TimeoutError:
            pass
        taken, self.inbox = self.inbox, []
        self.arrived.clear()
        return taken


class WaitingQueue:
    """The waiters of one task queue in this process, and its poller."""

    def __init__(self) -> None:
        self.waiters: deque[Waiter] = deque()
        # Tips being put for the callers here, claimed at their put (``Waiting.reserve``):
        # the room they will fill, which the poller does not receive tips for.
        self.reserved = 0
        self.poller: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()
        # The priorities (ranks) whose queues may hold visible tips: all at first, after a
        # fallback interval and when the doorbell cannot be relied on; a rank leaves when
        # a receive found its queue empty and nothing was rung meanwhile.
        self.dirty: set[int] = set(RANKS)
        self.rings = 0  # how many times rung: a ring during a receive keeps its rank dirty
        self.all_looked_at = float("-inf")  # when every rank was last dirty at once
        # When tips hidden by a receive whose answer was lost should be visible again.
        self.hidden_until = float("-inf")

    def rung(self, ranks: Iterable[int]) -> None:
        """Tips may have become visible at these ranks: look there now."""
        self.dirty.update(ranks)
        self.rings += 1
        self.wake.set()

    def look_everywhere(self, now: float) -> None:
        self.dirty.update(RANKS)
        self.all_looked_at = now

    def demand(self) -> int:
        return max(0, sum(w.room for w in self.waiters) - self.reserved)

    def hand(self, message: Message) -> bool:
        """Give ``message`` to the longest-waiting caller with room for it, unless the
        room left is held for tips being put (``reserved``)."""
        if self.demand() <= 0:
            return False
        for waiter in self.waiters:
            if waiter.room > 0:
                waiter.give(message)
                return True
        return False


class Waiting:
    """The waiting claimWork callers of this process, by task queue."""

    def __init__(self) -> None:
        self._queues: dict[str, WaitingQueue] = {}

    def entry(self, task_queue_id: str) -> WaitingQueue:
        """The entry of ``task_queue_id``, made if there is none (forgetting idle ones
        beyond ``MAX_TASK_QUEUES``)."""
        tq = self._queues.get(task_queue_id)
        if tq is not None:
            return tq
        if len(self._queues) >= MAX_TASK_QUEUES:
            for name in [n for n, q in self._queues.items() if not q.waiters and q.poller is None]:
                del self._queues[name]
        tq = self._queues[task_queue_id] = WaitingQueue()
        return tq

    def offer(self, task: Task, message: Message) -> bool:
        """A tip was just put for ``task``: hand it to a caller waiting here, if any;
        whether one took it."""
        tq = self._queues.get(task.task_queue_id)
        return tq is not None and tq.hand(message)

    def reserve(self, task_queue_id: str) -> bool:
        """Hold the room of one tip for a caller waiting for ``task_queue_id``, if one has
        room nobody holds: a tip about to be put for it, claimed at its put (``Tips.put``
        with ``claimed_for``). Whether it was held; ``unreserve`` lets go of it once the
        put is answered, and the tip is then ``offer``ed (a caller may have gone)."""
        tq = self._queues.get(task_queue_id)
        if tq is None or tq.demand() <= 0:
            return False
        tq.reserved += 1
        return True

    def unreserve(self, task_queue_id: str) -> None:
        tq = self._queues.get(task_queue_id)
        if tq is not None and tq.reserved > 0:
            tq.reserved -= 1

    def rung(self, task_queue_id: str, ranks: Iterable[int]) -> None:
        """Tips of ``task_queue_id`` may have become visible at these ranks (priorities):
        have its poller look there now."""
        tq = self._queues.get(task_queue_id)
        if tq is not None:
            tq.rung(ranks)

    def rung_everywhere(self) -> None:
        """Rings may have been missed: every task queue's poller looks everywhere next."""
        for tq in self._queues.values():
            tq.rung(RANKS)
