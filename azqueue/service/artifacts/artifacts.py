"""Artifact operations: create, finish, find, list (the rules of docs/workers/artifacts.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from azqueue import errors
from azqueue.events.outbox import EventOutbox
from azqueue.model import artifact as model
from azqueue.model import events
from azqueue.model import timeutil
from azqueue.model.artifact import Artifact
from azqueue.model.task import Task
from azqueue.model.upload import UploadGrant, UploadSigner
from azqueue.service.artifacts.uploads import (MEMORY, MIN_RATE, READ_TIMEOUT, RUN_MEMORY,
                                               UploadReceiver)
from azqueue.service.common import paging
from azqueue.storage.account import StorageAccount
from azqueue.storage.artifacts import ArtifactStore, name_fits
from azqueue.storage.blobs import BlobStore
from azqueue.storage.taskrows import outbox_row
from azqueue.storage.tasks import TaskStore

UPLOAD_URL_LIFETIME = timedelta(minutes=30)
DOWNLOAD_URL_LIFETIME = timedelta(minutes=10)
MAX_LINK_DEPTH = 10
MAX_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class Target:
    """Where a getArtifact goes: a URL to redirect to, or the error artifact itself;
    ``names`` are the artifacts read on the way (the one asked for first, links followed)."""

    artifact: Artifact
    names: tuple[str, ...]
    url: str = ""


__all__ = ["ArtifactService", "name_fits"]


class ArtifactService:
    """Artifacts of a task's runs: records in the task's partition, content in Blob storage."""

    def __init__(self, account: StorageAccount, tasks: TaskStore, signer: UploadSigner,
                 root_url: str, outbox: EventOutbox,
                 upload_read_timeout: float = READ_TIMEOUT,
                 upload_memory: int = MEMORY, upload_run_memory: int = RUN_MEMORY,
                 upload_min_rate: int = MIN_RATE) -> None:
        """``signer`` signs the ``putUrl`` of s3 artifacts, which point at ``root_url``
        (the service's public root URL); a PUT to one that sends nothing for
        ``upload_read_timeout`` seconds, or falls behind ``upload_min_rate`` bytes a
        second on average with that long to spare, is cut off; the PUTs under way hold at
        most ``upload_memory`` bytes in all, those of one run ``upload_run_memory``."""
        self.tasks = tasks
        self.records = ArtifactStore(account, tasks.name)
        self.blobs = BlobStore(account)
        self.outbox = outbox
        self.signer = signer
        self.root_url = root_url
        self.uploads = UploadReceiver(tasks, self.records, self.blobs, signer,
                                      upload_read_timeout, upload_memory,
                                      upload_run_memory, upload_min_rate)

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
            put_url = await self.blobs.upload_url(wanted.blob_name, now, UPLOAD_URL_LIFETIME,
                                                  append=wanted.blob_type == "append")
        async with self.outbox.writing(task_id) as out:
            created = out.events(lambda: events.artifact_created(task, run_id, wanted.info()))
            inserted = await self.records.insert(wanted, [outbox_row(task_id, e)
                                                          for e in created])
            out.wrote(created if inserted else [])
        if not inserted:
            existing = await self.records.get(task_id, run_id, name)
            if existing is not None and model.extends(existing, wanted):
                await self.records.extend(existing, wanted.expires)
            elif existing is None or existing.definition() != wanted.definition():
                raise errors.Conflict(
                    f"artifact {name!r} of run {run_id} of task {task_id} already exists with a "
                    "different definition (storageType, expires, contentType, blobType, ...); "
                    "artifacts cannot be changed, except for a later `expires`")
        if wanted.storage_type == "s3":
            grant = UploadGrant(task_id, run_id, name, wanted.content_type,
                                now + UPLOAD_URL_LIFETIME, body.get("contentLength"))
            return {"storageType": "s3", "putUrl": grant.url(self.root_url,
                                                            self.signer.sign(grant)),
                    "expires": timeutil.fmt(grant.expires), "contentType": grant.content_type}
        if wanted.storage_type == "blob":
            # Asked again with the same definition (an append blob's writer does so before
            # the URL expires), the answer is a fresh putUrl; the record is left as it is.
            content_type = wanted.content_type or "application/octet-stream"
            kind = "AppendBlob" if wanted.blob_type == "append" else "BlockBlob"
            return {"storageType": "blob", "putUrl": put_url,
                    "expires": timeutil.fmt(now + UPLOAD_URL_LIFETIME),
                    "contentType": content_type,
                    "headers": {"x-ms-blob-type": kind, "Content-Type": content_type}}
        # Taskcluster answers reference, link and error artifacts with their type alone.
        return {"storageType": wanted.storage_type}

    async def finish(self, task_id: str, run_id: int, name: str) -> None:
        """Make a ``blob`` artifact readable: its content as it is now, kept in a snapshot
        that is what readers get from then on (a block blob's), or once the run can no
        longer get artifacts (an append blob's: until then readers follow it as it grows,
        and finishing it again records its newer content). Refused once the run can no
        longer get artifacts: the snapshot is taken first and counts only if the run could
        still get them after it, so none holds what was written after that. A blob written
        by a copy is refused (``BlobStore``'s docstring says why)."""
        found = await self.records.get(task_id, run_id, name)
        if found is None:
            raise errors.NotFound(f"run {run_id} of task {task_id} has no artifact {name!r}; "
                                  "create it first")
        if found.storage_type != "blob":
            raise errors.InputError(
                f"artifact {name!r} is a {found.public_type!r} artifact, which has nothing to "
                "finish" + (": it is present once the PUT of its content to putUrl succeeded"
                            if found.storage_type == "s3" else
                            ": it was complete when createArtifact answered"))
        if found.present and found.snapshot and found.blob_type != "append":
            return  # finished: artifacts cannot be changed
        taken = await self.blobs.snapshot(found.blob_name)
        task = await self.tasks.get(task_id)
        model.check_can_create(task, run_id, timeutil.utcnow(), "finished")
        if taken is None:
            raise errors.Conflict(f"artifact {name!r} has no content yet: PUT it to the putUrl "
                                  "from createArtifact, then finish it")
        if taken.copied:
            raise errors.Conflict(
                f"artifact {name!r} was written by a copy (Copy Blob, x-ms-copy-source), which "
                "a blob artifact may not be: its content must be uploaded to the putUrl (Put "
                "Blob, Put Block and Put Block List, or Append Block). Upload it again, then "
                "finish it again" + (" (readers get what it held when it was last finished)"
                                     if found.present else ""))
        if found.snapshot < taken.id:  # snapshot ids are times: a later one holds more
            await self.records.mark_present(found, taken.content_type, taken.id)

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
        """Follow links to the artifact to serve, with a short-lived URL for its content.
        Gone (410) if it, or an artifact on the way, is past its ``expires``: as in
        Taskcluster, none is served once expired, though the expiry resolver deletes it
        later (its info and the listings show it until then)."""
        seen = [name]
        found = self._unexpired(await self.find(task_id, run_id, name))
        while found.storage_type == "link":
            if len(seen) > MAX_LINK_DEPTH or found.link in seen:
                raise errors.InputError(f"artifact {name!r} links in a loop or too deep: "
                                      + " -> ".join([*seen, found.link]))
            seen.append(found.link)
            found = self._unexpired(await self.find(task_id, run_id, found.link))
        names = tuple(seen)
        if found.storage_type == "reference":
            fault = model.url_fault(found.url)
            if fault:  # stored before such URLs were refused
                raise errors.Conflict(f"artifact {found.name!r} is a reference whose URL "
                                      f"{fault}; it cannot be served")
            return Target(found, names, found.url)
        if found.has_content:
            if not found.present and not (found.storage_type == "s3"
                                          and await self._uploaded(found)):
                raise errors.NotFound(f"artifact {found.name!r} has not been uploaded yet: "
                                      "its content is PUT to the putUrl createArtifact answered")
            now = timeutil.utcnow()
            snapshot = found.snapshot
            if found.blob_type == "append" and await self._growing(found, now) and \
                    not await self.blobs.copied(found.blob_name):
                snapshot = ""  # the blob as it grows, unless a copy replaced it
            return Target(found, names, await self.blobs.download_url(
                found.blob_name, now, DOWNLOAD_URL_LIFETIME, found.info()["contentType"],
                snapshot))
        return Target(found, names)

    @staticmethod
    def _unexpired(artifact: Artifact) -> Artifact:
        if artifact.expires <= timeutil.utcnow():
            raise errors.Gone(f"artifact {artifact.name!r} of run {artifact.run_id} of task "
                              f"{artifact.task_id} expired at {timeutil.fmt(artifact.expires)}")
        return artifact

    async def _growing(self, artifact: Artifact, now: datetime) -> bool:
        """Whether an append blob is still written (its run can get artifacts), so that
        readers follow the blob itself rather than what was last finished."""
        try:
            model.check_can_create(await self.tasks.get(artifact.task_id), artifact.run_id, now)
        except errors.Conflict:
            return False
        return True

    async def _uploaded(self, artifact: Artifact) -> bool:
        """Whether an s3 artifact not yet marked present has its content after all (an
        upload whose server stopped between committing the content and marking it)."""
        content_type = await self.blobs.content_type(artifact.blob_name)
        if content_type is None:
            return False
        await self.records.mark_present(artifact, content_type)
        return True

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
