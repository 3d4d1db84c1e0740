"""The transitions of rerunTask and changeTaskPriority, and the messages they publish."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from azqueue.errors import Conflict
from azqueue.model import events, timeutil
from azqueue.model import task as model
from azqueue.model.definition import normalize
from azqueue.model.priority import Priority
from azqueue.model.task import ReasonResolved, RunState

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _task(retries: int = 2, priority: str = "low") -> model.Task:
    body = {"taskQueueId": "p/w", "created": timeutil.fmt(NOW), "schedulerId": "sched",
            "taskGroupId": "G" * 22, "deadline": timeutil.fmt(NOW + timedelta(days=1)),
            "retries": retries, "priority": priority, "routes": ["r"], "payload": {},
            "metadata": {}}
    return model.new_task("T" * 22, normalize("T" * 22, body, NOW), NOW)


def _completed(task: model.Task) -> model.Task:
    run_id = len(task.runs) - 1
    task = model.claim(task, run_id, "wg", "w", NOW, timedelta(minutes=20))
    return model.resolve(task, run_id, RunState.COMPLETED, ReasonResolved.COMPLETED, NOW)


def test_rerun_adds_a_pending_run_and_resets_retries() -> None:
    """rerunTask 'will also reset the number of `retries` allowed'."""
    task = model.claim(_task(), 0, "wg", "w", NOW, timedelta(minutes=20))
    task = model.resolve(task, 0, RunState.EXCEPTION, ReasonResolved.WORKER_SHUTDOWN, NOW)
    task = _completed(task)
    assert task.retries_left == 1
    rerun = model.rerun(task, NOW)
    assert rerun.retries_left == 2 and rerun.state.value == "pending"
    assert rerun.runs[-1] == model.Run(2, RunState.PENDING, model.ReasonCreated.RERUN, NOW)
    assert model.rerun(rerun, NOW) is rerun  # pending: nothing to do


def test_rerun_schedules_an_unscheduled_task_and_refuses_past_the_deadline() -> None:
    """'It will schedule a task that is _unscheduled_ regardless of the state of its
    dependencies.'"""
    waiting = model.new_task("T" * 22, _task().definition, NOW, scheduled=False)
    assert model.rerun(waiting, NOW).runs[0].reason_created is model.ReasonCreated.RERUN
    with pytest.raises(Conflict, match="deadline"):
        model.rerun(_completed(_task()), NOW + timedelta(days=2))


def test_reruns_stop_at_fifty_runs_and_retries_never_pass_them() -> None:
    task = _completed(_task(retries=5))
    while len(task.runs) < model.MAX_RUNS:
        task = _completed(model.rerun(task, NOW))
        assert len(task.runs) + task.retries_left <= model.MAX_RUNS
    with pytest.raises(Conflict, match="50"):
        model.rerun(task, NOW)


def test_priority_changes_only_unresolved_tasks_and_publishes_old_and_new() -> None:
    task = _task(priority="low")
    changed = model.change_priority(task, Priority.HIGH, NOW)
    assert changed.priority is Priority.HIGH and changed.definition["priority"] == "high"
    assert model.change_priority(changed, Priority.HIGH, NOW) is changed
    [event] = events.for_change(task, changed)
    assert event.exchange == "task-priority-changed"
    assert event.routing_key == f"primary.{'T' * 22}._._._.p.w.sched.{'G' * 22}._"
    assert (event.payload["oldPriority"], event.payload["newPriority"]) == ("low", "high")
    assert event.cc == ("route.r",) and event.group is None
    with pytest.raises(Conflict, match="resolved"):
        model.change_priority(_completed(task), Priority.HIGH, NOW)
    with pytest.raises(Conflict, match="deadline"):
        model.change_priority(task, Priority.HIGH, NOW + timedelta(days=2))


def test_task_group_messages_are_routed_by_group_and_scheduler() -> None:
    sealed = events.task_group_sealed({"taskGroupId": "G" * 22, "schedulerId": "s",
                                       "expires": "2031-01-01T00:00:00.000Z",
                                       "sealed": "2030-01-01T00:00:00.000Z"})
    assert (sealed.exchange, sealed.routing_key) == ("task-group-sealed", f"primary.{'G' * 22}.s._")
    summary = events.task_group_priority_changed("G" * 22, "s", "high", 3)
    assert summary.payload == {"version": 1, "taskGroupId": "G" * 22, "schedulerId": "s",
                               "newPriority": "high", "tasksAffected": 3}
    assert {"task-group-sealed", "task-priority-changed",
            "task-group-priority-changed"} <= set(events.EXCHANGES)
