"""Hawk request authentication (sha256), as the Taskcluster clients sign requests.

The MAC covers ``hawk.1.header``, ts, nonce, method, the raw request target, host, port,
the payload hash and ``ext``. Unlike Taskcluster we refuse a replayed (id, ts, nonce)
within the skew window, in this process (``ReplayCache``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import hmac
import re
import time
from dataclasses import dataclass
from urllib.parse import unquote

from azqueue.errors import AuthenticationFailed

SKEW_SECONDS = 15 * 60
# Hawk clients send a few random characters (6 for the official clients' libraries).
MAX_NONCE = 64
# Requests remembered to refuse their replays (``ReplayCache``), per process.
MAX_REPLAY_ENTRIES = 100_000
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
    if len(attrs["nonce"]) > MAX_NONCE:
        raise AuthenticationFailed(f"the Hawk `nonce` has {len(attrs['nonce'])} characters; "
                                   f"use at most {MAX_NONCE}")
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
    """The (id, ts, nonce) of the requests received within the skew window, to refuse
    them a second time.

    Only requests whose MAC (and payload hash) verified are remembered, as a SHA-256
    digest of the three, so an entry's size does not depend on what the client sent. An
    entry is forgotten once its ``ts`` is out of the skew window (a replay of it is refused
    for its timestamp then), and there are at most ``max_entries``: when full, the entry
    closest to its end goes first. Refusing new requests instead would let any client with
    credentials, whatever its scopes, lock every other client out by filling the cache;
    dropping one only lets a request sent that long ago be replayed, as Taskcluster itself
    allows any replay within the skew window. At about 200 bytes an entry, the default cap
    holds about 20 MB; with clients' clocks in step an entry lives 15 minutes, so a process
    receiving fewer than 110 requests a second keeps every entry as long as it is needed.
    """

    def __init__(self, window: float = SKEW_SECONDS, max_entries: int = MAX_REPLAY_ENTRIES
                 ) -> None:
        self._window = window
        self._max = max_entries
        self._seen: set[bytes] = set()
        self._ends: list[tuple[float, bytes]] = []  # (when forgotten, digest): a heap

    def __len__(self) -> int:
        return len(self._seen)

    def check_and_add(self, h: HawkHeader, now: float | None = None) -> None:
        """AuthenticationFailed if ``h`` was received before; else remember it. ``now``:
        seconds since 1970 (the clock ``ts`` is on)."""
        now = time.time() if now is None else now
        while self._ends and self._ends[0][0] < now:
            self._seen.discard(heapq.heappop(self._ends)[1])
        key = hashlib.sha256(_wire(f"{h.id}\n{h.ts}\n{h.nonce}")).digest()
        if key in self._seen:
            raise AuthenticationFailed("this request was already received (same id, ts and "
                                       "nonce): replayed requests are refused")
        if len(self._ends) >= self._max:
            self._seen.discard(heapq.heappop(self._ends)[1])
        self._seen.add(key)
        heapq.heappush(self._ends, (int(h.ts) + self._window, key))
