"""The worker's view of the queue: the official client, plus the one call it lacks.

* ``Credentials``: a client's or a claim's credentials (temporary ones carry a
  ``certificate``), read from the usual ``TASKCLUSTER_*`` variables (or the token from
  the file ``TASKCLUSTER_ACCESS_TOKEN_FILE`` names) or a claim answer.
* ``queue()``: the official ``taskcluster.aio.Queue`` on a shared aiohttp session; it
  signs with Hawk and retries 5xx answers and connection errors with backoff.
* ``poll_task_urls()``: ``GET poll-task-url/<provisionerId>/<workerType>`` is not in the
  official client's API reference, so it is signed here with mohawk, the library the
  official client signs with, and the client's own Hawk ``ext`` (certificate,
  authorizedScopes).
* ``status_of()``: the HTTP status of any failure the official client raises.
* ``EXPECTED``: the failures a worker expects from the network and the queue (a
  connection dropped, a timeout, an error answer); anything else is a bug, to be logged
  with its traceback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp
import mohawk
import taskcluster.aio
from taskcluster.exceptions import TaskclusterFailure

from azqueue.worker.errors import QueueUnavailable

# What talking to the queue and to Azure can raise without anything being wrong with the
# worker: the official client's failures (an error answer, retries used up), aiohttp's
# (connection refused or dropped, an error status), a timeout, and pollTaskUrls' answer.
EXPECTED: tuple[type[Exception], ...] = (TaskclusterFailure, aiohttp.ClientError, TimeoutError,
                                         QueueUnavailable)


@dataclass(frozen=True, slots=True)
class Credentials:
    """Taskcluster credentials: a client's own, or the temporary ones of a claim.

    :param client_id: the ``clientId``.
    :param access_token: its ``accessToken``.
    :param certificate: the JSON ``certificate`` of temporary credentials (claims and
        reclaims answer those), None for a permanent client.
    """

    client_id: str
    access_token: str = field(repr=False)
    certificate: str | None = field(default=None, repr=False)

    def as_options(self) -> dict[str, str]:
        out = {"clientId": self.client_id, "accessToken": self.access_token}
        if self.certificate:
            out["certificate"] = self.certificate
        return out

    @classmethod
    def from_claim(cls, data: Mapping[str, Any]) -> Credentials:
        """The ``credentials`` of a claimTask, claimWork or reclaimTask answer."""
        token = data["accessToken"]
        return cls(data["clientId"], token.decode() if isinstance(token, bytes) else token,
                   data.get("certificate"))

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Credentials | None:
        """``TASKCLUSTER_CLIENT_ID``/``_ACCESS_TOKEN``/``_CERTIFICATE``; None if unset.

        ``TASKCLUSTER_ACCESS_TOKEN_FILE`` names a file holding the access token instead
        (its first line), so that the token is in no process's environment; ValueError
        saying what is wrong if it cannot be read, or if both are set."""
        client_id = env.get("TASKCLUSTER_CLIENT_ID", "")
        token = env.get("TASKCLUSTER_ACCESS_TOKEN", "")
        token_file = env.get("TASKCLUSTER_ACCESS_TOKEN_FILE", "")
        if token and token_file:
            raise ValueError("set TASKCLUSTER_ACCESS_TOKEN or TASKCLUSTER_ACCESS_TOKEN_FILE, "
                             "not both")
        if token_file:
            token = _read_token(token_file)
        if not client_id or not token:
            return None
        return cls(client_id, token, env.get("TASKCLUSTER_CERTIFICATE") or None)


def _read_token(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ValueError(f"TASKCLUSTER_ACCESS_TOKEN_FILE={path!r}: cannot read it ({why})"
                         ) from None
    if not token:
        raise ValueError(f"TASKCLUSTER_ACCESS_TOKEN_FILE={path!r} is empty: write the access "
                         "token on its first line")
    return token


def queue(root_url: str, credentials: Credentials | None,
          session: aiohttp.ClientSession | None = None) -> taskcluster.aio.Queue:
    options: dict[str, Any] = {"rootUrl": root_url}
    if credentials is not None:
        options["credentials"] = credentials.as_options()
    return taskcluster.aio.Queue(options, session=session)


async def poll_task_urls(session: aiohttp.ClientSession, root_url: str,
                         credentials: Credentials | None, task_queue_id: str,
                         pending: bool = False, wait: float = 0.0,
                         worker: tuple[str, str] | None = None) -> dict[str, Any]:
    """``{expires, queues: [{signedPollUrl, signedDeleteUrl}, ...]}``, highest priority
    first, and with ``pending`` the queue's ``pending: {sampled, queues: [bool, ...], ages: [seconds, ...]}``
    when it gave one (left out if malformed); ``QueueUnavailable`` saying why otherwise.
    With ``wait`` (and ``pending``), the queue answers once a queue holds a visible tip, or
    after that many seconds. ``worker`` (workerGroup, workerId) names the worker that asks,
    so that the queue knows it before its first claim (a queue that does not ignores it)."""
    url = f"{root_url.rstrip('/')}/api/queue/v1/poll-task-url/{task_queue_id}"
    query = []
    if pending:
        query.append("pending=true")
        if wait > 0:
            query.append(f"wait={wait:g}")
    if worker is not None:
        query += [f"workerGroup={worker[0]}", f"workerId={worker[1]}"]
    if query:
        url += "?" + "&".join(query)
    headers = {}
    if credentials is not None:
        ext = queue(root_url, credentials).makeHawkExt()
        sender = mohawk.Sender({"id": credentials.client_id, "key": credentials.access_token,
                                "algorithm": "sha256"}, url, "GET",
                               always_hash_content=False, ext=ext or None)
        headers["Authorization"] = sender.request_header
    async with session.get(url, headers=headers) as r:
        text = await r.text()
        if r.status != 200:
            raise QueueUnavailable(f"pollTaskUrls answered {error_answer(r.status, text)}",
                                   r.status)
    try:
        body: dict[str, Any] = json.loads(text)
        parse_time(body["expires"])
        if not all("signedPollUrl" in q and "signedDeleteUrl" in q for q in body["queues"]):
            raise ValueError("a queue without signedPollUrl/signedDeleteUrl")
    except (ValueError, KeyError, TypeError) as e:
        raise QueueUnavailable(f"pollTaskUrls answered something unexpected: {e!r}") from None
    hint = body.get("pending")
    if hint is not None and not (isinstance(hint, dict) and isinstance(hint.get("queues"), list)
                                 and len(hint["queues"]) == len(body["queues"])
                                 and all(isinstance(v, bool) for v in hint["queues"])
                                 and isinstance(hint.get("ages"), list)
                                 and len(hint["ages"]) == len(body["queues"])
                                 and all(isinstance(v, (int, float)) for v in hint["ages"])):
        del body["pending"]
    return body


def error_answer(status: int, text: str) -> str:
    """``STATUS code: message`` of the queue's JSON error answer (its message's first
    line), else ``STATUS: `` and the answer's first words."""
    try:
        body = json.loads(text)
        code, message = body["code"], str(body.get("message", ""))
    except (ValueError, KeyError, TypeError):
        return f"{status}: {' '.join(text.split())[:300]}"
    return f"{status} {code}: {(message.strip().splitlines() or [''])[0][:300]}"


def status_of(error: BaseException) -> int | None:
    """The HTTP status behind an official-client failure (it raises aiohttp's
    ``ClientResponseError`` once its retries of a 5xx are used up), or None."""
    if isinstance(error, TaskclusterFailure):
        status = getattr(error, "status_code", None)
        return status if isinstance(status, int) else None
    if isinstance(error, aiohttp.ClientResponseError):
        return error.status
    if isinstance(error, QueueUnavailable):
        return error.status
    return None


def code_of(error: BaseException) -> str | None:
    """The ``code`` of the queue's error answer behind an official-client failure (e.g.
    ``WorkerQuarantined``), or None."""
    body = getattr(error, "body", None)
    code = body.get("code") if isinstance(body, dict) else None
    return code if isinstance(code, str) else None


def describe(error: BaseException) -> str:
    """One line about an expected failure: the queue's ``code: message`` when it answered
    one, else what the exception says."""
    body = getattr(error, "body", None)
    if isinstance(body, dict) and body.get("code"):
        message = str(body.get("message", "")).strip().splitlines()
        return f"{status_of(error)} {body['code']}: {message[0] if message else ''}"[:400]
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:400]


def parse_time(value: str) -> datetime:
    """An ISO 8601 timestamp as the queue writes them (``...Z``), timezone-aware."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
