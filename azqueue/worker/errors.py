"""The one error tree of the worker SDK: how a handler says how its run ended, and what
the SDK raises on purpose (docs/workers/sdk.md).

    WorkerError                 the root: catch it to catch anything the SDK raises on purpose
    ├── TaskOutcome             raised by a handler: how its run is resolved
    │   ├── TaskFailed          the task's own code failed (e.g. exited non-zero): reportFailed
    │   └── TaskException       reportException with ``reason``
    │       ├── MalformedPayload     "malformed-payload": the payload cannot be run; never retried
    │       ├── ResourceUnavailable  "resource-unavailable": something the task needs is missing
    │       ├── IntermittentTask     "intermittent-task": the run is to be retried
    │       │   └── RequestFailed    storage or the queue kept failing a request the run needs
    │       │       └── LogNotWritten    a live log could not be created or appended to
    │       └── InternalError        "internal-error": the worker itself is broken
    ├── QueueUnavailable        the queue answered pollTaskUrls with an error, or no answer
    └── QueueRefused            the queue refused work in a way retrying cannot fix

The handler returns normally: ``reportCompleted``. Otherwise it raises a ``TaskOutcome``.
Any other exception escaping a handler is a bug in the worker and is reported
``internal-error``, except the failures of the network and the queue the official client
gives up on, which are reported ``intermittent-task`` as ``RequestFailed`` is. Whatever
the outcome, its reason (the message, or the exception's type and message) is written at
the end of the run's log (``TaskRun.end_log`` in ``azqueue.worker.run``). The handler
writes to the task log and should write the explanation there before raising ("it is
still important to write a detailed explanation of what is wrong with the task
definition to the task log", docs/workers/sdk.md), as ``azqueue.worker.shell`` does.
"""

from __future__ import annotations


class WorkerError(Exception):
    """The root of every error the worker SDK raises on purpose."""


class TaskOutcome(WorkerError):
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
    """The run is to be retried: the task asked for it (strongly discouraged by
    docs/workers/sdk.md), or what it needs kept failing (``RequestFailed``)."""

    reason = "intermittent-task"


class RequestFailed(IntermittentTask):
    """A request to Azure Storage or to the queue still failed after its retries; the
    message says what was asked and what each attempt got."""


class LogNotWritten(RequestFailed):
    """A live log could not be created or appended to (an error answer, or none)."""


class InternalError(TaskException):
    """The worker itself is broken."""

    reason = "internal-error"


class QueueUnavailable(WorkerError):
    """The queue answered a call the worker needs (e.g. pollTaskUrls) with an error;
    ``status`` is the HTTP status, None when the answer was not an error status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class QueueRefused(WorkerError):
    """The queue refused to give the worker work in a way retrying cannot fix (wrong
    credentials, missing scopes, an invalid task queue, a rootUrl that is no queue):
    ``Worker.start()`` raises it once its running tasks are done. ``status`` is the HTTP
    status of the refusal."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status
