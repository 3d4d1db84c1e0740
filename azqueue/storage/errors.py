"""Azure SDK errors, translated once into what the layers above act on."""

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
)

from azqueue.errors import StorageError


class EntityNotFound(Exception):
    """The table entity does not exist."""


class EntityExists(Exception):
    """An insert found the entity already there."""


class ETagMismatch(Exception):
    """A conditional write lost a race (HTTP 412): re-read and decide again."""


class TransactionConflict(Exception):
    """A batch transaction failed on an ETag (412) or an existing entity (409)."""


class MessageGone(Exception):
    """The queue message is gone or our pop receipt is stale: it is not ours any more.

    Azurite answers a stale receipt with 400 PopReceiptMismatch, Azure often with
    404 MessageNotFound; both mean the same to us.
    """


@contextmanager
def translate(what: str) -> Iterator[None]:
    """Run Azure SDK calls, raising this module's exceptions (or StorageError) instead."""
    try:
        yield
    except TableTransactionError as e:
        if e.status_code in (409, 412) or getattr(e, "error_code", "") in (
                "EntityAlreadyExists", "UpdateConditionNotSatisfied"):
            raise TransactionConflict(what) from None
        raise StorageError(f"Azure Storage failed during {what}: {e.status_code} "
                           f"{getattr(e, 'error_code', None) or e.reason}") from e
    except ResourceModifiedError:
        raise ETagMismatch(what) from None
    except ResourceExistsError:
        raise EntityExists(what) from None
    except ResourceNotFoundError:
        raise EntityNotFound(what) from None
    except HttpResponseError as e:
        if e.status_code == 412:
            raise ETagMismatch(what) from None
        raise StorageError(f"Azure Storage failed during {what}: {e.status_code} "
                           f"{getattr(e, 'error_code', None) or e.reason}") from e
    except AzureError as e:
        raise StorageError(f"Azure Storage failed during {what}: {type(e).__name__}") from e


@contextmanager
def translate_message(what: str) -> Iterator[None]:
    """Like ``translate``, for operations on one queue message by pop receipt."""
    try:
        yield
    except ResourceNotFoundError:
        raise MessageGone(what) from None
    except HttpResponseError as e:
        if e.status_code in (400, 404) and (
            e.status_code == 404 or getattr(e, "error_code", "") == "PopReceiptMismatch"
        ):
            raise MessageGone(what) from None
        raise StorageError(f"Azure Storage failed during {what}: {e.status_code} "
                           f"{getattr(e, 'error_code', None) or e.reason}") from e
    except AzureError as e:
        raise StorageError(f"Azure Storage failed during {what}: {type(e).__name__}") from e
