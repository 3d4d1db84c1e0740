"""How a task handler says how its task ended (documents 000 and 003).

The handler returns normally: ``reportCompleted``. Otherwise it raises::

    TaskOutcome
    ├── TaskFailed              the task's own code failed (e.g. exited non-zero): reportFailed
    └── TaskException           reportException with ``reason``
        ├── MalformedPayload    "malformed-payload": the payload cannot be run; never retried
        ├── ResourceUnavailable "resource-unavailable": something the task needs is missing
        ├── IntermittentTask    "intermittent-task": the task asked to be retried
        └── InternalError       "internal-error": the worker itself is broken

Any other exception escaping a handler is a bug in the worker and is reported
``internal-error`` too. The worker logs each exception's message; the handler owns the
task log and should write the explanation there before raising ("it is still important
to write a detailed explanation of what is wrong with the task definition to the task
log", docs/workers/sdk.md), as ``azqueue.worker.shell`` does.
"""

from __future__ import annotations


class TaskOutcome(Exception):
    """Base of the outcomes a handler can raise."""


class TaskFailed(TaskOutcome):
    """The task's own code failed: reportFailed."""


class TaskException(TaskOutcome):
    """The run is resolved exception with ``reason``."""

    reason = "internal-error"


class MalformedPayload(TaskException):
    """The payload cannot be run as it is; another run would fail alike."""

    reason = "malformed-payload"


class ResourceUnavailable(TaskException):
    """Something the task needs is missing for now."""

    reason = "resource-unavailable"


class IntermittentTask(TaskException):
    """The task asked to be retried (strongly discouraged by docs/workers/sdk.md)."""

    reason = "intermittent-task"


class InternalError(TaskException):
    """The worker itself is broken."""

    reason = "internal-error"


class QueueUnavailable(Exception):
    """The queue answered a call the worker needs (e.g. pollTaskUrls) with an error;
    ``status`` is the HTTP status, None when the answer was not an error status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class QueueRefused(Exception):
    """The queue refused to give the worker work in a way retrying cannot fix (wrong
    credentials, missing scopes, an invalid task queue, a rootUrl that is no queue):
    ``Worker.start()`` raises it once its running tasks are done. ``status`` is the HTTP
    status of the refusal."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status
