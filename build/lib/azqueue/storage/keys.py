"""Azure Table keys for arbitrary strings: Azure refuses ``/ \\ # ?`` and control
characters in PartitionKey and RowKey (Azurite answers 500 for ``/``), so those, and
``%`` itself, are percent-encoded. The encoding keeps the order of ASCII strings that
differ only in other characters, which is all that key ranges here rely on."""

from __future__ import annotations

from urllib.parse import quote, unquote

_SAFE = " !$&'()*+,;=:@-._~[]{}^|`\"<>"


def encode(value: str) -> str:
    return quote(value, safe=_SAFE)


def decode(value: str) -> str:
    return unquote(value)
