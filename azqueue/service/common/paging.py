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
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from azqueue import errors
from azqueue.service.common.gathering import MAX_PARALLEL, gather_limited

# The bytes of JSON a page's entries hold at most, besides its last entry: a page holds
# one entry at least, whatever its size.
MAX_PAGE_BYTES = 512 * 1024
# How many entries of a page are read at once before their sizes are known.
FIRST_WAVE = 4

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
    none), in order, until they hold ``budget`` bytes as JSON; and how many keys they are
    the entries of (``len(keys)``: all of them). They are read in waves: ``FIRST_WAVE``
    at once, then as many as the entries' sizes so far say fit in what is left (up to
    ``MAX_PARALLEL``), so that a page of large entries is not read many times over.
    Entries read past the one that filled the page are dropped."""
    found: list[tuple[dict[str, Any] | None, int]] = []
    held = 0
    while len(found) < len(keys) and (held < budget or not found):  # one key at least
        average = held / len(found) if found else 0
        wave = FIRST_WAVE if not average else int((budget - held) // average) + 1
        wave = min(wave, MAX_PARALLEL)
        found += await gather_limited(_sized(read, key) for key in keys[len(found):][:wave])
        held = sum(size for _, size in found)
    total = 0
    for i, (_, size) in enumerate(found):
        total += size
        if total >= budget:
            found = found[:i + 1]
            break
    return [entry for entry, _ in found if entry is not None], len(found)


async def _sized(read: Callable[[K], Awaitable[dict[str, Any] | None]], key: K
                 ) -> tuple[dict[str, Any] | None, int]:
    entry = await read(key)
    return entry, 0 if entry is None else json_size(entry)
