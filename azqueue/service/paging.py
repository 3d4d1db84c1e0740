"""Continuation tokens of paginated listings: the last key of a page, opaque to clients;
and the bytes a page may hold.

A page ends at ``limit`` entries, or earlier, once its entries hold ``MAX_PAGE_BYTES`` as
JSON (task definitions may be 400,000 characters each): the continuationToken then says
to go on after the last entry given, as it does after a full page, so a client that
follows tokens (the official client's listings do) gets every entry. The entries are
read a few at a time (``read_fitting``) and reading stops once the page is full, so a
request holds about one page of them, whatever its ``limit``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from azqueue import errors
from azqueue.service.dependencies import gather_limited

# The bytes of JSON a page's entries hold at most, besides its last entry: a page holds
# one entry at least, whatever its size.
MAX_PAGE_BYTES = 512 * 1024

K = TypeVar("K")


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


def json_size(entry: object) -> int:
    return len(json.dumps(entry, separators=(",", ":")))


async def read_fitting(keys: Sequence[K], read: Callable[[K], Awaitable[dict[str, Any] | None]],
                       budget: int = MAX_PAGE_BYTES
                       ) -> tuple[list[dict[str, Any]], int]:
    """The entries ``read(key)`` gives for the first of ``keys`` (None: that key has
    none), read a few at a time, in order, until they hold ``budget`` bytes as JSON;
    and how many keys they are the entries of (``len(keys)``: all of them). Entries
    read past that point are dropped: a page ends with the entry that filled it."""
    held = 0

    async def one(key: K) -> tuple[dict[str, Any] | None, int]:
        nonlocal held
        entry = await read(key)
        size = 0 if entry is None else json_size(entry)
        held += size
        return entry, size

    def calls() -> Iterator[Awaitable[tuple[dict[str, Any] | None, int]]]:
        for key in keys:
            if held >= budget:
                return
            yield one(key)

    found = await gather_limited(calls())
    total = 0
    for i, (_, size) in enumerate(found):
        total += size
        if total >= budget:
            found = found[:i + 1]
            break
    entries = [entry for entry, _ in found if entry is not None]
    return entries, len(found)
