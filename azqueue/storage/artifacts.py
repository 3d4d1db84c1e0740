"""Artifact records in Azure Tables, in the task's partition of the tasks table.

PartitionKey = taskId, RowKey = ``artifact:<runId as 4 digits>/<name>`` key-encoded, so
one run's artifacts are one contiguous key range, listed in name order; sharing the
task's partition lets an artifact and its artifact-created outbox row be written in one
transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.data.tables import UpdateMode

from azqueue.errors import NotFound
from azqueue.model.artifact import Artifact
from azqueue.storage import keys
from azqueue.storage.account import StorageAccount
from azqueue.storage.errors import (EntityExists, EntityNotFound, ETagMismatch,
                                    TransactionConflict, translate)


PREFIX = "artifact:"
# The properties marking an s3 artifact's upload under way (``begin_upload``): its id,
# and when the mark lapses unless it is moved on.
UPLOAD_ID = "uploadId"
UPLOADING_UNTIL = "uploadingUntil"


# Azure Table keys hold at most 512 characters (1 KiB of UTF-16).
MAX_KEY = 512
# Room for run numbers up to 99999 in a key.
RUN_DIGITS = 5


def _row(run_id: int, name: str) -> str:
    return PREFIX + keys.encode(f"{run_id:04d}/{name}")


def name_fits(name: str) -> bool:
    """Whether an artifact of this name can be stored: its key, percent-encoded, within
    Azure's limit."""
    return len(PREFIX + keys.encode(f"{'9' * RUN_DIGITS}/{name}")) <= MAX_KEY


def _to_entity(a: Artifact) -> dict[str, Any]:
    return {"PartitionKey": a.task_id, "RowKey": _row(a.run_id, a.name), "runId": a.run_id,
            "name": a.name, "storageType": a.storage_type, "expires": a.expires,
            "contentType": a.content_type, "url": a.url, "link": a.link, "reason": a.reason,
            "message": a.message, "present": a.present, "blobType": a.blob_type,
            "snapshot": a.snapshot}


def _from_entity(e: Any) -> Artifact:
    return Artifact(task_id=e["PartitionKey"], run_id=int(e["runId"]), name=e["name"],
                    storage_type=e["storageType"], expires=e["expires"],
                    content_type=e.get("contentType", ""), url=e.get("url", ""),
                    link=e.get("link", ""), reason=e.get("reason", ""),
                    message=e.get("message", ""), present=bool(e.get("present")),
                    blob_type=e.get("blobType", "block" if e["storageType"] == "blob" else ""),
                    snapshot=e.get("snapshot", ""))


class ArtifactStore:
    """Artifact rows in the tasks table (see the module docstring)."""

    def __init__(self, account: StorageAccount, table_name: str) -> None:
        self._table = account.tables.get_table_client(table_name)

    async def insert(self, artifact: Artifact, outbox: list[dict[str, Any]]) -> bool:
        """Store a new artifact with its outbox rows; False if it already exists."""
        try:
            with translate(f"creating artifact {artifact.name}"):
                if outbox:
                    await self._table.submit_transaction(
                        [("create", _to_entity(artifact)), *(("create", row) for row in outbox)])
                else:
                    await self._table.create_entity(_to_entity(artifact))
        except (EntityExists, TransactionConflict):
            return False
        return True

    async def expired(self, now: datetime) -> list[Artifact]:
        """Artifacts whose ``expires`` is before ``now`` (a scan of the whole table)."""
        with translate("looking for expired artifacts"):
            return [_from_entity(e) async for e in self._table.query_entities(
                "RowKey ge @low and RowKey lt @high and expires lt @now",
                parameters={"low": PREFIX, "high": PREFIX[:-1] + ";", "now": now})]

    async def delete(self, artifact: Artifact) -> None:
        try:
            with translate(f"deleting artifact {artifact.name}"):
                await self._table.delete_entity(artifact.task_id,
                                                _row(artifact.run_id, artifact.name))
        except EntityNotFound:
            pass

    async def get(self, task_id: str, run_id: int, name: str) -> Artifact | None:
        try:
            with translate(f"reading artifact {name}"):
                entity = await self._table.get_entity(task_id, _row(run_id, name))
        except EntityNotFound:
            return None
        return _from_entity(entity)

    async def begin_upload(self, task_id: str, run_id: int, name: str, upload_id: str,
                           until: datetime, now: datetime
                           ) -> tuple[Artifact | None, datetime | None]:
        """Mark the artifact as receiving upload ``upload_id`` until ``until``, unless
        another upload's mark is on it and ends after ``now``: the artifact (None if there
        is none), and the end of the other upload's mark (None once the mark is ours).
        Asked again with the same ``upload_id``, it moves the mark's end."""
        row = _row(run_id, name)
        while True:
            try:
                with translate(f"reading artifact {name}"):
                    entity = await self._table.get_entity(task_id, row)
            except EntityNotFound:
                return None, None
            other, other_until = entity.get(UPLOAD_ID, ""), entity.get(UPLOADING_UNTIL)
            if other and other != upload_id and other_until is not None and other_until > now:
                return _from_entity(entity), other_until
            try:
                with translate(f"marking artifact {name} as being uploaded"):
                    await self._table.update_entity(
                        {"PartitionKey": task_id, "RowKey": row, UPLOAD_ID: upload_id,
                         UPLOADING_UNTIL: until},
                        mode=UpdateMode.MERGE, etag=entity.metadata["etag"],
                        match_condition=MatchConditions.IfNotModified)
            except ETagMismatch:
                continue
            except EntityNotFound:
                return None, None
            return _from_entity(entity), None

    async def end_upload(self, artifact: Artifact, now: datetime) -> None:
        """Clear the mark of the upload under way (``begin_upload``)."""
        try:
            with translate(f"marking artifact {artifact.name} as uploaded"):
                await self._table.update_entity(
                    {"PartitionKey": artifact.task_id,
                     "RowKey": _row(artifact.run_id, artifact.name), UPLOAD_ID: "",
                     UPLOADING_UNTIL: now},
                    mode=UpdateMode.MERGE, match_condition=MatchConditions.Unconditionally)
        except EntityNotFound:
            pass

    async def mark_present(self, artifact: Artifact, content_type: str,
                           snapshot: str = "") -> None:
        """Mark the artifact present with ``content_type``; a ``blob`` artifact with the
        ``snapshot`` of its content that readers are served."""
        fields: dict[str, Any] = {"present": True, "contentType": content_type}
        if snapshot:
            fields["snapshot"] = snapshot
        try:
            with translate(f"finishing artifact {artifact.name}"):
                await self._table.update_entity(
                    {"PartitionKey": artifact.task_id,
                     "RowKey": _row(artifact.run_id, artifact.name), **fields},
                    mode=UpdateMode.MERGE, match_condition=MatchConditions.Unconditionally)
        except EntityNotFound:
            raise NotFound(f"artifact {artifact.name!r} of {artifact.task_id}/{artifact.run_id} "
                           "is gone (it expired)") from None

    async def extend(self, artifact: Artifact, expires: datetime) -> None:
        """Make the artifact expire at ``expires`` unless it already expires as late or
        later (two extensions at once leave the later one)."""
        row = _row(artifact.run_id, artifact.name)
        while True:
            try:
                with translate(f"reading artifact {artifact.name}"):
                    entity = await self._table.get_entity(artifact.task_id, row)
            except EntityNotFound:
                raise NotFound(f"artifact {artifact.name!r} of {artifact.task_id}/"
                               f"{artifact.run_id} is gone (it expired)") from None
            if _from_entity(entity).expires >= expires:
                return
            try:
                with translate(f"extending artifact {artifact.name}"):
                    await self._table.update_entity(
                        {"PartitionKey": artifact.task_id, "RowKey": row, "expires": expires},
                        mode=UpdateMode.MERGE, etag=entity.metadata["etag"],
                        match_condition=MatchConditions.IfNotModified)
            except (ETagMismatch, EntityNotFound):
                continue
            return

    async def list(self, task_id: str, run_id: int, after: str | None,
                   limit: int) -> tuple[list[Artifact], str | None]:
        """Up to ``limit`` artifacts of the run in name order after RowKey ``after``; the
        RowKey to continue after, if there may be more."""
        low = after or _row(run_id, "")
        high = PREFIX + keys.encode(f"{run_id:04d}0")  # "0" sorts after "%" of "%2F"
        found: list[Artifact] = []
        last: str | None = None
        with translate(f"listing artifacts of {task_id}/{run_id}"):
            pages = self._table.query_entities(
                "PartitionKey eq @pk and RowKey gt @low and RowKey lt @high",
                parameters={"pk": task_id, "low": low, "high": high},
                results_per_page=limit).by_page()
            async for page in pages:
                async for entity in page:
                    found.append(_from_entity(entity))
                    last = entity["RowKey"]
                    if len(found) >= limit:
                        return found, last
        return found, None
