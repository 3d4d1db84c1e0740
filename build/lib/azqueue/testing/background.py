"""An event loop in a thread of its own, for what synchronous code must keep running
while it blocks: an azqueue server, a worker, a fault proxy."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """``run(coro)`` runs ``coro`` on the loop and blocks until it is done; ``await
    run_async(coro)`` does the same from another event loop without blocking it.
    ``close()`` cancels what is still running and ends the thread."""

    def __init__(self, name: str = "azqueue-testing") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """The result of ``coro`` run on the loop; after ``timeout`` seconds it is
        cancelled and TimeoutError raised."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("BackgroundLoop.run called from its own thread: await instead")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def call(self, fn: Any, *args: Any) -> None:
        """Call ``fn(*args)`` on the loop (for state only its thread may touch)."""
        self.loop.call_soon_threadsafe(fn, *args)

    def close(self) -> None:
        if self.loop.is_closed():
            return

        async def cancel_the_rest() -> None:
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        self.run(cancel_the_rest(), timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()
