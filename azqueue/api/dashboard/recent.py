"""What the dashboard lists without an ID to start from: the tasks this process changed
lately, their failures, and the runs it resolved per minute.

The queue's API has no listing of recent or failed tasks, and storage keeps none that a
read could use without scanning: so each process remembers, in memory and bounded, the
changes it stores itself (fed by ``metrics.on_change``, on the change's path, with no
storage request). A deployment of several replicas has one such memory each: the page
says "recent on this replica". A restart forgets it.

Bounds: ``MAX_QUEUES`` task queues (those changed most recently), each with its latest
``PER_QUEUE`` tasks and its latest ``FAILURES_PER_QUEUE`` failed or exception tasks (one
entry per task, its newest state), and ``MINUTES`` minutes of resolutions by state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from collections import Counter, OrderedDict
from typing import Any

from azqueue import metrics
from azqueue.model import timeutil
from azqueue.model.task import RESOLVED_STATES, Task

MAX_QUEUES = 50
PER_QUEUE = 100
FAILURES_PER_QUEUE = 50
MINUTES = 60
FAILED = ("failed", "exception")

Entry = dict[str, Any]


class _Queue:
    def __init__(self) -> None:
        self.tasks: OrderedDict[str, Entry] = OrderedDict()
        self.failures: OrderedDict[str, Entry] = OrderedDict()
        # minute (seconds since 1970 // 60) -> resolutions by state
        self.minutes: OrderedDict[int, Counter[str]] = OrderedDict()


def _remember(entries: OrderedDict[str, Entry], entry: Entry, bound: int) -> None:
    entries[entry["taskId"]] = entry
    entries.move_to_end(entry["taskId"])
    while len(entries) > bound:
        entries.popitem(last=False)


def _resolved_at(minutes: OrderedDict[int, Counter[str]], minute: int, state: str) -> None:
    minutes.setdefault(minute, Counter())[state] += 1
    while minutes and next(iter(minutes)) <= minute - MINUTES:
        minutes.popitem(last=False)


class RecentChanges:
    """The changes this process stored lately, by task queue."""

    def __init__(self) -> None:
        self._queues: OrderedDict[str, _Queue] = OrderedDict()
        self._minutes: OrderedDict[int, Counter[str]] = OrderedDict()

    def record(self, before: Task | None, after: Task) -> None:
        """A ``metrics.on_change`` listener: remember ``after``'s newest state."""
        run = after.last_run
        if run is None:
            return
        name = after.task_queue_id
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = _Queue()
        self._queues.move_to_end(name)
        while len(self._queues) > MAX_QUEUES:
            self._queues.popitem(last=False)
        metadata = after.definition.get("metadata") or {}
        entry: Entry = {
            "taskId": after.task_id, "taskGroupId": after.definition.get("taskGroupId"),
            "taskQueueId": name, "name": metadata.get("name", ""), "state": str(after.state),
            "runId": run.run_id, "reasonCreated": run.reason_created.value,
            "reasonResolved": run.reason_resolved.value if run.reason_resolved else None,
            "workerGroup": run.worker_group, "workerId": run.worker_id,
            "scheduled": timeutil.fmt(run.scheduled),
            "started": timeutil.fmt(run.started) if run.started else None,
            "resolved": timeutil.fmt(run.resolved) if run.resolved else None,
            "changed": timeutil.fmt(timeutil.utcnow())}
        _remember(queue.tasks, entry, PER_QUEUE)
        if entry["state"] in FAILED:
            _remember(queue.failures, entry, FAILURES_PER_QUEUE)
        was = before.runs[run.run_id].state.value \
            if before is not None and run.run_id < len(before.runs) else None
        if entry["state"] in RESOLVED_STATES and was != entry["state"]:
            minute = int(time.time() // 60)
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
            minutes = found.minutes if found is not None else OrderedDict()

        def newest(kind: str) -> list[Entry]:
            entries = [e for q in queues for e in getattr(q, kind).values()]
            entries.sort(key=lambda e: e["changed"], reverse=True)
            return [e for e in entries if visible(e)][:limit]

        now = int(time.time() // 60)
        return {
            "tasks": newest("tasks"), "failures": newest("failures"),
            "throughput": [{"minute": timeutil.fmt(datetime.fromtimestamp(minute * 60, UTC)),
                            **{state: counts.get(state, 0) for state in RESOLVED_STATES}}
                           for minute, counts in minutes.items() if minute > now - MINUTES]}


RECENT = RecentChanges()
metrics.on_change(RECENT.record)
