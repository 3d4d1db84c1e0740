"""Storage errors, translated once into what the layers above act on: the Azure SDK's
(``azure.core.exceptions``, the Tables SDK's transaction error) and those of the
hand-written requests (``storage.rest.RequestFailed``).

The exceptions raised here are the ``StorageCondition``s of ``azqueue.errors`` (the one
error tree; they are importable from here too), ``StorageUnavailable`` when Azure stayed
busy, failing or silent through every retry (``storage.retry``), and ``StorageError`` for
everything else.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from azure.data.tables import TableTransactionError
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)

from azqueue.errors import EntityExists as EntityExists
from azqueue.errors import EntityNotFound as EntityNotFound
from azqueue.errors import ETagMismatch as ETagMismatch
from azqueue.errors import MessageGone as MessageGone
from azqueue.errors import QueueBeingDeleted as QueueBeingDeleted
from azqueue.errors import ReceiptLost as ReceiptLost
from azqueue.errors import StorageCondition as StorageCondition
from azqueue.errors import StorageError as StorageError
from azqueue.errors import StorageUnavailable as StorageUnavailable
from azqueue.errors import GroupJoined as GroupJoined
from azqueue.errors import TransactionConflict as TransactionConflict
from azqueue.storage.rest import RequestFailed
from azqueue.storage.retry import RETRIED_STATUS


def _failed(what: str, e: AzureError) -> StorageError:
    """What a failure that is none of the conditions becomes: StorageUnavailable when the
    retries ran out on a busy, failing or silent service, else StorageError."""
    if isinstance(e, (ServiceRequestError, ServiceResponseError)):
        return StorageUnavailable(f"Azure Storage did not answer during {what}: {e}; "
                                  "try again in a moment")
    status = getattr(e, "status_code", None)
    code = getattr(e, "error_code", None) or getattr(e, "reason", None)
    code = getattr(code, "value", code)  # the Tables SDK's codes are enums
    if status in RETRIED_STATUS or isinstance(e, HttpResponseError):
        return _answered(what, status, code)
    return StorageError(f"Azure Storage failed during {what}: {type(e).__name__}")


def _answered(what: str, status: int | None, code: object) -> StorageError:
    """What an error answer that is none of the conditions becomes: StorageUnavailable
    when it is one that is retried (the retries ran out), else StorageError."""
    if status in RETRIED_STATUS:
        return StorageUnavailable(f"Azure Storage is busy or failing ({status} {code}) during "
                                  f"{what}; try again in a moment")
    return StorageError(f"Azure Storage failed during {what}: {status} {code}")


def _refused(what: str, e: RequestFailed) -> StorageCondition | StorageError:
    """What an error answer to a request of ``storage.rest`` becomes (the SDK's errors of
    the same answers become the same)."""
    if e.status == 404:
        return EntityNotFound(what)
    if e.status == 412:
        return ETagMismatch(what)
    if e.status == 409 and e.code == "QueueBeingDeleted":
        return QueueBeingDeleted(f"Azure Storage is still deleting the queue during {what}; "
                                 "try again in a moment")
    if e.status == 409 and e.code in ("EntityAlreadyExists", "QueueAlreadyExists"):
        return EntityExists(what)
    return _answered(what, e.status, e.code)


def _being_deleted(e: AzureError) -> bool:
    """Whether Azure answered 409 ``QueueBeingDeleted``: the queue was deleted moments ago."""
    code = getattr(e, "error_code", None)
    return getattr(code, "value", code) == "QueueBeingDeleted"


@contextmanager
def translate(what: str) -> Iterator[None]:
    """Run storage calls (the SDK's or ``storage.rest``'s), raising this module's
    exceptions (or StorageError) instead."""
    try:
        yield
    except RequestFailed as e:
        error = _refused(what, e)
        raise error from (None if isinstance(error, StorageCondition | QueueBeingDeleted)
                          else e)
    except TableTransactionError as e:
        if e.status_code in (409, 412) or getattr(e, "error_code", "") in (
                "EntityAlreadyExists", "UpdateConditionNotSatisfied"):
            raise TransactionConflict(what) from None
        raise _failed(what, e) from e
    except ResourceModifiedError:
        raise ETagMismatch(what) from None
    except ResourceExistsError as e:
        if _being_deleted(e):
            raise QueueBeingDeleted(f"Azure Storage is still deleting the queue during {what}; "
                                    "try again in a moment") from None
        raise EntityExists(what) from None
    except ResourceNotFoundError:
        raise EntityNotFound(what) from None
    except HttpResponseError as e:
        if e.status_code == 412:
            raise ETagMismatch(what) from None
        if e.status_code == 409 and _being_deleted(e):
            raise QueueBeingDeleted(f"Azure Storage is still deleting the queue during {what}; "
                                    "try again in a moment") from None
        raise _failed(what, e) from e
    except AzureError as e:
        raise _failed(what, e) from e


@contextmanager
def translate_message(what: str) -> Iterator[None]:
    """Like ``translate``, for operations on one queue message by pop receipt: ReceiptLost
    when the receipt stopped matching after an attempt of ours whose answer was lost."""
    try:
        yield
    except RequestFailed as e:
        if e.status == 404 or (e.status == 400 and e.code == "PopReceiptMismatch"):
            if e.after_lost_answer:
                raise ReceiptLost(what) from None
            raise MessageGone(what) from None
        raise _answered(what, e.status, e.code) from e
    except HttpResponseError as e:
        if e.status_code == 404 or (
                e.status_code == 400 and getattr(e, "error_code", "") == "PopReceiptMismatch"):
            raise MessageGone(what) from None
        raise _failed(what, e) from e
    except AzureError as e:
        raise _failed(what, e) from e
