"""Tasks for a test without the boilerplate: a task definition with Taskcluster's
defaults filled in (``definition``), and waiting for a task's resolution
(``Resolution``, what ``AzqueueServer.wait`` returns, and ``WaitTimeout``, what it
raises saying what is still pending or running)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

RESOLVED = ("completed", "failed", "exception")
# How often ``wait`` reads the task's status (one table read on the server each time).
WAIT_INTERVAL = 0.1
DEFAULT_DEADLINE = timedelta(hours=1)


def _when(value: object, now: datetime) -> str:
    """An ISO time: ``value`` as given (a string), a ``datetime``, or a ``timedelta``
    (or seconds) from ``now``."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = timedelta(seconds=value)
    if isinstance(value, timedelta):
        value = now + value
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    raise TypeError(f"a time must be an ISO string, a datetime, a timedelta or seconds from "
                    f"now, not {value!r}")


def definition(task_queue_id: str, payload: dict[str, Any] | None = None,
               **fields: Any) -> dict[str, Any]:
    """A task definition for ``task_queue_id``: ``created`` now, ``deadline`` an hour
    later, ``metadata`` naming the test, an empty payload; ``fields`` sets any field of
    Taskcluster's task definition by its name (``deadline`` and ``expires`` may be a
    ``timedelta`` or seconds from now, or a ``datetime``)."""
    now = datetime.now(UTC)
    task: dict[str, Any] = {
        "taskQueueId": task_queue_id, "payload": {} if payload is None else payload,
        "metadata": {"name": f"a task of {task_queue_id}", "description": "a test's task",
                     "owner": "azqueue-testing@example.com",
                     "source": "https://example.com/azqueue-testing"},
        **fields}
    task["created"] = _when(task.get("created", now), now)
    task["deadline"] = _when(task.get("deadline", DEFAULT_DEADLINE), now)
    if "expires" in task:
        task["expires"] = _when(task["expires"], now)
    return task


@dataclass(frozen=True, slots=True)
class Resolution:
    """A resolved task: ``state`` (``completed``, ``failed`` or ``exception``),
    ``reason`` (its last run's ``reasonResolved``), ``runs`` (Taskcluster's runs, each
    with ``state``, ``reasonCreated``, ``reasonResolved``, ``workerGroup``, ...), and the
    whole ``status`` structure."""

    task_id: str
    state: str
    reason: str
    runs: list[dict[str, Any]]
    status: dict[str, Any]

    @classmethod
    def of(cls, status: dict[str, Any]) -> Resolution:
        runs = list(status.get("runs", []))
        reason = str(runs[-1].get("reasonResolved", "")) if runs else ""
        return cls(str(status["taskId"]), str(status["state"]), reason, runs, status)


class WaitTimeout(AssertionError):
    """``wait()`` gave up: the task was not resolved in time (the message says where it
    was, and what else of its task queue is pending or running)."""


def wait(queue: Any, task_id: str, timeout: float) -> Resolution:
    """Read the task's status (``queue``: a synchronous ``taskcluster.Queue``) until it is
    resolved; ``WaitTimeout`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        status: dict[str, Any] = queue.status(task_id)["status"]
        if status["state"] in RESOLVED:
            return Resolution.of(status)
        if time.monotonic() >= end:
            raise WaitTimeout(not_resolved(queue, status, timeout))
        time.sleep(WAIT_INTERVAL)


def not_resolved(queue: Any, status: dict[str, Any], timeout: float) -> str:
    """What ``WaitTimeout`` says: the task's state and runs, and the tasks of its task
    queue that are pending or claimed."""
    runs = ", ".join(f"run {i} {r['state']}" + (f" by {r.get('workerGroup')}/"
                                                f"{r.get('workerId')}" if "workerId" in r
                                                else "")
                     for i, r in enumerate(status.get("runs", []))) or "no run"
    task_queue_id = str(status["taskQueueId"])
    listed = []
    for what, method, key in (("pending", "listPendingTasks", "tasks"),
                              ("claimed", "listClaimedTasks", "tasks")):
        try:
            ids = [str(t["taskId"]) for t in getattr(queue, method)(
                task_queue_id, query={"limit": 10})[key]]
        except Exception as e:  # a listing is a hint: say it failed, keep the rest
            listed.append(f"{what}: unknown ({type(e).__name__})")
            continue
        listed.append(f"{what}: {', '.join(ids) or 'none'}")
    return (f"task {status['taskId']} not resolved within {timeout:g} s: it is "
            f"{status['state']} ({runs}); in {task_queue_id}, {'; '.join(listed)}. Is a "
            "worker draining that task queue (azqueue_worker(...).drain() runs one until "
            "it is empty; wait() only watches)?")
