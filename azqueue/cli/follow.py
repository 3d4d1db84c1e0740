"""``azqueue task log --follow``: print a task's live log as it grows, until it is resolved.

About every ``POLL`` seconds: read the task's status; if its latest run has a log, ask its
blob for the bytes after those printed (``Range: bytes=<offset>-``; 416, or an empty
answer, is nothing new) and print them as they are, bytes (a UTF-8 sequence split
between two reads is printed whole in the end). The read URL comes from getArtifact's
redirect and is kept until it expires (403), then asked for again. While the task is
pending or its run has no log yet, a line on stderr says so. A new run (a retry) starts
its own log, announced on stderr. The end: the task was resolved before a read that
found nothing new (the worker appends the whole log before it reports, so nothing is
missed); the exit code is then ``task wait``'s for the resolution.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TextIO

import aiohttp
import taskcluster

from azqueue.model.task import RESOLVED_STATES
from azqueue.cli import terminal
from azqueue.cli.exitcodes import WAIT_EXIT_CODES

POLL = 1.0
READ_CHUNK = 65536


class LogUnavailable(Exception):
    """The log cannot be read, for a reason waiting does not fix (one line)."""


@dataclass
class Follower:
    """Follows the log ``name`` of task ``task_id`` (see the module docstring), printing
    to ``out`` and saying what it waits for on ``err``."""

    queue: taskcluster.Queue
    session: aiohttp.ClientSession
    task_id: str
    name: str
    out: BinaryIO
    err: TextIO
    run_id: int | None = None
    offset: int = 0  # the bytes of the run's log printed so far
    _blob_url: str = ""
    _said: str = ""
    _log: terminal.LogText = field(default_factory=terminal.LogText)  # over the runs' logs

    def _say(self, line: str) -> None:
        """A line on stderr, unless it is the one said last."""
        if line != self._said:
            print(f"azqueue: {terminal.line(line)}", file=self.err, flush=True)
            self._said = line

    async def run(self) -> int:
        while True:
            status: dict[str, Any] = (await asyncio.to_thread(self.queue.status,
                                                              self.task_id))["status"]
            runs = status["runs"]
            resolved = status["state"] in RESOLVED_STATES
            if runs and runs[-1]["runId"] != self.run_id:
                if self.run_id is not None:
                    self._say(f"run {runs[-1]['runId']} of {self.task_id} started "
                              f"({runs[-1].get('reasonCreated', 'retry')}); its log follows")
                self.run_id, self.offset, self._blob_url = runs[-1]["runId"], 0, ""
            if not runs or runs[-1]["state"] == "pending":
                self._say(f"{self.task_id} is pending; waiting for a worker to claim it")
            else:
                printed = await self._read_new()
                if printed is None and resolved:
                    self._say(f"run {self.run_id} of {self.task_id} is {runs[-1]['state']} "
                              f"and has no {self.name}")
                    return WAIT_EXIT_CODES[status["state"]]
                if printed is None:
                    self._say(f"run {self.run_id} of {self.task_id} is {runs[-1]['state']}; "
                              f"waiting for its {self.name}")
                elif printed == 0 and resolved:
                    return WAIT_EXIT_CODES[status["state"]]
            await asyncio.sleep(POLL)

    async def _read_new(self) -> int | None:
        """Print the bytes after ``offset``; how many, or None if there is no log yet."""
        for _ in range(2):  # a second time with a fresh URL, if the first one expired
            if not self._blob_url:
                url = await self._locate()
                if url is None:
                    return None
                self._blob_url = url
            async with self.session.get(self._blob_url, headers={
                    "Range": f"bytes={self.offset}-"}) as r:
                if r.status == 416:
                    return 0
                if r.status in (200, 206):
                    if r.status == 200 and self.offset:  # no range answered: skip what we have
                        await r.content.readexactly(self.offset)
                    printed = 0
                    async for chunk in r.content.iter_chunked(READ_CHUNK):
                        self.out.write(self._log.feed(chunk))
                        printed += len(chunk)
                    self.out.flush()
                    self.offset += printed
                    return printed
                if r.status == 403:
                    self._blob_url = ""
                    continue
                raise LogUnavailable(f"reading {self.name} answered {r.status}: "
                                     f"{' '.join((await r.text()).split())[:300]}")
        raise LogUnavailable(f"reading {self.name} is refused (403) even with a fresh URL")

    async def _locate(self) -> str | None:
        """The read URL of the run's log, from getArtifact's redirect; None if the run has
        no such artifact (yet)."""
        build = (self.queue.buildSignedUrl if self.queue.options.get("credentials")
                 else self.queue.buildUrl)
        url = build("getArtifact", self.task_id, str(self.run_id), self.name)
        async with self.session.get(url, allow_redirects=False) as r:
            if r.status in (302, 303, 307) and r.headers.get("Location"):
                return r.headers["Location"]
            if r.status == 404:
                return None
            raise LogUnavailable(f"getArtifact of {self.name} answered {r.status}: "
                                 f"{' '.join((await r.text()).split())[:300]}")


async def follow(queue: taskcluster.Queue, task_id: str, name: str) -> int:
    async with aiohttp.ClientSession() as session:
        return await Follower(queue, session, task_id, name, sys.stdout.buffer,
                              sys.stderr).run()
