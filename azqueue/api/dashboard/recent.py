"""What the dashboard lists without an ID to start from: the tasks changed lately, their
failures, and the runs resolved per minute.

The queue's API has no listing of recent or failed tasks, and storage keeps none that a
read could use without scanning: so each server remembers, in memory and bounded, the
changes it hears of, with no storage request:

- the changes this server stores itself (``record``, an observer of its services'
  changes, ``service.runs.changes``): with events off, that is all, and the page says "recent
  on this replica" (``THIS_REPLICA``);
- with events on, while the dashboard is watched (``listening``: see
  ``dashboard.Hearing``), every replica's too: the task exchanges' messages (``hear``,
  fed by an ``azqueue.events.listener.Listener``), which every replica publishes and the
  broker keeps for an hour (``events.history``), so every replica shows the same lists
  of the last hour (``EVERY_REPLICA``) from the first time it is watched. A change both
  recorded and heard, or heard twice, is listed (and counted) once.

Each change is placed at the time it happened, as its status says (the run's resolution,
start or scheduling), not when it was heard: an hour read at once keeps its order and
its minutes.

A restart forgets. A task's name is not in its messages: it is shown where this process
stored or changed the task (``record`` notes it either way), and the page reads the
others' from their definitions.

Bounds: ``MAX_QUEUES`` task queues (those changed most recently), each with its latest
``PER_QUEUE`` tasks and its latest ``FAILURES_PER_QUEUE`` failed or exception tasks (one
entry per task, its newest state), ``MINUTES`` minutes of resolutions by state, and the
names of the latest ``MAX_NAMES`` tasks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from collections import Counter, OrderedDict
from typing import Any

from azqueue.model import timeutil
from azqueue.model.task import RESOLVED_STATES, Task

MAX_QUEUES = 50
PER_QUEUE = 100
FAILURES_PER_QUEUE = 50
MINUTES = 60
FAILED = ("failed", "exception")
MAX_NAMES = 5000
# The exchanges whose messages carry a task's status structure.
TASK_EXCHANGES = ("task-defined", "task-pending", "task-running", "task-completed",
                  "task-failed", "task-exception")
EVERY_REPLICA = "the last hour on every replica"
THIS_REPLICA = "recent on this replica"

Entry = dict[str, Any]


class _Queue:
    def __init__(self) -> None:
        self.tasks: OrderedDict[str, Entry] = OrderedDict()
        self.failures: OrderedDict[str, Entry] = OrderedDict()
        # minute (seconds since 1970 // 60) -> resolutions by state
        self.minutes: dict[int, Counter[str]] = {}


def _remember(entries: OrderedDict[str, Any], key: str, value: Any, bound: int) -> None:
    """Put ``key`` last in ``entries``, and drop the oldest beyond ``bound``."""
    entries[key] = value
    entries.move_to_end(key)
    while len(entries) > bound:
        entries.popitem(last=False)


def _resolved_at(minutes: dict[int, Counter[str]], minute: int, state: str) -> None:
    """Count a resolution in its minute, if that is one of the last ``MINUTES``."""
    now = int(time.time() // 60)
    if minute <= now - MINUTES:
        return
    minutes.setdefault(minute, Counter())[state] += 1
    for old in [m for m in minutes if m <= now - MINUTES]:
        del minutes[old]


def _happened(run: dict[str, Any]) -> str:
    """When a task's last change happened, as its last run says (now if it has none)."""
    return (run.get("resolved") or run.get("started") or run.get("scheduled")
            or timeutil.fmt(timeutil.utcnow()))


def _progress(entry: Entry) -> tuple[int, int]:
    """How far a task has come: its runs, then its last run's state."""
    run_id = entry["runId"]
    state = entry["state"]
    return (-1 if run_id is None else run_id,
            3 if state in RESOLVED_STATES else {"pending": 1, "running": 2}.get(state, 0))


def _entry(status: dict[str, Any], name: str) -> Entry:
    """What the lists show of a task, from its status structure."""
    runs = status["runs"]
    run: dict[str, Any] = runs[-1] if runs else {}
    return {
        "taskId": status["taskId"], "taskGroupId": status["taskGroupId"],
        "taskQueueId": status["taskQueueId"], "name": name, "state": status["state"],
        "runId": run.get("runId"), "reasonCreated": run.get("reasonCreated"),
        "reasonResolved": run.get("reasonResolved"), "workerGroup": run.get("workerGroup"),
        "workerId": run.get("workerId"), "scheduled": run.get("scheduled"),
        "started": run.get("started"), "resolved": run.get("resolved"),
        "changed": _happened(run)}


class RecentChanges:
    """The changes heard of lately, by task queue. ``listening`` says whether every
    replica's changes are heard now (``hear``), besides those ``record`` notes."""

    def __init__(self) -> None:
        self.listening: Callable[[], bool] = lambda: False
        self._queues: OrderedDict[str, _Queue] = OrderedDict()
        self._minutes: dict[int, Counter[str]] = {}
        self._names: OrderedDict[str, str] = OrderedDict()

    @property
    def note(self) -> str:
        return EVERY_REPLICA if self.listening() else THIS_REPLICA

    def record(self, before: Task | None, after: Task) -> None:
        """An observer of the server's changes (``service.runs.changes.ChangeObserver``): note
        ``after``'s name and remember its newest state."""
        name = (after.definition.get("metadata") or {}).get("name", "")
        if name:
            _remember(self._names, after.task_id, name, MAX_NAMES)
        self._add(after.status())

    def hear(self, exchange: str, payload: dict[str, Any]) -> None:
        """A ``Listener``'s handler: remember the newest state a task message carries."""
        if exchange in TASK_EXCHANGES:
            self._add(payload["status"])

    def _add(self, status: dict[str, Any]) -> None:
        name = status["taskQueueId"]
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = _Queue()
        self._queues.move_to_end(name)
        while len(self._queues) > MAX_QUEUES:
            self._queues.popitem(last=False)
        entry = _entry(status, self._names.get(status["taskId"], ""))
        known = queue.tasks.get(entry["taskId"])
        if known is not None and _progress(known) > _progress(entry):
            return  # a message that arrived late (recovered, or from a slower replica)
        was = (known["runId"], known["state"]) if known is not None else None
        _remember(queue.tasks, entry["taskId"], entry, PER_QUEUE)
        if entry["state"] in FAILED:
            _remember(queue.failures, entry["taskId"], entry, FAILURES_PER_QUEUE)
        if entry["state"] in RESOLVED_STATES and was != (entry["runId"], entry["state"]):
            minute = int(timeutil.parse(entry["resolved"]).timestamp() // 60) \
                if entry["resolved"] else int(time.time() // 60)
            _resolved_at(queue.minutes, minute, entry["state"])
            _resolved_at(self._minutes, minute, entry["state"])

    def view(self, task_queue_id: str | None, visible: Callable[[Entry], bool],
             limit: int = PER_QUEUE) -> dict[str, Any]:
        """The newest ``limit`` tasks and failures (of ``task_queue_id``, or of every task
        queue), only those ``visible(entry)`` lets through, and the resolutions per minute
        of the last ``MINUTES`` minutes (oldest first; minutes without any left out)."""
        if task_queue_id is None:
            queues = list(self._queues.values())
            minutes = self._minutes
        else:
            found = self._queues.get(task_queue_id)
            queues = [found] if found is not None else []
            minutes = found.minutes if found is not None else {}

        def newest(kind: str) -> list[Entry]:
            entries = [e for q in queues for e in getattr(q, kind).values()]
            entries.sort(key=lambda e: e["changed"], reverse=True)
            return [e for e in entries if visible(e)][:limit]

        now = int(time.time() // 60)
        return {
            "tasks": newest("tasks"), "failures": newest("failures"),
            "throughput": [{"minute": timeutil.fmt(datetime.fromtimestamp(minute * 60, UTC)),
                            **{state: counts.get(state, 0) for state in RESOLVED_STATES}}
                           for minute, counts in sorted(minutes.items())
                           if minute > now - MINUTES]}

