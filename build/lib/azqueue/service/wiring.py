"""Everything a process needs to act on the queue, built in one place, opened and closed
together.

Both the HTTP server and the stand-alone resolvers (``azqueue resolve``) build their
services here, so a state change made anywhere writes and publishes its events. Each
component is given its collaborators by name; this is the only module that knows how
they fit together. The handlers reach a component as ``call.services.<component>``, the
resolver loops are given the components they use.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta

from azqueue import metrics
from azqueue.config import Settings
from azqueue.events.bells import BrokerBells
from azqueue.events.outbox import Outbox
from azqueue.events.publisher import EventSink, Publisher
from azqueue.model import credentials
from azqueue.model.task import Task
from azqueue.model.tip import TipForm, TipSigner
from azqueue.model.upload import UploadSigner
from azqueue.service.artifacts import ArtifactService
from azqueue.service.batch import BatchReads
from azqueue.service.cache import TaskCache
from azqueue.service.changes import Changes
from azqueue.service.claimindex import ClaimIndex
from azqueue.service.claims import Claims
from azqueue.service.counts import RunningClaims, TaskQueueCounts
from azqueue.service.definitions import Definitions
from azqueue.service.dependencies import Dependencies
from azqueue.service.doorbell import Doorbell
from azqueue.service.expiry import Expiry
from azqueue.service.groupowner import GroupOwners
from azqueue.service.groups import TaskGroups
from azqueue.service.health import Health
from azqueue.service.hints import PendingHints
from azqueue.service.priority import TaskPriority
from azqueue.service.repair import Repair
from azqueue.service.rerun import Rerun
from azqueue.service.resolution import Resolution
from azqueue.service.taskurls import TaskUrls
from azqueue.service.tips import Tips
from azqueue.service.waiting import Waiting
from azqueue.service.workclaimer import WorkClaimer
from azqueue.service.workers import WorkerInfo
from azqueue.storage.account import StorageAccount
from azqueue.storage.bells import BellTable
from azqueue.storage.claims import ClaimNotes, ClaimStore
from azqueue.storage.dependents import DependentStore
from azqueue.storage.groups import GroupStore
from azqueue.storage.queues import PendingQueues, Queues
from azqueue.storage.taskrows import Stored
from azqueue.storage.tasks import TaskStore
from azqueue.storage.workers import TaskQueueStore, WorkerStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Services:
    """The components of one process, each built once (see their modules)."""

    definitions: Definitions  # createTask, scheduleTask, task, status, listDependentTasks
    claims: Claims  # claimTask, reclaimTask
    work: WorkClaimer  # claimWork
    resolution: Resolution  # reports, cancelTask, claim expiry, deadlines
    groups: TaskGroups
    priority: TaskPriority  # changeTaskPriority
    rerun: Rerun
    batch: BatchReads  # tasks, statuses
    counts: TaskQueueCounts
    workers: WorkerInfo
    task_urls: TaskUrls  # pollTaskUrls
    artifacts: ArtifactService
    expiry: Expiry
    health: Health  # __heartbeat__, __metrics__
    dependencies: Dependencies
    index: ClaimIndex
    changes: Changes
    tips: Tips
    doorbell: Doorbell
    outbox: Outbox | None


def build(settings: Settings, account: StorageAccount, outbox: Outbox | None) -> Services:
    """The components on ``account``, wired together; nothing is created in storage yet
    (``open_services`` does that)."""
    tasks = TaskStore(account)
    queues = Queues(account)
    pending = PendingQueues(account, queues)
    groups = GroupStore(account)
    signer = TipSigner(settings.tip_secrets, settings.tip_form)
    cache = TaskCache()
    claim_timeout = timedelta(seconds=settings.claim_timeout)
    deadline_queue = account.queue_name("deadline")
    repair_delay = timedelta(seconds=settings.tip_repair_delay)
    hints = PendingHints(queues, pending, settings.claim_work_fallback_interval)
    waiting = Waiting()
    index = ClaimIndex(ClaimStore(account), ClaimNotes(account), tasks, claim_timeout)
    doorbell = Doorbell(
        waiting, hints, index.replica,
        broker=BrokerBells(settings.amqp_url, settings.exchange_prefix,
                           settings.storage.prefix, index.replica)
        if settings.amqp_url else None,
        table=None if settings.amqp_url else BellTable(account),
        interval=settings.doorbell_interval)
    tips = Tips(signer, queues, pending, tasks, waiting, doorbell)
    workerinfo = WorkerInfo(WorkerStore(account), TaskQueueStore(account))

    # Passing a resolution on schedules the tasks that wait for it, which is defining's
    # part: bound once ``definitions`` exists (it needs ``dependencies`` itself).
    async def schedule(task_id: str, loaded: Stored, requeue: bool) -> Task:
        return await definitions.schedule(task_id, loaded, requeue)

    dependencies = Dependencies(
        tasks, DependentStore(account), queues, account.queue_name("dependencies"),
        timedelta(seconds=settings.dependencies_recovery_delay), schedule)
    changes = Changes(tasks, outbox, dependencies, cache, queues, tips, index,
                      settings.crash_after_commit)
    owners = GroupOwners(tasks, groups)
    definitions = Definitions(tasks, groups, owners, queues, deadline_queue, repair_delay,
                              dependencies, tips, changes, outbox, workerinfo)
    root = settings.root
    claims = Claims(tasks, queues, pending, signer, cache, changes, tips, index, workerinfo,
                    credentials.Principal(root.client_id, root.access_token, root.scopes),
                    claim_timeout)
    repair = Repair(changes, tips, repair_delay)
    priority = TaskPriority(tasks, changes, tips)
    artifacts = ArtifactService(account, tasks, UploadSigner(settings.tip_secrets),
                                settings.public_root_url, outbox,
                                upload_read_timeout=settings.upload_read_timeout)
    return Services(
        definitions=definitions,
        claims=claims,
        work=WorkClaimer(queues, pending, claims, workerinfo, waiting, doorbell,
                         wait=settings.claim_work_wait,
                         poll_interval=settings.claim_work_poll_interval,
                         fallback_interval=settings.claim_work_fallback_interval),
        resolution=Resolution(tasks, queues, cache, changes, index.store, deadline_queue,
                              repair),
        groups=TaskGroups(tasks, groups, owners, queues, account.queue_name("group-passes"),
                          outbox, changes, definitions, priority),
        priority=priority,
        rerun=Rerun(tasks, groups, changes, tips, events_on=outbox is not None),
        batch=BatchReads(tasks),
        counts=TaskQueueCounts(tasks, queues, pending, signer, cache,
                               RunningClaims(index)),
        workers=workerinfo,
        task_urls=TaskUrls(pending, hints, doorbell, timedelta(seconds=settings.sas_lifetime)),
        artifacts=artifacts,
        expiry=Expiry(tasks, index.store, dependencies.dependents, groups, workerinfo,
                      artifacts),
        health=Health(account, tasks),
        dependencies=dependencies,
        index=index,
        changes=changes,
        tips=tips,
        doorbell=doorbell,
        outbox=outbox)


async def _setup(services: Services) -> None:
    """Create the tables and internal queues (idempotent), start the claim index."""
    await services.definitions.setup()
    await services.index.store.ensure()
    await services.index.notes.ensure()
    await services.workers.setup()
    await services.dependencies.setup()
    services.index.start()
    await services.artifacts.setup()
    await services.groups.setup()
    await services.doorbell.start()


async def _close(services: Services) -> None:
    """Index the claims still running, let in-flight bookkeeping finish (briefly)."""
    await services.doorbell.close()
    await services.index.close()
    await services.workers.close()
    await services.dependencies.close()


EVENTS_OFF = "AZQUEUE_AMQP_URL is not set: task events are off"


@asynccontextmanager
async def open_services(settings: Settings, events: EventSink | None = None,
                        events_off: str | None = EVENTS_OFF) -> AsyncIterator[Services]:
    """The services on the settings' storage, closed on exit. Events go to ``events`` if
    given, else to the broker of ``settings.amqp_url``; with neither they are off, which
    is logged as ``events_off`` (None: the caller says so itself)."""
    account = StorageAccount(settings.storage)
    metrics.STORAGE.watch(account)
    publisher = events
    try:
        outbox = None
        if publisher is None and settings.amqp_url:
            publisher = Publisher(settings.amqp_url, settings.exchange_prefix)
        if publisher is not None:
            outbox = Outbox(TaskStore(account), GroupStore(account), Queues(account), publisher,
                            account.queue_name("events"),
                            timedelta(seconds=settings.events_recovery_delay))
            await outbox.setup()
            await publisher.start()
            await outbox.start()
        elif events_off:
            log.warning("%s", events_off)
        services = build(settings, account, outbox)
        await _setup(services)
        if settings.tip_form is TipForm.RUN:
            log.warning("AZQUEUE_TIP_FORM=run: tips are signed over the taskId and runId "
                        "alone, for replicas of releases up to 6bb8ea3 serving beside this "
                        "one; remove it once none does (docs/operating/upgrades.md)")
        if account.uses_identity:
            log.warning("storage: signed in with azure-identity, no account key: pollTaskUrls "
                        "cannot sign queue SAS URLs and answers 503 (Azure has no "
                        "user-delegation SAS for queues); workers must use claimWork. Artifact "
                        "URLs are signed with a user delegation key")
        elif account.account_key is None:
            log.warning("storage: no account key: pollTaskUrls and artifact URLs cannot be "
                        "signed and answer 503; workers must use claimWork")
        try:
            yield services
        finally:
            await _close(services)
    finally:
        if outbox is not None:
            await outbox.close()
        if publisher is not None:
            await publisher.close()
        await account.close()
