"""Who is calling, and may they: Hawk, temporary credentials, authorizedScopes, scopes.

Requests without an Authorization header are anonymous and hold the configured
anonymous scopes; as in Taskcluster, every signed-in caller holds them too, whatever its
credentials or ``authorizedScopes`` narrow it to. Everything that fails authentication
is a 401 that says what was wrong; no secret ever goes into a message or a log line. An
unknown clientId (or certificate issuer) is answered as a wrong signature is, so a
caller cannot learn which clients exist; the log says which it was.
"""

from __future__ import annotations

import base64
import binascii
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from azqueue.config import Settings
from azqueue.errors import AuthenticationFailed, InsufficientScopes
from azqueue.model import credentials, jsontext, scopes
from azqueue.model.credentials import Principal
from azqueue.api import hawk

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Caller:
    client_id: str | None  # None: anonymous
    scopes: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"client {self.client_id!r}" if self.client_id else "an anonymous request"


def _decode_ext(ext: str) -> dict[str, Any]:
    try:
        data = jsontext.loads(base64.urlsafe_b64decode(ext + "=" * (-len(ext) % 4)))
    except (binascii.Error, ValueError):
        raise AuthenticationFailed("the Hawk `ext` is not base64-encoded JSON") from None
    if not isinstance(data, dict):
        raise AuthenticationFailed("the Hawk `ext` must encode a JSON object")
    return data


# A Hawk `ts` (or bewit expiry) longer than this is no time a clock can show.
MAX_TS_DIGITS = 15
# A signed URL lives no longer than temporary credentials may.
MAX_BEWIT_LIFETIME = credentials.MAX_LIFETIME


def _host_port(host_header: str, default_port: int) -> tuple[str, int]:
    host, sep, port = host_header.rpartition(":")
    if sep and port.isascii() and port.isdigit() and not host_header.endswith("]"):
        return host, int(port)
    return host_header, default_port


class Authenticator:
    """Hawk and temporary credentials: who sent a request, and which scopes it holds."""

    def __init__(self, settings: Settings) -> None:
        self._clients = {c.client_id: Principal(c.client_id, c.access_token, c.scopes)
                         for c in (settings.root, *settings.clients)}
        self._anonymous = Caller(None, settings.anonymous_scopes)
        self._nobody = Principal("", secrets.token_urlsafe(32), ())
        self.replays = hawk.ReplayCache()
        self._default_port = 443 if settings.public_root_url.startswith("https:") else 80

    def _known(self, client_id: str) -> Principal | None:
        """The client ``client_id``; None, noted in the log, if there is none (the caller
        is told no more than for a wrong signature)."""
        found = self._clients.get(client_id)
        if found is None:
            log.info("authentication failed: clientId %r is not a known client", client_id)
        return found

    def authenticate(self, *, method: str, target: str, host: str, content_type: str,
                     body: bytes, authorization: str | None, now: datetime) -> Caller:
        """The caller of a request: Hawk header, a bewit in a GET's query, or anonymous."""
        if not authorization:
            target, bewit = hawk.split_bewit(target)
            if bewit is None:
                return self._anonymous
            if method != "GET":
                raise AuthenticationFailed("a bewit (signed URL) is only valid for GET requests")
            header = hawk.parse_bewit(bewit)
            if len(header.ts) > MAX_TS_DIGITS:
                raise AuthenticationFailed("this signed URL's expiry is no time a clock can show")
            if int(header.ts) < now.timestamp():
                raise AuthenticationFailed("this signed URL has expired; make a new one")
            if int(header.ts) > now.timestamp() + MAX_BEWIT_LIFETIME.total_seconds():
                raise AuthenticationFailed(
                    f"this signed URL expires more than {MAX_BEWIT_LIFETIME.days} days from "
                    "now; sign it for a shorter time (as temporary credentials, it may last at "
                    f"most {MAX_BEWIT_LIFETIME.days} days)")
            kind = "bewit"
        else:
            header = hawk.parse(authorization)
            digits = header.ts.removeprefix("-")
            if not (digits.isascii() and digits.isdigit() and len(digits) <= MAX_TS_DIGITS):
                raise AuthenticationFailed("the Hawk `ts` must be an integer (seconds since "
                                           "1970) of at most 15 digits")
            ts = int(header.ts)
            if abs(now.timestamp() - ts) > hawk.SKEW_SECONDS:
                raise AuthenticationFailed(
                    f"the request's timestamp is more than 15 minutes from the server's time "
                    f"({int(now.timestamp())}); fix the client's clock")
            kind = "header"
        ext = _decode_ext(header.ext) if header.ext else {}
        if "certificate" in ext:
            principal = credentials.verify(ext["certificate"], header.id, self._known, now)
        else:
            # An unknown clientId is checked against a key nobody holds, and answered as a
            # wrong signature is: the caller cannot tell which clientIds exist.
            principal = self._known(header.id) or self._nobody
        hostname, port = _host_port(host, self._default_port)
        expected = hawk.mac(principal.access_token, kind, header, method, target, hostname,
                            port, header.hash)
        if not hawk.equal(expected, header.mac) or principal is self._nobody:
            if principal is not self._nobody:
                log.info("authentication failed: the Hawk signature of clientId %r does not "
                         "match", header.id)
            raise AuthenticationFailed(
                f"the Hawk signature of clientId {header.id!r} does not match: no such client, "
                "or a wrong accessToken, or the request was signed for another URL (signed "
                f"for host {hostname}:{port}?)")
        if kind == "header":
            if header.hash and not hawk.equal(hawk.payload_hash(content_type, body), header.hash):
                raise AuthenticationFailed("the Hawk payload hash does not match the request body")
            self.replays.check_and_add(header, now.timestamp())
        # The anonymous scopes count among what authorizedScopes may ask for, and are
        # held again after it narrowed the rest.
        held = (*principal.scopes, *self._anonymous.scopes)
        if "authorizedScopes" in ext:
            authorized = ext["authorizedScopes"]
            if not isinstance(authorized, list):
                raise AuthenticationFailed("`authorizedScopes` must be a list of scopes")
            for scope in authorized:
                if (problem := scopes.invalid(scope)) is not None:
                    raise AuthenticationFailed(f"`authorizedScopes`: {problem}")
            excess = scopes.missing_scopes(held, authorized)
            if excess:
                raise AuthenticationFailed(
                    f"`authorizedScopes` asks for scopes clientId {header.id!r} lacks: "
                    + ", ".join(excess))
            held = (*authorized, *self._anonymous.scopes)
        return Caller(principal.client_id, held)


def require(caller: Caller, expression: scopes.Expression) -> None:
    missing = scopes.unsatisfied(caller.scopes, expression)
    if missing is not None:
        raise InsufficientScopes(
            f"{caller.name} lacks the scopes this request needs: {scopes.describe(missing)}")
