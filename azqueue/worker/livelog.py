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
3. Each Append Block carries ``x-ms-blob-condition-appendpos: <offset>`` and is sent
   again after Azure's routine failures (``azqueue.worker.retry``: 500, 503, timeouts,
   dropped connections, with a bounded backoff). An attempt may have been applied
   whatever answer follows it, so until an append succeeds every attempt sends the very
   same bytes at the same offset: a ``412 AppendPositionConditionNotMet`` then means that
   an earlier one was applied after all, so the offset moves past it and no byte is ever
   written twice. (The putUrl has no read permission, so the blob's length is not read
   instead.)
4. The putUrl lives 30 minutes: ``createArtifact`` with the same definition is asked
   again ``REFRESH_MARGIN`` before it expires (or after a 403), for a fresh one.
5. Readers of the resolved run get the log as it was last finished, whatever is written
   to the blob after (a putUrl outlives the run): ``finishArtifact`` is called again
   once the rest is appended (``close()``), and every ``FINISH_EVERY`` while appends go
   on, so a run resolved by someone else (cancelTask, its deadline) keeps most of its log.

Failures while the command runs, once the retries of one append are used up, are logged
as warnings and tried again at the next tick: a run never fails because one append
failed. ``close()`` appends the rest and raises ``LogNotWritten`` (the run then ends
``intermittent-task``) if the log cannot be written whole then. ``append()`` adds bytes
that are in no file (the reason a run failed, ``TaskRun.end_log``) after the rest.

A handler streams a file of its own this way (``LiveLog(run, LOG_ARTIFACT, fd,
content_type)``, as ``azqueue.worker.shell`` does), or writes ``run.log``, which
``HandlerLog`` streams alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
from datetime import UTC, datetime, timedelta

from azqueue.worker import client, retry
from azqueue.worker.errors import LogNotWritten, RequestFailed
from azqueue.worker.run import LOG_ARTIFACT, LOG_CONTENT_TYPE, TaskRun

log = logging.getLogger(__name__)

CHUNK = 4 * 1024 * 1024  # Azure's largest Append Block before API version 2022-11-02
REFRESH_MARGIN = timedelta(minutes=5)
FINISH_EVERY = timedelta(minutes=1)
# The pauses between the last tries to append the rest of a log, once the command ended.
FINAL_PAUSES = (1.0, 3.0)

__all__ = ["HandlerLog", "LiveLog", "LogNotWritten"]


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
        self.run.log_appender = self.append
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

    async def append(self, data: bytes) -> None:
        """Append ``data``, bytes that are in no file, after the whole file once
        ``close()`` has appended it, and finish the log again; ``LogNotWritten`` if it
        cannot be done."""
        if self._doubt:
            raise LogNotWritten(f"{self.name}: the file's last append is still unsettled")
        await self._create(final=True)
        for start in range(0, len(data), CHUNK):
            await self._append(data[start:start + CHUNK], final=True)
        await self._finish_again()

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
            answer = await retry.send(self.run.session, "PUT", self._put_url,
                                      "creating the log blob",
                                      headers={**self._headers, "If-None-Match": "*"},
                                      body=lambda: io.BytesIO(b""))
            if answer.status not in (201, 409):
                raise self._fail(f"creating the log blob answered {answer.status}: "
                                 f"{answer.code}", final)
            await self.run.queue.finishArtifact(self.run.task_id, self.run.run_id, self.name, {})
        except RequestFailed as e:
            raise self._fail(str(e), final) from None
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
        """Append ``data`` at ``offset``, sent again after Azure's routine failures
        (``azqueue.worker.retry``). Any attempt may have been applied whatever the answer
        that follows it (the HTTP client itself sends a PUT again after a dropped
        connection), so ``_doubt`` holds the length of ``data`` until an answer settles
        it: the next attempt, in this call or a later one, sends the very same bytes at
        the same offset, and 412 ``AppendPositionConditionNotMet`` then means they are
        there (nobody else appends to this blob)."""
        self._doubt = len(data)
        what = f"appending {len(data)} bytes at {self.offset}"
        try:
            answer = await retry.send(
                self.run.session, "PUT", self._put_url + "&comp=appendblock", what,
                headers={"x-ms-blob-condition-appendpos": str(self.offset)},
                body=lambda: io.BytesIO(data))
        except RequestFailed as e:
            raise self._fail(str(e), final) from None
        if answer.status == 201 or (answer.status == 412
                                    and answer.code == "AppendPositionConditionNotMet"):
            self.offset += len(data)
            self.appends += 1
            self._doubt = 0
            return
        if answer.status in (401, 403):
            self._expires = datetime.min.replace(tzinfo=UTC)  # ask for a fresh putUrl
        raise self._fail(f"{what} answered {answer.status}: {answer.code}", final)


class HandlerLog:
    """Streams what a handler writes to ``run.log`` (``azqueue.worker.run.RunLog``) to the
    run's ``LOG_ARTIFACT`` with a ``LiveLog``, from the first write on (made on the
    worker's loop, whatever thread wrote); ``close()`` appends the rest once the handler
    is over. A log that cannot be written is a warning: the run's outcome stands."""

    def __init__(self, run: TaskRun) -> None:
        self.run = run
        self._live: LiveLog | None = None
        self._follower: asyncio.Future[None] | None = None
        loop = asyncio.get_running_loop()

        def first_write() -> None:
            loop.call_soon_threadsafe(self._begin)

        run.log.on_first_write = first_write

    def _begin(self) -> None:
        fd = self.run.log.fileno()
        if self._live is not None or fd is None:
            return
        self._live = LiveLog(self.run, LOG_ARTIFACT, fd, LOG_CONTENT_TYPE)
        self._follower = asyncio.ensure_future(self._follow(self._live))

    async def _follow(self, live: LiveLog) -> None:
        await live.start()
        await live.follow(self.run.log_interval)

    async def close(self) -> None:
        """Append what is left; the reason the run ended goes after it (``end_log``)."""
        self._begin()  # a first write whose call to _begin has not come yet
        if self._live is None or self._follower is None:
            return
        self._live.stop()
        await self._follower
        try:
            await self._live.close()
        except LogNotWritten as e:
            log.warning("task %s/%d: %s", self.run.task_id, self.run.run_id, e)
