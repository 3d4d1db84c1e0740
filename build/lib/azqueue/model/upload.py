"""Upload grants: what an ``s3`` artifact's ``putUrl`` allows, and its signature.

Workers upload (docs/workers/artifacts.md) an ``s3`` artifact with a plain ``PUT`` of the
bytes to ``putUrl``, sending only ``Content-Type`` and ``Content-Length``. Azure Blob
storage refuses a PUT without ``x-ms-blob-type``, so ``putUrl`` points at the queue
itself, which streams the body into a block blob. The URL is a capability: an
HMAC-SHA256 signature binds it to one artifact (taskId, runId, name), its declared
content type, the length declared at createArtifact (if any) and an expiry, so it can
neither be used after it expires nor changed to write anything else.

The signing keys are derived (HKDF) from the tip secrets, so no new secret needs to be
configured and a tip signature can never pass as an upload signature or the other way
round. As with tips, the first secret signs and every one verifies (rotation).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote, urlencode

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from azqueue.model.signing import Macs

_KEY_INFO = b"azqueue artifact upload URL v1"
# Where uploads are received, under the service's public root URL.
PATH = "/api/queue/v1/artifact-upload"


@dataclass(frozen=True, slots=True)
class UploadGrant:
    """The right to PUT the content of one ``s3`` artifact until ``expires``."""

    task_id: str
    run_id: int
    name: str
    content_type: str
    expires: datetime
    length: int | None = None  # the contentLength declared at createArtifact, if any

    def text(self) -> bytes:
        """The signed text: every field, unambiguously (a JSON list)."""
        return json.dumps(["upload", self.task_id, self.run_id, self.name, self.content_type,
                           int(self.expires.timestamp()), self.length],
                          separators=(",", ":")).encode()

    def url(self, root_url: str, signature: str) -> str:
        """The ``putUrl``: ``<root>/api/queue/v1/artifact-upload/<taskId>/<runId>/<name>``
        with the rest of the grant and its signature in the query."""
        query = {"contentType": self.content_type, "expires": int(self.expires.timestamp())}
        if self.length is not None:
            query["length"] = self.length
        query["signature"] = signature
        return (f"{root_url}{PATH}/{self.task_id}/{self.run_id}/{quote(self.name, safe='')}"
                f"?{urlencode(query)}")

    @classmethod
    def from_query(cls, task_id: str, run_id: int, name: str,
                   query: Mapping[str, str]) -> tuple[UploadGrant, str]:
        """The grant and signature a ``putUrl``'s query carries; ValueError naming what
        is missing or malformed."""
        try:
            expires = datetime.fromtimestamp(int(query["expires"]), UTC)
            length = int(query["length"]) if "length" in query else None
            return cls(task_id, run_id, name, query["contentType"], expires,
                       length), query["signature"]
        except KeyError as e:
            raise ValueError(f"the query parameter {e} is missing") from None
        except (ValueError, OverflowError, OSError) as e:
            raise ValueError(f"a query parameter is malformed: {e}") from None


class UploadSigner:
    """Signs upload grants with a key derived from the newest tip secret; verifies them
    with keys derived from every one."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        if not secrets:
            raise ValueError("at least one secret is needed")
        self._macs = Macs(tuple(
            HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_KEY_INFO)
            .derive(s.encode()) for s in secrets))

    def sign(self, grant: UploadGrant) -> str:
        return self._macs.sign(grant.text())

    def verify(self, grant: UploadGrant, signature: str) -> bool:
        """Constant-time check of ``signature`` against every configured secret."""
        return self._macs.verify(grant.text(), signature)
