"""Many awaitables awaited a few at a time: ``gather_limited``, at most ``MAX_PARALLEL``
at once, results in order, the first failure stopping the rest; and a component's
background loops stopped together (``cancel_all``)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Iterable
from typing import TypeVar

MAX_PARALLEL = 16
T = TypeVar("T")


async def gather_limited(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Await ``calls`` with at most MAX_PARALLEL at a time; results in order. The first
    failure stops the rest: those under way are cancelled and, given as a generator,
    those not yet begun are never made, so a failed request costs no more storage
    requests afterwards."""
    items = enumerate(calls)
    results: dict[int, T] = {}

    async def worker() -> None:
        for i, call in items:  # shared: each call is taken (and made) by one worker
            results[i] = await call

    workers = [asyncio.create_task(worker()) for _ in range(MAX_PARALLEL)]
    try:
        await asyncio.gather(*workers)
    except BaseException:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for _, call in items:
            if inspect.iscoroutine(call):
                call.close()  # made by the caller, never begun
        raise
    return [results[i] for i in range(len(results))]


async def cancel_all(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` (a component's background loops) and wait until each has ended,
    whatever it raised on the way out."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
