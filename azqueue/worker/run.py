"""One claimed run, as a task handler sees it (``TaskRun``), and the handler's type."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, BinaryIO

import aiohttp
import taskcluster.aio

from azqueue.worker import client
from azqueue.worker.client import Credentials


@dataclass(slots=True)
class TaskRun:
    """One claimed run, as a handler sees it.

    ``task`` is the task definition and ``payload`` its payload; ``queue`` is a client
    with the run's temporary credentials, swapped for new ones at every reclaim;
    ``upload_artifact`` creates, uploads and finishes a blob artifact; ``log_interval``
    is the worker's (seconds between appends to a live log). ``lost`` becomes
    True when the run is no longer this worker's (a reclaim answered 409, or its status
    shows it resolved by someone else; ``lost_because`` says which): the handler is
    then cancelled.
    """

    task_id: str
    run_id: int
    task: dict[str, Any]
    taken_until: datetime
    credentials: Credentials
    root_url: str
    session: aiohttp.ClientSession
    log_interval: float = 2.0
    lost: bool = False
    lost_because: str = ""

    def lose(self, because: str) -> None:
        self.lost, self.lost_because = True, because

    @property
    def payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = self.task.get("payload", {})
        return payload

    @property
    def queue(self) -> taskcluster.aio.Queue:
        """A queue client with the task's current temporary credentials."""
        return client.queue(self.root_url, self.credentials, self.session)

    async def upload_artifact(self, name: str, data: bytes | BinaryIO,
                              content_type: str) -> None:
        """A blob artifact expiring with the task: created, PUT, finished. ``data`` may be
        an open file (read from its current position): it is streamed in chunks, never
        held whole in memory."""
        made = await self.queue.createArtifact(self.task_id, self.run_id, name, {
            "storageType": "blob", "expires": self.task["expires"], "contentType": content_type})
        async with self.session.put(made["putUrl"], data=data, headers=made["headers"]) as r:
            if r.status not in (200, 201):
                raise RuntimeError(f"uploading {name} answered {r.status}: {await r.text()}")
        await self.queue.finishArtifact(self.task_id, self.run_id, name, {})


Handler = Callable[[TaskRun], Awaitable[None]]
