"""Getting work through claimWork (``mode="claim-work"``, docs/workers/sdk.md): one
long-polling call per request for work, asking for the worker's free capacity.

``requests`` counts the calls under ``CLAIM_WORK``, as ``azqueue.worker.sas.SasSource``
counts its own.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp

from azqueue.worker import client

CLAIM_WORK_TIMEOUT = 25.0
CLAIM_WORK = "claimWork"  # the key of ``Worker.requests`` counting claimWork calls


class ClaimWorkSource:
    """Claims from the task queue's claimWork.

    :param session: the aiohttp session for the queue.
    :param root_url: the queue's rootUrl.
    :param credentials: the worker's credentials (None: anonymous).
    :param task_queue_id: ``<provisionerId>/<workerType>``.
    :param worker_group: claimWork's ``workerGroup``.
    :param worker_id: claimWork's ``workerId``.
    :param requests: where to count the calls (a new ``Counter`` if None).
    """

    def __init__(self, session: aiohttp.ClientSession, root_url: str,
                 credentials: client.Credentials | None, task_queue_id: str,
                 worker_group: str, worker_id: str, *,
                 requests: Counter[str] | None = None) -> None:
        self.queue = client.queue(root_url, credentials, session)
        self.task_queue_id = task_queue_id
        self.worker_group = worker_group
        self.worker_id = worker_id
        self.requests: Counter[str] = requests if requests is not None else Counter()

    async def get(self, n: int, stop: asyncio.Event) -> list[Any]:
        """Up to ``n`` claims: claimWork's ``tasks``, "the number of tasks it is
        willing to process", is the free capacity. None when ``stop`` is set or no answer
        came within ``CLAIM_WORK_TIMEOUT`` seconds, unless one comes while the call is
        given up."""
        self.requests[CLAIM_WORK] += 1
        call = asyncio.ensure_future(self.queue.claimWork(self.task_queue_id, {
            "workerGroup": self.worker_group, "workerId": self.worker_id, "tasks": n}))
        stopping = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({call, stopping}, timeout=CLAIM_WORK_TIMEOUT,
                                     return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if call not in done:
            # Stopping (or stuck): give up the call. A task the server claimed for us
            # just now expires and is retried; one answered while we gave up is run.
            call.cancel()
            await asyncio.wait({call})
            if call.cancelled():
                return []
        return list(call.result()["tasks"])
