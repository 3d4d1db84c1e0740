"""The worker's view of the queue: the official client, plus the one call it lacks.

``pollTaskUrls`` is not in the official client's API reference any more, so it is made
here as a Hawk-signed GET (mohawk, which the official client itself signs with).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import aiohttp
import mohawk
import taskcluster.aio


@dataclass(frozen=True, slots=True)
class Credentials:
    client_id: str
    access_token: str
    certificate: str | None = None

    def as_options(self) -> dict[str, str]:
        out = {"clientId": self.client_id, "accessToken": self.access_token}
        if self.certificate:
            out["certificate"] = self.certificate
        return out

    @classmethod
    def from_claim(cls, data: dict[str, Any]) -> Credentials:
        token = data["accessToken"]
        return cls(data["clientId"], token.decode() if isinstance(token, bytes) else token,
                   data.get("certificate"))


def queue(root_url: str, credentials: Credentials | None,
          session: aiohttp.ClientSession | None = None) -> taskcluster.aio.Queue:
    options: dict[str, Any] = {"rootUrl": root_url}
    if credentials is not None:
        options["credentials"] = credentials.as_options()
    return taskcluster.aio.Queue(options, session=session)


async def poll_task_urls(session: aiohttp.ClientSession, root_url: str,
                         credentials: Credentials | None, task_queue_id: str) -> dict[str, Any]:
    url = f"{root_url.rstrip('/')}/api/queue/v1/poll-task-url/{task_queue_id}"
    headers = {}
    if credentials is not None:
        ext = None
        if credentials.certificate:
            ext = base64.urlsafe_b64encode(json.dumps(
                {"certificate": json.loads(credentials.certificate)}).encode()).decode()
        sender = mohawk.Sender({"id": credentials.client_id, "key": credentials.access_token,
                                "algorithm": "sha256"}, url, "GET",
                               always_hash_content=False, ext=ext)
        headers["Authorization"] = sender.request_header
    async with session.get(url, headers=headers) as r:
        body: dict[str, Any] = await r.json()
        if r.status != 200:
            raise RuntimeError(f"pollTaskUrls answered {r.status}: {body.get('message')}")
        return body
