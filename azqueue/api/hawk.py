"""Hawk request authentication (sha256), as the Taskcluster clients sign requests.

The MAC covers ``hawk.1.header``, ts, nonce, method, the raw request target, host, port,
the payload hash and ``ext``. Unlike Taskcluster we refuse a replayed (id, ts, nonce)
within the skew window, in this process.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import unquote

from azqueue.errors import AuthenticationFailed

SKEW_SECONDS = 15 * 60
_ATTR_RE = re.compile(r'\s*(\w+)="([^"\\]*)"\s*(?:,|$)')
_ALLOWED = {"id", "ts", "nonce", "hash", "ext", "mac", "app", "dlg"}


@dataclass(frozen=True, slots=True)
class HawkHeader:
    id: str
    ts: str
    nonce: str
    mac: str
    hash: str = ""
    ext: str = ""
    app: str = ""
    dlg: str = ""


def parse(value: str) -> HawkHeader:
    scheme, _, rest = value.partition(" ")
    if scheme.lower() != "hawk":
        raise AuthenticationFailed("the Authorization header must use the Hawk scheme")
    attrs: dict[str, str] = {}
    pos = 0
    while pos < len(rest):
        m = _ATTR_RE.match(rest, pos)
        if m is None or m.end() == pos:
            raise AuthenticationFailed("the Hawk Authorization header is malformed")
        key, val = m.groups()
        if key not in _ALLOWED or key in attrs:
            raise AuthenticationFailed(f"the Hawk header has an unknown or repeated `{key}`")
        attrs[key] = val
        pos = m.end()
    missing = [k for k in ("id", "ts", "nonce", "mac") if not attrs.get(k)]
    if missing:
        raise AuthenticationFailed(f"the Hawk header lacks {', '.join(missing)}")
    return HawkHeader(**attrs)


def split_bewit(target: str) -> tuple[str, str | None]:
    """The request target without its ``bewit`` query parameter, and the bewit."""
    path, sep, query = target.partition("?")
    if not sep:
        return target, None
    params = query.split("&")
    bewits = [p for p in params if p.startswith("bewit=")]
    if not bewits:
        return target, None
    rest = [p for p in params if not p.startswith("bewit=")]
    return path + ("?" + "&".join(rest) if rest else ""), unquote(bewits[0][len("bewit="):])


def parse_bewit(bewit: str) -> HawkHeader:
    """A bewit is base64url("<id>\\<expiry>\\<mac>\\<ext>"); its expiry plays the ts."""
    try:
        raw = base64.urlsafe_b64decode(bewit + "=" * (-len(bewit) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise AuthenticationFailed("the bewit (signed URL) is not base64url") from None
    parts = raw.split("\\")
    if len(parts) != 4 or not all(parts[:3]) or not (parts[1].isascii() and parts[1].isdigit()):
        raise AuthenticationFailed("the bewit (signed URL) is malformed")
    return HawkHeader(id=parts[0], ts=parts[1], nonce="", mac=parts[2], ext=parts[3])


def _normalized(kind: str, h: HawkHeader, method: str, resource: str, host: str, port: int,
                payload_hash: str) -> bytes:
    ext = h.ext.replace("\\", "\\\\").replace("\n", "\\n")
    text = (f"hawk.1.{kind}\n{h.ts}\n{h.nonce}\n{method.upper()}\n{resource}\n{host.lower()}\n"
            f"{port}\n{payload_hash}\n{ext}\n")
    if h.app:
        text += f"{h.app}\n{h.dlg}\n"
    return _wire(text)


def mac(key: str, kind: str, h: HawkHeader, method: str, resource: str, host: str,
        port: int, payload_hash: str) -> str:
    digest = hmac.new(key.encode(), _normalized(kind, h, method, resource, host, port,
                                                payload_hash), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def payload_hash(content_type: str, body: bytes) -> str:
    mime = content_type.split(";")[0].strip().lower()
    digest = hashlib.sha256(b"hawk.1.payload\n" + _wire(mime) + b"\n" + body + b"\n").digest()
    return base64.b64encode(digest).decode()


def equal(a: str, b: str) -> bool:
    return hmac.compare_digest(_wire(a), _wire(b))


def _wire(text: str) -> bytes:
    """Header text as the bytes that came over the wire: aiohttp decodes bytes that are
    not UTF-8 as surrogates, which a plain ``encode()`` refuses."""
    return text.encode("utf-8", "surrogateescape")


class ReplayCache:
    """(id, ts, nonce) seen within the skew window, forgotten after it."""

    def __init__(self, window: float = 2 * SKEW_SECONDS) -> None:
        self._window = window
        self._seen: set[tuple[str, str, str]] = set()
        self._order: deque[tuple[float, tuple[str, str, str]]] = deque()

    def check_and_add(self, h: HawkHeader) -> None:
        now = time.monotonic()
        while self._order and self._order[0][0] < now - self._window:
            self._seen.discard(self._order.popleft()[1])
        key = (h.id, h.ts, h.nonce)
        if key in self._seen:
            raise AuthenticationFailed("this request was already received (same id, ts and "
                                       "nonce): replayed requests are refused")
        self._seen.add(key)
        self._order.append((now, key))
