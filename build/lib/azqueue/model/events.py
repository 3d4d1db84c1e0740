"""The AMQP messages a state change publishes (see docs/concepts.md).

Every task message goes to ``exchange/taskcluster-queue/v1/<name>`` with the routing key
``primary.<taskId>.<runId>.<workerGroup>.<workerId>.<provisionerId>.<workerType>.
<schedulerId>.<taskGroupId>._`` (``_`` for absent values) and is CC'd to
``route.<route>`` for each of ``task.routes``.

Which messages a transition publishes, computed from the task before and after it:

* a new task: task-defined, then task-pending for run 0;
* a run claimed: task-running (preceded by task-pending when the same change scheduled
  the run, e.g. a claim that expired the previous run and claimed its retry);
* a run resolved and retried at once (claim-expired, worker-shutdown, intermittent-task
  with retries left): task-pending for the new run, not task-exception;
* a run resolved for good: task-completed, task-failed or task-exception; these carry
  the task group's check (``group``): the group is resolved once none of its tasks is
  unresolved, and then task-group-resolved goes out;
* an artifact created: artifact-created, except for one that reads as ``s3``;
* a priority changed (changeTaskPriority, changeTaskGroupPriority): task-priority-changed,
  routed without a run, as Taskcluster routes it.

Task group messages (task-group-resolved, task-group-sealed, task-group-priority-changed)
are routed ``primary.<taskGroupId>.<schedulerId>._``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from azqueue.model import timeutil
from azqueue.model.task import Run, RunState, Task

EXCHANGES = ("task-defined", "task-pending", "task-running", "artifact-created",
             "task-completed", "task-failed", "task-exception", "task-group-resolved",
             "task-group-sealed", "task-priority-changed", "task-group-priority-changed")


@dataclass(frozen=True, slots=True)
class Event:
    exchange: str  # e.g. "task-pending"
    routing_key: str
    payload: dict[str, Any]
    cc: tuple[str, ...] = ()
    # For final resolutions: (taskGroupId, schedulerId) whose resolution to check.
    group: tuple[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"exchange": self.exchange, "routingKey": self.routing_key,
                "payload": self.payload, "cc": list(self.cc),
                "group": list(self.group) if self.group else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        group = data.get("group")
        return cls(exchange=data["exchange"], routing_key=data["routingKey"],
                   payload=data["payload"], cc=tuple(data.get("cc", ())),
                   group=(group[0], group[1]) if group else None)


def _part(value: object) -> str:
    return "_" if value is None or value == "" else str(value)


def routing_key(task: Task, run: Run | None) -> str:
    d = task.definition
    return ".".join([
        "primary", task.task_id,
        _part(run.run_id if run else None), _part(run.worker_group if run else None),
        _part(run.worker_id if run else None), d["provisionerId"], d["workerType"],
        d["schedulerId"], d["taskGroupId"], "_"])


def _event(name: str, task: Task, run: Run | None, group: bool = False,
           **extra: Any) -> Event:
    payload = {"version": 1, "status": task.status(), **extra}
    d = task.definition
    return Event(exchange=name, routing_key=routing_key(task, run), payload=payload,
                 cc=tuple(f"route.{r}" for r in d["routes"]),
                 group=(d["taskGroupId"], d["schedulerId"]) if group else None)


def _worker(run: Run) -> dict[str, Any]:
    return {"runId": run.run_id, "workerGroup": run.worker_group, "workerId": run.worker_id}


def for_change(before: Task | None, after: Task) -> list[Event]:
    """The messages that the change from ``before`` (None: new task) to ``after`` publishes."""
    events: list[Event] = []
    if before is None:
        events.append(_event("task-defined", after, None))
    elif before.definition.get("priority") != after.definition.get("priority"):
        events.append(_event("task-priority-changed", after, None,
                             oldPriority=str(before.priority), newPriority=str(after.priority)))
    old = {r.run_id: r for r in (before.runs if before else ())}
    for run in after.runs:
        prev = old.get(run.run_id)
        if prev == run:
            continue
        if prev is None and run.state in (RunState.PENDING, RunState.RUNNING):
            events.append(_event("task-pending", after, run, runId=run.run_id))
        if run.state is RunState.RUNNING and (prev is None or prev.state is RunState.PENDING):
            assert run.taken_until is not None
            events.append(_event("task-running", after, run, **_worker(run),
                                 takenUntil=timeutil.fmt(run.taken_until)))
        elif run.state.resolved and (prev is None or not prev.state.resolved):
            retried = run.run_id + 1 < len(after.runs)
            if retried:
                continue  # its retry's task-pending is the message
            if run.state is RunState.EXCEPTION:
                extra = _worker(run) if run.worker_group else {"runId": run.run_id}
                events.append(_event("task-exception", after, run, group=True, **extra))
            else:
                events.append(_event(f"task-{run.state}", after, run, group=True, **_worker(run)))
    return events


def artifact_created(task: Task, run_id: int, artifact: dict[str, Any]) -> list[Event]:
    """The message of an artifact created (``artifact``: its artifactInfo): none for one
    that reads as ``s3``, as in Taskcluster, whose artifact-created message does not
    admit that storage type."""
    if artifact["storageType"] == "s3":
        return []
    run = task.runs[run_id]
    return [_event("artifact-created", task, run, artifact=artifact, **_worker(run))]


def task_group_resolved(task_group_id: str, scheduler_id: str, expires: str) -> Event:
    """``expires``: the latest of its tasks' (ISO)."""
    return Event(exchange="task-group-resolved",
                 routing_key=f"primary.{task_group_id}.{scheduler_id}._",
                 payload={"version": 1, "taskGroupId": task_group_id,
                          "schedulerId": scheduler_id, "expires": expires})


def _group_key(task_group_id: str, scheduler_id: str) -> str:
    return f"primary.{task_group_id}.{scheduler_id}._"


def task_group_sealed(group: dict[str, Any]) -> Event:
    """``group``: the getTaskGroup answer of the group just sealed."""
    return Event(exchange="task-group-sealed",
                 routing_key=_group_key(group["taskGroupId"], group["schedulerId"]),
                 payload={"version": 1, **group})


def task_group_priority_changed(task_group_id: str, scheduler_id: str, priority: str,
                                affected: int) -> Event:
    return Event(exchange="task-group-priority-changed",
                 routing_key=_group_key(task_group_id, scheduler_id),
                 payload={"version": 1, "taskGroupId": task_group_id,
                          "schedulerId": scheduler_id, "newPriority": priority,
                          "tasksAffected": affected})
