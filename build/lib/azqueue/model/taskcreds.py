"""The temporary credentials handed out with a claim (Taskcluster's ``task-creds``).

A worker that claims or reclaims a run gets credentials for working on that run alone:
reclaiming it, resolving it, creating its artifacts, plus the task's own ``scopes``.
They are issued by the root client, named after the run and the worker, and valid until
shortly after ``takenUntil`` (the run's state still decides what they may do).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from azqueue.model import credentials
from azqueue.model.task import Task

# Claim credentials stay valid this long past takenUntil.
AFTER_TAKEN_UNTIL = timedelta(minutes=5)


def for_run(issuer: credentials.Principal, task: Task, run_id: int,
            now: datetime) -> dict[str, Any]:
    """Credentials for the worker holding run ``run_id`` (which must be running)."""
    run = task.runs[run_id]
    assert run.taken_until is not None and run.worker_group and run.worker_id
    name = (f"task-client/{task.task_id}/{run_id}/on/{run.worker_group}/{run.worker_id}"
            f"/until/{int(run.taken_until.timestamp())}")
    granted = [f"queue:reclaim-task:{task.task_id}/{run_id}",
               f"queue:resolve-task:{task.task_id}/{run_id}",
               f"queue:create-artifact:{task.task_id}/{run_id}",
               *task.definition["scopes"]]
    return credentials.issue(issuer, granted, now, run.taken_until + AFTER_TAKEN_UNTIL, name)
