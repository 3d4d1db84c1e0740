"""In-process wake-ups for claimWork: a tip was queued for this task queue.

Waiters queue up per task queue; ``notify`` wakes the longest-waiting one(s), so one new
task wakes one claimWork call instead of all of them. Across replicas nobody is woken:
the waiters' polling interval bounds the wait there.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque


class WorkSignals:
    def __init__(self) -> None:
        self._waiters: defaultdict[str, deque[asyncio.Future[None]]] = defaultdict(deque)

    async def wait(self, task_queue_id: str, timeout: float) -> bool:
        """Wait until notified (True) or ``timeout`` seconds pass (False)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters[task_queue_id]
        waiters.append(future)
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            if future in waiters:
                waiters.remove(future)
            if not waiters:
                self._waiters.pop(task_queue_id, None)

    def notify(self, task_queue_id: str, count: int = 1) -> None:
        waiters = self._waiters.get(task_queue_id)
        while waiters and count > 0:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)
                count -= 1
