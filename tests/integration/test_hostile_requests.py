"""Requests no client should send get a 4xx and one log line, never a 500: Hawk
timestamps too large for a float, header bytes that are not UTF-8, malformed HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, urlsplit

import aiohttp
import mohawk
import pytest
import taskcluster

from azqueue.model.definition import MAX_SCOPES_JSON
from azqueue.testing import sas
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition, iso, slugid
from tests.servers import ROOT, Server, tip_signer


async def _raw(server: Server, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """Send ``head`` (request line and headers, without the final blank line) as is."""
    url = urlsplit(server.root_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(head + f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                     .encode() + body)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    status = int(answer.split(b" ", 2)[1])
    return status, answer.partition(b"\r\n\r\n")[2]


def _hawk(ts: str = "1", nonce: str = "n", extra: str = "") -> bytes:
    return (f'Authorization: Hawk id="{ROOT.client_id}", ts="{ts}", nonce="{nonce}", '
            f'mac="x"{extra}').encode()


@pytest.mark.parametrize("ts", ["1" + "0" * 310, "-" + "1" * 320, "9" * 400])
async def test_a_hawk_ts_too_large_for_any_clock_is_401(server: Server, ts: str) -> None:
    status, body = await _raw(
        server, b"GET /api/queue/v1/ping HTTP/1.1\r\nHost: x\r\n" + _hawk(ts=ts))
    assert status == 401, body
    assert json.loads(body)["code"] == "AuthenticationFailed"


@pytest.mark.parametrize("where", ["nonce", "hash", "host"])
async def test_header_bytes_that_are_not_utf8_are_refused_not_500(server: Server,
                                                                  where: str) -> None:
    """A signed request (current ts, known id) with a raw 0xff byte where the Hawk
    normalized string takes it."""
    now = str(int(time.time()))
    nonce = b"\xff" if where == "nonce" else b"n"
    hash_ = b', hash="\xff"' if where == "hash" else b""
    host = b"\xff\xfe" if where == "host" else b"x"
    head = (b"GET /api/queue/v1/ping HTTP/1.1\r\nHost: " + host + b"\r\n"
            b'Authorization: Hawk id="' + ROOT.client_id.encode() + b'", ts="' + now.encode()
            + b'", nonce="' + nonce + b'", mac="x"' + hash_)
    status, body = await _raw(server, head)
    assert 400 <= status < 500, (status, body)


async def test_a_content_type_that_is_not_utf8_on_a_signed_body_is_refused_not_500(
        server: Server, http: aiohttp.ClientSession) -> None:
    """The Hawk payload hash covers the Content-Type: a raw 0xff byte in it."""
    task_id = slugid()
    signed = mohawk.Sender({"id": ROOT.client_id, "key": ROOT.access_token,
                            "algorithm": "sha256"}, f"{server.api}/task/{task_id}", "PUT",
                           content=b"{}", content_type="application/json")
    url = urlsplit(server.root_url)
    head = (f"PUT /api/queue/v1/task/{task_id} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: {signed.request_header}\r\n").encode() + \
        b"Content-Type: application/json\xff"
    status, body = await _raw(server, head, b"{}")
    assert 400 <= status < 500, (status, body)


async def test_a_malformed_http_request_is_one_warning_line(
        server: Server, caplog: pytest.LogCaptureFixture) -> None:
    """aiohttp refuses it (400); the log gets one line saying so, not a traceback."""
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    status, _ = await _raw(server, b"GET /api/queue/v1/ping HTTP/1.1\r\nHost: x\r\n"
                                   b"X-Long: " + b"a" * 20_000)
    assert status in (400, 431)
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert records and all(r.levelno <= logging.WARNING and r.exc_info is None
                           for r in records), [(r.levelname, r.getMessage()) for r in records]


@pytest.mark.parametrize(("name", "says"), [
    ("public/" + "a" * 600, "too long"),
    ("public/" + "é" * 200, "too long"),
    ("public/./x", "`.` or `..`"),
    ("public/../../other/0/x", "`.` or `..`"),
    ("public\\x", "backslash"),
])
async def test_artifact_names_storage_cannot_hold_or_that_leave_the_run_are_400(
        server: Server, http: aiohttp.ClientSession, name: str, says: str) -> None:
    """Names whose table key would pass Azure's 512 characters once encoded, and names
    whose `.`/`..` segments a blob path would resolve (into another run's or task's
    blobs), are refused before anything is written."""
    task_id = await create(http, server.api, definition("prov/names"))
    code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/claim",
                             {"workerGroup": "wg", "workerId": "w"})
    assert code == 200
    code, err = await sas.post(
        http, f"{server.api}/task/{task_id}/runs/0/artifacts/{quote(name, safe='')}",
        {"storageType": "reference", "url": "https://example.com/x",
         "expires": iso(datetime.now(UTC) + timedelta(hours=1))})
    assert code == 400 and says in err["message"], (code, err)


def _nested(levels: int) -> str:
    """A JSON array ``levels`` deep, as text (json.dumps would refuse the deepest ones)."""
    return "[" * levels + "1" + "]" * levels


def _definition_text(payload_text: str) -> bytes:
    """A valid definition whose `payload.data` is ``payload_text``, spliced in as is."""
    text = json.dumps(definition("prov/hostile", payload={"data": "@@"}))
    return text.replace('"@@"', payload_text).encode()


async def _storage_writes(server: Server) -> int:
    """Storage requests of this server that may write (the resolvers only read when idle)."""
    return sum(n for kind, n in server.services.health.storage_requests().items()
               if kind.split()[-1] not in ("GET", "HEAD"))


@pytest.mark.parametrize("levels", [99, 150, 975, 976, 5000])
async def test_json_nested_deeper_than_the_limit_is_400_before_anything_is_written(
        server: Server, http: aiohttp.ClientSession, levels: int) -> None:
    """"Bound the depth (and size) of what is accepted far below what any reader needs, and
    check it before anything is written": the definition (payload at level 2, its array
    at level 3) is refused with a 400 naming the limit, and nothing is written to storage."""
    task_id = slugid()
    before = await _storage_writes(server)
    async with http.put(f"{server.api}/task/{task_id}", data=_definition_text(_nested(levels)),
                        headers={"Content-Type": "application/json"}) as r:
        answer = await r.json()
        assert r.status == 400, answer
    assert answer["code"] == "MalformedPayload"
    assert "at most 100 levels" in answer["message"], answer["message"]
    assert await _storage_writes(server) == before
    async with http.get(f"{server.api}/task/{task_id}") as r:
        assert r.status == 404


async def test_json_nested_as_deep_as_the_limit_is_stored_and_read_back(
        server: Server, http: aiohttp.ClientSession) -> None:
    """The definition is level 1, payload level 2: 98 arrays in it reach level 100."""
    task_id = slugid()
    async with http.put(f"{server.api}/task/{task_id}", data=_definition_text(_nested(98)),
                        headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200, await r.text()
    async with http.get(f"{server.api}/task/{task_id}") as r:
        assert r.status == 200
        assert json.dumps((await r.json())["payload"]["data"]) == json.dumps(
            json.loads(_nested(98)))


@pytest.mark.parametrize(("path", "body"), [
    ("/claim-work/prov%2Fhostile", '{"workerGroup": "g", "workerId": "w", "tasks": 1, "x": @@}'),
    ("/task/{task_id}/runs/0/exception", '{"reason": "worker-shutdown", "x": @@}'),
    ("/task/{task_id}/runs/0/claim", '{"workerGroup": "g", "workerId": "w", "x": @@}'),
])
async def test_deep_json_in_any_body_is_refused_naming_the_limit(
        server: Server, http: aiohttp.ClientSession, path: str, body: str) -> None:
    task_id = await create(http, server.api, definition("prov/hostile"))
    async with http.post(f"{server.api}{path.format(task_id=task_id)}",
                         data=body.replace("@@", _nested(500)).encode(),
                         headers={"Content-Type": "application/json"}) as r:
        answer = await r.json()
        assert r.status == 400, answer
    assert "at most 100 levels" in answer["message"]
    assert answer["requestInfo"]["payload"] == {}


@pytest.mark.parametrize("number", ["1e999", "-1e999", "1E400", "NaN", "Infinity", "-Infinity",
                                    "9" * 400])
@pytest.mark.parametrize("where", ["payload", "extra"])
async def test_non_finite_numbers_are_refused_however_spelled(
        server: Server, http: aiohttp.ClientSession, number: str, where: str) -> None:
    """"`1e999` (and `-1e999`, `1E400`) anywhere in a definition is accepted and read back as
    `Infinity`, which is not JSON ... Refuse non-finite numbers however they are spelled
    (400), including in `requestInfo` echoes." An integer too large for a double is read
    as Infinity by JavaScript, so it is refused too."""
    task_id = slugid()
    text = json.dumps(definition("prov/hostile", **{where: {"n": "@@"}}))
    async with http.put(f"{server.api}/task/{task_id}", data=text.replace('"@@"', number),
                        headers={"Content-Type": "application/json"}) as r:
        raw = await r.text()
        assert r.status == 400, raw
    answer = json.loads(raw, parse_constant=lambda c: pytest.fail(f"{c} in the answer"))
    assert answer["code"] == "MalformedPayload"
    assert "finite" in answer["message"] or "not JSON" in answer["message"], answer["message"]
    async with http.get(f"{server.api}/task/{task_id}") as r:
        assert r.status == 404


async def test_ten_thousand_missing_dependencies_stop_at_the_first_missing_one(
        server: Server, http: aiohttp.ClientSession) -> None:
    """"createTask with 10,000 nonexistent dependencies ... Check existence with bounded
    concurrency and stop at the first missing one": the 400 names it, and the refusal
    costs a few dozen storage reads, not one per dependency. (10,000 is the most the
    Taskcluster task definition allows: `dependencies` has maxItems 10000.)"""
    existing = await create(http, server.api, definition("prov/hostile"))
    ghosts = [slugid() for _ in range(9_999)]
    reads_before = sum(server.services.health.storage_requests().values())
    async with http.put(f"{server.api}/task/{slugid()}",
                        json=definition("prov/hostile", dependencies=[existing, *ghosts])) as r:
        answer = await r.json()
        assert r.status == 400, answer
    assert "do not exist" in answer["message"] and ghosts[0] in answer["message"]
    spent = sum(server.services.health.storage_requests().values()) - reads_before
    assert spent < 500, f"{spent} storage requests to refuse the definition"


async def test_more_dependencies_than_the_reference_allows_is_a_short_400(
        server: Server, http: aiohttp.ClientSession) -> None:
    """Taskcluster's task definition: `dependencies` has maxItems 10000. The 400 says so
    without echoing the 10,001 ids in its message."""
    async with http.put(f"{server.api}/task/{slugid()}", json=definition(
            "prov/hostile", dependencies=[slugid() for _ in range(10_001)])) as r:
        answer = await r.json()
        assert r.status == 400, answer
    assert "`dependencies`" in answer["message"] and "too long" in answer["message"]
    assert len(answer["message"]) < 1000, answer["message"]


@pytest.mark.parametrize(("days", "status"), [(30, 200), (32, 401), (3650, 401)])
async def test_a_signed_url_lives_at_most_31_days(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession,
        days: int, status: int) -> None:
    """"A bewit with an expiry of 10^400 is honoured: cap bewit lifetime": a URL signed by
    the official client for longer than temporary credentials may last is refused."""
    queue = taskcluster.Queue({"rootUrl": server.root_url, "credentials": {
        "clientId": ROOT.client_id, "accessToken": ROOT.access_token}})
    task_id = await create(http, server.api, definition("prov/hostile"))
    url = queue.buildSignedUrl("task", task_id, expiration=days * 24 * 3600)
    async with anonymous.get(url) as r:
        answer = await r.json()
        assert r.status == status, answer
    if status == 401:
        assert "31 days" in answer["message"]


def _scopes_of_json_length(total: int) -> list[str]:
    """Distinct scopes (each under the 500 characters the schema allows) whose JSON, as
    the official client writes it, is ``total`` characters long."""
    n = total // 400 + 1
    each, extra = divmod(total - 2 - n * 2 - (n - 1) * 2, n)
    scopes = [f"test:hostile:{i}:".ljust(each, "x") for i in range(n)]
    scopes[0] += "y" * extra
    assert len(json.dumps(scopes)) == total
    return scopes


def _work_with_claim_credentials(root_url: str, scopes: list[str]) -> str:
    """createTask with ``scopes``, claim it, and reclaim, create an artifact and report
    completed with the claim's credentials, all with the official client."""
    root = taskcluster.Queue({"rootUrl": root_url, "maxRetries": 0, "credentials": {
        "clientId": ROOT.client_id, "accessToken": ROOT.access_token}})
    task_id = slugid()
    root.createTask(task_id, definition("prov/hostile", scopes=scopes))
    claim = root.claimTask(task_id, 0, {"workerGroup": "g" * 38, "workerId": "w" * 38})
    worker = taskcluster.Queue({"rootUrl": root_url, "maxRetries": 0,
                                "credentials": claim["credentials"]})
    reclaimed = worker.reclaimTask(task_id, 0)
    worker = taskcluster.Queue({"rootUrl": root_url, "maxRetries": 0,
                                "credentials": reclaimed["credentials"]})
    worker.createArtifact(task_id, 0, "public/log.txt", {
        "storageType": "reference", "url": "https://example.com/log",
        "expires": iso(datetime.now(UTC) + timedelta(hours=1))})
    state: str = worker.reportCompleted(task_id, 0)["status"]["state"]
    return state


async def test_scopes_that_fit_a_request_header_work_with_the_claim_credentials(
        server: Server) -> None:
    """"Claim credentials for a task with many long scopes produce an Authorization header
    over aiohttp's 8,190-byte limit ... cap scopes at createTask with a 400 that says why":
    a task with as many scopes as the cap allows is worked on with its claim's
    credentials, through the official client, with the longest worker names."""
    scopes = _scopes_of_json_length(MAX_SCOPES_JSON)
    assert await asyncio.to_thread(_work_with_claim_credentials, server.root_url,
                                   scopes) == "completed"


async def test_scopes_too_long_for_a_request_header_are_400_at_create_task(
        server: Server, http: aiohttp.ClientSession) -> None:
    task_id = slugid()
    async with http.put(f"{server.api}/task/{task_id}", json=definition(
            "prov/hostile", scopes=_scopes_of_json_length(MAX_SCOPES_JSON + 1))) as r:
        answer = await r.json()
        assert r.status == 400, answer
    assert "`scopes`" in answer["message"] and "header" in answer["message"]
    async with http.get(f"{server.api}/task/{task_id}") as r:
        assert r.status == 404


async def _claims_suggesting_a_lost_tip(server: Server, http: aiohttp.ClientSession,
                                        orphaned: bool) -> tuple[str, list[int]]:
    """A pending task, then twelve claims with a valid signature that each suggest its tip
    was lost: ten at once, then two more. ``orphaned``: run 1's signature with the task's
    own message (as if a claim rewrote it and died); else run 0's signature with
    messageIds that are none of the task's tips. Returns the taskId and the answers."""
    task_queue = f"prov/lost{slugid()[:8].replace('-', 'x').replace('_', 'y').lower()}"
    task_id = await create(http, server.api, definition(task_queue))
    queue = (await sas.poll_task_urls(http, server.api, *task_queue.split("/")))["queues"][6]
    [message] = await sas.get_messages(http, queue["signedPollUrl"])
    run_id = 1 if orphaned else 0
    signature = tip_signer(server).sign(task_queue, task_id, run_id)

    async def claim(i: int) -> int:
        body = {"workerGroup": "wg", "workerId": "w",
                "messageId": message.message_id if orphaned else str(uuid.UUID(int=i)),
                "receipt": message.pop_receipt, "signature": signature}
        code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/{run_id}/claim", body)
        return code

    codes = list(await asyncio.gather(*(claim(i) for i in range(10))))
    codes += [await claim(10), await claim(11)]
    return task_id, codes


@pytest.mark.parametrize("orphaned", [False, True], ids=["unrecorded", "orphaned"])
async def test_claims_suggesting_a_lost_tip_add_at_most_one_tip(
        server: Server, http: aiohttp.ClientSession, storage: StorageInspector,
        orphaned: bool) -> None:
    """"Each claimTask carrying a valid signature but a messageId that is not one of the
    task's recorded tips queues another tip for the pending task (10 such claims → 10
    extra tips). A misbehaving worker must not be able to multiply messages: repair at
    most once per run per interval": twelve such claims (refused) add one tip."""
    task_id, codes = await _claims_suggesting_a_lost_tip(server, http, orphaned)
    assert all(400 <= c < 500 for c in codes), codes
    stored = await storage.stored(task_id)
    assert len(stored.tips) == 2, f"{len(stored.tips)} tips recorded"


@pytest.mark.parametrize("path", ["/task/a%0Ab/status", "/task/%0A/runs/0/artifacts/x",
                                  "/no%0Asuch"])
async def test_a_newline_in_the_path_gets_a_json_answer(server: Server, path: str) -> None:
    """Found by the fuzz test: `%0A` decodes to a newline, which the catch-all route
    once missed, leaving aiohttp's plain-text 404."""
    status, body = await _raw(server, f"GET /api/queue/v1{path} HTTP/1.1\r\nHost: x".encode())
    assert status in (400, 404), (status, body)
    answer = json.loads(body)
    assert answer["code"] and answer["message"]


@pytest.mark.parametrize("where", ["payload", "extra", "tags", "name"])
async def test_a_lone_surrogate_in_a_definition_is_refused(
        server: Server, http: aiohttp.ClientSession, where: str) -> None:
    """`"\\udc00"` is valid JSON syntax but no character: Python reads it, strict readers
    (serde_json, for one) refuse the whole document, so the task could not be read back
    by them. Refused (400) before anything is stored."""
    body = definition("prov/hostile")
    if where == "name":
        body["metadata"]["name"] = "@@"
    else:
        body[where] = {"x": "@@"}
    task_id = slugid()
    async with http.put(f"{server.api}/task/{task_id}",
                        data=json.dumps(body).replace('"@@"', '"a\\udc00"'),
                        headers={"Content-Type": "application/json"}) as r:
        answer = await r.json()
        assert r.status == 400, answer
    assert "surrogate" in answer["message"]
    async with http.get(f"{server.api}/task/{task_id}") as r:
        assert r.status == 404


@pytest.mark.parametrize("path", ["/provisioners/prov%0A", "/task-queues/prov%2Fwt%0A/counts",
                                  "/pending/prov%2Fwt%0A"])
async def test_a_name_ending_in_a_newline_is_not_a_name(server: Server, path: str) -> None:
    """`^…$` alone lets a trailing newline through: a path parameter must be the name and
    nothing more."""
    async with aiohttp.ClientSession() as anonymous:
        async with anonymous.get(f"{server.api}{path}") as r:
            answer = await r.json()
            assert r.status == 400 and "path parameter" in answer["message"], answer


@pytest.mark.parametrize("field,value", [("taskQueueId", "prov/wt\n"),
                                         ("schedulerId", "sched\n"),
                                         ("taskGroupId", "+QbYWYJzTMa0S1_HtRfjxQ\n")])
async def test_a_body_identifier_ending_in_a_newline_is_refused(
        server: Server, http: aiohttp.ClientSession, field: str, value: str) -> None:
    """In a body as in a path: a schema's `^…$` is the whole string, as JSON Schema
    means it, not Python's `$` that also matches before a final newline."""
    task_id = slugid()
    body = definition("prov/wt")
    body[field] = value
    async with http.put(f"{server.api}/task/{task_id}", json=body) as r:
        answer = await r.json()
        assert r.status == 400, answer
    assert field in answer["message"] and "does not match" in answer["message"], answer
    async with http.get(f"{server.api}/task/{task_id}") as r:
        assert r.status == 404


async def test_a_worker_group_ending_in_a_newline_cannot_claim_work(
        server: Server, http: aiohttp.ClientSession) -> None:
    async with http.post(f"{server.api}/claim-work/prov%2Fwt",
                         json={"workerGroup": "wg\n", "workerId": "w", "tasks": 1}) as r:
        answer = await r.json()
        assert r.status == 400 and "workerGroup" in answer["message"], answer
