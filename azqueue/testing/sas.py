"""A worker's side of the SAS polling flow (docs/workers/sas.md) in plain aiohttp: no
Azure SDK, exactly what a worker written from that page does, one request a call (the
worker SDK's ``SasSource`` runs the whole loop; its message parsing is shared). Requests
to the queue API need a Hawk-signed session (``azqueue.testing.hawk``); those to the
signed URLs do not care."""

from __future__ import annotations

from typing import Any

import aiohttp

from azqueue.testing.tasks import UnexpectedAnswer, call
from azqueue.worker.sas import QueueMessage, delete_url, parse_messages, queue_not_found

__all__ = ["QueueMessage", "claim", "delete_message", "delete_url", "get_messages",
           "parse_messages", "poll_once", "poll_task_urls", "post"]


async def poll_task_urls(http: aiohttp.ClientSession, api: str, provisioner_id: str,
                         worker_type: str) -> dict[str, Any]:
    """pollTaskUrls: ``{expires, queues: [{signedPollUrl, signedDeleteUrl}, ...]}``."""
    return await call(http, "GET", f"{api}/poll-task-url/{provisioner_id}/{worker_type}")


async def get_messages(http: aiohttp.ClientSession, signed_poll_url: str,
                       n: int = 1) -> list[QueueMessage]:
    """GET the poll URL with &numofmessages=N and parse <QueueMessagesList> (none if the
    queue does not exist yet); ``UnexpectedAnswer`` unless Azure answers 200 or 404
    ``QueueNotFound``."""
    async with http.get(f"{signed_poll_url}&numofmessages={n}") as r:
        body = await r.text()
        if queue_not_found(r.status, body):
            return []
        if r.status != 200:
            raise UnexpectedAnswer(f"polling answered {r.status}: {body[:300]}")
    return parse_messages(body)


async def poll_once(http: aiohttp.ClientSession, urls: dict[str, Any],
                    n: int = 1) -> list[QueueMessage]:
    """Poll the queues in the order given; the messages of the first non-empty one."""
    for q in urls["queues"]:
        messages = await get_messages(http, q["signedPollUrl"], n)
        if messages:
            return messages
    return []


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
