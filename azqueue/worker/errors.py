"""How a task handler says how its task ended (documents 000 and 003).

Return normally: reportCompleted. Raise:

* ``TaskFailed``: the task's own code failed (e.g. exited non-zero): reportFailed;
* ``MalformedPayload``: the payload cannot be run; the explanation goes to the task log,
  then reportException ``malformed-payload`` (never retried);
* ``ResourceUnavailable``: something the task needs is missing for now:
  ``resource-unavailable``;
* ``IntermittentTask``: the task asked to be retried: ``intermittent-task``.

Any other exception is a bug in the worker: ``internal-error``.
"""

from __future__ import annotations


class TaskOutcome(Exception):
    reason = ""


class TaskFailed(TaskOutcome):
    """The task's own code failed."""


class MalformedPayload(TaskOutcome):
    reason = "malformed-payload"


class ResourceUnavailable(TaskOutcome):
    reason = "resource-unavailable"


class IntermittentTask(TaskOutcome):
    reason = "intermittent-task"
