"""In-process wake-ups for claimWork: a tip was queued for this task queue.

Waiters queue up per task queue; ``notify`` wakes the longest-waiting one(s), so one new
task wakes one claimWork call instead of all of them, and tells it the tip's priority.
Across replicas nobody is woken: the waiters' polling interval bounds the wait there.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque

from azqueue.model.priority import Priority


class WorkSignals:
    def __init__(self) -> None:
        self._waiters: defaultdict[str, deque[asyncio.Future[Priority]]] = defaultdict(deque)

    async def wait(self, task_queue_id: str, timeout: float) -> Priority | None:
        """The priority of the tip we were woken for, or None after ``timeout`` seconds."""
        future: asyncio.Future[Priority] = asyncio.get_running_loop().create_future()
        waiters = self._waiters[task_queue_id]
        waiters.append(future)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            return None
        finally:
            if future in waiters:
                waiters.remove(future)
            if not waiters:
                self._waiters.pop(task_queue_id, None)

    def notify(self, task_queue_id: str, priority: Priority, count: int = 1) -> None:
        waiters = self._waiters.get(task_queue_id)
        while waiters and count > 0:
            future = waiters.popleft()
            if not future.done():
                future.set_result(priority)
                count -= 1
