"""The one error tree of azqueue.

Every error azqueue raises on purpose is one of these. Only the ``QueueError`` branch is
an answer to a client: the HTTP layer (``api/middleware.py``) renders it as Taskcluster's
``{code, message, requestInfo}`` with the status it carries. A ``StorageError`` is an
outage or a failure of a service we depend on, not an answer: the same middleware maps it
to its 5xx (``StorageUnavailable``: 503 with ``Retry-After``, the client tries again;
any other: 500 with an incident id, logged with its cause). Anything else that escapes a
request is a bug, answered 500 with an incident id and logged with its traceback.

    AzqueueError
    ├── ConfigError                  a setting is missing or malformed: the process does not start
    ├── BrokerError                  RabbitMQ is away or did not confirm: events wait for recovery
    ├── StartupError                 the server cannot start for a reason outside its settings
    ├── StorageCondition             an answer of Azure Storage the caller decides on
    │   ├── EntityNotFound           the table entity does not exist
    │   ├── EntityExists             an insert found the entity already there
    │   ├── ETagMismatch             a conditional write lost a race (412): re-read, decide again
    │   ├── TransactionConflict      a batch failed on an ETag (412) or an existing entity (409)
    │   ├── GroupJoined              a task joined a group before the group's own task was stored
    │   └── MessageGone              the queue message is gone or our pop receipt is stale
    │       └── ReceiptLost          ...after our own update whose answer was lost
    ├── StorageError                 Azure failed in a way we did not expect   (HTTP: 500)
    │   └── StorageUnavailable       Azure stayed busy or silent: try again    (HTTP: 503)
    │       └── QueueBeingDeleted    a queue deleted moments ago cannot be made again yet
    └── QueueError                   an answer to a client, with its code and HTTP status
        ├── InputError               400 InputValidationError  a body or parameter breaks a rule
        ├── InvalidJson              400 MalformedPayload      the request body is not JSON
        ├── AuthenticationFailed     401 AuthenticationFailed
        ├── InsufficientScopes       403 InsufficientScopes
        ├── Quarantined              403 WorkerQuarantined     the worker may not claim work now
        ├── NotFound                 404 ResourceNotFound
        ├── MethodNotAllowed         405 MethodNotAllowed
        ├── Conflict                 409 RequestConflict       the state forbids the request
        │   └── ClaimLost            409                       the run is no longer yours
        ├── SlowRequest              408 RequestTimeout        the body did not arrive in time
        ├── Gone                     410 ResourceExpired
        ├── LengthRequired           411 LengthRequired        an upload without Content-Length
        ├── TooLarge                 413 InputTooLarge
        ├── ArtifactFailed           424 ArtifactError         an error artifact was asked for
        ├── NotConfigured            503 NotConfigured         the deployment lacks what the request needs
        └── Busy                     503 ServerBusy            this process takes no more of these now: try again

Errors raised by the Azure SDK never leave ``azqueue.storage``: ``storage/errors.py``
translates them into the ``StorageCondition``s and ``StorageError``; ``events/publisher.py``
does the same for aio-pika's with ``BrokerError``. ``TRANSIENT`` are the errors of a
service we depend on that a retry may cure: loops that retry log them in one line, and
anything else with its traceback. Code that handles a failed request whatever its cause
catches ``(QueueError, StorageError)``: the two branches, explicitly.

The worker SDK (``azqueue.worker``) is a client of the HTTP API and has a tree of its
own for task handlers: ``azqueue.worker.errors``.

(``InvalidJson`` keeps Taskcluster's code ``MalformedPayload`` on the wire; in azqueue the
name ``MalformedPayload`` means a task payload a worker cannot run, which resolves the
run exception ``malformed-payload``: ``azqueue.worker.MalformedPayload``.)
"""

from __future__ import annotations


class AzqueueError(Exception):
    """Base class of every error azqueue raises on purpose; ``message`` says what is wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(AzqueueError):
    """A setting is missing or malformed; the message names the variable."""


class BrokerError(AzqueueError):
    """The AMQP broker could not be reached or did not confirm a message."""


class StartupError(AzqueueError):
    """The server cannot start for a reason outside its settings (``azqueue serve`` exits
    1 with the message): a port in use, storage unreachable or refusing what start-up
    asks of it."""


class StorageCondition(AzqueueError):
    """An answer of Azure Storage that the caller acts on; never shown to a client."""


class EntityNotFound(StorageCondition):
    """The table entity does not exist."""


class EntityExists(StorageCondition):
    """An insert found the entity already there."""


class ETagMismatch(StorageCondition):
    """A conditional write lost a race (HTTP 412): re-read and decide again."""


class TransactionConflict(StorageCondition):
    """A batch transaction failed on an ETag (412) or an existing entity (409)."""


class GroupJoined(StorageCondition):
    """The insert of a group's own task found that another task joined the group before
    it was stored: the group's records decide whether it may be."""


class MessageGone(StorageCondition):
    """The queue message is gone or our pop receipt is stale: it is not ours any more.

    Azurite answers a stale receipt with 400 PopReceiptMismatch, Azure often with
    404 MessageNotFound; both mean the same to us.
    """


class ReceiptLost(MessageGone):
    """An update of the message was retried after its answer was lost, and the retry was
    told the receipt no longer matches: most likely the lost attempt was applied (the
    message changed as asked) and handed out a receipt nobody heard of."""


class StorageError(AzqueueError):
    """Azure Storage failed in a way the caller does not decide on; never an answer of
    its own: the API answers it 500 with an incident id (``api/middleware.py``)."""


class StorageUnavailable(StorageError):
    """Azure Storage stayed busy (503 ServerBusy), failing or silent through every retry
    the request's time allowed (``storage.retry``); nothing is wrong with the request.
    The API answers it 503 ``StorageUnavailable`` with ``Retry-After``: the client tries
    again (the official client does)."""


class QueueBeingDeleted(StorageUnavailable):
    """A pending queue deleted moments ago (an idle task queue's,
    ``service.upkeep.idlequeues``) cannot be made again yet: Azure answers 409
    ``QueueBeingDeleted`` for a while (about 40 s) after a delete. Waited out
    within the time a call has (``PendingQueues.put``)."""


class QueueError(AzqueueError):
    """An answer to a client: a Taskcluster code and an HTTP status."""

    code = "InternalServerError"
    status = 500


class InputError(QueueError):
    code = "InputValidationError"
    status = 400


class MissingDependencies(InputError):
    """A task definition names dependencies that do not exist (``missing``)."""

    def __init__(self, message: str, missing: tuple[str, ...]) -> None:
        super().__init__(message)
        self.missing = missing


class InvalidJson(QueueError):
    code = "MalformedPayload"
    status = 400


class AuthenticationFailed(QueueError):
    code = "AuthenticationFailed"
    status = 401


class InsufficientScopes(QueueError):
    code = "InsufficientScopes"
    status = 403


class Quarantined(QueueError):
    """A quarantined worker asked for a task. 403, not 400, 404 or 409 (after which a
    worker deletes the tip it polled): the tip is the task's, for other workers."""

    code = "WorkerQuarantined"
    status = 403


class NotFound(QueueError):
    code = "ResourceNotFound"
    status = 404


class MethodNotAllowed(QueueError):
    code = "MethodNotAllowed"
    status = 405


class Conflict(QueueError):
    code = "RequestConflict"
    status = 409


class ClaimLost(Conflict):
    """The run is not (or no longer) claimed by the caller."""


class SlowRequest(QueueError):
    """The request's body did not arrive in time: answered, and its connection closed."""

    code = "RequestTimeout"
    status = 408


class Gone(QueueError):
    code = "ResourceExpired"
    status = 410


class LengthRequired(QueueError):
    code = "LengthRequired"
    status = 411


class TooLarge(QueueError):
    code = "InputTooLarge"
    status = 413


class ArtifactFailed(QueueError):
    code = "ArtifactError"
    status = 424


class NotConfigured(QueueError):
    code = "NotConfigured"
    status = 503


class Busy(QueueError):
    """This process holds as much of this kind of work as it takes; the answer carries
    ``Retry-After: RETRY_AFTER``."""
    code = "ServerBusy"
    status = 503
    RETRY_AFTER = 5  # seconds


TRANSIENT: tuple[type[AzqueueError], ...] = (StorageError, BrokerError)
