"""The storage requests of a task's lifecycle, made directly over the shared aiohttp session.

Which client makes a request is decided by its kind, once, here:

* this module: the requests a task's lifecycle makes on every API call (read, insert,
  replace and merge one entity; a change's entity-group transaction with its outbox
  rows; the first page of a small query, whether a task group has members; put,
  receive, update and delete a queue message);
* the Azure SDK: everything else (queues and tables made, deleted, peeked, counted and
  listed; longer queries and their paging; upserts and deletes of rows; blobs; SAS URLs
  and user delegation keys). Those are made once per task queue, group, worker or
  artifact, or by the background upkeep, not per lifecycle step, and the SDK's paging,
  blob uploads and SAS signing would be much more code here to save little.

Why: on the server's CPU, each request of the first kind costs about a third of what the
SDK's costs, the transaction a ninth (``scripts/measure_storage_clients.py``, 2,000 of
each one after another on Azurite, this process's CPU per request, rest.py / SDK: put
0.42 / 1.31 ms, receive 0.35 / 1.04, update 0.34 / 0.84, delete 0.27 / 0.73; insert
0.34 / 1.16, read 0.37 / 0.94, replace 0.33 / 0.97, transaction 0.36 / 3.30, first page
of a query 0.34 / 1.10). A lifecycle makes some ten of them (two puts, a transaction,
a receive, two updates, two replaces, a merge, a delete): through the SDK they would add
some 9 ms of CPU to the 5 ms a whole lifecycle costs the server (docs/capacity.md). The
SDK spends it in its pipeline (policies, serializers, tracing hooks) and, for the
transaction, in its multipart machinery.

The module is one client, a little over the usual length, because its requests share
the signing, the retries and the error answers below. What is done here is what the SDK
does on the wire:

* authentication: Shared Key with the account key, as the SDK signs for Tables and
  Queues, or a bearer token from the azure-identity credential (scope
  ``https://storage.azure.com/.default``), renewed five minutes before it expires;
* Tables: JSON with minimal metadata; ``Edm.DateTime`` and ``Edm.Int64`` properties
  annotated; ETags from the answer's header;
* Queues: the XML bodies of Put, Update, Get and Delete Message;
* errors: an error answer raises this module's ``RequestFailed`` (status, error code,
  ``after_lost_answer``), which ``storage.errors.translate`` turns into azqueue's errors
  as it does the SDK's for the same answer; no answer through every retry raises what
  ``storage.retry`` raises for both clients (``ServiceRequestError``);
* retries: as ``storage.retry`` says for every storage request (attempts, backoff with
  jitter, Retry-After, the time left to the client's request). A write retried after an
  answer that was lost may find its own effect (an insert "exists", a replace 412, a
  receipt that no longer matches): the error it raises then carries
  ``after_lost_answer``, and the callers decide on the stored state again, which makes
  that harmless.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import re
import secrets
import ssl
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import formatdate
from typing import Any
from urllib.parse import quote, unquote, urlsplit
from xml.sax.saxutils import escape

import aiohttp
import yarl
from multidict import CIMultiDict
from azure.core.exceptions import ServiceRequestError
from azure.data.tables import EntityProperty

from azqueue.storage.retry import DEFAULT, RETRIED_STATUS, RetryPolicy, send

log = logging.getLogger(__name__)

TABLE_VERSION = "2019-02-02"
QUEUE_VERSION = "2021-12-02"
TOKEN_SCOPE = "https://storage.azure.com/.default"
TOKEN_MARGIN = 300
JSON = "application/json"
JSON_ACCEPT = "application/json;odata=minimalmetadata"


class Entity(dict[str, Any]):
    """A table entity as the SDK gives it: properties, and ``metadata`` with the etag."""

    metadata: dict[str, Any]


@dataclass(frozen=True, slots=True)
class QueueMessage:
    message_id: str
    pop_receipt: str
    text: str
    dequeue_count: int


class Signer:
    """Authorization headers: Shared Key, or a bearer token from a credential."""

    def __init__(self, account_name: str, account_key: str | None, credential: Any,
                 sas: str | None = None) -> None:
        self.account_name = account_name
        self.sas = sas.lstrip("?") if sas else None
        self._key = base64.b64decode(account_key) if account_key else None
        self._credential = credential
        self._token: tuple[str, float] | None = None
        self._token_lock = asyncio.Lock()

    def _sign(self, text: str) -> str:
        assert self._key is not None
        return base64.b64encode(hmac.new(self._key, text.encode(), hashlib.sha256).digest()).decode()

    async def bearer(self) -> str | None:
        if self._key is not None or self._credential is None:
            return None
        async with self._token_lock:
            if self._token is None or self._token[1] - TOKEN_MARGIN < time.time():
                token = await self._credential.get_token(TOKEN_SCOPE)
                self._token = (token.token, float(token.expires_on))
            return self._token[0]

    def table(self, method: str, path: str, headers: Mapping[str, str]) -> str:
        """Shared Key for the Table service."""
        text = "\n".join([method, headers.get("Content-MD5", ""), headers.get("Content-Type", ""),
                          headers["x-ms-date"], f"/{self.account_name}{path}"])
        return f"SharedKey {self.account_name}:{self._sign(text)}"

    def queue(self, method: str, path: str, query: Mapping[str, str],
              headers: Mapping[str, str]) -> str:
        """Shared Key for the Queue service."""
        lower = {k.lower(): v for k, v in headers.items()}
        length = lower.get("content-length", "")
        standard = [lower.get(h, "") for h in (
            "content-encoding", "content-language")] + [
            "" if length == "0" else length] + [lower.get(h, "") for h in (
                "content-md5", "content-type", "date", "if-modified-since", "if-match",
                "if-none-match", "if-unmodified-since", "range")]
        canonical = "".join(f"{k}:{v}\n" for k, v in sorted(
            (k, v) for k, v in lower.items() if k.startswith("x-ms-")))
        resource = f"/{self.account_name}{path}" + "".join(
            f"\n{k.lower()}:{unquote(v)}" for k, v in sorted(query.items()))
        text = "\n".join([method, *standard]) + "\n" + canonical + resource
        return f"SharedKey {self.account_name}:{self._sign(text)}"


class RequestFailed(Exception):
    """Azure Storage answered a request of this module with an error: its HTTP
    ``status``, its error code (``x-ms-error-code``, or the code in the body), and
    ``after_lost_answer``: whether an attempt before this answer may have been applied, its
    answer lost. ``storage.errors.translate`` turns it into azqueue's errors."""

    def __init__(self, what: str, status: int, code: str, after_lost_answer: bool = False
                 ) -> None:
        super().__init__(f"{what}: {status} {code}")
        self.status = status
        self.code = code
        self.after_lost_answer = after_lost_answer


class RestClient:
    """The few Table and Queue requests of the hot path, counted in ``requests``."""

    def __init__(self, session: Any, signer: Signer, table_endpoint: str, queue_endpoint: str,
                 requests: Counter[str], ca_file: str | None = None,
                 policy: RetryPolicy = DEFAULT) -> None:
        self._session = session  # a SharedSession: the aiohttp session is made on first use
        self._signer = signer
        tables, queues = urlsplit(table_endpoint.rstrip("/")), urlsplit(queue_endpoint.rstrip("/"))
        self._table_origin, self._table_path = f"{tables.scheme}://{tables.netloc}", tables.path
        self._queue_origin, self._queue_path = f"{queues.scheme}://{queues.netloc}", queues.path
        self._requests = requests
        self._ssl: ssl.SSLContext | bool = (ssl.create_default_context(cafile=ca_file)
                                            if ca_file else True)
        self._policy = policy

    async def _send(self, service: str, method: str, origin: str, path: str,
                    query: dict[str, str], headers: dict[str, str], body: bytes | None,
                    what: str) -> tuple[int, Mapping[str, str], bytes, bool]:
        """Send, retrying as ``storage.retry`` says; the status, headers and body of the
        last answer, and whether an attempt before it may have been applied unanswered."""
        # Sent exactly as signed: the path is encoded here, the query values too.
        parts = [f"{k}={quote(v, safe='')}" for k, v in query.items()]
        if self._signer.sas:
            parts.append(self._signer.sas)
        url = yarl.URL(origin + path + ("?" + "&".join(parts) if parts else ""), encoded=True)
        if body is not None or method in ("PUT", "POST", "PATCH"):
            # aiohttp sends both headers for these methods: they are signed as sent.
            body = body or b""
        lost = False

        async def attempt(timeout: float, number: int
                          ) -> tuple[int, Mapping[str, str], bytes]:
            nonlocal lost
            request_headers = {**headers, "x-ms-date": _http_date(),
                               "x-ms-version": TABLE_VERSION if service == "table" else QUEUE_VERSION}
            if body is not None:
                request_headers["Content-Length"] = str(len(body))
                request_headers.setdefault("Content-Type", "application/octet-stream")
            token = await self._signer.bearer()
            if token is not None:
                request_headers["Authorization"] = f"Bearer {token}"
            elif self._signer.sas is not None:
                pass  # the SAS token is in the query
            elif service == "table":
                request_headers["Authorization"] = self._signer.table(method, path, request_headers)
            else:
                request_headers["Authorization"] = self._signer.queue(method, path, query,
                                                                      request_headers)
            self._requests[f"{service} {method}"] += 1
            try:
                async with self._session.get().request(
                        method, url, headers=request_headers, data=body, ssl=self._ssl,
                        timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                    content = await r.read()
                    if r.status in RETRIED_STATUS:
                        # 503 (ServerBusy) was refused; any other 5xx may have been applied.
                        lost = lost or r.status != 503
                    return r.status, CIMultiDict(r.headers), content
            except (aiohttp.ClientError, TimeoutError) as e:
                lost = lost or not isinstance(e, aiohttp.ClientConnectorError)
                if isinstance(e, TimeoutError):
                    log.info("%s: no answer within %.1fs (attempt %d)", what, timeout,
                             number + 1)
                raise ServiceRequestError(f"{what}: {type(e).__name__}: {e}") from e

        status, answer, content = await send(attempt, self._policy, what)
        return status, answer, content, lost

    def _check(self, status: int, headers: Mapping[str, str], content: bytes, ok: tuple[int, ...],
               what: str, lost: bool = False) -> None:
        if status in ok:
            return
        code = headers.get("x-ms-error-code", "")
        if not code and content:
            try:
                code = str(json.loads(content)["odata.error"]["code"])
            except (ValueError, KeyError, TypeError):
                code = ""
        raise RequestFailed(what, status, code or str(status), lost)

    # -- tables ----------------------------------------------------------------------

    def _entity_path(self, table: str, partition: str, row: str) -> str:
        def key(value: str) -> str:
            return quote(value.replace("'", "''"), safe="")
        return f"{self._table_path}/{table}(PartitionKey='{key(partition)}',RowKey='{key(row)}')"

    async def _table(self, method: str, path: str, headers: dict[str, str],
                     body: bytes | None, ok: tuple[int, ...], what: str,
                     query: dict[str, str] | None = None) -> tuple[Mapping[str, str], bytes]:
        if body is not None:
            headers = {**headers, "DataServiceVersion": "3.0"}
        status, answer, content, lost = await self._send(
            "table", method, self._table_origin, path, query or {}, headers, body, what)
        self._check(status, answer, content, ok, what, lost)
        return answer, content

    async def get_entity(self, table: str, partition: str, row: str) -> Entity:
        path = self._entity_path(table, partition, row)
        headers, content = await self._table("GET", path, {"Accept": JSON_ACCEPT}, None, (200,),
                                             f"reading {table}")
        return _entity_from_json(json.loads(content), headers.get("ETag", ""))

    async def query_first(self, table: str, odata_filter: str, select: list[str],
                          top: int) -> list[Entity]:
        """The first entities, at most ``top``, that ``odata_filter`` matches (its string
        literals quoted by the caller, as ``odata_string`` does): one request, unless
        the service answers a page with none but a continuation (it may, at a partition
        boundary or after its time limit), which is followed."""
        query = {"$filter": odata_filter, "$select": ",".join(select), "$top": str(top)}
        while True:
            headers, content = await self._table(
                "GET", f"{self._table_path}/{table}()", {"Accept": JSON_ACCEPT}, None,
                (200,), f"reading {table}", query)
            rows = [_entity_from_json(row, "") for row in json.loads(content).get("value", [])]
            following = {name: headers[header] for name, header in _CONTINUATION
                         if header in headers}
            if rows or not following:
                return rows
            query = {**query, **following}

    async def create_entity(self, table: str, entity: Mapping[str, Any]) -> dict[str, Any]:
        path = f"{self._table_path}/{table}"
        headers, _ = await self._table(
            "POST", path, {"Accept": JSON_ACCEPT, "Content-Type": JSON,
                           "Prefer": "return-no-content"},
            _entity_to_json(entity), (201, 204), f"inserting into {table}")
        return {"etag": headers.get("ETag", "")}

    async def update_entity(self, table: str, entity: Mapping[str, Any], etag: str,
                            merge: bool = False) -> dict[str, Any]:
        """Replace (or merge into) an existing entity, if it is still at ``etag`` (``*``:
        whatever its ETag)."""
        if not etag:
            raise ValueError("update_entity needs the ETag to write at, or '*'")
        path = self._entity_path(table, entity["PartitionKey"], entity["RowKey"])
        headers, _ = await self._table(
            "PATCH" if merge else "PUT", path,
            {"Accept": JSON_ACCEPT, "Content-Type": JSON, "If-Match": etag},
            _entity_to_json(entity), (204,), f"updating {table}")
        return {"etag": headers.get("ETag", "")}

    async def transaction(self, table: str, ops: list[tuple[str, Mapping[str, Any], str]]
                          ) -> str:
        """An entity-group transaction (one partition, at most 100 operations): each op is
        ("create", entity, "") or ("replace", entity, etag). Answers the ETag the first
        op wrote; if one op fails, nothing is written and its error is raised (404, 409
        EntityAlreadyExists, 412 as for a single request). Built and read here, without
        the SDK's multipart machinery, which costs more CPU than the rest of a change."""
        batch, changeset = f"batch_{secrets.token_hex(8)}", f"changeset_{secrets.token_hex(8)}"
        parts: list[bytes] = []
        for kind, entity, etag in ops:
            if kind == "create":
                line = f"POST {self._table_origin}{self._table_path}/{table} HTTP/1.1"
                extra = "Prefer: return-no-content\r\n"
            else:
                path = self._entity_path(table, entity["PartitionKey"], entity["RowKey"])
                line = f"PUT {self._table_origin}{path} HTTP/1.1"
                extra = f"If-Match: {etag}\r\n"
            parts.append((f"--{changeset}\r\nContent-Type: application/http\r\n"
                          f"Content-Transfer-Encoding: binary\r\n\r\n{line}\r\n"
                          f"Content-Type: {JSON}\r\nAccept: {JSON_ACCEPT}\r\n"
                          f"DataServiceVersion: 3.0\r\n{extra}\r\n").encode()
                         + _entity_to_json(entity) + b"\r\n")
        body = (f"--{batch}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n"
                ).encode() + b"".join(parts) + f"--{changeset}--\r\n--{batch}--\r\n".encode()
        what = f"writing to {table}"
        status, headers, content, lost = await self._send(
            "table", "POST", self._table_origin, f"{self._table_path}/$batch", {},
            {"Accept": JSON_ACCEPT, "Content-Type": f"multipart/mixed; boundary={batch}",
             "DataServiceVersion": "3.0", "MaxDataServiceVersion": "3.0;NetFx"},
            body, what)
        self._check(status, headers, content, (202,), what, lost)
        text = content.decode("utf-8", "replace")
        answers = _BATCH_STATUS.findall(text)
        failed = next((int(a) for a in answers if not 200 <= int(a) < 300), None)
        if failed is not None or not answers:
            code = _BATCH_CODE.search(text)
            raise RequestFailed(what, failed or 500, code.group(1) if code else str(failed), lost)
        first = _BATCH_ETAG.search(text)
        return first.group(1).strip() if first else ""

    # -- queues ----------------------------------------------------------------------

    async def _queue(self, method: str, name: str, suffix: str, query: dict[str, str],
                     body: bytes | None, ok: tuple[int, ...], what: str
                     ) -> tuple[Mapping[str, str], bytes, bool]:
        """The answer's headers and body, and whether an attempt before it may have been
        applied unanswered."""
        path = f"{self._queue_path}/{name}/messages{suffix}"
        headers = {"Content-Type": "application/xml"} if body is not None else {}
        # Receiving and updating hand out new pop receipts. Received again after a lost
        # answer, the messages of the lost one stay invisible until their timeout (then
        # they are received again); updated again, the message answers that the receipt
        # no longer matches (``after_lost_answer``: the caller holds it no more).
        status, answer, content, lost = await self._send(
            "queue", method, self._queue_origin, path, query, headers, body, what)
        self._check(status, answer, content, ok, what, lost)
        return answer, content, lost

    async def put_message(self, name: str, text: str, visibility: int | None,
                          ttl: int | None) -> QueueMessage:
        query = {}
        if visibility:
            query["visibilitytimeout"] = str(visibility)
        if ttl is not None:
            query["messagettl"] = str(ttl)
        _, content, _ = await self._queue("POST", name, "", query, _message_xml(text), (201,),
                                          f"adding a message to {name}")
        [message] = _messages(content)
        return QueueMessage(message.message_id, message.pop_receipt, text, 0)

    async def update_message(self, name: str, message_id: str, pop_receipt: str,
                             visibility: int, text: str | None) -> str:
        query = {"popreceipt": pop_receipt, "visibilitytimeout": str(visibility)}
        headers, _, _ = await self._queue(
            "PUT", name, f"/{quote(message_id, safe='')}", query,
            _message_xml(text) if text is not None else None, (204,),
            f"updating message {message_id} in {name}")
        return headers.get("x-ms-popreceipt", "")

    async def delete_message(self, name: str, message_id: str, pop_receipt: str) -> None:
        await self._queue("DELETE", name, f"/{quote(message_id, safe='')}",
                          {"popreceipt": pop_receipt}, None, (204,),
                          f"deleting message {message_id} from {name}")

    async def receive_messages(self, name: str, count: int, visibility: int
                               ) -> tuple[list[QueueMessage], bool]:
        """The messages received, and whether an attempt before the one answered may have
        received others, which nobody heard of: they stay hidden for ``visibility``."""
        _, content, lost = await self._queue(
            "GET", name, "", {"numofmessages": str(count), "visibilitytimeout": str(visibility)},
            None, (200,), f"receiving messages from {name}")
        return _messages(content), lost


class _HttpDate:
    """``formatdate(usegmt=True)``, the date of a request, made once a second: it names
    whole seconds, and a request's signature covers it."""

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def __call__(self) -> str:
        second = int(time.time())
        if second != self._second:
            self._second, self._text = second, formatdate(second, usegmt=True)
        return self._text


_http_date = _HttpDate()


def _message_xml(text: str) -> bytes:
    return (f'<?xml version="1.0" encoding="utf-8"?><QueueMessage><MessageText>{escape(text)}'
            "</MessageText></QueueMessage>").encode()


def _messages(content: bytes) -> list[QueueMessage]:
    return [QueueMessage(m.findtext("MessageId", ""), m.findtext("PopReceipt", ""),
                         m.findtext("MessageText", ""), int(m.findtext("DequeueCount", "0") or 0))
            for m in ET.fromstring(content).findall("QueueMessage")]


_BATCH_STATUS = re.compile(r"^HTTP/1\.1 (\d{3})", re.MULTILINE)
_BATCH_CODE = re.compile(r'"code"\s*:\s*"([^"]+)"')
_BATCH_ETAG = re.compile(r"^ETag:\s*(.+?)\r?$", re.MULTILINE | re.IGNORECASE)


def _entity_to_json(entity: Mapping[str, Any]) -> bytes:
    body: dict[str, Any] = {}
    for name, value in entity.items():
        if isinstance(value, EntityProperty):
            edm = str(getattr(value.edm_type, "value", value.edm_type))
            value = value.value
            if edm == "Edm.Int64":
                body[f"{name}@odata.type"] = edm
                value = str(value)
            elif edm == "Edm.DateTime":
                body[f"{name}@odata.type"] = edm
                value = _fmt_time(value)
        elif isinstance(value, datetime):
            body[f"{name}@odata.type"] = "Edm.DateTime"
            value = _fmt_time(value)
        elif isinstance(value, int) and not isinstance(value, bool) and \
                not -2 ** 31 <= value < 2 ** 31:
            body[f"{name}@odata.type"] = "Edm.Int64"
            value = str(value)
        body[name] = value
    return json.dumps(body, separators=(",", ":")).encode()


def _fmt_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# A query's continuation: the answer's headers, and the query parameters that follow it.
_CONTINUATION = (("NextPartitionKey", "x-ms-continuation-NextPartitionKey"),
                 ("NextRowKey", "x-ms-continuation-NextRowKey"))


def odata_string(value: str) -> str:
    """``value`` as a string literal of an OData filter."""
    return "'" + value.replace("'", "''") + "'"


def _parse_time(text: str) -> datetime:
    whole, _, fraction = text.rstrip("Z").partition(".")
    moment = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return moment.replace(microsecond=int((fraction + "000000")[:6])) if fraction else moment


def _entity_from_json(data: Mapping[str, Any], etag: str) -> Entity:
    entity = Entity()
    entity.metadata = {"etag": etag or data.get("odata.etag", "")}
    for name, value in data.items():
        if name.startswith("odata.") or "@odata." in name:
            continue
        edm = data.get(f"{name}@odata.type")
        if edm == "Edm.DateTime":
            value = _parse_time(value)
        elif edm == "Edm.Int64":
            value = int(value)
        entity[name] = value
    return entity
