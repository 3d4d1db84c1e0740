"""Artifact operations: create, finish, find, list (source document 003's rules)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from azqueue import errors
from azqueue.events.outbox import Outbox
from azqueue.model import artifact as model
from azqueue.model import events
from azqueue.model import timeutil
from azqueue.model.artifact import Artifact
from azqueue.model.task import Task
from azqueue.service import paging
from azqueue.storage.account import StorageAccount
from azqueue.storage.artifacts import ArtifactStore, name_fits
from azqueue.storage.blobs import BlobStore
from azqueue.storage.tasks import TaskStore, outbox_row

UPLOAD_URL_LIFETIME = timedelta(minutes=30)
DOWNLOAD_URL_LIFETIME = timedelta(minutes=10)
MAX_LINK_DEPTH = 10
MAX_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class Target:
    """Where a getArtifact goes: a URL to redirect to, or the error artifact itself."""

    artifact: Artifact
    url: str = ""


__all__ = ["ArtifactService", "name_fits"]


class ArtifactService:
    """Artifacts of a task's runs: records in the task's partition, content in Blob storage."""

    def __init__(self, account: StorageAccount, tasks: TaskStore,
                 outbox: Outbox | None = None) -> None:
        self.tasks = tasks
        self.records = ArtifactStore(account, tasks.name)
        self.blobs = BlobStore(account)
        self.outbox = outbox

    async def setup(self) -> None:
        await self.blobs.ensure()

    async def create(self, task_id: str, run_id: int, name: str,
                     body: dict[str, Any]) -> dict[str, Any]:
        now = timeutil.utcnow()
        task = await self.tasks.get(task_id)
        task.run(run_id)
        wanted = model.from_request(task, run_id, name, body)
        model.check_can_create(task, run_id, now)
        put_url = ""
        if wanted.storage_type == "blob":  # signed first: a refusal must write nothing
            put_url = await self.blobs.upload_url(wanted.blob_name, now, UPLOAD_URL_LIFETIME)
        trigger = await self.outbox.begin(task_id) if self.outbox else None
        outbox = [outbox_row(task_id, events.artifact_created(task, run_id, wanted.info()))
                  ] if trigger else []
        inserted = await self.records.insert(wanted, outbox)
        if trigger and self.outbox:
            await self.outbox.finish(task_id, trigger)
        if not inserted:
            existing = await self.records.get(task_id, run_id, name)
            if existing is None or existing.definition() != wanted.definition():
                raise errors.Conflict(
                    f"artifact {name!r} of run {run_id} of task {task_id} already exists with a "
                    "different definition; artifacts cannot be changed")
        answer: dict[str, Any] = {"storageType": wanted.storage_type,
                                  "expires": timeutil.fmt(wanted.expires)}
        if wanted.storage_type == "blob":
            content_type = wanted.content_type or "application/octet-stream"
            answer.update(
                putUrl=put_url,
                expires=timeutil.fmt(now + UPLOAD_URL_LIFETIME), contentType=content_type,
                headers={"x-ms-blob-type": "BlockBlob", "Content-Type": content_type})
        return answer

    async def finish(self, task_id: str, run_id: int, name: str) -> None:
        found = await self.records.get(task_id, run_id, name)
        if found is None:
            raise errors.NotFound(f"run {run_id} of task {task_id} has no artifact {name!r}; "
                                  "create it first")
        if found.storage_type != "blob" or found.present:
            return
        content_type = await self.blobs.content_type(found.blob_name)
        if content_type is None:
            raise errors.Conflict(f"artifact {name!r} has no content yet: PUT it to the putUrl "
                                  "from createArtifact, then finish it")
        await self.records.mark_present(found, content_type)

    async def _task(self, task_id: str) -> Task:
        return await self.tasks.get(task_id)

    async def latest_run(self, task_id: str) -> int:
        task = await self._task(task_id)
        if not task.runs:
            raise errors.NotFound(f"task {task_id} has no runs yet, so no artifacts")
        return len(task.runs) - 1

    async def find(self, task_id: str, run_id: int, name: str) -> Artifact:
        found = await self.records.get(task_id, run_id, name)
        if found is None:
            await self._task(task_id)  # a missing task is named as such
            raise errors.NotFound(f"run {run_id} of task {task_id} has no artifact {name!r}")
        return found

    async def target(self, task_id: str, run_id: int, name: str) -> Target:
        """Follow links to the artifact to serve, with a short-lived URL for its content."""
        seen = []
        found = await self.find(task_id, run_id, name)
        while found.storage_type == "link":
            seen.append(found.name)
            if len(seen) > MAX_LINK_DEPTH or found.link in seen:
                raise errors.Conflict(f"artifact {name!r} links in a loop or too deep: "
                                      + " -> ".join(seen))
            found = await self.find(task_id, run_id, found.link)
        if found.storage_type == "reference":
            return Target(found, found.url)
        if found.storage_type == "blob":
            if not found.present:
                raise errors.NotFound(f"artifact {found.name!r} has not been uploaded yet")
            return Target(found, await self.blobs.download_url(
                found.blob_name, timeutil.utcnow(), DOWNLOAD_URL_LIFETIME))
        return Target(found)

    async def list(self, task_id: str, run_id: int, continuation: str | None,
                   limit: int | None) -> dict[str, Any]:
        task = await self._task(task_id)
        if run_id >= len(task.runs):
            raise errors.NotFound(f"task {task_id} has no run {run_id}")
        after = paging.after(continuation)
        page, last = await self.records.list(task_id, run_id, after,
                                             min(limit or MAX_LIMIT, MAX_LIMIT))
        answer: dict[str, Any] = {"artifacts": [a.info() for a in page]}
        if last is not None:
            answer["continuationToken"] = paging.token(last)
        return answer
