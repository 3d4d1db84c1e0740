"""Scopes, Hawk MACs and certificates: the pure parts of authentication."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime, timedelta

import mohawk
import pytest
import taskcluster

from azqueue.api import hawk
from azqueue.errors import AuthenticationFailed
from azqueue.model import credentials, scopes
from azqueue.model.credentials import Principal


@pytest.mark.parametrize("held,scope,ok", [
    (["queue:*"], "queue:create-task:high:p/w", True),
    (["queue:create-task:*"], "queue:claim-task:p/w", False),
    (["*"], "anything", True),
    (["a:b"], "a:b", True),
    (["a:b"], "a:bc", False),
    (["a:b*"], "a:b", True),
])
def test_a_trailing_star_matches_any_suffix(held: list[str], scope: str, ok: bool) -> None:
    assert scopes.satisfies(held, scope) is ok


def test_expressions_and_what_is_missing() -> None:
    expr: scopes.Expression = {"AllOf": ["a", {"AnyOf": ["b", "c"]}, "d"]}
    assert scopes.satisfies(["a", "c", "d"], expr)
    assert scopes.unsatisfied(["a", "c"], expr) == "d"
    assert scopes.unsatisfied(["d"], expr) == {"AllOf": ["a", {"AnyOf": ["b", "c"]}]}
    assert scopes.describe({"AnyOf": ["b", "c"]}) == "any of (`b`, `c`)"


def test_our_mac_matches_mohawk_for_the_same_request() -> None:
    """An independent Hawk implementation (the one the official client uses) agrees."""
    url = "http://queue.example.com:8080/api/queue/v1/task/abc?x=1"
    sender = mohawk.Sender({"id": "me", "key": "secret-key", "algorithm": "sha256"}, url, "PUT",
                           content=b'{"a":1}', content_type="application/json; charset=utf-8",
                           ext="some-ext")
    header = hawk.parse(sender.request_header)
    assert header.ext == "some-ext"
    assert header.hash == hawk.payload_hash("application/json; charset=utf-8", b'{"a":1}')
    assert hawk.mac("secret-key", "header", header, "PUT", "/api/queue/v1/task/abc?x=1",
                    "queue.example.com", 8080, header.hash) == header.mac
    assert hawk.mac("other-key", "header", header, "PUT", "/api/queue/v1/task/abc?x=1",
                    "queue.example.com", 8080, header.hash) != header.mac


@pytest.mark.parametrize("value", ["Basic abc", 'Hawk id="x"', 'Hawk id="x", ts="1", nonce="n", '
                                   'mac="m", bogus="1"', 'Hawk id="x" ts="1"'])
def test_malformed_headers_are_refused(value: str) -> None:
    with pytest.raises(AuthenticationFailed):
        hawk.parse(value)


def test_replays_within_the_window_are_refused() -> None:
    cache = hawk.ReplayCache()
    ts = str(int(time.time()))
    header = hawk.HawkHeader(id="a", ts=ts, nonce="n", mac="m")
    cache.check_and_add(header)
    with pytest.raises(AuthenticationFailed, match="replayed"):
        cache.check_and_add(header)
    cache.check_and_add(hawk.HawkHeader(id="a", ts=ts, nonce="other", mac="m"))


def test_certificates_we_issue_verify_like_the_official_clients() -> None:
    issuer = Principal("issuer", "issuer-token", ("queue:*", "auth:create-client:n/*"))
    now = datetime.now(UTC)
    ours = credentials.issue(issuer, ["queue:a"], now, now + timedelta(hours=1), name="n/1")
    theirs = taskcluster.createTemporaryCredentials("issuer", "issuer-token", now,
                                                    now + timedelta(hours=1), ["queue:a"], name="n/2")
    lookup = {"issuer": issuer}.get
    for creds in (ours, theirs):
        token = creds["accessToken"]
        principal = credentials.verify(creds["certificate"], creds["clientId"], lookup, now)
        assert principal.access_token == (token.decode() if isinstance(token, bytes) else token)
        assert principal.scopes == ("queue:a",)
    with pytest.raises(AuthenticationFailed, match="expired"):
        credentials.verify(ours["certificate"], "n/1", lookup, now + timedelta(hours=1, minutes=6))
    # 5 minutes of slack either side.
    credentials.verify(ours["certificate"], "n/1", lookup, now + timedelta(hours=1, minutes=4))
    credentials.verify(ours["certificate"], "n/1", lookup, now - timedelta(minutes=4))
    with pytest.raises(AuthenticationFailed, match="31 days"):
        credentials.verify(credentials.issue(issuer, [], now, now + timedelta(days=32))
                           ["certificate"], "issuer", lookup, now)


@pytest.mark.parametrize("start", [10**20, -(10**20)])
def test_certificate_times_out_of_range_are_refused_not_crashed(start: int) -> None:
    issuer = Principal("issuer", "issuer-token", ("queue:*",))
    now = datetime.now(UTC)
    cert = credentials.issue(issuer, ["queue:a"], now, now + timedelta(hours=1))["certificate"]
    forged = {**json.loads(cert), "start": start}
    with pytest.raises(AuthenticationFailed, match="1970-9999"):
        credentials.verify(json.dumps(forged), "issuer", {"issuer": issuer}.get, now)


def test_a_bewit_whose_time_is_a_non_ascii_digit_is_refused() -> None:
    bewit = base64.urlsafe_b64encode("id\\²\\mac\\".encode()).decode().rstrip("=")
    with pytest.raises(AuthenticationFailed, match="malformed"):
        hawk.parse_bewit(bewit)


def test_a_declared_scope_template_is_filled_from_the_request() -> None:
    """As Taskcluster's API declarations: `<name>` placeholders, `if`/`then`, and
    `for`/`in`/`each` inside AllOf and AnyOf."""
    template: scopes.Template = {"AllOf": [
        {"for": "route", "in": "routes", "each": "queue:route:<route>"},
        "queue:scheduler-id:<schedulerId>",
        {"if": "private", "then": "queue:get-artifact:<name>"},
        {"AnyOf": [{"for": "p", "in": "priorities", "each": "queue:create-task:<p>:<queue>"}]},
    ]}
    values = {"routes": ["a", "b"], "schedulerId": "-", "private": False, "name": "public/x",
              "priorities": ["highest", "high"], "queue": "p/w"}
    assert scopes.render(template, values) == {"AllOf": [
        "queue:route:a", "queue:route:b", "queue:scheduler-id:-",
        {"AnyOf": ["queue:create-task:highest:p/w", "queue:create-task:high:p/w"]}]}
    assert scopes.render({"if": "private", "then": "x:<name>"}, values) is None
    with pytest.raises(scopes.Unresolved) as info:
        scopes.render("queue:claim-task:<taskQueueId>", values)
    assert info.value.args == ("taskQueueId",)
