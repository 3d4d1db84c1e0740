"""Continuation tokens of paginated listings: the last key of a page, opaque to clients."""

from __future__ import annotations

import base64
import binascii

from azqueue import errors


def token(last_key: str) -> str:
    return base64.urlsafe_b64encode(last_key.encode()).decode()


def after(continuation: str | None) -> str | None:
    """The key a ``continuationToken`` says to continue after; InputError if it is not
    one of ours."""
    if not continuation:
        return None
    try:
        return base64.urlsafe_b64decode(continuation.encode()).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise errors.InputError("`continuationToken` is not one this API returned") from None
