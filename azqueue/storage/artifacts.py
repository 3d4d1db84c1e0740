"""Artifact records in Azure Tables.

PartitionKey = taskId, RowKey = ``<runId as 4 digits>/<name>`` key-encoded, so one run's
artifacts are one contiguous key range, listed in name order.
"""

from __future__ import annotations

from typing import Any

from azure.core import MatchConditions
from azure.data.tables import UpdateMode

from azqueue.model.artifact import Artifact
from azqueue.storage import keys
from azqueue.storage.account import StorageAccount
from azqueue.storage.errors import EntityExists, EntityNotFound, translate


def _row(run_id: int, name: str) -> str:
    return keys.encode(f"{run_id:04d}/{name}")


def _to_entity(a: Artifact) -> dict[str, Any]:
    return {"PartitionKey": a.task_id, "RowKey": _row(a.run_id, a.name), "runId": a.run_id,
            "name": a.name, "storageType": a.storage_type, "expires": a.expires,
            "contentType": a.content_type, "url": a.url, "link": a.link, "reason": a.reason,
            "message": a.message, "present": a.present}


def _from_entity(e: Any) -> Artifact:
    return Artifact(task_id=e["PartitionKey"], run_id=int(e["runId"]), name=e["name"],
                    storage_type=e["storageType"], expires=e["expires"],
                    content_type=e.get("contentType", ""), url=e.get("url", ""),
                    link=e.get("link", ""), reason=e.get("reason", ""),
                    message=e.get("message", ""), present=bool(e.get("present")))


class ArtifactStore:
    def __init__(self, account: StorageAccount) -> None:
        self.name = account.table_name("artifacts")
        self._service = account.tables
        self._table = account.tables.get_table_client(self.name)

    async def ensure(self) -> None:
        with translate(f"creating table {self.name}"):
            await self._service.create_table_if_not_exists(self.name)

    async def insert(self, artifact: Artifact) -> bool:
        try:
            with translate(f"creating artifact {artifact.name}"):
                await self._table.create_entity(_to_entity(artifact))
        except EntityExists:
            return False
        return True

    async def get(self, task_id: str, run_id: int, name: str) -> Artifact | None:
        try:
            with translate(f"reading artifact {name}"):
                entity = await self._table.get_entity(task_id, _row(run_id, name))
        except EntityNotFound:
            return None
        return _from_entity(entity)

    async def mark_present(self, artifact: Artifact, content_type: str) -> None:
        with translate(f"finishing artifact {artifact.name}"):
            await self._table.update_entity(
                {"PartitionKey": artifact.task_id, "RowKey": _row(artifact.run_id, artifact.name),
                 "present": True, "contentType": content_type},
                mode=UpdateMode.MERGE, match_condition=MatchConditions.Unconditionally)

    async def list(self, task_id: str, run_id: int, after: str | None,
                   limit: int) -> tuple[list[Artifact], str | None]:
        """Up to ``limit`` artifacts of the run in name order after RowKey ``after``; the
        RowKey to continue after, if there may be more."""
        low = after or keys.encode(f"{run_id:04d}/")
        high = keys.encode(f"{run_id:04d}0")  # "0" follows "/" in ASCII
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
