"""Waiting in tests: one helper that polls until a condition holds or fails loudly.

A test never sleeps and hopes; it names what it waits for, and a time-out is a failure
that says what never happened and what was seen last. Time-outs are generous (a loaded
machine is slow, not wrong); a test that passes does not wait for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

TIMEOUT = 30.0
INTERVAL = 0.2


async def eventually(probe: Callable[[], Awaitable[T]], until: Callable[[T], object] = bool, *,
                     what: str, timeout: float = TIMEOUT, interval: float = INTERVAL) -> T:
    """Call ``probe`` every ``interval`` seconds until ``until`` holds for its value, and
    return that value; after ``timeout`` seconds fail with ``what`` never happened and the
    last value seen. Exceptions of ``probe`` are not caught: they fail the test at once."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = await probe()
        if until(value):
            return value
        if loop.time() >= end:
            raise AssertionError(f"{what}: not within {timeout:g}s; last seen: {value!r}")
        await asyncio.sleep(interval)
