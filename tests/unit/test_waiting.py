"""The waiting helpers fail loudly: a time-out is an error that says what never happened."""

from __future__ import annotations

import aiohttp
import pytest

from azqueue.testing.processes import until_serving
from tests.waiting import eventually, stays


async def test_eventually_returns_the_first_value_that_holds() -> None:
    seen = iter([0, 0, 3, 4])

    async def probe() -> int:
        return next(seen)

    assert await eventually(probe, what="a positive number", interval=0) == 3


async def test_eventually_fails_naming_what_never_happened_and_the_last_value() -> None:
    async def probe() -> list[str]:
        return []

    with pytest.raises(AssertionError) as info:
        await eventually(probe, what="a message arriving", timeout=0.05, interval=0.01)
    assert str(info.value) == "a message arriving: not within 0.05s; last seen: []"


async def test_until_serving_fails_when_nothing_answers(refused_port: int) -> None:
    api = f"http://127.0.0.1:{refused_port}/api/queue/v1"
    async with aiohttp.ClientSession() as http:
        with pytest.raises(AssertionError) as info:
            await until_serving(http, api, seconds=0.3)
    assert f"{api}/ping answering 200" in str(info.value)
    assert "ClientConnectorError" in str(info.value)


async def test_eventually_takes_a_plain_function_too() -> None:
    seen = iter([None, "", "ready"])
    assert await eventually(lambda: next(seen), what="ready", interval=0) == "ready"


async def test_stays_returns_the_last_value_when_the_condition_kept_holding() -> None:
    assert await stays(lambda: [], lambda m: m == [], what="no message", for_=0.05,
                       interval=0.01) == []


async def test_stays_fails_naming_what_changed_and_the_value_seen() -> None:
    seen = iter([[], [], ["late"]])

    async def probe() -> list[str]:
        return next(seen, ["late"])

    with pytest.raises(AssertionError) as info:
        await stays(probe, lambda m: m == [], what="no message arriving", for_=30, interval=0)
    assert str(info.value).startswith("no message arriving: no longer so after ")
    assert str(info.value).endswith("seen: ['late']")
