"""Artifacts and the rules for creating them (see docs/workers/artifacts.md).

* ``s3``: content a worker PUTs to ``putUrl`` with only ``Content-Type`` and
  ``Content-Length`` (docs/workers/artifacts.md); the queue receives it (``azqueue.model.upload``)
  and the artifact is present once that PUT succeeded: there is nothing to finish.
  ``reference``: a URL; ``link``: another artifact of the same run; ``error``: a reason
  and a message, answered with 424.
* ``blob`` (ours, for workers that can send Azure's headers): content uploaded straight
  to Azure Blob storage through a SAS ``putUrl``, then finished with finishArtifact.
  ``blobType`` ``block`` (the default): the content is PUT whole; ``append``: an empty
  append blob is PUT, finished at once (readers then see what has been appended so far)
  and grown with Append Block, as a live log is. Readers see either as ``s3``: what
  clients read is Taskcluster's vocabulary only. The putUrl outlives the run, so readers
  are served a snapshot taken at finishArtifact (a block blob's at once; an append blob's
  once the run can no longer get artifacts, the snapshot of its last finishArtifact) with
  the content type recorded then; finishArtifact follows the rule of createArtifact.
* ``object`` needs Taskcluster's object service, which this queue does not have: 400.
* Artifacts can be created while the run is running, and for 20 minutes after it was
  resolved exception; never after completed or failed ("Artifacts can be uploaded until
  reportCompleted or reportFailed is called").
* ``expires`` may not be later than the task's.
* Creating the same artifact again with the same definition is harmless; with a later
  ``expires`` and nothing else changed it extends the artifact's life, as Taskcluster's
  createArtifact allows; with any other difference (an earlier ``expires`` included) it
  is a conflict.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from azqueue.errors import Conflict, InputError
from azqueue.model import timeutil
from azqueue.model.task import RunState, Task

AFTER_EXCEPTION = timedelta(minutes=20)


@dataclass(frozen=True, slots=True)
class Artifact:
    task_id: str
    run_id: int
    name: str
    storage_type: str
    expires: datetime
    content_type: str = ""
    url: str = ""
    link: str = ""
    reason: str = ""
    message: str = ""
    present: bool = True
    blob_type: str = ""  # a blob's: "block" or "append"; "" for the other types
    snapshot: str = ""  # a finished blob's: the snapshot of its content readers get

    @property
    def public_type(self) -> str:
        """The storage type as clients read it: Taskcluster's (a ``blob`` is ``s3``)."""
        return "s3" if self.storage_type == "blob" else self.storage_type

    @property
    def has_content(self) -> bool:
        """Whether the content lives in Blob storage (``s3`` and ``blob``)."""
        return self.storage_type in ("s3", "blob")

    @property
    def blob_name(self) -> str:
        return f"{self.task_id}/{self.run_id}/{self.name}"

    def definition(self) -> dict[str, Any]:
        """What the creator asked for: equal definitions make createArtifact idempotent."""
        return {"storageType": self.storage_type, "expires": timeutil.fmt(self.expires),
                "contentType": self.content_type, "url": self.url, "artifact": self.link,
                "reason": self.reason, "message": self.message, "blobType": self.blob_type}

    def info(self) -> dict[str, Any]:
        return {"storageType": self.public_type, "name": self.name,
                "expires": timeutil.fmt(self.expires),
                "contentType": self.content_type or _DEFAULT_TYPES[self.storage_type]}


_DEFAULT_TYPES = {"s3": "application/octet-stream", "blob": "application/octet-stream",
                  "reference": "application/octet-stream", "link": "application/octet-stream",
                  "error": "application/json"}


_FIELDS = {"s3": {"contentType", "contentLength"}, "blob": {"contentType", "blobType"},
           "reference": {"url", "contentType"}, "link": {"artifact", "contentType"},
           "error": {"reason", "message"}}


def url_fault(url: str) -> str | None:
    """What makes ``url`` unfit for a reference artifact, whose URL readers are redirected
    to (a ``Location`` header): None if nothing does. A URL is printable ASCII without
    spaces; a control character (CR, LF) would end the header."""
    bad = next((i for i, c in enumerate(url) if not "!" <= c <= "~"), None)
    if bad is None:
        return None
    return (f"holds {url[bad]!r} at position {bad}: a URL is printable ASCII without spaces "
            "or control characters; percent-encode anything else")


def from_request(task: Task, run_id: int, name: str, body: dict[str, Any]) -> Artifact:
    """The artifact a (schema-valid) createArtifact body describes, or InputError."""
    kind = body["storageType"]
    if kind == "object":
        raise InputError(
            "storageType 'object' needs Taskcluster's object service, which this queue does "
            "not run: create the artifact with storageType 's3' and PUT its content to the "
            "putUrl in the answer (with Content-Type and Content-Length)")
    extra = sorted(set(body) - _FIELDS[kind] - {"storageType", "expires"})
    if extra:
        raise InputError(f"{', '.join(f'`{f}`' for f in extra)} cannot be given with storageType "
                         f"{kind!r}; it takes {', '.join(sorted(_FIELDS[kind]))}")
    fault = url_fault(body.get("url", "")) if kind == "reference" else None
    if fault:
        raise InputError(f"`url` {body['url'][:100]!r} {fault}")
    try:
        expires = timeutil.parse(body["expires"])
    except ValueError as e:
        raise InputError(f"`expires`: {e}") from None
    if expires > task.expires:
        raise InputError(f"`expires` ({body['expires']}) is later than the task's expires "
                         f"({task.definition['expires']}); artifacts may not outlive their task")
    return Artifact(
        task_id=task.task_id, run_id=run_id, name=name, storage_type=kind, expires=expires,
        content_type=body.get("contentType", ""), url=body.get("url", ""),
        link=body.get("artifact", ""), reason=body.get("reason", ""),
        message=body.get("message", ""), present=kind not in ("s3", "blob"),
        blob_type=body.get("blobType", "block") if kind == "blob" else "")


def extends(existing: Artifact, wanted: Artifact) -> bool:
    """Whether ``wanted`` is ``existing`` asked for again with a later ``expires`` and
    nothing else changed: createArtifact then extends the artifact's life."""
    same = {**wanted.definition(), "expires": ""} == {**existing.definition(), "expires": ""}
    return same and wanted.expires > existing.expires


def check_can_create(task: Task, run_id: int, now: datetime, action: str = "created") -> None:
    """Conflict unless run ``run_id`` may get artifacts (``action``: created or uploaded)."""
    run = task.run(run_id)
    if run.state is RunState.RUNNING:
        return
    if run.state is RunState.EXCEPTION and run.resolved and now < run.resolved + AFTER_EXCEPTION:
        return
    if run.state is RunState.EXCEPTION:
        raise Conflict(f"run {run_id} of task {task.task_id} was resolved exception more than "
                       f"20 minutes ago; artifacts can no longer be {action}")
    raise Conflict(f"run {run_id} of task {task.task_id} is {run.state}; artifacts can only be "
                   f"{action} while it runs (or within 20 minutes of an exception)")
