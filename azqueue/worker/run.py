"""One claimed run, as a task handler sees it (``TaskRun``), its log (``RunLog``), and the
handler's type.

The run's log is the artifact ``LOG_ARTIFACT`` that the dashboard shows, and the SDK owns
it: a handler writes to it with ``run.log`` (streamed by the worker from the first write
on), or streams a file of its own there with ``azqueue.worker.livelog.LiveLog``;
``upload_artifact`` refuses its name. The reason a run failed or ended in an exception is
written at its end, as Taskcluster's workers do (``TaskRun.end_log``): appended to the
live log, or else uploaded as that artifact, a text of its own."""

from __future__ import annotations

import inspect
import io
import logging
import tempfile
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, BinaryIO

import aiohttp
import taskcluster.aio

from azqueue.worker import client, retry
from azqueue.worker.client import Credentials
from azqueue.worker.errors import RequestFailed, WorkerError

log = logging.getLogger(__name__)

# The run's log, where the reason it failed ends up.
LOG_ARTIFACT = "public/logs/live.log"
LOG_CONTENT_TYPE = "text/plain; charset=utf-8"
NOT_WRITTEN: tuple[type[Exception], ...] = (WorkerError, *client.EXPECTED)


class RunLog:
    """The run's log (``LOG_ARTIFACT``) as a handler writes it: ``write(text)``, str or
    bytes, from any thread, so ``print(..., file=run.log)`` works too. What is written
    goes to a temporary file that the worker streams to the artifact every
    ``log_interval`` seconds from the first write on (a run that writes nothing costs no
    request), the rest once the handler is over, and after it the reason the run failed.
    ``on_first_write`` is the worker's: called, from the writing thread, once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._file: Any = None
        self.on_first_write: Callable[[], None] | None = None

    def write(self, text: str | bytes) -> int:
        data = text.encode() if isinstance(text, str) else bytes(text)
        with self._lock:
            first = self._file is None
            if first:
                self._file = tempfile.TemporaryFile()
            self._file.write(data)
            self._file.flush()  # the worker reads the file by its descriptor
        if first and self.on_first_write is not None:
            self.on_first_write()
        return len(text)

    def flush(self) -> None:
        """Nothing to do: ``write`` hands every byte to the file at once."""

    def fileno(self) -> int | None:
        """The file's descriptor, None until something was written."""
        with self._lock:
            return None if self._file is None else int(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()


@dataclass(slots=True)
class TaskRun:
    """One claimed run, as a handler sees it.

    ``task`` is the task definition and ``payload`` its payload; ``queue`` is a client
    with the run's temporary credentials, swapped for new ones at every reclaim;
    ``upload_artifact`` creates, uploads and finishes a blob artifact; ``log_interval``
    is the worker's (seconds between appends to a live log). ``lost`` becomes
    True when the run is no longer this worker's (a reclaim answered 409, or its status
    shows it resolved by someone else; ``lost_because`` says which): the handler is
    then cancelled. ``log`` is the run's log (``RunLog``: ``run.log.write("...")``).
    ``log_appender`` appends bytes to the live log being streamed (set by
    ``azqueue.worker.livelog.LiveLog``), None if none is.
    """

    task_id: str
    run_id: int
    task: dict[str, Any]
    taken_until: datetime
    credentials: Credentials
    root_url: str
    session: aiohttp.ClientSession
    log_interval: float = 2.0
    lost: bool = False
    lost_because: str = ""
    canceled: bool = False  # lost because the task was canceled (cancelTask)
    log_appender: Callable[[bytes], Awaitable[None]] | None = None
    log: RunLog = field(default_factory=RunLog)

    def lose(self, because: str, canceled: bool = False) -> None:
        self.lost, self.lost_because, self.canceled = True, because, canceled

    @property
    def payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = self.task.get("payload", {})
        return payload

    @property
    def queue(self) -> taskcluster.aio.Queue:
        """A queue client with the task's current temporary credentials."""
        return client.queue(self.root_url, self.credentials, self.session)

    async def upload_artifact(self, name: str, data: bytes | BinaryIO, content_type: str,
                              content_encoding: str | None = None) -> None:
        """A blob artifact expiring with the task: created, PUT, finished. ``data`` may be
        an open file that can be read again (read from its current position to its end):
        it is streamed in chunks, never held whole in memory. With ``content_encoding``
        (``"gzip"``: ``data`` is gzipped) the bytes are stored as given and served with
        that ``Content-Encoding``, so an HTTP client that decodes reads the original.

        Azure's routine failures (500, 503, timeouts, dropped connections) are ridden
        out: the PUT is sent again from the start of ``data`` with a bounded backoff
        (``azqueue.worker.retry``), and the queue's calls are retried by its client.
        ``RequestFailed`` (the run then ends ``intermittent-task``) says what was tried
        once the retries are used up.

        ``LOG_ARTIFACT`` is refused (ValueError): that log is the SDK's, which writes
        the reason a run failed at its end; write to it with ``run.log``."""
        if name == LOG_ARTIFACT:
            raise ValueError(f"{LOG_ARTIFACT} is the run's log, which the worker writes (and "
                             "the reason a run failed at its end): write to it with "
                             "run.log.write(...), or upload your own log under another name")
        await self._upload(name, data, content_type, content_encoding)

    async def _upload(self, name: str, data: bytes | BinaryIO, content_type: str,
                      content_encoding: str | None = None) -> None:
        body: Callable[[], object]
        if isinstance(data, bytes | bytearray | memoryview):
            payload = bytes(data)
            length, body = len(payload), (lambda: io.BytesIO(payload))
        else:
            body, length = retry.file_body(data)
        made = await self.queue.createArtifact(self.task_id, self.run_id, name, {
            "storageType": "blob", "expires": self.task["expires"], "contentType": content_type})
        headers = {**made["headers"], "Content-Length": str(length)}
        if content_encoding:  # stored with the blob (Azurite ignores a plain Content-Encoding)
            headers["x-ms-blob-content-encoding"] = content_encoding
        answer = await retry.send(self.session, "PUT", made["putUrl"], f"uploading {name}",
                                  headers=headers, body=body)
        if answer.status not in (200, 201):
            raise RequestFailed(f"uploading {name} answered {answer.status}: {answer.code}")
        await self.queue.finishArtifact(self.task_id, self.run_id, name, {})

    async def end_log(self, line: str) -> None:
        """Write ``line`` at the end of the run's log (see the module's docstring); a
        warning if it cannot be written."""
        data = f"\n[azqueue] {line}\n".encode()
        try:
            if self.log_appender is not None:
                await self.log_appender(data)
            else:
                await self._upload(LOG_ARTIFACT, data, LOG_CONTENT_TYPE)
        except NOT_WRITTEN as e:
            log.warning("task %s/%d: could not write why it ended to %s: %s", self.task_id,
                        self.run_id, LOG_ARTIFACT, client.describe(e))


Handler = Callable[[TaskRun], Awaitable[None]]


def check_handler(handler: object) -> None:
    """TypeError naming ``handler`` unless it is an async function (or an object whose
    ``__call__`` is one): what the worker calls and awaits for each run."""
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)):
        return
    name = getattr(handler, "__qualname__", None) or repr(handler)
    what = "not callable" if not callable(handler) else "not an async function"
    raise TypeError(f"the handler {name} is {what}: write it as `async def {_plain(name)}"
                    "(run: TaskRun) -> None: ...` (a blocking call inside it goes in "
                    "`await asyncio.to_thread(...)`)")


def _plain(name: str) -> str:
    short = name.rsplit(".", 1)[-1]
    return short if short.isidentifier() else "handler"
