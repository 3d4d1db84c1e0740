"""Task definitions for tests."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp


def slugid() -> str:
    """A v4 slugid as Taskcluster makes them (the pattern wants a 'nice' first bit)."""
    raw = bytearray(uuid.uuid4().bytes)
    raw[0] &= 0x7F
    return base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def definition(task_queue_id: str = "prov/wt", *, priority: str | None = None,
               deadline: timedelta = timedelta(hours=1), **extra: Any) -> dict[str, Any]:
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
                 task_id: str | None = None) -> str:
    task_id = task_id or slugid()
    async with http.put(f"{api}/task/{task_id}", json=body or definition()) as r:
        assert r.status == 200, await r.text()
    return task_id


async def status(http: aiohttp.ClientSession, api: str, task_id: str) -> dict[str, Any]:
    async with http.get(f"{api}/task/{task_id}/status") as r:
        assert r.status == 200, await r.text()
        data: dict[str, Any] = (await r.json())["status"]
        return data
