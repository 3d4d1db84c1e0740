"""Task definitions and the few queue API calls a test or benchmark makes over a plain
(Hawk-signed, see ``azqueue.testing.hawk``) aiohttp session: create a task, read its
status, any other call whose answer must be 200."""

from __future__ import annotations

import asyncio
import base64
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp


class UnexpectedAnswer(AssertionError):
    """The queue answered other than 200: the message has the status and the body. An
    AssertionError, so that a test fails on it as on its own asserts."""


def slugid() -> str:
    """A v4 slugid as Taskcluster makes them (the pattern wants a 'nice' first bit)."""
    raw = bytearray(uuid.uuid4().bytes)
    raw[0] &= 0x7F
    return base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


def iso(moment: datetime) -> str:
    """``moment`` as the queue writes times: UTC, milliseconds, ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def definition(task_queue_id: str = "prov/wt", *, priority: str | None = None,
               deadline: timedelta = timedelta(hours=1), **extra: Any) -> dict[str, Any]:
    """A task created now for ``task_queue_id``, due after ``deadline``, at ``priority``
    (by default none given: the queue's default, ``lowest``), with a small payload; any
    field of ``extra`` replaces or adds to it (``payload={}``, ``dependencies=[...]``)."""
    now = datetime.now(UTC)
    body: dict[str, Any] = {
        "taskQueueId": task_queue_id,
        "created": iso(now),
        "deadline": iso(now + deadline),
        "payload": {"command": ["true"]},
        "metadata": {"name": "test", "description": "a test task", "owner": "tests@example.com",
                     "source": "https://example.com/tests"},
    }
    if priority:
        body["priority"] = priority
    body.update(extra)
    return body


async def create(http: aiohttp.ClientSession, api: str, body: dict[str, Any] | None = None,
                 task_id: str | None = None, *, attempts: int = 1,
                 busy: list[str] | None = None) -> str:
    """createTask (``body`` by default ``definition()``, ``task_id`` by default a new
    slugid); the task's id. A 503 (storage unavailable) is tried again after its
    Retry-After, as the official client does, up to ``attempts`` tries in all, each noted
    in ``busy`` (the start of its body); any other answer but 200 is ``UnexpectedAnswer``."""
    task_id = task_id or slugid()
    for attempt in range(1, attempts + 1):
        async with http.put(f"{api}/task/{task_id}", json=body or definition()) as r:
            if r.status == 200:
                return task_id
            text = await r.text()
            if r.status != 503 or attempt == attempts:
                raise UnexpectedAnswer(f"createTask answered {r.status}: {text}")
            if busy is not None:
                busy.append(text[:300])
            delay = float(r.headers.get("Retry-After", "1"))
        await asyncio.sleep(delay)
    raise ValueError(f"attempts must be 1 or more, not {attempts}")


async def call(http: aiohttp.ClientSession, method: str, url: str,
               body: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON answer of ``method url`` (with ``body`` as JSON); ``UnexpectedAnswer``
    unless it is 200."""
    async with http.request(method, url, json=body) as r:
        if r.status != 200:
            raise UnexpectedAnswer(f"{method} {url} answered {r.status}: {await r.text()}")
        data: dict[str, Any] = await r.json()
        return data


async def status(http: aiohttp.ClientSession, api: str, task_id: str) -> dict[str, Any]:
    """The task's status structure (``status`` of the task's status answer)."""
    data: dict[str, Any] = (await call(http, "GET", f"{api}/task/{task_id}/status"))["status"]
    return data
