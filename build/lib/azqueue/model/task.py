"""Tasks, runs and every transition between their states, in one place.

Each transition is a pure function ``(task, ..., now) -> task`` that either returns
the task as it must be stored next (possibly the same object: nothing to write) or
raises ``Conflict`` naming why the request does not fit the task's state. Every path
(HTTP handlers, claimWork, the background resolvers) goes through these functions, so
the rules below hold whichever path got there first; ``storage`` makes the write
conditional on the ETag the decision was based on.

Run rules (Taskcluster's, see docs/concepts.md):

* Runs are numbered from 0; only the last run may be unresolved.
* pending --claim--> running --report--> completed | failed | exception.
* A run resolved exception for ``claim-expired``, ``worker-shutdown`` or
  ``intermittent-task`` is followed by a new pending run (``retry``, ``retry``,
  ``task-retry``) while ``retriesLeft`` > 0, which it decrements.
* At the deadline every unresolved run is resolved exception ``deadline-exceeded``.
* A task with dependencies is defined unscheduled (no runs) and gets run 0 when every
  dependency is satisfied (``requires``: all completed, or all resolved in any way) or
  scheduleTask says so; never after its deadline.
* cancelTask resolves the unresolved run exception ``canceled`` (a task with no run gets
  one, resolved at once); it never retries, and a resolved task is left as it is.
* rerunTask gives a resolved (or unscheduled) task a new pending run (``rerun``) and
  resets ``retriesLeft``, never past ``MAX_RUNS`` runs in all nor after the deadline.
* changeTaskPriority changes an unresolved task's ``priority``; a running run keeps its
  claim, and the change applies to its pending runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from azqueue.errors import Conflict
from azqueue.model import timeutil
from azqueue.model.priority import Priority


class TaskState(StrEnum):
    UNSCHEDULED = "unscheduled"
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    EXCEPTION = "exception"

    @property
    def resolved(self) -> bool:
        return self in (TaskState.COMPLETED, TaskState.FAILED, TaskState.EXCEPTION)


RESOLVED_STATES: tuple[TaskState, ...] = tuple(s for s in TaskState if s.resolved)
"""The states a task ends in: completed, failed, exception."""


class RunState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    EXCEPTION = "exception"

    @property
    def resolved(self) -> bool:
        return self not in (RunState.PENDING, RunState.RUNNING)


class ReasonCreated(StrEnum):
    SCHEDULED = "scheduled"
    RETRY = "retry"
    TASK_RETRY = "task-retry"
    RERUN = "rerun"
    EXCEPTION = "exception"


class ReasonResolved(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    DEADLINE_EXCEEDED = "deadline-exceeded"
    CANCELED = "canceled"
    SUPERSEDED = "superseded"
    CLAIM_EXPIRED = "claim-expired"
    WORKER_SHUTDOWN = "worker-shutdown"
    MALFORMED_PAYLOAD = "malformed-payload"
    RESOURCE_UNAVAILABLE = "resource-unavailable"
    INTERNAL_ERROR = "internal-error"
    INTERMITTENT_TASK = "intermittent-task"


# Exceptions that schedule another run while retries are left, and the reason it carries.
_RETRY_REASON: Mapping[ReasonResolved, ReasonCreated] = {
    ReasonResolved.CLAIM_EXPIRED: ReasonCreated.RETRY,
    ReasonResolved.WORKER_SHUTDOWN: ReasonCreated.RETRY,
    ReasonResolved.INTERMITTENT_TASK: ReasonCreated.TASK_RETRY,
}


def _opt_time(value: str | None) -> datetime | None:
    return timeutil.parse(value) if value else None


@dataclass(frozen=True, slots=True)
class Run:
    run_id: int
    state: RunState
    reason_created: ReasonCreated
    scheduled: datetime
    reason_resolved: ReasonResolved | None = None
    worker_group: str | None = None
    worker_id: str | None = None
    taken_until: datetime | None = None
    started: datetime | None = None
    resolved: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "runId": self.run_id,
            "state": str(self.state),
            "reasonCreated": str(self.reason_created),
            "scheduled": timeutil.fmt(self.scheduled),
        }
        if self.reason_resolved is not None:
            out["reasonResolved"] = str(self.reason_resolved)
        if self.worker_group is not None:
            out["workerGroup"] = self.worker_group
            out["workerId"] = self.worker_id
        if self.taken_until is not None:
            out["takenUntil"] = timeutil.fmt(self.taken_until)
        if self.started is not None:
            out["started"] = timeutil.fmt(self.started)
        if self.resolved is not None:
            out["resolved"] = timeutil.fmt(self.resolved)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Run:
        reason = data.get("reasonResolved")
        return cls(
            run_id=int(data["runId"]),
            state=RunState(data["state"]),
            reason_created=ReasonCreated(data["reasonCreated"]),
            scheduled=timeutil.parse(data["scheduled"]),
            reason_resolved=ReasonResolved(reason) if reason else None,
            worker_group=data.get("workerGroup"),
            worker_id=data.get("workerId"),
            taken_until=_opt_time(data.get("takenUntil")),
            started=_opt_time(data.get("started")),
            resolved=_opt_time(data.get("resolved")),
        )


@dataclass(frozen=True, slots=True)
class Task:
    """A task as stored: its (normalized) definition, its runs and retries left.

    ``has_dependents``: some task was defined depending on this one, so its resolution
    must be passed on to them. ``group_members``, for the task a group is named after
    (its ``taskGroupId`` is its ``taskId``): whether another task has joined its group,
    so whether its resolution resolves the group alone; None when the task does not
    know (then the group's records say).
    """

    task_id: str
    definition: Mapping[str, Any]
    runs: tuple[Run, ...]
    retries_left: int
    has_dependents: bool = False
    group_members: bool | None = None

    @property
    def alone_in_group(self) -> bool | None:
        """Whether this task is the only task of its group, as far as it knows: its group
        is named after it and no other task has joined (None: it does not know)."""
        if self.definition["taskGroupId"] != self.task_id:
            return False
        return None if self.group_members is None else not self.group_members

    @property
    def task_queue_id(self) -> str:
        return str(self.definition["taskQueueId"])

    @property
    def priority(self) -> Priority:
        return Priority.from_definition(self.definition["priority"])

    @property
    def deadline(self) -> datetime:
        return timeutil.parse(self.definition["deadline"])

    @property
    def expires(self) -> datetime:
        return timeutil.parse(self.definition["expires"])

    @property
    def state(self) -> TaskState:
        if not self.runs:
            return TaskState.UNSCHEDULED
        return TaskState(str(self.runs[-1].state))

    @property
    def dependencies(self) -> frozenset[str]:
        return frozenset(self.definition["dependencies"])

    @property
    def last_run(self) -> Run | None:
        return self.runs[-1] if self.runs else None

    def run(self, run_id: int) -> Run:
        if not 0 <= run_id < len(self.runs):
            raise Conflict(
                f"task {self.task_id} has no run {run_id}; it has {len(self.runs)} run(s)"
            )
        return self.runs[run_id]

    def status(self) -> dict[str, Any]:
        d = self.definition
        return {
            "taskId": self.task_id,
            "provisionerId": d["provisionerId"],
            "workerType": d["workerType"],
            "taskQueueId": d["taskQueueId"],
            "schedulerId": d["schedulerId"],
            "projectId": d["projectId"],
            "taskGroupId": d["taskGroupId"],
            "deadline": d["deadline"],
            "expires": d["expires"],
            "retriesLeft": self.retries_left,
            "state": str(self.state),
            "runs": [r.to_json() for r in self.runs],
        }


# -- transitions ------------------------------------------------------------------------


def new_task(task_id: str, definition: Mapping[str, Any], now: datetime,
             scheduled: bool = True) -> Task:
    """A freshly defined task: run 0 pending, or no run yet when not ``scheduled`` (it
    waits for dependencies)."""
    task = Task(task_id=task_id, definition=definition, runs=(),
                retries_left=int(definition["retries"]))
    return schedule(task, now) if scheduled else task


def schedule(task: Task, now: datetime) -> Task:
    """Give an unscheduled task its pending run 0; unchanged if it has runs or its
    deadline has passed (the deadline resolver resolves it then)."""
    if task.runs or now >= task.deadline:
        return task
    first = Run(run_id=0, state=RunState.PENDING, reason_created=ReasonCreated.SCHEDULED,
                scheduled=now)
    return replace(task, runs=(first,))


def satisfies(dependency: Task, requires: str) -> bool:
    """Whether ``dependency``'s state lets a task with this ``requires`` go ahead."""
    if requires == "all-resolved":
        return dependency.state.resolved
    return dependency.state is TaskState.COMPLETED


def _replace_run(task: Task, run: Run) -> Task:
    runs = list(task.runs)
    runs[run.run_id] = run
    return replace(task, runs=tuple(runs))


def _finish(task: Task, run: Run, state: RunState, reason: ReasonResolved, now: datetime) -> Task:
    """Resolve ``run`` and schedule the retry its reason calls for, if retries are left."""
    done = replace(run, state=state, reason_resolved=reason, resolved=now)
    task = _replace_run(task, done)
    retry_reason = _RETRY_REASON.get(reason) if state is RunState.EXCEPTION else None
    if retry_reason is not None and task.retries_left > 0 and now < task.deadline:
        retry = Run(run_id=run.run_id + 1, state=RunState.PENDING,
                    reason_created=retry_reason, scheduled=now)
        task = replace(task, runs=(*task.runs, retry), retries_left=task.retries_left - 1)
    return task


def claim(task: Task, run_id: int, worker_group: str, worker_id: str, now: datetime,
          claim_timeout: timedelta, expiry_tolerance: timedelta = timedelta(0)) -> Task:
    """Claim run ``run_id`` for the worker.

    ``run_id`` may also be one past the last run when that run is running and its claim
    has expired (the rewritten tip of the claim protocol): that run is resolved
    ``claim-expired`` first and its retry, if any, is claimed. With no retries left the
    returned task has no run ``run_id``: the caller stores it and answers 409.
    """
    if run_id == len(task.runs) and task.runs:
        last = task.runs[-1]
        if last.state is not RunState.RUNNING:
            raise Conflict(f"task {task.task_id} has no run {run_id}: run {last.run_id} "
                           f"is {last.state}, so no retry was scheduled")
        assert last.taken_until is not None
        if last.taken_until > now + expiry_tolerance:
            raise Conflict(f"run {last.run_id} of task {task.task_id} is claimed until "
                           f"{timeutil.fmt(last.taken_until)}; run {run_id} does not exist yet")
        task = _finish(task, last, RunState.EXCEPTION, ReasonResolved.CLAIM_EXPIRED, now)
        if run_id >= len(task.runs):
            return task  # retries exhausted: resolved, nothing to claim
    run = task.run(run_id)
    if run.state is RunState.RUNNING and (run.worker_group, run.worker_id) == (worker_group, worker_id):
        return task  # a repeated claim by the same worker
    if run.state is not RunState.PENDING:
        raise Conflict(f"run {run_id} of task {task.task_id} is {run.state}, not pending; "
                       "it cannot be claimed")
    if now >= task.deadline:
        raise Conflict(f"task {task.task_id} passed its deadline "
                       f"{task.definition['deadline']} and cannot be claimed")
    claimed = replace(run, state=RunState.RUNNING, worker_group=worker_group, worker_id=worker_id,
                      started=now, taken_until=now + claim_timeout)
    return _replace_run(task, claimed)


def is_claimed_by(task: Task, run_id: int, worker_group: str, worker_id: str) -> bool:
    if run_id >= len(task.runs):
        return False
    run = task.runs[run_id]
    return run.state is RunState.RUNNING and (run.worker_group, run.worker_id) == (worker_group, worker_id)


def _running(task: Task, run_id: int, action: str) -> Run:
    run = task.run(run_id)
    if run.state is not RunState.RUNNING:
        raise Conflict(f"run {run_id} of task {task.task_id} is {run.state}, not running; "
                       f"it cannot be {action}")
    return run


def reclaim(task: Task, run_id: int, now: datetime, claim_timeout: timedelta) -> Task:
    run = _running(task, run_id, "reclaimed")
    if now >= task.deadline:
        raise Conflict(f"task {task.task_id} passed its deadline and cannot be reclaimed")
    return _replace_run(task, replace(run, taken_until=now + claim_timeout))


def resolve(task: Task, run_id: int, state: RunState, reason: ReasonResolved,
            now: datetime) -> Task:
    """A worker's report. Repeating a report that already took effect changes nothing."""
    run = task.run(run_id)
    if run.state is state and run.reason_resolved is reason:
        return task
    _running(task, run_id, f"reported {reason}")
    return _finish(task, run, state, reason, now)


def expire_claim(task: Task, run_id: int, now: datetime) -> Task:
    """Resolve run ``run_id`` claim-expired if it is running past ``takenUntil``; else no change."""
    if run_id >= len(task.runs):
        return task
    run = task.runs[run_id]
    if run.state is not RunState.RUNNING or run.taken_until is None or run.taken_until > now:
        return task
    return _finish(task, run, RunState.EXCEPTION, ReasonResolved.CLAIM_EXPIRED, now)


def _resolve_unscheduled(task: Task, reason: ReasonResolved, now: datetime) -> Task:
    """A task with no run gets run 0, resolved exception ``reason`` at once."""
    run = Run(run_id=0, state=RunState.EXCEPTION, reason_created=ReasonCreated.EXCEPTION,
              scheduled=now, reason_resolved=reason, resolved=now)
    return replace(task, runs=(run,))


def cancel(task: Task, now: datetime) -> Task:
    """Resolve the unresolved run exception ``canceled``; a resolved task is unchanged, a
    task past its deadline is left to the deadline (Conflict)."""
    if not task.runs and now >= task.deadline:
        raise Conflict(f"task {task.task_id} passed its deadline {task.definition['deadline']}; "
                       "it is resolved deadline-exceeded, not canceled")
    if not task.runs:
        return _resolve_unscheduled(task, ReasonResolved.CANCELED, now)
    last = task.runs[-1]
    if last.state.resolved:
        return task
    if now >= task.deadline:
        raise Conflict(f"task {task.task_id} passed its deadline {task.definition['deadline']}; "
                       "it is resolved deadline-exceeded, not canceled")
    return _finish(task, last, RunState.EXCEPTION, ReasonResolved.CANCELED, now)


def resolve_deadline(task: Task, now: datetime) -> Task:
    """At the deadline, resolve every unresolved run exception ``deadline-exceeded``."""
    if now < task.deadline:
        return task
    if not task.runs:
        return _resolve_unscheduled(task, ReasonResolved.DEADLINE_EXCEEDED, now)
    last = task.runs[-1]
    if last.state.resolved:
        return task
    done = replace(last, state=RunState.EXCEPTION,
                   reason_resolved=ReasonResolved.DEADLINE_EXCEEDED, resolved=now)
    return _replace_run(task, done)


# Taskcluster's sanity limit on the runs of one task: rerunTask refuses past it, and the
# retries it grants stop there.
MAX_RUNS = 50


def rerun(task: Task, now: datetime) -> Task:
    """rerunTask: a resolved (or unscheduled) task gets a new pending run ``rerun`` and
    its retries back, as many as still fit under ``MAX_RUNS``. A pending or running task
    is unchanged; past the deadline, or with ``MAX_RUNS`` runs, Conflict."""
    if now >= task.deadline:
        raise Conflict(f"task {task.task_id} passed its deadline {task.definition['deadline']} "
                       "and cannot be rerun; create a new task instead")
    last = task.last_run
    if last is not None and not last.state.resolved:
        return task
    run_id = len(task.runs)
    if run_id >= MAX_RUNS:
        raise Conflict(f"task {task.task_id} has {run_id} runs, the most a task may have "
                       f"({MAX_RUNS}); create a new task instead")
    run = Run(run_id=run_id, state=RunState.PENDING, reason_created=ReasonCreated.RERUN,
              scheduled=now)
    retries = min(int(task.definition["retries"]), MAX_RUNS - run_id - 1)
    return replace(task, runs=(*task.runs, run), retries_left=retries)


def change_priority(task: Task, priority: Priority, now: datetime) -> Task:
    """changeTaskPriority: an unresolved task's definition gets ``priority``; unchanged if
    it has that priority already; Conflict if it is resolved or past its deadline."""
    if now >= task.deadline:
        raise Conflict(f"task {task.task_id} passed its deadline {task.definition['deadline']} "
                       "and cannot be reprioritized")
    if task.state.resolved:
        raise Conflict(f"task {task.task_id} is resolved ({task.state}) and cannot be "
                       "reprioritized; rerunTask it first if it should run again")
    if task.priority is priority:
        return task
    return replace(task, definition={**task.definition, "priority": str(priority)})
