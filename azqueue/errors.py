"""The one error tree of azqueue.

Every error a client can cause or observe is one of these; the HTTP layer renders
them as Taskcluster's ``{code, message, requestInfo}`` with the status they carry.

    QueueError
    ├── InputError               400 InputValidationError  a body or parameter breaks a rule
    ├── MalformedPayload         400 MalformedPayload      the body is not JSON
    ├── AuthenticationFailed     401 AuthenticationFailed
    ├── InsufficientScopes       403 InsufficientScopes
    ├── NotFound                 404 ResourceNotFound
    ├── MethodNotAllowed         405 MethodNotAllowed
    ├── Conflict                 409 RequestConflict       the state forbids the request
    │   └── ClaimLost            409                       the run is no longer yours
    ├── Gone                     410 ResourceExpired
    ├── TooLarge                 413 InputTooLarge
    ├── ArtifactFailed           424 ArtifactError         an error artifact was asked for
    ├── NotConfigured            503 NotConfigured          the deployment lacks what the request needs
    └── StorageError             500 InternalServerError   Azure failed in a way we did not expect

Errors raised by the Azure SDK never leave ``azqueue.storage``: it translates them
into the storage-level exceptions there, and into these where a client is concerned.
"""

from __future__ import annotations


class QueueError(Exception):
    """Base class: an error with a Taskcluster code and an HTTP status."""

    code = "InternalServerError"
    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InputError(QueueError):
    code = "InputValidationError"
    status = 400


class MalformedPayload(QueueError):
    code = "MalformedPayload"
    status = 400


class AuthenticationFailed(QueueError):
    code = "AuthenticationFailed"
    status = 401


class InsufficientScopes(QueueError):
    code = "InsufficientScopes"
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


class Gone(QueueError):
    code = "ResourceExpired"
    status = 410


class TooLarge(QueueError):
    code = "InputTooLarge"
    status = 413


class ArtifactFailed(QueueError):
    code = "ArtifactError"
    status = 424


class NotConfigured(QueueError):
    code = "NotConfigured"
    status = 503


class StorageError(QueueError):
    code = "InternalServerError"
    status = 500
