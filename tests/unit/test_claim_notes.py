"""The claims a process noted and has not indexed yet (``ClaimIndex``): the earliest
takenUntil among them, which the claim resolver sleeps until, follows every claim,
reclaim and resolution; the resolver is woken only by a claim due before all the others."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from azqueue.service.runs.claimindex import ClaimIndex


def _index() -> ClaimIndex:
    # Noting, extending and forgetting a note touch no storage.
    return ClaimIndex(cast(Any, None), cast(Any, None), cast(Any, None), timedelta(minutes=20))


async def test_the_earliest_takenuntil_follows_claims_reclaims_and_resolutions() -> None:
    index = _index()
    start = datetime.now(UTC)
    assert index.earliest() is None
    for i in range(5):
        index.claimed(f"task{i}", 0, start + timedelta(minutes=i + 1), "prov/notes")
    assert index.earliest() == start + timedelta(minutes=1)
    await index.extended("task0", 0, start, start + timedelta(minutes=10))
    assert index.earliest() == start + timedelta(minutes=2)
    index.forget("task1", 0, start)
    assert index.earliest() == start + timedelta(minutes=3)
    index.claimed("task2", 0, start + timedelta(minutes=7), "prov/notes")  # answered again
    assert index.earliest() == start + timedelta(minutes=4)
    for task_id in ("task0", "task2", "task3", "task4"):
        index.forget(task_id, 0, start)
    assert index.earliest() is None and index.local() == []


async def test_many_reclaims_leave_the_earliest_right() -> None:
    index = _index()
    start = datetime.now(UTC)
    for i in range(50):
        index.claimed(f"task{i}", 0, start + timedelta(seconds=i), "prov/notes")
    for round_ in range(1, 20):
        for i in range(50):
            await index.extended(f"task{i}", 0, start, start + timedelta(seconds=round_ * 100 + i))
        assert index.earliest() == start + timedelta(seconds=round_ * 100)
    assert index.earliest() == min(r.taken_until for r in index.local())


async def test_only_a_claim_due_before_the_others_wakes_the_resolver() -> None:
    index = _index()
    start = datetime.now(UTC)
    index.claimed("first", 0, start + timedelta(minutes=5), "prov/notes")
    assert index.changed.is_set()
    index.changed.clear()
    index.claimed("later", 0, start + timedelta(minutes=6), "prov/notes")
    await index.extended("first", 0, start, start + timedelta(minutes=8))
    assert not index.changed.is_set()
    index.claimed("sooner", 0, start + timedelta(minutes=1), "prov/notes")
    assert index.changed.is_set()
