"""Taskcluster temporary credentials: certificates, verified and issued.

A certificate ``{version: 1, scopes, start, expiry, seed, signature[, issuer]}`` is
signed by its issuer's access token over

    version:1
    [clientId:<name>          named credentials only
     issuer:<issuer>]
    seed:<seed>
    start:<ms>
    expiry:<ms>
    scopes:
    <scope>...

and its holder signs requests with ``base64url(HMAC-SHA256(issuer token, seed))``
(unpadded). Unnamed credentials use the issuer's clientId as Hawk id; named ones use
their own name and need ``auth:create-client:<name>`` on the issuer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from azqueue.errors import AuthenticationFailed
from azqueue.model import jsontext, scopes as scopeset

SLACK = timedelta(minutes=5)
MAX_LIFETIME = timedelta(days=31)


@dataclass(frozen=True, slots=True)
class Principal:
    """Someone who can sign requests: a Hawk id, its key and the scopes it holds."""

    client_id: str
    access_token: str = field(repr=False)
    scopes: tuple[str, ...]


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _signature(issuer_token: str, cert: Mapping[str, Any], name: str | None) -> str:
    lines = ["version:1"]
    if name is not None:
        lines += [f"clientId:{name}", f"issuer:{cert['issuer']}"]
    lines += [f"seed:{cert['seed']}", f"start:{cert['start']}", f"expiry:{cert['expiry']}",
              "scopes:", *cert["scopes"]]
    digest = hmac.new(issuer_token.encode(), "\n".join(lines).encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def _derived_token(issuer_token: str, seed: str) -> str:
    digest = hmac.new(issuer_token.encode(), seed.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def issue(issuer: Principal, scopes: list[str], start: datetime, expiry: datetime,
          name: str | None = None) -> dict[str, str]:
    """Temporary credentials ``{clientId, accessToken, certificate}`` (certificate as JSON)."""
    cert: dict[str, Any] = {"version": 1, "scopes": list(scopes), "start": _ms(start),
                            "expiry": _ms(expiry), "seed": secrets.token_urlsafe(33)}
    if name is not None:
        cert["issuer"] = issuer.client_id
    cert["signature"] = _signature(issuer.access_token, cert, name)
    return {"clientId": name or issuer.client_id,
            "accessToken": _derived_token(issuer.access_token, cert["seed"]),
            "certificate": json.dumps(cert, separators=(",", ":"))}


def _fail(message: str) -> AuthenticationFailed:
    return AuthenticationFailed(f"invalid temporary credentials: {message}")


def verify(raw: Any, hawk_id: str, lookup: Callable[[str], Principal | None],
           now: datetime) -> Principal:
    """The principal a certificate makes of ``hawk_id``, or AuthenticationFailed saying why."""
    if isinstance(raw, str):
        try:
            raw = jsontext.loads(raw)
        except ValueError:
            raise _fail("the certificate is not JSON") from None
    if not isinstance(raw, dict):
        raise _fail("the certificate must be an object")
    cert: dict[str, Any] = raw
    if cert.get("version") != 1:
        raise _fail("certificate version must be 1")
    seed, start, expiry, cert_scopes = (cert.get(k) for k in ("seed", "start", "expiry", "scopes"))
    if not isinstance(seed, str) or len(seed) != 44:
        raise _fail("the seed must be 44 characters")
    if not isinstance(start, int) or not isinstance(expiry, int):
        raise _fail("start and expiry must be integers (milliseconds since the epoch)")
    if not isinstance(cert_scopes, list):
        raise _fail("scopes must be a list of scopes")
    for scope in cert_scopes:
        if (problem := scopeset.invalid(scope)) is not None:
            raise _fail(f"the certificate's scopes: {problem}")
    if not isinstance(cert.get("signature"), str):
        raise _fail("the certificate has no signature")
    try:
        start_at = datetime.fromtimestamp(start / 1000, UTC)
        expiry_at = datetime.fromtimestamp(expiry / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        raise _fail("start and expiry must be times (milliseconds since the epoch) in years "
                    "1970-9999") from None
    if expiry_at - start_at > MAX_LIFETIME:
        raise _fail("temporary credentials may last at most 31 days")
    if now < start_at - SLACK:
        raise _fail("the certificate is not valid yet (start is in the future)")
    if now > expiry_at + SLACK:
        raise _fail("the certificate has expired")

    issuer_id = cert.get("issuer")
    name: str | None = None
    if issuer_id is not None:
        if not isinstance(issuer_id, str) or issuer_id == hawk_id:
            raise _fail("`issuer` must name another client")
        name = hawk_id
    else:
        issuer_id = hawk_id
    # An unknown issuer and a wrong signature answer alike: a caller cannot tell which
    # clientIds exist (``lookup`` may note which it was, for the operator).
    issuer = lookup(issuer_id)
    if issuer is None or not hmac.compare_digest(
            _signature(issuer.access_token, cert, name).encode(),
            str(cert["signature"]).encode()):
        raise _fail(f"the certificate signature does not match the access token of its issuer "
                    f"{issuer_id!r}, or no such client exists")
    excess = scopeset.missing_scopes(issuer.scopes, cert_scopes)
    if excess:
        raise _fail(f"the certificate grants scopes its issuer {issuer_id!r} lacks: "
                    + ", ".join(excess))
    if name is not None and not scopeset.satisfies_scope(issuer.scopes,
                                                         f"auth:create-client:{name}"):
        raise _fail(f"the issuer {issuer_id!r} lacks `auth:create-client:{name}` and cannot "
                    "issue named credentials")
    return Principal(hawk_id, _derived_token(issuer.access_token, seed), tuple(cert_scopes))
