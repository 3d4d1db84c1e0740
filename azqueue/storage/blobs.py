"""Artifact content in Azure Blob storage: one container, reached through SAS URLs.

Uploaders get a URL with only create and write permission (and add, to append to an
append blob); readers a read-only one. Both are short-lived, signed with the account key or, with azure-identity, a user
delegation key. Blob names are ``<taskId>/<runId>/<artifact name>``.

Create and write let an uploader replace the blob, set its properties and snapshot it for
as long as its URL lives, whatever became of the run. What is finished is therefore read
from a snapshot (``snapshot``): a snapshot is read-only, and deleting one needs the delete
permission no upload URL has. A read URL of a snapshot grants that snapshot alone, not the
blob, and states the content type it is served with.

Create and write also allow Copy Blob and Copy Blob From URL (``x-ms-copy-source``) into
the blob, and a copy's source in the same account may be authorized by the destination's
signature alone (Azurite copies any blob of its account so): a putUrl could copy another
task's private artifact. A blob written by a copy says so in its properties (its copy id,
status and source, kept by its snapshots), and is never served (``Snapshot.copied``,
``copied``); writing it again with Put Blob, Put Block List or Set Blob Properties clears
them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from io import BytesIO
from typing import Any, NamedTuple
from urllib.parse import quote

from azure.core.exceptions import HttpResponseError
from azure.storage.blob import (BlobBlock, BlobSasPermissions, ContentSettings, CorsRule,
                                generate_blob_sas)

from azqueue.errors import ConfigError, NotConfigured
from azqueue.storage.account import StorageAccount
from azqueue.storage.errors import EntityExists, EntityNotFound, translate

SAS_START_SLACK = timedelta(minutes=5)
# What a page may read of an answer to a (Range) GET of a blob, besides the basics.
CORS_EXPOSED = ["content-range", "content-length", "content-type", "x-ms-blob-type"]
MAX_CORS_RULES = 5  # Azure's limit per service


def _origins(rule: CorsRule) -> list[str]:
    return sorted(o.strip() for o in str(rule.allowed_origins).split(","))


def _fields(rule: CorsRule) -> tuple[str, ...]:
    return tuple(str(getattr(rule, f)).lower().replace(" ", "") for f in (
        "allowed_origins", "allowed_methods", "allowed_headers", "exposed_headers",
        "max_age_in_seconds"))


class Snapshot(NamedTuple):
    """A snapshot taken of a blob: its id, its content type, and whether what it holds
    was written by a copy (Copy Blob or Copy Blob From URL)."""

    id: str
    content_type: str
    copied: bool


def _settings(content_type: str, content_encoding: str) -> ContentSettings:
    return ContentSettings(content_type=content_type,
                           content_encoding=content_encoding or None)


def _copied(props: Any) -> bool:
    copy = props.copy
    return bool(copy.id or copy.status or copy.source)


class BlobStore:
    """Artifact content in the blob container, and the signed URLs to it."""

    def __init__(self, account: StorageAccount) -> None:
        self._account = account
        self.container = account.queue_name("artifacts")
        self._client = account.blobs.get_container_client(self.container)

    async def ensure(self) -> None:
        try:
            with translate(f"creating container {self.container}"):
                await self._client.create_container()
        except EntityExists:
            pass

    async def _url(self, blob: str, permission: BlobSasPermissions, now: datetime,
                   lifetime: timedelta, snapshot: str = "", content_type: str = "") -> str:
        signing: dict[str, Any]
        if self._account.account_key:
            signing = {"account_key": self._account.account_key}
        elif self._account.uses_identity:
            signing = {"user_delegation_key": await self._account.user_delegation_key(now)}
        else:
            raise NotConfigured("artifact URLs need the storage account key or azure-identity "
                                "to sign blob SAS URLs; configure a connection string with "
                                "AccountKey, or one with neither AccountKey nor "
                                "SharedAccessSignature to sign in with azure-identity")
        if content_type:
            signing["content_type"] = content_type  # rsct: the Content-Type answered
        sas = generate_blob_sas(self._account.account_name, self.container, blob,
                                snapshot=snapshot or None, permission=permission,
                                start=now - SAS_START_SLACK, expiry=now + lifetime, **signing)
        query = f"snapshot={quote(snapshot)}&{sas}" if snapshot else sas
        return self._account.public_url("blob", f"{self._client.url}/{quote(blob)}?{query}")

    async def upload_url(self, blob: str, now: datetime, lifetime: timedelta,
                         append: bool = False) -> str:
        """A URL to create and write ``blob``; with ``append``, to add blocks to it too
        (Append Block needs the ``a`` permission)."""
        return await self._url(blob, BlobSasPermissions(create=True, write=True, add=append),
                               now, lifetime)

    async def download_url(self, blob: str, now: datetime, lifetime: timedelta,
                           content_type: str, snapshot: str = "") -> str:
        """A URL to read ``blob`` (with ``snapshot``, that snapshot of it and nothing else),
        answered with ``Content-Type: content_type`` whatever the blob's properties say."""
        return await self._url(blob, BlobSasPermissions(read=True), now, lifetime,
                               snapshot, content_type)

    async def allow_browsers(self, origins: tuple[str, ...]) -> bool:
        """Let pages of ``origins`` read blobs through the read URLs (a CORS rule for GET
        and HEAD with a Range header, exposing Content-Range and Content-Length) on the
        account's Blob service, so a dashboard can follow a live log. The account's other
        CORS rules are kept; one for exactly these origins is replaced. False if the rule
        was there already (nothing written)."""
        wanted = CorsRule(list(origins), ["GET", "HEAD"], allowed_headers=["range"],
                          exposed_headers=CORS_EXPOSED, max_age_in_seconds=3600)
        service = self._account.blobs
        with translate("reading the Blob service's CORS rules"):
            rules = list((await service.get_service_properties()).get("cors") or [])
        ours = [r for r in rules if _origins(r) == _origins(wanted)]
        if len(ours) == 1 and _fields(ours[0]) == _fields(wanted):
            return False
        kept = [r for r in rules if r not in ours]
        if len(kept) >= MAX_CORS_RULES:
            raise ConfigError(
                f"the storage account's Blob service has {len(kept)} CORS rules already, the "
                "most Azure allows: remove one, or leave AZQUEUE_BLOB_CORS_ORIGINS empty")
        with translate("setting the Blob service's CORS rules"):
            await service.set_service_properties(cors=[*kept, wanted])
        return True

    # Bodies are passed as streams: aiohttp (under the SDK) warns that a large body given
    # as bytes may block the event loop.

    async def put(self, blob: str, data: bytes, content_type: str,
                  content_encoding: str = "") -> None:
        """Store ``data`` as the whole blob in one request (Put Blob), replacing any; it is
        read back with ``content_encoding`` (empty: none) as its Content-Encoding."""
        with translate(f"uploading blob {blob}"):
            await self._client.get_blob_client(blob).upload_blob(
                BytesIO(data), length=len(data), overwrite=True,
                content_settings=_settings(content_type, content_encoding))

    async def stage(self, blob: str, block_id: str, data: bytes) -> None:
        """Stage one block of a blob (Put Block); it is not part of the blob until
        ``commit`` lists it, and Azure discards uncommitted blocks after a week."""
        with translate(f"staging a block of blob {blob}"):
            await self._client.get_blob_client(blob).stage_block(block_id, BytesIO(data),
                                                                 length=len(data))

    async def commit(self, blob: str, block_ids: list[str], content_type: str,
                     content_encoding: str = "") -> bool:
        """Make the blob exactly the staged blocks ``block_ids``, in order (Put Block
        List): the one moment the new content appears, whole. False if some of them are
        gone: writing a blob discards every uncommitted block, so when two uploads of one
        blob overlap, the first to finish wins and the other's blocks are gone."""
        with translate(f"committing blob {blob}"):
            try:
                await self._client.get_blob_client(blob).commit_block_list(
                    [BlobBlock(block_id=b) for b in block_ids],
                    content_settings=_settings(content_type, content_encoding))
            except HttpResponseError as e:
                if getattr(e, "error_code", None) == "InvalidBlockList":
                    return False
                raise
        return True

    async def delete(self, blob: str) -> None:
        try:
            with translate(f"deleting blob {blob}"):
                await self._client.delete_blob(blob, delete_snapshots="include")
        except EntityNotFound:
            pass

    async def delete_all(self, prefix: str) -> None:
        """Delete every blob whose name starts with ``prefix``."""
        with translate(f"listing blobs under {prefix}"):
            names = [b.name async for b in self._client.list_blobs(name_starts_with=prefix)]
        for name in names:
            await self.delete(name)

    async def snapshot(self, blob: str) -> Snapshot | None:
        """Take a snapshot of the blob; None if there is no blob."""
        client = self._client.get_blob_client(blob)
        try:
            with translate(f"taking a snapshot of blob {blob}"):
                taken = str((await client.create_snapshot())["snapshot"])
                props = await self._client.get_blob_client(
                    blob, snapshot=taken).get_blob_properties()
        except EntityNotFound:
            return None
        return Snapshot(taken, str(props.content_settings.content_type or ""), _copied(props))

    async def copied(self, blob: str) -> bool:
        """Whether the blob as it is now was written by a copy (False if there is none)."""
        try:
            with translate(f"reading blob {blob}"):
                props = await self._client.get_blob_client(blob).get_blob_properties()
        except EntityNotFound:
            return False
        return _copied(props)

    async def content_type(self, blob: str) -> str | None:
        """The uploaded blob's content type, or None if nothing was uploaded."""
        try:
            with translate(f"reading blob {blob}"):
                props = await self._client.get_blob_client(blob).get_blob_properties()
        except EntityNotFound:
            return None
        return str(props.content_settings.content_type or "")
