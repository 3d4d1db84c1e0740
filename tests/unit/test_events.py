"""Which messages a transition publishes, and their routing keys (see docs/concepts.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from azqueue.model import events, timeutil
from azqueue.model import task as model
from azqueue.model.definition import normalize
from azqueue.model.task import ReasonResolved, RunState

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
TIMEOUT = timedelta(minutes=20)


def _task(retries: int = 1, routes: list[str] | None = None) -> model.Task:
    body = {"taskQueueId": "p/w", "created": timeutil.fmt(NOW), "schedulerId": "sched",
            "taskGroupId": "G" * 22, "deadline": timeutil.fmt(NOW + timedelta(days=1)),
            "retries": retries, "routes": routes or [], "payload": {}, "metadata": {}}
    return model.new_task("T" * 22, normalize("T" * 22, body, NOW), NOW)


def test_a_new_task_is_defined_then_pending_with_absent_values_as_underscores() -> None:
    defined, pending = events.for_change(None, _task(routes=["notify.by-email"]))
    assert (defined.exchange, pending.exchange) == ("task-defined", "task-pending")
    assert defined.routing_key == f"primary.{'T' * 22}._._._.p.w.sched.{'G' * 22}._"
    assert pending.routing_key == f"primary.{'T' * 22}.0._._.p.w.sched.{'G' * 22}._"
    assert pending.cc == ("route.notify.by-email",) and pending.payload["runId"] == 0


def test_claim_expiry_with_retries_left_is_pending_then_running_never_exception() -> None:
    claimed = model.claim(_task(), 0, "g", "a", NOW, TIMEOUT)
    [running] = events.for_change(_task(), claimed)
    assert running.exchange == "task-running" and running.payload["workerId"] == "a"
    retried = model.claim(claimed, 1, "g", "b", NOW + TIMEOUT, TIMEOUT)
    assert [e.exchange for e in events.for_change(claimed, retried)] == [
        "task-pending", "task-running"]
    exhausted = model.claim(retried, 2, "g", "c", NOW + 2 * TIMEOUT, TIMEOUT)
    [final] = events.for_change(retried, exhausted)
    assert final.exchange == "task-exception" and final.group == ("G" * 22, "sched")
    assert final.payload["runId"] == 1


def test_final_resolutions_carry_the_group_check_and_no_change_publishes_nothing() -> None:
    claimed = model.claim(_task(), 0, "g", "a", NOW, TIMEOUT)
    done = model.resolve(claimed, 0, RunState.FAILED, ReasonResolved.FAILED, NOW)
    [failed] = events.for_change(claimed, done)
    assert failed.exchange == "task-failed" and failed.group is not None
    assert events.for_change(done, done) == []
    reclaimed = model.reclaim(claimed, 0, NOW, TIMEOUT)
    assert events.for_change(claimed, reclaimed) == []


def test_task_group_resolved_routing_key() -> None:
    event = events.task_group_resolved("G" * 22, "sched", "2030-01-01T00:00:00.000Z")
    assert event.routing_key == f"primary.{'G' * 22}.sched._"
    assert event.payload == {"version": 1, "taskGroupId": "G" * 22, "schedulerId": "sched",
                             "expires": "2030-01-01T00:00:00.000Z"}


def test_a_canceled_run_publishes_task_exception_with_the_group_check() -> None:
    claimed = model.claim(_task(), 0, "g", "a", NOW, TIMEOUT)
    [event] = events.for_change(claimed, model.cancel(claimed, NOW))
    assert event.exchange == "task-exception" and event.group is not None
    assert event.payload["runId"] == 0 and event.payload["workerId"] == "a"
    assert event.payload["status"]["runs"][0]["reasonResolved"] == "canceled"


def test_a_waiting_task_is_defined_alone_and_pending_once_scheduled() -> None:
    waiting = model.new_task("W" * 22, _task().definition, NOW, scheduled=False)
    assert [e.exchange for e in events.for_change(None, waiting)] == ["task-defined"]
    [pending] = events.for_change(waiting, model.schedule(waiting, NOW))
    assert pending.exchange == "task-pending" and pending.payload["runId"] == 0
