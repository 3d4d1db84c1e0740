"""Azure SDK errors, translated once into what the layers above act on.

The exceptions raised here are the ``StorageCondition``s of ``azqueue.errors`` (the one
error tree; they are importable from here too) and ``StorageError`` for everything else.
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
)

from azqueue.errors import EntityExists as EntityExists
from azqueue.errors import EntityNotFound as EntityNotFound
from azqueue.errors import ETagMismatch as ETagMismatch
from azqueue.errors import MessageGone as MessageGone
from azqueue.errors import StorageCondition as StorageCondition
from azqueue.errors import StorageError as StorageError
from azqueue.errors import TransactionConflict as TransactionConflict


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
