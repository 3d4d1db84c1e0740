"""Requests to Azure Storage through SAS URLs, sent again after Azure's routine failures.

Azure answers 500 (OperationTimedOut, InternalError) and 503 ServerBusy routinely at
scale, and a connection may drop or a request time out. ``send()`` tries a request up to
``ATTEMPTS`` times, pausing ``FIRST_PAUSE`` doubled per failure in a row (up to
``MAX_PAUSE``, times a random factor between 1 and 1.5) between attempts: 47 to 71 s of
pauses in all, about the minute of throttling that Azure's own SDKs ride out by default
(three retries, after 15, 18 and 24 s). Fewer attempts give up on a throttled account
too soon: with 30% of requests answered ServerBusy, six attempts all fail once in 1,400
uploads (ten, once in 170,000), and the run, ended ``intermittent-task``, is then run
again from the start. Each attempt
sends the body from its start (``body()`` makes it afresh). It returns the first answer
that is none of those failures, and raises ``RequestFailed`` saying what each attempt got
once all of them failed.

A failed attempt may have been applied (Azure timed out after writing, or the answer was
lost on the way), and aiohttp itself sends an idempotent request (``PUT``) a second time
after a kept-alive connection dropped: the answer ``send()`` returns may be the answer to
a request sent more than once. Whoever sends a write that is not idempotent checks what
was applied, as ``azqueue.worker.livelog`` does with the position of an append.

Requests to the queue go through the official client (``azqueue.worker.client``), which
retries the same failures itself.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import aiohttp

from azqueue.worker.errors import RequestFailed

ATTEMPTS = 10
FIRST_PAUSE = 0.5
MAX_PAUSE = 8.0
RETRIED = frozenset({408, 429, 500, 502, 503, 504})
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=120, sock_connect=30)
CHUNK = 1024 * 1024  # what is read from a file at a time


@dataclass(frozen=True, slots=True)
class Answer:
    """Azure's answer: its status, headers and text; ``failed`` says what the attempts
    before it got (empty when it answered the first)."""

    status: int
    headers: Mapping[str, str]
    text: str
    failed: tuple[str, ...] = ()

    @property
    def code(self) -> str:
        """Azure's error code (``x-ms-error-code``), else the start of the text."""
        return self.headers.get("x-ms-error-code") or " ".join(self.text.split())[:200]


def pause(failures: int) -> float:
    """Seconds to wait after ``failures`` failed attempts in a row."""
    return float(min(FIRST_PAUSE * 2 ** (failures - 1), MAX_PAUSE) * random.uniform(1, 1.5))


async def send(session: aiohttp.ClientSession, method: str, url: str, what: str, *,
               headers: Mapping[str, str] | None = None,
               body: Callable[[], Any] = lambda: None,
               attempts: int = ATTEMPTS) -> Answer:
    """``method url`` with ``headers`` and ``body()``, sent again after each routine
    failure; ``RequestFailed`` naming ``what`` and what every attempt got once all
    ``attempts`` failed."""
    failed: list[str] = []
    started = time.monotonic()
    for attempt in range(1, attempts + 1):
        try:
            async with session.request(method, url, data=body(), headers=headers,
                                       timeout=REQUEST_TIMEOUT) as r:
                answer = Answer(r.status, r.headers, await r.text(), tuple(failed))
            if answer.status not in RETRIED:
                return answer
            failed.append(f"{answer.status} {answer.code}")
        except (aiohttp.ClientError, TimeoutError) as e:
            failed.append(f"no answer ({type(e).__name__}{f': {e}' if str(e) else ''})")
        if attempt < attempts:
            await asyncio.sleep(pause(attempt))
    raise RequestFailed(f"{what}: {attempts} attempts in {time.monotonic() - started:.0f} s "
                        f"all failed: {'; '.join(failed)}")


def file_body(data: BinaryIO) -> tuple[Callable[[], AsyncIterator[bytes]], int]:
    """A body that sends the open file ``data`` from its current position to its end,
    ``CHUNK`` bytes at a time, again from that position at every attempt; and its
    length. ValueError if the file cannot be read again (a pipe, a socket)."""
    try:
        start = data.tell()
        end = data.seek(0, os.SEEK_END)
        data.seek(start)
    except (OSError, ValueError, AttributeError):
        raise ValueError("an artifact's data must be bytes or a file that can be read again "
                         "from its start (open(path, 'rb')); read a stream into bytes first"
                         ) from None

    async def chunks() -> AsyncIterator[bytes]:
        await asyncio.to_thread(data.seek, start)
        left = end - start
        while left > 0:
            chunk = await asyncio.to_thread(data.read, min(CHUNK, left))
            if not chunk:
                raise OSError(f"the file ended {left} bytes early: it shrank while uploaded")
            left -= len(chunk)
            yield chunk

    return chunks, end - start
