"""Getting work through SAS URLs, as documents 000 and 001 tell a worker to.

* pollTaskUrls, refreshed before ``expires``;
* the URLs polled in the order given, ``numofmessages`` = free capacity (at most 32);
* ``<MessageText>`` base64-decoded and JSON-parsed into ``{taskId, runId, signature}``;
* claimTask with messageId, receipt and signature; after a successful claim the message
  is left alone (the queue rewrote it to enforce the claim);
* after a 400, 404 or 409 answer, the message is deleted through signedDeleteUrl with the
  URI-encoded receipt, and a failed delete is logged ("failure to delete messages from
  Azure queue is serious"); after a 401 or 403 the worker's own credentials are at
  fault, so the message is left for another worker and an error is logged;
* a message dequeued more than 10 times is reported to the operator;
* 5xx answers are retried with backoff by the official client.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import aiohttp

from azqueue.worker import client

log = logging.getLogger(__name__)

MAX_MESSAGES = 32
DEQUEUE_ALERT = 10
REFRESH_BEFORE = timedelta(minutes=2)
# Answers to claimTask after which the message is deleted: the task does not exist, is
# not (or no longer) pending, or the tip is not valid (documents 000 and 001).
DELETE_AFTER = frozenset({400, 404, 409})


@dataclass(frozen=True, slots=True)
class QueueMessage:
    message_id: str
    pop_receipt: str
    dequeue_count: int
    text: str


def parse_messages(xml: str) -> list[QueueMessage]:
    root = ET.fromstring(xml)
    return [QueueMessage(m.findtext("MessageId", ""), m.findtext("PopReceipt", ""),
                         int(m.findtext("DequeueCount", "0") or 0), m.findtext("MessageText", ""))
            for m in root.findall("QueueMessage")]


def delete_url(template: str, message: QueueMessage) -> str:
    return (template.replace("{{messageId}}", quote(message.message_id, safe=""))
            .replace("{{popReceipt}}", quote(message.pop_receipt, safe="")))


class SasSource:
    def __init__(self, session: aiohttp.ClientSession, root_url: str,
                 credentials: client.Credentials | None, task_queue_id: str,
                 worker_group: str, worker_id: str, idle_sleep: float = 1.0) -> None:
        self.session = session
        self.root_url = root_url
        self.credentials = credentials
        self.task_queue_id = task_queue_id
        self.worker_group = worker_group
        self.worker_id = worker_id
        self.idle_sleep = idle_sleep
        self.queue = client.queue(root_url, credentials, session)
        self._urls: dict[str, Any] | None = None
        self._expires = datetime.min.replace(tzinfo=UTC)

    async def _queues(self) -> list[dict[str, str]]:
        if self._urls is None or datetime.now(UTC) >= self._expires - REFRESH_BEFORE:
            self._urls = await client.poll_task_urls(self.session, self.root_url,
                                                     self.credentials, self.task_queue_id)
            self._expires = client.parse_time(self._urls["expires"])
        return list(self._urls["queues"])

    async def get(self, wanted: int, stop: asyncio.Event) -> list[dict[str, Any]]:
        """Claims for up to ``wanted`` tasks; [] after an empty pass and a short sleep."""
        for q in await self._queues():
            if stop.is_set():
                return []
            async with self.session.get(
                    f"{q['signedPollUrl']}&numofmessages={min(wanted, MAX_MESSAGES)}") as r:
                body = await r.text()
                if r.status != 200:
                    log.warning("polling an Azure queue answered %d: %s", r.status, body[:200])
                    continue
            messages = parse_messages(body)
            if messages:
                claims = []
                for message in messages:
                    claim = await self._claim(message, q["signedDeleteUrl"])
                    if claim is not None:
                        claims.append(claim)
                return claims
        try:  # "sleep a second or so, and start polling from the start of the list"
            await asyncio.wait_for(stop.wait(), self.idle_sleep * random.uniform(0.75, 1.25))
        except TimeoutError:
            pass
        return []

    async def _claim(self, message: QueueMessage, delete_template: str) -> dict[str, Any] | None:
        if message.dequeue_count > DEQUEUE_ALERT:
            log.warning("OPERATOR: message %s of %s has been dequeued %d times; tips that keep "
                        "coming back mean claims or deletes keep failing", message.message_id,
                        self.task_queue_id, message.dequeue_count)
        try:
            tip = json.loads(base64.b64decode(message.text))
            task_id, run_id, signature = str(tip["taskId"]), int(tip["runId"]), str(tip["signature"])
        except (ValueError, KeyError, TypeError):
            log.warning("message %s is not a tip; deleting it", message.message_id)
            await self._delete(message, delete_template)
            return None
        try:
            claim: dict[str, Any] = await self.queue.claimTask(task_id, run_id, {
                "workerGroup": self.worker_group, "workerId": self.worker_id,
                "messageId": message.message_id, "receipt": message.pop_receipt,
                "signature": signature})
            return claim
        except Exception as e:
            status = client.status_of(e)
            if status in DELETE_AFTER:
                log.info("claim of %s/%d refused (%d): %s; deleting its message", task_id, run_id,
                         status, e)
                await self._delete(message, delete_template)
            elif status in (401, 403):
                # Our own credentials are wrong, not the task: leave the tip for a worker
                # that may claim it, and slow down.
                log.error("claim of %s/%d refused (%d): %s; check this worker's credentials "
                          "and scopes", task_id, run_id, status, e)
                await asyncio.sleep(self.idle_sleep * random.uniform(1, 2))
            else:
                log.warning("claim of %s/%d failed after retries: %s", task_id, run_id, e)
            return None

    async def _delete(self, message: QueueMessage, template: str) -> None:
        try:
            async with self.session.delete(delete_url(template, message)) as r:
                if r.status not in (200, 204):
                    log.warning("could not delete message %s (%d): %s", message.message_id,
                                r.status, (await r.text())[:200])
        except aiohttp.ClientError as e:
            log.warning("could not delete message %s: %s", message.message_id, e)
