"""The storage retry policy's limits, and when a task's tip repair looks again."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from azqueue.model import definition as definitions
from azqueue.model import task as model
from azqueue.model import timeutil
from azqueue.service.runs.repair import needs_tip, next_check
from azqueue.storage.retry import RetryPolicy, budget, retry_after
from azqueue.testing.tasks import definition

DELAY = timedelta(minutes=3)


def _task(scheduled: bool = True) -> model.Task:
    now = timeutil.utcnow()
    return model.new_task("t", definitions.normalize("t", definition(), now), now,
                          scheduled=scheduled)


async def test_a_retry_waits_no_longer_than_the_request_has_left() -> None:
    policy = RetryPolicy(attempts=5, first_backoff=0.05, max_backoff=1.0)
    with budget(0.05):
        deadline = policy.deadline()
        assert deadline <= asyncio.get_running_loop().time() + 0.05
        assert policy.pause(0, deadline) is None  # no time for another attempt
    deadline = policy.deadline()
    waits = [policy.pause(a, deadline) for a in range(4)]
    assert all(w is not None and 0 <= w <= min(1.0, 0.05 * 2 ** a) for a, w in enumerate(waits))
    assert policy.pause(4, deadline) is None  # the fifth attempt was the last
    assert policy.pause(0, deadline, asked=2.0) == 2.0  # Retry-After is honoured


def test_retry_after_reads_seconds_and_ignores_nonsense() -> None:
    assert retry_after({"Retry-After": "3"}) == 3.0
    assert retry_after({}) is None
    assert retry_after({"Retry-After": "soon"}) is None


def test_a_pending_run_is_looked_at_the_repair_delay_after_it_became_pending() -> None:
    task = _task()
    scheduled = task.runs[0].scheduled
    assert next_check(task, scheduled, DELAY) == scheduled + DELAY
    assert not needs_tip(task, scheduled + DELAY / 2, DELAY)
    assert needs_tip(task, scheduled + DELAY, DELAY)


def test_a_long_pending_run_is_looked_at_less_and_less_often() -> None:
    """A run waiting in a backlog gets another tip at each look: after as long again as it
    has been pending, so a handful, not one every repair delay."""
    task = _task()
    now = task.runs[0].scheduled + timedelta(hours=1)
    assert next_check(task, now, DELAY) == now + timedelta(hours=1)


def test_a_running_run_is_looked_at_after_its_claim_could_expire() -> None:
    now = timeutil.utcnow()
    task = model.claim(_task(), 0, "wg", "w", now, timedelta(minutes=20))
    taken_until = task.runs[0].taken_until
    assert taken_until is not None
    assert next_check(task, now, DELAY) == taken_until + DELAY


def test_a_resolved_task_is_never_looked_at_again() -> None:
    now = timeutil.utcnow()
    task = model.claim(_task(), 0, "wg", "w", now, timedelta(minutes=20))
    done = model.resolve(task, 0, model.RunState.COMPLETED, model.ReasonResolved.COMPLETED, now)
    assert next_check(done, now, DELAY) is None
