"""Getting work through SAS URLs, as docs/workers/sas.md tells a worker to.

* pollTaskUrls, refreshed before ``expires``;
* the URLs polled in the order given, ``numofmessages`` = free capacity (at most 32);
* ``<MessageText>`` base64-decoded and JSON-parsed into ``{taskId, runId, signature}``;
  a queue answered 404 ``QueueNotFound`` is empty (no task was ever put in it);
* claimTask with messageId, receipt and signature, for every message of a poll at once
  (``asyncio.gather``); after a successful claim the message is left alone (the queue
  rewrote it to enforce the claim);
* after a 400, 404 or 409 answer, the message is deleted through signedDeleteUrl with the
  URI-encoded receipt, and a failed delete is logged ("failure to delete messages from
  Azure queue is serious"); after a 401 or 403 the worker's own credentials are at
  fault, so the message is left for another worker and an error is logged;
* a message dequeued more than 10 times is reported to the operator;
* 5xx answers are retried with backoff by the official client.

What it costs. Every poll of an Azure queue is a billed storage request, an empty one
too, and the plain loop of docs/workers/sas.md spends seven of them per task when the backlog is in
the last queue (``lowest``, the default priority). Two rules bring that down without
reordering the queues:

* **Sticky queue.** A poll that found work in queue *p* makes the next poll start at *p*
  again, while the worker keeps finding work there. An empty poll of *p*, or a pass from
  the top that is ``priority_recheck`` seconds old, sends the worker back to the top of
  the list (highest priority first), so a higher-priority task waits at most
  ``priority_recheck`` seconds longer for this worker than with a pass from the top
  every time. With *W* workers sticky on a lower queue, whose rechecks fall at
  independent moments, one of them looks at the top after about
  ``priority_recheck / (W + 1)`` seconds on average. At a backlog a worker polls once per
  batch of claims, plus one pass over the queues above *p* every ``priority_recheck``
  seconds.
* **Sampled queues.** A pass from the top first asks the queue which of the seven hold
  visible tips (pollTaskUrls with ``?pending=true``: a request to the queue, which
  answers from a sample shared by all its workers, at most ``hints.SAMPLE_TTL`` seconds
  old), and polls only those. So a recheck at a ``lowest`` backlog costs no empty poll,
  a worker whose tasks outlast ``priority_recheck`` polls once per claim instead of
  seven times, and an idle pass polls nothing at all. A tip put meanwhile by another
  replica of the queue waits at most that age longer; without an answer (the queue
  unreachable, or one that does not sample) the pass polls all seven queues.
* **Waiting for a tip.** When the sample says that no queue holds a visible tip, the
  next pass asks pollTaskUrls to wait for one (``&wait=20``): the queue answers as soon as
  any replica puts or rings a tip for the task queue (see docs/capacity.md, "At rest"),
  so an idle worker wakes within moments at no storage request and one request to the
  queue per 20 s. A queue that cannot wait (an earlier release) answers 400, after which
  the worker sleeps between passes as below.
* **Idle backoff.** Otherwise, after the *k*-th empty pass in a row the worker sleeps
  ``min(idle_sleep * 2 ** (k - 1), max_idle_sleep)`` seconds, times a random factor
  between 0.75 and 1.25 so that workers do not poll in step: "a second or so" after the
  first empty pass (docs/workers/sas.md), growing to ``max_idle_sleep`` on average. Finding
  work resets it. An idle worker thus costs one pollTaskUrls per ``max_idle_sleep``
  seconds (seven polls without sampled queues).

``requests`` counts what the source asked of Azure and of the queue (``REQUEST_KINDS``);
it is logged at DEBUG after every pass that found nothing and when the worker stops.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import random
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import aiohttp

from azqueue.worker import client

log = logging.getLogger(__name__)

MAX_MESSAGES = 32
# How long an idle worker asks pollTaskUrls to wait for a visible tip (seconds).
LONG_POLL = 20.0
DEQUEUE_ALERT = 10
REFRESH_BEFORE = timedelta(minutes=2)
# Answers to claimTask after which the message is deleted: the task does not exist, is
# not (or no longer) pending, or the tip is not valid (docs/workers/sas.md).
DELETE_AFTER = frozenset({400, 404, 409})
# The keys of ``SasSource.requests``.
POLL = "azure poll"
EMPTY_POLL = "azure poll (empty)"
DELETE = "azure delete"
POLL_TASK_URLS = "pollTaskUrls"
CLAIM_TASK = "claimTask"
REQUEST_KINDS = (POLL, EMPTY_POLL, DELETE, POLL_TASK_URLS, CLAIM_TASK)


@dataclass(frozen=True, slots=True)
class QueueMessage:
    """One ``<QueueMessage>`` of a poll answer."""

    message_id: str
    pop_receipt: str
    dequeue_count: int
    text: str

    @property
    def tip(self) -> dict[str, Any]:
        """base64 decode and JSON parse <MessageText>: ``{taskId, runId, signature}`` for a
        tip; ValueError if the text is no base64 of JSON."""
        data: dict[str, Any] = json.loads(base64.b64decode(self.text))
        return data


def parse_messages(xml: str) -> list[QueueMessage]:
    root = ET.fromstring(xml)
    return [QueueMessage(m.findtext("MessageId", ""), m.findtext("PopReceipt", ""),
                         int(m.findtext("DequeueCount", "0") or 0), m.findtext("MessageText", ""))
            for m in root.findall("QueueMessage")]


def queue_not_found(status: int, body: str) -> bool:
    """Whether a poll's answer says the queue does not exist yet (404 ``QueueNotFound``):
    no task was ever put in it, which a worker takes as an empty queue."""
    return status == 404 and "<Code>QueueNotFound</Code>" in body


def delete_url(template: str, message: QueueMessage) -> str:
    return (template.replace("{{messageId}}", quote(message.message_id, safe=""))
            .replace("{{popReceipt}}", quote(message.pop_receipt, safe="")))


def idle_delay(empty_passes: int, idle_sleep: float, max_idle_sleep: float,
               jitter: float) -> float:
    """Seconds to sleep after the ``empty_passes``-th empty pass in a row (1, 2, …):
    ``idle_sleep`` doubled per further empty pass up to ``max_idle_sleep``, times
    ``jitter`` (drawn from 0.75–1.25 by the caller)."""
    doublings = min(max(empty_passes - 1, 0), 32)
    return min(idle_sleep * 2.0 ** doublings, max_idle_sleep) * jitter


class SasSource:
    """Claims from the task queue's Azure queues, polled through pollTaskUrls' SAS URLs.

    :param session: the aiohttp session for the Azure queues and the queue.
    :param root_url: the queue's rootUrl.
    :param credentials: the worker's credentials (None: anonymous).
    :param task_queue_id: ``<provisionerId>/<workerType>``.
    :param worker_group: claimTask's ``workerGroup``.
    :param worker_id: claimTask's ``workerId``.
    :param idle_sleep: seconds slept after the first empty pass.
    :param max_idle_sleep: the longest (average) sleep after many empty passes in a row.
    :param priority_recheck: seconds after which a worker sticky on one queue polls from
        the top of the list again, whatever it finds where it is.
    :param hints: ask pollTaskUrls, at every pass from the top, which queues hold
        visible tips (``?pending=true``), and poll only those.
    :param requests: where to count requests (a new ``Counter`` if None).
    """

    def __init__(self, session: aiohttp.ClientSession, root_url: str,
                 credentials: client.Credentials | None, task_queue_id: str,
                 worker_group: str, worker_id: str, idle_sleep: float = 1.0, *,
                 max_idle_sleep: float = 5.0, priority_recheck: float = 5.0,
                 hints: bool = True, requests: Counter[str] | None = None) -> None:
        self.session = session
        self.root_url = root_url
        self.credentials = credentials
        self.task_queue_id = task_queue_id
        self.worker_group = worker_group
        self.worker_id = worker_id
        self._worker = (worker_group, worker_id)
        self.idle_sleep = idle_sleep
        self.max_idle_sleep = max_idle_sleep
        self.priority_recheck = priority_recheck
        self.hints = hints
        self.requests: Counter[str] = Counter() if requests is None else requests
        self.queue = client.queue(root_url, credentials, session)
        self._urls: dict[str, Any] | None = None
        self._expires = datetime.min.replace(tzinfo=UTC)
        self._sticky: int | None = None  # the queue that had work at the last poll
        self._recheck_at = 0.0  # time.monotonic() at which to poll from the top again
        self.empty_passes = 0  # empty passes in a row
        self._emptied: dict[int, float] = {}  # queue -> when its last empty poll started
        # Idle, ask pollTaskUrls to wait for a tip (a queue that cannot turns it off).
        self.long_poll = hints
        self._nothing_pending = False  # the last sample said no queue holds a visible tip

    async def _queues(self) -> list[dict[str, str]]:
        if self._urls is None or datetime.now(UTC) + REFRESH_BEFORE >= self._expires:
            self.requests[POLL_TASK_URLS] += 1
            self._urls = await client.poll_task_urls(self.session, self.root_url,
                                                     self.credentials, self.task_queue_id,
                                                     worker=self._worker)
            self._expires = client.parse_time(self._urls["expires"])
        return list(self._urls["queues"])

    async def _pass(self, wait: float = 0.0) -> list[tuple[int, dict[str, str]]]:
        """The queues a pass from the top polls: those the queue's sample says hold
        visible tips (fresh URLs with it), or all of them without a sample. With ``wait``,
        the queue is asked to answer once a queue holds one (or after ``wait`` seconds)."""
        self._nothing_pending = False
        if self.hints:
            self.requests[POLL_TASK_URLS] += 1
            try:
                urls = await client.poll_task_urls(self.session, self.root_url,
                                                   self.credentials, self.task_queue_id,
                                                   pending=True, wait=wait,
                                                   worker=self._worker)
            except client.EXPECTED as e:
                if wait and client.status_of(e) == 400:
                    # A queue that does not wait (an earlier release): sleep between passes.
                    log.info("pollTaskUrls does not wait here (%s); sleeping between idle "
                             "passes instead", e)
                    self.long_poll = False
                    return await self._pass()
                if 400 <= (client.status_of(e) or 0) < 500:
                    raise  # refused: as when the URLs themselves are refused
                log.debug("no sample of %s's queues (%s): polling them all",
                          self.task_queue_id, e)
            else:
                self._urls, self._expires = urls, client.parse_time(urls["expires"])
                if "pending" in urls:
                    # A queue this worker found empty after the sample was taken is
                    # skipped too: the worker knows better.
                    now, pending = time.monotonic(), urls["pending"]
                    self._nothing_pending = not any(pending["queues"])
                    return [(i, q) for i, q in enumerate(urls["queues"])
                            if pending["queues"][i]
                            and self._emptied.get(i, -math.inf) < now - pending["ages"][i]]
        return list(enumerate(await self._queues()))

    async def get(self, wanted: int, stop: asyncio.Event) -> list[dict[str, Any]]:
        """Claims for up to ``wanted`` tasks; [] after an empty pass and its sleep."""
        sticky = self._sticky
        if sticky is not None and time.monotonic() < self._recheck_at:
            queues = await self._queues()
            if stop.is_set():
                return []
            messages = (await self._poll(queues[sticky], wanted, sticky)
                        if sticky < len(queues) else [])
            if messages:
                return await self._claim_all(messages, queues[sticky]["signedDeleteUrl"])
        # From the top: "the worker must poll the Azure queues in order they are given",
        # skipping those the queue saw empty just now.
        self._sticky = None
        self._recheck_at = time.monotonic() + self.priority_recheck
        wait = LONG_POLL if self.long_poll and self._nothing_pending else 0.0
        passing = asyncio.ensure_future(self._pass(wait))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({passing, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not passing.done():  # stopped while the queue waited for a tip
            passing.cancel()
            await asyncio.gather(passing, return_exceptions=True)
            return []
        for index, q in passing.result():
            if stop.is_set():
                return []
            messages = await self._poll(q, wanted, index)
            if messages:
                self._sticky = index
                self.empty_passes = 0
                return await self._claim_all(messages, q["signedDeleteUrl"])
        # "If at end of the array, the worker should sleep a second or so, and start
        # polling from the start of the list" (docs/workers/sas.md); longer while nothing comes.
        self.empty_passes += 1
        if self.long_poll and self._nothing_pending:
            return []  # the next pass waits in pollTaskUrls for a tip, at no storage request
        delay = idle_delay(self.empty_passes, self.idle_sleep, self.max_idle_sleep,
                           random.uniform(0.75, 1.25))
        log.debug("%s: empty pass %d in a row, sleeping %.1f s; requests so far: %s",
                  self.task_queue_id, self.empty_passes, delay, dict(self.requests))
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except TimeoutError:
            pass
        return []

    async def _poll(self, q: dict[str, str], wanted: int, index: int) -> list[QueueMessage]:
        self.requests[POLL] += 1
        started = time.monotonic()
        async with self.session.get(
                f"{q['signedPollUrl']}&numofmessages={min(wanted, MAX_MESSAGES)}") as r:
            body = await r.text()
        if r.status != 200 and not queue_not_found(r.status, body):
            self.requests[EMPTY_POLL] += 1
            log.warning("polling an Azure queue answered %d: %s", r.status, body[:200])
            return []
        messages = parse_messages(body) if r.status == 200 else []
        if not messages:
            self.requests[EMPTY_POLL] += 1
            self._emptied[index] = started
        return messages

    async def _claim_all(self, messages: list[QueueMessage],
                         delete_template: str) -> list[dict[str, Any]]:
        """Claim every message of a poll at once, each deleted after its own 4xx."""
        claims = await asyncio.gather(*(self._claim(m, delete_template) for m in messages))
        return [c for c in claims if c is not None]

    async def _claim(self, message: QueueMessage, delete_template: str) -> dict[str, Any] | None:
        if message.dequeue_count > DEQUEUE_ALERT:
            log.warning("OPERATOR: message %s of %s has been dequeued %d times; tips that keep "
                        "coming back mean claims or deletes keep failing", message.message_id,
                        self.task_queue_id, message.dequeue_count)
        try:
            tip = message.tip
            task_id, run_id, signature = str(tip["taskId"]), int(tip["runId"]), str(tip["signature"])
        except (ValueError, KeyError, TypeError):
            log.warning("message %s is not a tip; deleting it", message.message_id)
            await self._delete(message, delete_template)
            return None
        self.requests[CLAIM_TASK] += 1
        try:
            claim: dict[str, Any] = await self.queue.claimTask(task_id, run_id, {
                "workerGroup": self.worker_group, "workerId": self.worker_id,
                "messageId": message.message_id, "receipt": message.pop_receipt,
                "signature": signature})
            return claim
        except client.EXPECTED as e:
            status = client.status_of(e)
            if status in DELETE_AFTER:
                log.info("claim of %s/%d refused (%d): %s; deleting its message", task_id, run_id,
                         status, e)
                await self._delete(message, delete_template)
            elif status == 403 and client.code_of(e) == "WorkerQuarantined":
                # Not our credentials: the operator quarantined this worker. The queue
                # made the tip visible to others; poll again only after a long while.
                log.warning("claim of %s/%d refused: %s; waiting %.1f s before polling again",
                            task_id, run_id, e, self.max_idle_sleep)
                await asyncio.sleep(self.max_idle_sleep * random.uniform(0.75, 1.25))
            elif status in (401, 403):
                # Our own credentials are wrong, not the task: leave the tip for a worker
                # that may claim it, and slow down.
                log.error("claim of %s/%d refused (%d): %s; check this worker's credentials "
                          "and scopes", task_id, run_id, status, e)
                await asyncio.sleep(self.idle_sleep * random.uniform(1, 2))
            else:
                log.warning("claim of %s/%d failed after retries: %s", task_id, run_id, e)
        except Exception:
            # Not an answer of the queue: a bug. The tip reappears after its hold, so the
            # task is not lost; say so loudly.
            log.error("claim of %s/%d failed unexpectedly", task_id, run_id, exc_info=True)
        return None

    async def _delete(self, message: QueueMessage, template: str) -> None:
        self.requests[DELETE] += 1
        try:
            async with self.session.delete(delete_url(template, message)) as r:
                if r.status not in (200, 204):
                    log.warning("could not delete message %s (%d): %s", message.message_id,
                                r.status, (await r.text())[:200])
        except (aiohttp.ClientError, TimeoutError) as e:
            log.warning("could not delete message %s: %s", message.message_id, e)
