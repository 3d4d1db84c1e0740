"""Everything a process needs to act on the queue, opened and closed together.

Both the HTTP server and the stand-alone resolvers (``azqueue resolve``) build their
services here, so a state change made anywhere writes and publishes its events.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta

from azqueue import metrics
from azqueue.config import Settings
from azqueue.events.outbox import Outbox
from azqueue.events.publisher import Publisher
from azqueue.model.upload import UploadSigner
from azqueue.service.artifacts import ArtifactService
from azqueue.service.counts import TaskQueueCounts
from azqueue.service.groups import TaskGroups
from azqueue.service.queue import QueueService
from azqueue.service.workers import WorkerInfo
from azqueue.storage.account import StorageAccount
from azqueue.storage.groups import GroupStore
from azqueue.storage.queues import Queues
from azqueue.storage.tasks import TaskStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Services:
    queue: QueueService
    artifacts: ArtifactService
    outbox: Outbox | None
    groups: TaskGroups
    workers: WorkerInfo
    counts: TaskQueueCounts


@asynccontextmanager
async def open_services(settings: Settings) -> AsyncIterator[Services]:
    account = StorageAccount(settings.storage)
    metrics.STORAGE.watch(account)
    publisher = None
    try:
        outbox = None
        if settings.amqp_url:
            publisher = Publisher(settings.amqp_url, settings.exchange_prefix)
            outbox = Outbox(TaskStore(account), GroupStore(account), Queues(account), publisher,
                            account.queue_name("events"),
                            timedelta(seconds=settings.events_recovery_delay))
            await outbox.setup()
        else:
            log.warning("AZQUEUE_AMQP_URL is not set: task events are off")
        queue = QueueService(settings, account, outbox)
        await queue.setup()
        artifacts = ArtifactService(account, queue.tasks, UploadSigner(settings.tip_secrets),
                                    settings.public_root_url, outbox,
                                    upload_read_timeout=settings.upload_read_timeout)
        await artifacts.setup()
        groups = TaskGroups(queue)
        await groups.setup()
        if account.uses_identity:
            log.warning("storage: signed in with azure-identity, no account key: pollTaskUrls "
                        "cannot sign queue SAS URLs and answers 503 (Azure has no "
                        "user-delegation SAS for queues); workers must use claimWork. Artifact "
                        "URLs are signed with a user delegation key")
        elif account.account_key is None:
            log.warning("storage: no account key: pollTaskUrls and artifact URLs cannot be "
                        "signed and answer 503; workers must use claimWork")
        try:
            yield Services(queue, artifacts, outbox, groups, workers=queue.workerinfo,
                           counts=TaskQueueCounts(queue))
        finally:
            await queue.close()
    finally:
        if publisher is not None:
            await publisher.close()
        await account.close()
