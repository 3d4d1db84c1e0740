"""Reads and writes fanned out for one request (counts of many task queues, a group's
tasks, a batch of statuses): a bounded number at a time, and nothing more once one fails."""

from __future__ import annotations

import asyncio

import pytest

from azqueue.service.common.gathering import MAX_PARALLEL, gather_limited


async def test_results_come_in_the_order_asked_with_at_most_the_limit_at_once() -> None:
    running = most = 0

    async def call(i: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.001 * (i % 3))
        running -= 1
        return i

    assert await gather_limited(call(i) for i in range(100)) == list(range(100))
    assert most == MAX_PARALLEL
    assert await gather_limited(call(i) for i in range(0)) == []


async def test_the_first_failure_stops_the_calls_under_way_and_begins_no_more() -> None:
    begun: list[int] = []
    cancelled: list[int] = []

    async def call(i: int) -> int:
        begun.append(i)
        try:
            if i == 3:
                raise LookupError("storage said no")
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return i

    with pytest.raises(LookupError, match="storage said no"):
        await gather_limited(call(i) for i in range(1000))
    assert len(begun) == MAX_PARALLEL  # the first ones; the other 984 never made
    assert sorted(cancelled) == sorted(set(begun) - {3})


async def test_calls_made_beforehand_and_never_begun_are_closed_not_left_unawaited() -> None:
    async def call(i: int) -> int:
        if i == 0:
            raise LookupError("no")
        await asyncio.sleep(10)
        return i

    made = [call(i) for i in range(MAX_PARALLEL * 2)]
    with pytest.raises(LookupError):
        await gather_limited(made)
    assert all(c.cr_frame is None for c in made)  # finished or closed
