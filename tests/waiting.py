"""Waiting in tests: ``eventually`` polls until a condition holds or fails loudly;
``stays`` checks that a condition keeps holding for a while (that something does not
happen).

A test never sleeps and hopes; it names what it waits for, and a time-out is a failure
that says what never happened and what was seen last. Time-outs are generous (a loaded
machine is slow, not wrong); a test that passes does not wait for them. ``stays`` is the
one wait a passing test sits out: use it only where the claim is "this does not happen",
and give it the time the thing would take to happen if it were going to.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

TIMEOUT = 60.0
INTERVAL = 0.2
STAYS = 2.0


async def _value(probe: Callable[[], Any]) -> Any:
    value = probe()
    return await value if inspect.isawaitable(value) else value


@overload
async def eventually(probe: Callable[[], Awaitable[T]], until: Callable[[T], object] = bool, *,
                     what: str, timeout: float = TIMEOUT, interval: float = INTERVAL) -> T: ...
@overload
async def eventually(probe: Callable[[], T], until: Callable[[T], object] = bool, *,
                     what: str, timeout: float = TIMEOUT, interval: float = INTERVAL) -> T: ...
async def eventually(probe: Callable[[], Any], until: Callable[[Any], object] = bool, *,
                     what: str, timeout: float = TIMEOUT, interval: float = INTERVAL) -> Any:
    """Call ``probe`` (a function, or an async one) every ``interval`` seconds until
    ``until`` holds for its value, and return that value; after ``timeout`` seconds fail
    with ``what`` never happened and the last value seen. Exceptions of ``probe`` are not
    caught: they fail the test at once."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = await _value(probe)
        if until(value):
            return value
        if loop.time() >= end:
            raise AssertionError(f"{what}: not within {timeout:g}s; last seen: {value!r}")
        await asyncio.sleep(interval)


@overload
async def stays(probe: Callable[[], Awaitable[T]], until: Callable[[T], object] = bool, *,
                what: str, for_: float = STAYS, interval: float = INTERVAL) -> T: ...
@overload
async def stays(probe: Callable[[], T], until: Callable[[T], object] = bool, *,
                what: str, for_: float = STAYS, interval: float = INTERVAL) -> T: ...
async def stays(probe: Callable[[], Any], until: Callable[[Any], object] = bool, *,
                what: str, for_: float = STAYS, interval: float = INTERVAL) -> Any:
    """Call ``probe`` (a function, or an async one) every ``interval`` seconds for
    ``for_`` seconds, failing as soon as ``until`` does not hold for its value (``what``
    says what should have stayed so, with the value seen); return the last value."""
    loop = asyncio.get_running_loop()
    end = loop.time() + for_
    while True:
        value = await _value(probe)
        if not until(value):
            raise AssertionError(f"{what}: no longer so after "
                                 f"{for_ - max(0.0, end - loop.time()):.1f}s; seen: {value!r}")
        if loop.time() >= end:
            return value
        await asyncio.sleep(min(interval, max(0.0, end - loop.time())))
