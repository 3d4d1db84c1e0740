"""A live log: a file the worker writes, streamed to an append blob as it grows.

The artifact (``public/logs/live.log`` for ``azqueue.worker.shell``) is a ``blob``
artifact with ``blobType`` ``append``. The protocol, all of it between the worker and
Azure except the two queue calls:

1. ``createArtifact`` answers a SAS ``putUrl`` (create, write and add on that blob) and
   the headers; an empty ``PUT`` with those headers and ``If-None-Match: *`` creates the
   empty append blob (409 ``BlobAlreadyExists``: a retried creation, already done);
   ``finishArtifact`` follows at once, so readers see the log from then on.
2. Every ``interval`` seconds, if the file has grown, what is new is appended in Append
   Blocks (``PUT <putUrl>&comp=appendblock``) of at most ``CHUNK`` bytes read from the
   file, never more: memory stays bounded whatever the log's size. A quiet command costs
   no request.
3. Each Append Block carries ``x-ms-blob-condition-appendpos: <offset>``. After a failed
   append (an error answer, or none) the next attempt sends the very same bytes at the
   same offset: a ``412 AppendPositionConditionNotMet`` then means that the failed one
   was applied after all, so the offset moves past it and no byte is ever written twice.
   (The putUrl has no read permission, so the blob's length is not read instead.)
4. The putUrl lives 30 minutes: ``createArtifact`` with the same definition is asked
   again ``REFRESH_MARGIN`` before it expires (or after a 403), for a fresh one.
5. Readers of the resolved run get the log as it was last finished, whatever is written
   to the blob after (a putUrl outlives the run): ``finishArtifact`` is called again
   once the rest is appended (``close()``), and every ``FINISH_EVERY`` while appends go
   on, so a run resolved by someone else (cancelTask, its deadline) keeps most of its log.

Failures while the command runs are logged as warnings and retried at the next tick:
a run never fails because one append failed. ``close()`` appends the rest and raises
if the log cannot be written whole then.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
from datetime import UTC, datetime, timedelta
import aiohttp

from azqueue.worker import client
from azqueue.worker.worker import TaskRun

log = logging.getLogger(__name__)

CHUNK = 4 * 1024 * 1024  # Azure's largest Append Block before API version 2022-11-02
REFRESH_MARGIN = timedelta(minutes=5)
FINISH_EVERY = timedelta(minutes=1)
# The pauses between the last tries to append the rest of a log, once the command ended.
FINAL_PAUSES = (1.0, 3.0)
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=120, sock_connect=30)


class LogNotWritten(Exception):
    """An append or the creation of the log was refused or got no answer."""


class LiveLog:
    """Streams the file open as ``fd`` to the artifact ``name`` of ``run`` (see the module
    docstring). ``start()`` creates it, ``follow(interval)`` keeps appending until
    ``stop()``, ``close()`` appends the rest. ``offset`` is how many bytes the blob holds;
    ``appends`` counts the Append Blocks that were applied."""

    def __init__(self, run: TaskRun, name: str, fd: int, content_type: str) -> None:
        self.run = run
        self.name = name
        self.fd = fd
        self.content_type = content_type
        self.offset = 0
        self.appends = 0
        self._created = False
        self._put_url = ""
        self._headers: dict[str, str] = {}
        self._expires = datetime.min.replace(tzinfo=UTC)
        self._doubt = 0  # the size of a failed append that may have been applied
        self._stop = asyncio.Event()
        self._finished = datetime.min.replace(tzinfo=UTC)  # when finishArtifact last was

    async def start(self) -> None:
        """Create the artifact and its empty blob, and finish it; a failure is a warning
        (the next tick tries again)."""
        with contextlib.suppress(LogNotWritten):
            await self._create()

    async def follow(self, interval: float) -> None:
        """Append what is new every ``interval`` seconds until ``stop()``."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), interval)
            if self._stop.is_set():
                return
            try:
                await self._append_new()
            except LogNotWritten:
                pass  # warned; the next tick tries again

    def stop(self) -> None:
        self._stop.set()

    async def close(self) -> None:
        """Append the rest of the file and finish the log again, tried once more after each
        of ``FINAL_PAUSES``; ``LogNotWritten`` if it still cannot be done."""
        for pause in FINAL_PAUSES:
            try:
                await self._append_new(final=True)
                await self._finish_again()
                return
            except LogNotWritten as e:
                log.warning("task %s/%d: %s; trying again in %g s", self.run.task_id,
                            self.run.run_id, e, pause)
                await asyncio.sleep(pause)
        await self._append_new(final=True)
        await self._finish_again()

    # -- the protocol ------------------------------------------------------------------

    def _fail(self, what: str, final: bool) -> LogNotWritten:
        if not final:
            log.warning("task %s/%d: %s; trying again in the next interval", self.run.task_id,
                        self.run.run_id, what)
        return LogNotWritten(f"{self.name}: {what}")

    async def _create(self, final: bool = False) -> None:
        """Create the artifact and its blob if not done yet, and renew a putUrl that is
        about to expire."""
        if self._created and datetime.now(UTC) + REFRESH_MARGIN < self._expires:
            return
        try:
            made = await self.run.queue.createArtifact(
                self.run.task_id, self.run.run_id, self.name, {
                    "storageType": "blob", "blobType": "append",
                    "expires": self.run.task["expires"], "contentType": self.content_type})
        except client.EXPECTED as e:
            raise self._fail(f"createArtifact failed: {client.describe(e)}", final) from None
        self._put_url, self._headers = made["putUrl"], dict(made["headers"])
        self._expires = client.parse_time(made["expires"])
        if self._created:
            return
        try:
            async with self.run.session.put(
                    self._put_url, data=b"", headers={**self._headers, "If-None-Match": "*"},
                    timeout=REQUEST_TIMEOUT) as r:
                if r.status not in (201, 409):
                    raise self._fail(f"creating the log blob answered {r.status}: "
                                     f"{_error(r, await r.text())}", final)
            await self.run.queue.finishArtifact(self.run.task_id, self.run.run_id, self.name, {})
        except (aiohttp.ClientError, TimeoutError) as e:
            raise self._fail(f"creating the log blob failed: {e or type(e).__name__}",
                             final) from None
        except client.EXPECTED as e:
            raise self._fail(f"finishArtifact failed: {client.describe(e)}", final) from None
        self._created = True
        self._finished = datetime.now(UTC)

    async def _finish_again(self) -> None:
        """finishArtifact on the whole log: what readers get once the run is resolved."""
        if not self._created:
            return  # nothing was ever written
        try:
            await self.run.queue.finishArtifact(self.run.task_id, self.run.run_id, self.name, {})
        except client.EXPECTED as e:
            raise self._fail(f"finishArtifact failed: {client.describe(e)}", True) from None
        self._finished = datetime.now(UTC)

    async def _append_new(self, final: bool = False) -> None:
        """Append everything the file holds beyond ``offset``, ``CHUNK`` bytes at most per
        request (and in memory)."""
        if os.fstat(self.fd).st_size <= self.offset:
            return  # nothing new: no request (a putUrl about to expire is renewed later)
        await self._create(final)
        while (size := os.fstat(self.fd).st_size) > self.offset:
            length = self._doubt or min(CHUNK, size - self.offset)
            data = await asyncio.to_thread(os.pread, self.fd, length, self.offset)
            await self._append(data, final)
        if not final and datetime.now(UTC) - self._finished >= FINISH_EVERY:
            try:
                await self._finish_again()
            except LogNotWritten as e:
                log.warning("task %s/%d: %s; trying again after the next append",
                            self.run.task_id, self.run.run_id, e)

    async def _append(self, data: bytes, final: bool) -> None:
        retry = self._doubt > 0
        self._doubt = len(data)  # until an answer says otherwise
        try:
            async with self.run.session.put(
                    self._put_url + "&comp=appendblock", data=io.BytesIO(data),
                    timeout=REQUEST_TIMEOUT,
                    headers={"x-ms-blob-condition-appendpos": str(self.offset)}) as r:
                if r.status == 201:
                    self.offset += len(data)
                    self.appends += 1
                    self._doubt = 0
                    return
                text = await r.text()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise self._fail(f"appending {len(data)} bytes at {self.offset} got no answer "
                             f"({e or type(e).__name__})", final) from None
        code = r.headers.get("x-ms-error-code", "")
        if r.status == 412 and code == "AppendPositionConditionNotMet" and retry:
            # These bytes at this offset failed before, and were applied after all.
            self.offset += len(data)
            self.appends += 1
            self._doubt = 0
            return
        if 400 <= r.status < 500 and not retry:
            # Refused: nothing was applied. (A retry's refusal, say a 403 of an expired
            # putUrl, leaves the doubt about the attempt before it as it was.)
            self._doubt = 0
        if r.status in (401, 403):
            self._expires = datetime.min.replace(tzinfo=UTC)  # ask for a fresh putUrl
        raise self._fail(f"appending {len(data)} bytes at {self.offset} answered {r.status}: "
                         f"{_error(r, text)}", final)


def _error(answer: aiohttp.ClientResponse, text: str) -> str:
    """Azure's error code, else the start of the answer."""
    return answer.headers.get("x-ms-error-code") or " ".join(text.split())[:200]

