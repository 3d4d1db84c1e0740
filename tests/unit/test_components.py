"""The parts of a process start in the order of their declared needs and stop in the
reverse (``service.common.components``, as ``service.wiring`` declares them)."""

from __future__ import annotations

import pytest

from azqueue.service import wiring
from azqueue.service.common.components import Components, WiringError


class Part:
    def __init__(self, name: str, seen: list[str], fails: bool = False) -> None:
        self.name, self.seen, self.fails = name, seen, fails

    async def start(self) -> None:
        self.seen.append(f"start {self.name}")
        if self.fails:
            raise RuntimeError(f"{self.name} cannot start")

    async def stop(self) -> None:
        self.seen.append(f"stop {self.name}")


def three(seen: list[str], failing: str = "") -> Components:
    """store <- index <- api, declared from the top down (the order is not the text's)."""
    parts = Components(seen="list[str]")

    @parts.add(start=Part.start, stop=Part.stop)
    def api(index: Part, store: Part, seen: list[str]) -> Part:
        return Part("api", seen, failing == "api")

    @parts.add(start=Part.start, stop=Part.stop)
    def index(store: Part, seen: list[str]) -> Part:
        return Part("index", seen, failing == "index")

    @parts.add(start=Part.start, stop=Part.stop)
    def store(seen: list[str]) -> Part:
        return Part("store", seen, failing == "store")

    return parts


async def test_parts_start_after_what_they_need_and_stop_before_it() -> None:
    seen: list[str] = []
    async with three(seen).running(seen=seen) as built:
        assert [p.name for p in (built["store"], built["index"], built["api"])] == [
            "store", "index", "api"]
        assert seen == ["start store", "start index", "start api"]
    assert seen[3:] == ["stop api", "stop index", "stop store"]


async def test_a_part_that_fails_to_start_stops_with_those_started_before_it() -> None:
    seen: list[str] = []
    with pytest.raises(RuntimeError, match="index cannot start"):
        async with three(seen, failing="index").running(seen=seen):
            pytest.fail("nothing runs on parts that did not start")
    assert seen == ["start store", "start index", "stop index", "stop store"]


def test_a_cycle_an_unknown_need_and_a_need_of_another_kind_are_refused() -> None:
    parts = Components()

    @parts.add
    def a(b: int) -> int:
        return b

    @parts.add
    def b(a: int) -> int:
        return a

    with pytest.raises(WiringError, match="cycle"):
        parts.order()
    other = Components()

    @other.add
    def c(d: int, e: str) -> int:
        return d

    @other.add
    def e() -> bytes:
        return b""

    with pytest.raises(WiringError) as refused:
        other.order()
    assert str(refused.value) == ("c needs d, which nothing provides; "
                                  "c needs e as str; it is bytes")


def test_the_service_layer_declares_parts_that_fit_together() -> None:
    """Every need of a component is provided, as the kind it is written as, without a
    cycle; what settles resolved runs stops before what settling uses, and the passing on
    of resolutions (which makes changes) before the changes and the outbox."""
    order = wiring.COMPONENTS.order()
    assert order[-1] == "services"
    for before, after in [("index", "changes"), ("doorbell", "changes"),
                          ("changes", "dependency_passing"), ("outbox", "dependency_passing"),
                          ("definitions", "dependency_passing"), ("account", "outbox")]:
        assert order.index(before) < order.index(after), (before, after)
