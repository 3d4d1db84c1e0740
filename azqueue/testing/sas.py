"""A worker's side of the SAS polling flow (docs/workers/sas.md) in plain aiohttp: no
Azure SDK, exactly what a worker written from that page does. Requests to the queue API
need a Hawk-signed session (``azqueue.testing.hawk``); those to the signed URLs do not
care."""

from __future__ import annotations

import base64
import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from azqueue.testing.tasks import UnexpectedAnswer, call


@dataclass(frozen=True, slots=True)
class QueueMessage:
    """One ``<QueueMessage>`` of a poll answer."""

    message_id: str
    pop_receipt: str
    dequeue_count: int
    text: str

    @property
    def tip(self) -> dict[str, Any]:
        """base64 decode and JSON parse <MessageText>: {taskId, runId, signature}."""
        data: dict[str, Any] = json.loads(base64.b64decode(self.text))
        return data


async def poll_task_urls(http: aiohttp.ClientSession, api: str, provisioner_id: str,
                         worker_type: str) -> dict[str, Any]:
    """pollTaskUrls: ``{expires, queues: [{signedPollUrl, signedDeleteUrl}, ...]}``."""
    return await call(http, "GET", f"{api}/poll-task-url/{provisioner_id}/{worker_type}")


async def get_messages(http: aiohttp.ClientSession, signed_poll_url: str,
                       n: int = 1) -> list[QueueMessage]:
    """GET the poll URL with &numofmessages=N and parse <QueueMessagesList>;
    ``UnexpectedAnswer`` unless Azure answers 200."""
    async with http.get(f"{signed_poll_url}&numofmessages={n}") as r:
        body = await r.text()
        if r.status != 200:
            raise UnexpectedAnswer(f"polling answered {r.status}: {body[:300]}")
    root = ET.fromstring(body)
    return [QueueMessage(message_id=m.findtext("MessageId", ""),
                         pop_receipt=m.findtext("PopReceipt", ""),
                         dequeue_count=int(m.findtext("DequeueCount", "0")),
                         text=m.findtext("MessageText", ""))
            for m in root.findall("QueueMessage")]


async def poll_once(http: aiohttp.ClientSession, urls: dict[str, Any],
                    n: int = 1) -> list[QueueMessage]:
    """Poll the queues in the order given; the messages of the first non-empty one."""
    for q in urls["queues"]:
        messages = await get_messages(http, q["signedPollUrl"], n)
        if messages:
            return messages
    return []


def delete_url(signed_delete_url: str, message: QueueMessage) -> str:
    """Substitute {{messageId}} and the URI-encoded {{popReceipt}}."""
    return (signed_delete_url.replace("{{messageId}}", quote(message.message_id, safe=""))
            .replace("{{popReceipt}}", quote(message.pop_receipt, safe="")))


async def delete_message(http: aiohttp.ClientSession, signed_delete_url: str,
                         message: QueueMessage) -> int:
    """DELETE the message through the signed delete URL; Azure's status."""
    async with http.delete(delete_url(signed_delete_url, message)) as r:
        await r.read()
        return r.status


async def claim(http: aiohttp.ClientSession, api: str, message: QueueMessage,
                worker_id: str = "w1", worker_group: str = "wg") -> tuple[int, dict[str, Any]]:
    """claimTask with the message's tip and receipt: the status and the JSON answer."""
    tip = message.tip
    body = {"workerGroup": worker_group, "workerId": worker_id, "messageId": message.message_id,
            "receipt": message.pop_receipt, "signature": tip["signature"]}
    async with http.post(f"{api}/task/{tip['taskId']}/runs/{tip['runId']}/claim", json=body) as r:
        return r.status, await r.json()


async def post(http: aiohttp.ClientSession, url: str,
               body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """POST ``body`` (default ``{}``) to the queue API: the status and the JSON answer."""
    async with http.post(url, json=body if body is not None else {}) as r:
        return r.status, await r.json()
