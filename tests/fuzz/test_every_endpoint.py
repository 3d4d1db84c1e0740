"""Every endpoint of the API, fuzzed with Hypothesis against one real server on Azurite.

For each route of the table the server serves (``azqueue.api.app.ROUTES``, read when the
test runs, so routes declared later are covered too), requests are generated from our own JSON schemas
and from hostile variants of them: path parameters that are not what the route wants,
bodies that are not JSON, not UTF-8, nested too deep, carrying non-finite numbers or
values of the wrong shape, query parameters of any kind; signed as the root client,
anonymous, or with a Hawk header that is garbage. What every answer must be:
"no 5xx and a `{code, message}` body on every 4xx".

The budget is bounded (``EXAMPLES`` a route) and the examples are derandomized, so the
same requests are sent in every run.
"""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import mohawk
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from azqueue.api import validation
from azqueue.api.app import ROUTES
from azqueue.api.routing import Route
from azqueue.testing import sas
from azqueue.testing.tasks import create, definition, iso, slugid
from tests.fuzz.schemas import JSON_VALUES, from_schema
from tests.servers import ROOT, Server, ServerFactory

EXAMPLES = 30  # a route, of each kind
TASK_QUEUE = "prov/fuzz"
AUTH = ("root", "anonymous", "garbage")


@dataclass(frozen=True, slots=True)
class World:
    """What exists on the server before the fuzzing: ids worth sending, and the
    date-times to put in bodies."""

    pending: str
    running: str
    times: list[str]


def _parameter(name: str, world: World, hostile: bool) -> st.SearchStrategy[str]:
    odd = st.text(max_size=40) | st.sampled_from(
        ["", ".", "..", "%", "%ff", "%2e%2e", "a" * 2000, "é" * 300, "0" * 400, "-1", " "])
    plausible: dict[str, list[str]] = {
        "taskId": [world.pending, world.running, slugid()],
        "taskGroupId": [world.pending, world.running, slugid()],
        "runId": ["0", "1", "1000", "1001", "00", "1e3"],
        "name": ["public/log.txt", "private/secret.txt", "public/missing", "public/../x",
                 "public/" + "n" * 600],
        "taskQueueId": [TASK_QUEUE, "prov/other"],
        "provisionerId": ["prov"],
        "workerType": ["fuzz", "other"],
        "schema": validation.schema_names(),
    }
    likely = st.sampled_from(plausible.get(name, ["x"]))
    return likely | odd if hostile else likely


def _body(route: Route, world: World, hostile: bool) -> st.SearchStrategy[bytes]:
    """Request bodies: valid by our schema (or nearly), and (``hostile``) variants."""
    schema = validation.schema(route.body) if route.body else {"type": "object"}
    base = (definition(TASK_QUEUE) if route.body == "task-definition-request.json"
            else {"workerGroup": "wg", "workerId": "w", "tasks": 1} if route.body and
            "claim" in route.body else {})
    valid = from_schema(schema, times=world.times)
    # A body that works, with at most two of its fields drawn from the schema instead.
    fields = sorted(schema.get("properties", {})) or ["x"]
    shaped = st.builds(lambda v, keys: {**base, **{k: v[k] for k in keys if k in v}},
                       valid, st.lists(st.sampled_from(fields), max_size=2))

    def spliced(value: dict[str, Any], raw: str) -> bytes:
        return json.dumps({**value, "extra": "@@"}).replace('"@@"', raw).encode()

    as_json = shaped.map(lambda v: json.dumps(v).encode())
    if not hostile:
        return as_json
    return st.one_of(
        as_json,
        valid.map(lambda v: json.dumps(v).encode()),
        st.builds(spliced, shaped, st.sampled_from(
            ["1e999", "-1E400", "NaN", "Infinity", "9" * 400, '"\\udc00"', '{"\\ud800": 1}',
             "[" * 120 + "]" * 120,
             "[" * 3000 + "]" * 3000])),
        JSON_VALUES.map(lambda v: json.dumps(v).encode()),
        st.sampled_from([b"", b"{", b"\xff\xfe{}", b'{"a": "\xff"}', b"[]", b"null",
                         b"{" * 50_000]),
        st.binary(max_size=64),
    )


def _target(route: Route, values: dict[str, str], raw: bool) -> str:
    """The route's path with ``values`` encoded as the official client does (or, with
    ``raw``, with `/` and `%` left alone)."""
    path = route.path
    for name, value in values.items():
        path = path.replace(f"<{name}>", quote(value, safe="/%" if raw else ""))
    return path


def _query() -> st.SearchStrategy[str]:
    return st.sampled_from(["", "?limit=2", "?limit=0", "?limit=abc", "?limit=99999",
                            "?continuationToken=%ff%00", "?continuationToken=abc&limit=1"])


def _send(root_url: str, method: str, target: str, body: bytes, content_type: str,
          auth: str) -> tuple[int, bytes]:
    url = urlsplit(root_url)
    headers = {"Content-Type": content_type}
    if auth == "root":
        headers["Authorization"] = mohawk.Sender(
            {"id": ROOT.client_id, "key": ROOT.access_token, "algorithm": "sha256"},
            f"{root_url}{target}", method, content=body, content_type=content_type
        ).request_header
    elif auth == "garbage":
        headers["Authorization"] = 'Hawk id="root", ts="1", nonce="~", mac="%%", ext="!"'
    connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
    try:
        connection.request(method, target, body=body if method != "GET" else None,
                           headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _check(status: int, answer: bytes, what: str) -> None:
    assert status < 500, f"{what} -> {status}: {answer[:500]!r}"
    if 400 <= status < 500:
        try:
            body = json.loads(answer)
        except ValueError:
            pytest.fail(f"{what} -> {status} without a JSON body: {answer[:300]!r}")
        assert isinstance(body, dict) and isinstance(body.get("code"), str) and \
            isinstance(body.get("message"), str) and body["message"], \
            f"{what} -> {status} without {{code, message}}: {answer[:300]!r}"


def _fuzz(route: Route, root_url: str, world: World, hostile: bool) -> Callable[[], None]:
    """Requests for ``route``: mostly well-formed ones from the root client or anonymous,
    or (``hostile``) anything, also with a garbage Hawk header."""
    names = list(route.pattern.groupindex)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(values=st.fixed_dictionaries({n: _parameter(n, world, hostile) for n in names}),
           raw=st.booleans() if hostile else st.just(False),
           query=_query(), body=_body(route, world, hostile),
           content_type=st.sampled_from(["application/json", "text/plain", ""]),
           auth=st.sampled_from(AUTH if hostile else AUTH[:-1]))
    def check(values: dict[str, str], raw: bool, query: str, body: bytes, content_type: str,
              auth: str) -> None:
        target = _target(route, values, raw) + query
        method = route.method
        status, answer = _send(root_url, method, target, body if route.body else b"",
                               content_type, auth)
        _check(status, answer, f"{route.name}: {auth} {method} {target[:200]} "
                               f"{body[:200]!r}")

    return check


# The server's own use of the global `random` (a storage retry's jitter) while Hypothesis
# draws in the other thread is not the strategies' doing.
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")
async def test_no_endpoint_answers_5xx_and_every_4xx_says_what_is_wrong(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """Over every declared route, signed as root and anonymous: no 5xx, and a
    `{code, message}` body on every 4xx."""
    # No background resolvers: their jittered sleeps would use the global `random` while
    # Hypothesis draws in the other thread, which it reports as a strategy using it.
    server: Server = await make_server(claim_work_wait=0.2, claim_work_poll_interval=0.1,
                                       run_resolvers=False)
    pending = await create(http, server.api, definition(TASK_QUEUE))
    running = await create(http, server.api, definition("prov/fuzz-running"))
    code, _ = await sas.post(http, f"{server.api}/task/{running}/runs/0/claim",
                             {"workerGroup": "wg", "workerId": "w"})
    assert code == 200
    now = datetime.now(UTC)
    code, _ = await sas.post(http, f"{server.api}/task/{running}/runs/0/artifacts/public%2Flog.txt",
                             {"storageType": "reference", "url": "https://example.com/log",
                              "expires": iso(now + timedelta(hours=1))})
    assert code == 200
    world = World(pending, running, [iso(now + offset) for offset in (
        timedelta(0), timedelta(minutes=-1), timedelta(hours=1), timedelta(days=6),
        timedelta(days=-1))] + ["2026-13-45T99:99:99Z", "yesterday"])
    assert ROUTES, "no routes declared"
    for route in list(ROUTES):
        for hostile in (False, True):
            await asyncio.to_thread(_fuzz(route, server.root_url, world, hostile))
