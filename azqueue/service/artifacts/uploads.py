"""Receiving an ``s3`` artifact's content: the plain ``PUT`` to ``putUrl``
(docs/workers/artifacts.md).

Promises:

* Nothing is written unless the grant is genuine and unexpired, the declared
  ``Content-Type`` and ``Content-Length`` are what it allows, the artifact exists (as
  ``s3``) and its run may still get artifacts: "Artifacts can be uploaded until
  reportCompleted or reportFailed is called" (docs/workers/artifacts.md), or for 20 minutes after an
  exception, the rule of createArtifact. An upload under way when the run is reported
  is finished.
* The body is never held whole: it is staged in blocks of ``BLOCK_SIZE`` with at most
  ``PARALLEL`` blocks in flight, so a request holds those and the block being read. A
  body of at most ``SINGLE_PUT`` is stored in a single request.
* The content appears whole or not at all: only the final Put Block List (or the single
  Put Blob) makes it the blob, and only once exactly ``Content-Length`` bytes arrived.
  A body that ends early stages blocks nobody commits (Azure discards them after a week).
  Block ids carry a random per-upload part, so two uploads of one artifact at once cannot
  mix their blocks: the blob is one of them, whole. Writing a blob discards its
  uncommitted blocks, so of two overlapping uploads the first to finish wins and the
  other answers 409 having stored nothing.
* Once the content is committed the artifact is marked present; a PUT of the same
  artifact again (a retry) replaces the content with its own, like S3.
* One upload of an artifact at a time: a PUT while another of the same artifact is
  under way is refused (409) before anything is read: at once when the other is in this
  process, else when the artifact's row bears the other's mark (``begin_upload``), which
  its server moves on while it runs and clears when it ends; the mark of a server that
  stopped lapses after ``UPLOAD_MARK``. (Two PUTs that read the row at once: one of them
  writes its mark first, and the other's conditional write fails, reads again and sees it.)
* What the uploads of a process hold is bounded as a whole: each takes, before its
  body is read, the buffers it may need (``footprint``) out of ``memory`` bytes, and gives
  them back when it ends; a PUT that finds too few left is refused (503 ``Busy``, with
  ``Retry-After``) before anything is read.
* One run cannot hold the others' share: the uploads of one run (of one task) take at most
  ``run_memory`` bytes of that in all, so a worker holding one claim cannot fill the
  process's buffers, however it sends; a PUT beyond is refused (503 ``Busy``) before
  anything is read. Its first upload is always let in (if the process has room), so a
  ``run_memory`` smaller than one ``footprint`` still lets a run upload one at a time.
* An upload keeps its buffers only while it keeps sending: besides being cut off after
  ``read_timeout`` seconds without a byte, one is cut off once it falls behind an
  average of ``min_rate`` bytes a second with ``read_timeout`` seconds to spare, that is
  once the time spent waiting for its body exceeds ``read_timeout + received /
  min_rate`` (Apache's ``mod_reqtimeout`` ``MinRate``). Only time spent waiting for the
  body counts, not time spent waiting for Blob storage. A body trickling a byte at a
  time is so cut off within about ``read_timeout`` seconds; it stores nothing, its client
  is answered 400 if it still listens, and its buffers are given back before that answer
  is written.
* The bytes stored are the bytes sent: a body with a ``Content-Encoding`` (scriptworker
  gzips its logs) is stored as it came, counted against the ``Content-Length`` it was
  sent with, and served back with that ``Content-Encoding``, as S3 does.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from azqueue import errors
from azqueue.model import timeutil
from azqueue.model import artifact as rules
from azqueue.model.artifact import Artifact
from azqueue.model.task import Task
from azqueue.model.upload import UploadGrant, UploadSigner
from azqueue.storage.artifacts import ArtifactStore
from azqueue.storage.blobs import BlobStore
from azqueue.storage.tasks import TaskStore

BLOCK_SIZE = 4 * 1024 * 1024
# The longest body stored with one Put Blob (longer ones are staged as blocks, one block
# up to BLOCK_SIZE): the SDK hands Put Blob's body to aiohttp as bytes, and aiohttp warns
# (ResourceWarning) of bodies over 1 MiB given so, which a test suite that turns warnings
# into errors (as pytest's ``filterwarnings = error`` does) answers with a 500.
SINGLE_PUT = 1024 * 1024
PARALLEL = 4
# Azure allows 50,000 committed blocks per blob.
MAX_LENGTH = 50_000 * BLOCK_SIZE
# Seconds a body may send nothing before the upload is cut off, storing nothing (the
# default of AZQUEUE_UPLOAD_READ_TIMEOUT).
READ_TIMEOUT = 60.0
# How long the mark of an upload under way lasts on the artifact's row unless moved on (its
# server moves it on every third of that while the upload runs).
UPLOAD_MARK = timedelta(seconds=60)
# The bytes a process's uploads may hold in all (the default of AZQUEUE_UPLOAD_MEMORY_MIB).
MEMORY = 256 * 1024 * 1024
# The bytes the uploads of one run may hold of that (the default of
# AZQUEUE_UPLOAD_RUN_MEMORY_MIB): three bodies over 4 MiB, or many smaller ones.
RUN_MEMORY = 64 * 1024 * 1024
# The average bytes a second an upload must keep up, with READ_TIMEOUT seconds to spare
# (the default of AZQUEUE_UPLOAD_MIN_RATE_KIB): about 128 kbit/s, which a worker on a slow
# link, or sending a few uploads at once over one, keeps above.
MIN_RATE = 16 * 1024


def footprint(content_length: int) -> int:
    """The bytes an upload of ``content_length`` may hold at once: the block it reads,
    and the blocks in flight."""
    if content_length <= BLOCK_SIZE:
        return content_length
    return (PARALLEL + 1) * BLOCK_SIZE

Read = Callable[[int], Awaitable[bytes]]


def _media_type(value: str) -> str:
    return ";".join(part.strip() for part in value.split(";")).lower()


class UploadReceiver:
    """Checks a PUT to a ``putUrl`` against its grant and streams its body into Blob storage."""

    def __init__(self, tasks: TaskStore, records: ArtifactStore, blobs: BlobStore,
                 signer: UploadSigner, read_timeout: float = READ_TIMEOUT,
                 memory: int = MEMORY, run_memory: int = RUN_MEMORY,
                 min_rate: int = MIN_RATE) -> None:
        self.tasks = tasks
        self.read_timeout = read_timeout
        self.memory = memory
        self.run_memory = run_memory
        self.min_rate = min_rate
        self.records = records
        self.blobs = blobs
        self.signer = signer
        self._under_way: set[tuple[str, int, str]] = set()
        self.held = 0  # bytes the uploads under way took
        self.held_by_run: dict[tuple[str, int], int] = {}  # the same, run by run

    @contextmanager
    def _admitted(self, grant: UploadGrant, content_length: int) -> Iterator[None]:
        """The upload's turn: Conflict if another of the artifact is under way here, Busy
        if the uploads under way of its run, or of all runs, hold too much to take its
        ``footprint`` too."""
        key = (grant.task_id, grant.run_id, grant.name)
        if key in self._under_way:
            raise errors.Conflict(
                f"another upload of artifact {grant.name!r} of run {grant.run_id} of task "
                f"{grant.task_id} is under way: one upload of an artifact at a time. Wait "
                "for it to end (one that sends nothing is cut off after "
                f"{self.read_timeout:g} s) and PUT again")
        need = footprint(content_length)
        run = (grant.task_id, grant.run_id)
        by_run = self.held_by_run.get(run, 0)
        if by_run and by_run + need > self.run_memory:
            raise errors.Busy(
                f"the uploads of run {grant.run_id} of task {grant.task_id} under way on this "
                f"server already hold the buffers one run may "
                f"({self.run_memory // (1024 * 1024)} MiB, AZQUEUE_UPLOAD_RUN_MEMORY_MIB); "
                f"nothing was stored: PUT again in {errors.Busy.RETRY_AFTER} s, or upload "
                "fewer artifacts at once")
        if self.held + need > self.memory:
            raise errors.Busy(
                f"this server is receiving as many uploads as it holds buffers for "
                f"({self.memory // (1024 * 1024)} MiB, AZQUEUE_UPLOAD_MEMORY_MIB); nothing was "
                f"stored: PUT again in {errors.Busy.RETRY_AFTER} s")
        self._under_way.add(key)
        self.held += need
        self.held_by_run[run] = by_run + need
        try:
            yield
        finally:
            self._under_way.discard(key)
            self.held -= need
            left = self.held_by_run.pop(run) - need
            if left:
                self.held_by_run[run] = left

    def check(self, grant: UploadGrant, signature: str, content_type: str | None,
              content_length: int | None) -> None:
        """Refuse a request the grant does not allow, before anything is read or written."""
        if not self.signer.verify(grant, signature):
            raise errors.AuthenticationFailed(
                "this upload URL's signature does not match it: use the putUrl exactly as "
                "createArtifact answered it (call createArtifact again for a fresh one)")
        if timeutil.utcnow() >= grant.expires:
            raise errors.AuthenticationFailed(
                f"this upload URL expired at {timeutil.fmt(grant.expires)}: call "
                "createArtifact again (with the same definition) for a fresh putUrl")
        if content_type is None or _media_type(content_type) != _media_type(grant.content_type):
            sent = "there is no Content-Type header" if content_type is None else (
                f"the Content-Type header is {content_type!r}")
            raise errors.InputError(
                f"{sent}, but the artifact was created with contentType "
                f"{grant.content_type!r}: send `Content-Type: {grant.content_type}`")
        if content_length is None:
            raise errors.LengthRequired("the upload has no Content-Length header: send the body's "
                                 "length in bytes as Content-Length (not chunked)")
        if grant.length is not None and content_length != grant.length:
            raise errors.InputError(
                f"Content-Length is {content_length}, but the artifact was created with "
                f"contentLength {grant.length}: send exactly {grant.length} bytes")
        if content_length > MAX_LENGTH:
            raise errors.TooLarge(f"Content-Length is {content_length}; an artifact holds at "
                                  f"most {MAX_LENGTH} bytes")

    async def receive(self, grant: UploadGrant, content_length: int, read: Read,
                      content_encoding: str = "") -> Artifact:
        """Store the body (``read(n)`` gives up to n more bytes, b"" at its end;
        ``content_length`` in all) as the artifact's content, served with
        ``content_encoding`` (empty: none), and mark it present. InputError if the body is
        shorter or longer than that; Conflict or Busy (``_admitted``) before anything is
        read."""
        with self._admitted(grant, content_length):
            return await self._receive(grant, content_length, read, content_encoding)

    async def _receive(self, grant: UploadGrant, content_length: int, read: Read,
                       content_encoding: str) -> Artifact:
        """The upload, once the artifact's row says no other is under way (on any
        replica) and marks this one, until it ends."""
        upload_id = secrets.token_hex(8)
        task, begun = await asyncio.gather(self.tasks.get(grant.task_id),
                                           self._begin(grant, upload_id),
                                           return_exceptions=True)
        if isinstance(begun, BaseException):
            raise begun
        found, other_until = begun
        if found is None:
            if isinstance(task, BaseException):
                raise task
            raise errors.NotFound(f"run {grant.run_id} of task {grant.task_id} has no artifact "
                                  f"{grant.name!r} (it expired, or was never created)")
        if other_until is not None:
            raise errors.Conflict(
                f"another upload of artifact {grant.name!r} of run {grant.run_id} of task "
                f"{grant.task_id} is under way on another server: one upload of an artifact "
                f"at a time. Wait for it to end (one that sends nothing is cut off after "
                f"{self.read_timeout:g} s; one whose server stopped holds the artifact until "
                f"{timeutil.fmt(other_until)}) and PUT again")
        renewing = asyncio.create_task(self._renew(grant, upload_id))
        try:
            if isinstance(task, BaseException):
                raise task
            return await self._store(grant, content_length, read, task, found,
                                     content_encoding)
        finally:
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)
            with contextlib.suppress(errors.StorageError):  # the mark lapses by itself
                await self.records.end_upload(found, timeutil.utcnow())

    async def _begin(self, grant: UploadGrant, upload_id: str
                     ) -> tuple[Artifact | None, datetime | None]:
        now = timeutil.utcnow()
        return await self.records.begin_upload(grant.task_id, grant.run_id, grant.name,
                                               upload_id, now + UPLOAD_MARK, now)

    async def _renew(self, grant: UploadGrant, upload_id: str) -> None:
        """Move the upload's mark on while it runs, so that it lapses only once its
        server is gone."""
        while True:
            await asyncio.sleep(UPLOAD_MARK.total_seconds() / 3)
            with contextlib.suppress(errors.StorageError):
                await self._begin(grant, upload_id)

    async def _store(self, grant: UploadGrant, content_length: int, read: Read, task: Task,
                     found: Artifact, content_encoding: str) -> Artifact:
        rules.check_can_create(task, grant.run_id, timeutil.utcnow(), "uploaded")
        if found.storage_type != "s3":
            raise errors.Conflict(f"artifact {grant.name!r} is a {found.storage_type!r} "
                                  "artifact, not s3: it has no content to upload")
        body = _Body(read, content_length, self.read_timeout, self.min_rate)
        if content_length <= SINGLE_PUT:
            data = await body.take(content_length)
            await body.end()
            await self.blobs.put(found.blob_name, data, grant.content_type, content_encoding)
        else:
            await self._blocks(found, grant.content_type, content_encoding, body)
        if not found.present:
            await self.records.mark_present(found, grant.content_type)
        return found

    async def _blocks(self, artifact: Artifact, content_type: str, content_encoding: str,
                      body: _Body) -> None:
        nonce = secrets.token_hex(8)
        ids: list[str] = []
        staging: set[asyncio.Task[None]] = set()
        try:
            while body.remaining:
                block = await body.take(min(BLOCK_SIZE, body.remaining))
                if len(staging) >= PARALLEL:
                    done, staging = await asyncio.wait(staging,
                                                       return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()  # a failed stage fails the upload
                ids.append(f"{nonce}-{len(ids):06d}")
                staging.add(asyncio.create_task(
                    self.blobs.stage(artifact.blob_name, ids[-1], block)))
            await body.end()
            await asyncio.gather(*staging)
        finally:  # after a failure: stop staging, and collect what the stages raised
            for task in staging:
                task.cancel()
            await asyncio.gather(*staging, return_exceptions=True)
        if not await self.blobs.commit(artifact.blob_name, ids, content_type, content_encoding):
            raise errors.Conflict(
                f"another upload of artifact {artifact.name!r} finished while this one was "
                "under way; the content is that upload's, whole, and nothing of this one was "
                "stored: PUT again to replace it")


class _Body:
    """A request body of a known length, read in pieces of exactly the size asked for;
    InputError once a read waits ``timeout`` seconds without a byte, or once the time
    spent waiting for it all exceeds ``timeout`` plus a second per ``min_rate`` bytes
    received."""

    def __init__(self, read: Read, length: int, timeout: float, min_rate: int) -> None:
        self._given = read
        self.length = length
        self.remaining = length
        self.timeout = timeout
        self.min_rate = min_rate
        self.received = 0
        self.waited = 0.0  # seconds spent waiting for the body

    def _too_slow(self) -> errors.InputError:
        return errors.InputError(
            f"the body arrived at less than {self.min_rate / 1024:g} KiB/s on average "
            f"(AZQUEUE_UPLOAD_MIN_RATE_KIB, with {self.timeout:g} s to spare): "
            f"{self.received} of the {self.length} bytes its Content-Length announced in "
            f"{self.waited:.0f} s; nothing was stored: send the body faster, or fewer "
            "uploads at once over a slow link")

    async def _read(self, size: int) -> bytes:
        spare = self.timeout + self.received / self.min_rate - self.waited
        if spare <= 0:
            raise self._too_slow()
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(min(self.timeout, spare)):
                chunk = await self._given(size)
        except TimeoutError:
            self.waited += loop.time() - started
            if spare < self.timeout:
                raise self._too_slow() from None
            raise errors.InputError(
                f"the body sent nothing for {self.timeout:g} s after {self.received} of the "
                f"{self.length} bytes its Content-Length announced; nothing was stored: "
                "send the whole body without pausing") from None
        self.waited += loop.time() - started
        self.received += len(chunk)
        return chunk

    async def take(self, size: int) -> bytes:
        chunks: list[bytes] = []
        got = 0
        while got < size:
            chunk = await self._read(size - got)
            if not chunk:
                raise errors.InputError(
                    f"the body ended after {self.length - self.remaining + got} of the "
                    f"{self.length} bytes its Content-Length announced; nothing was stored")
            chunks.append(chunk)
            got += len(chunk)
        self.remaining -= size
        return b"".join(chunks)

    async def end(self) -> None:
        if await self._read(1):
            raise errors.InputError(f"the body is longer than the {self.length} bytes its "
                                    "Content-Length announced; nothing was stored")
