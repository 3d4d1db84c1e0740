"""A page of a listing ends once its entries hold the byte budget, reading few entries
past it, and says how many keys it covers, so the continuationToken goes on from there."""

from __future__ import annotations

from typing import Any

from azqueue.service.common.gathering import MAX_PARALLEL
from azqueue.service.common.paging import json_size, read_fitting

BUDGET = 100_000


async def test_a_page_ends_with_the_entry_that_fills_it_and_reads_little_beyond() -> None:
    asked: list[int] = []

    async def read(key: int) -> dict[str, Any] | None:
        asked.append(key)
        return None if key % 3 == 0 else {"data": "x" * (key * 1000)}  # some keys have none

    keys = list(range(1, 200))
    entries, covered = await read_fitting(keys, read, BUDGET)
    sizes = [json_size(e) for e in entries]
    assert sum(sizes) >= BUDGET > sum(sizes[:-1])
    assert [e["data"] for e in entries] == ["x" * (k * 1000) for k in keys[:covered] if k % 3]
    assert len(asked) - covered <= MAX_PARALLEL


async def test_a_page_under_its_budget_covers_every_key_and_any_page_one_at_least() -> None:
    async def read(key: int) -> dict[str, Any] | None:
        return {"key": key}

    assert await read_fitting([1, 2, 3], read, BUDGET) == ([{"key": 1}, {"key": 2}, {"key": 3}], 3)
    assert await read_fitting([], read, BUDGET) == ([], 0)
    assert await read_fitting([1, 2], read, 0) == ([{"key": 1}], 1)  # one key at least
