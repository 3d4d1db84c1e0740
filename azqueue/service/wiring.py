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
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta

from azqueue import metrics
from azqueue.config import Settings
from azqueue.errors import ConfigError, StartupError
from azqueue.events.bells import BrokerBells
from azqueue.events.outbox import EventOutbox, NullOutbox, Outbox
from azqueue.events.publisher import EventSink, Publisher
from azqueue.model import credentials
from azqueue.model.task import Task
from azqueue.model.tip import TipForm, TipSigner
from azqueue.model.upload import UploadSigner
from azqueue.service.artifacts.artifacts import ArtifactService
from azqueue.service.dispatch.brokerbell import BrokerTransport
from azqueue.service.dispatch.doorbell import Doorbell, Transport
from azqueue.service.dispatch.hints import PendingHints
from azqueue.service.dispatch.tablebell import TableTransport
from azqueue.service.dispatch.taskurls import TaskUrls
from azqueue.service.dispatch.tips import Tips
from azqueue.service.dispatch.waiting import Waiting
from azqueue.service.runs.cache import TaskCache
from azqueue.service.runs.changes import ChangeObserver, Changes
from azqueue.service.runs.claimindex import ClaimIndex
from azqueue.service.runs.claims import Claims
from azqueue.service.runs.dependencies import Dependencies
from azqueue.service.runs.priority import TaskPriority
from azqueue.service.runs.repair import Repair
from azqueue.service.runs.rerun import Rerun
from azqueue.service.runs.resolution import Resolution
from azqueue.service.runs.triggers import DeadlineTriggers
from azqueue.service.runs.workclaimer import WorkClaimer
from azqueue.service.tasks.batch import BatchReads
from azqueue.service.tasks.counts import RunningClaims, TaskQueueCounts
from azqueue.service.tasks.definitions import Definitions
from azqueue.service.tasks.groupowner import GroupOwners
from azqueue.service.tasks.groups import TaskGroups
from azqueue.service.upkeep.expiry import Expiry
from azqueue.service.upkeep.health import Health
from azqueue.service.upkeep.idlequeues import IdleQueues
from azqueue.service.workers.workers import WorkerInfo
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
    outbox: EventOutbox  # with events off, a NullOutbox


def build(settings: Settings, account: StorageAccount, outbox: EventOutbox,
          observers: tuple[ChangeObserver, ...] = ()) -> Services:
    """The components on ``account``, wired together, every stored change told to
    ``observers``; nothing is created in storage yet (``open_services`` does that)."""
    tasks = TaskStore(account)
    queues = Queues(account)
    pending = PendingQueues(account=account, queues=queues)
    groups = GroupStore(account)
    signer = TipSigner(secrets=settings.tip_secrets, form=settings.tip_form)
    cache = TaskCache()
    claim_timeout = timedelta(seconds=settings.claim_timeout)
    deadline_triggers = DeadlineTriggers(queues, account.queue_name("deadline-batches"),
                                         budget=settings.request_budget)
    legacy_deadline_queue = account.queue_name("deadline")
    repair_delay = timedelta(seconds=settings.tip_repair_delay)
    hints = PendingHints(queues=queues, pending=pending,
                         fallback=settings.claim_work_fallback_interval)
    waiting = Waiting()
    index = ClaimIndex(store=ClaimStore(account), notes=ClaimNotes(account), tasks=tasks,
                       claim_timeout=claim_timeout)
    doorbell = _doorbell(settings, account, waiting, hints, index.replica)
    tips = Tips(signer=signer, queues=queues, pending=pending, tasks=tasks, waiting=waiting,
                doorbell=doorbell)
    task_queues = TaskQueueStore(account)
    workerinfo = WorkerInfo(workers=WorkerStore(account), task_queues=task_queues)
    dependencies = _dependencies(settings, account, tasks, queues, lambda: definitions)
    changes = Changes(tasks=tasks, outbox=outbox, dependencies=dependencies, cache=cache,
                      queues=queues, tips=tips, index=index,
                      crash_after_commit=settings.crash_after_commit, observers=observers)
    owners = GroupOwners(tasks=tasks, groups=groups)
    definitions = Definitions(
        tasks=tasks, groups=groups, owners=owners, queues=queues,
        triggers=deadline_triggers, legacy_deadline_queue=legacy_deadline_queue,
        repair_delay=repair_delay, dependencies=dependencies,
        tips=tips, changes=changes, outbox=outbox, workerinfo=workerinfo)
    root = settings.root
    claims = Claims(
        tasks=tasks, queues=queues, pending=pending, signer=signer, cache=cache,
        changes=changes, tips=tips, index=index, workerinfo=workerinfo,
        issuer=credentials.Principal(root.client_id, root.access_token, root.scopes),
        claim_timeout=claim_timeout)
    priority = TaskPriority(tasks=tasks, changes=changes, tips=tips)
    artifacts = _artifacts(settings, account, tasks, outbox)
    return Services(
        definitions=definitions,
        claims=claims,
        work=WorkClaimer(queues=queues, pending=pending, claims=claims, workerinfo=workerinfo,
                         waiting=waiting, doorbell=doorbell, wait=settings.claim_work_wait,
                         poll_interval=settings.claim_work_poll_interval,
                         fallback_interval=settings.claim_work_fallback_interval),
        resolution=Resolution(
            tasks=tasks, queues=queues, cache=cache, changes=changes, claim_store=index.store,
            deadline_queue=deadline_triggers.queue_name,
            legacy_deadline_queue=legacy_deadline_queue,
            repair=Repair(changes=changes, tips=tips, delay=repair_delay)),
        groups=TaskGroups(tasks=tasks, groups=groups, owners=owners, queues=queues,
                          passes=account.queue_name("group-passes"), outbox=outbox,
                          changes=changes, definitions=definitions, priority=priority),
        priority=priority,
        rerun=Rerun(tasks=tasks, groups=groups, changes=changes, tips=tips,
                    triggers=deadline_triggers, repair_delay=repair_delay,
                    events_on=outbox.on),
        batch=BatchReads(tasks),
        counts=TaskQueueCounts(tasks=tasks, queues=queues, pending_queues=pending,
                               signer=signer, cache=cache, running=RunningClaims(index)),
        workers=workerinfo,
        task_urls=TaskUrls(pending=pending, hints=hints, doorbell=doorbell,
                           sas_lifetime=timedelta(seconds=settings.sas_lifetime)),
        artifacts=artifacts,
        expiry=Expiry(tasks=tasks, claim_store=index.store,
                      dependents=dependencies.dependents, groups=groups,
                      workerinfo=workerinfo, artifacts=artifacts,
                      idle_queues=IdleQueues(pending=pending, task_queues=task_queues)),
        health=Health(account=account, tasks=tasks, broker=_broker_reachable(outbox)),
        dependencies=dependencies, index=index, changes=changes, tips=tips,
        doorbell=doorbell, outbox=outbox)


def _artifacts(settings: Settings, account: StorageAccount, tasks: TaskStore,
               outbox: EventOutbox) -> ArtifactService:
    return ArtifactService(
        account=account, tasks=tasks, signer=UploadSigner(settings.tip_secrets),
        root_url=settings.public_root_url, outbox=outbox,
        upload_read_timeout=settings.upload_read_timeout,
        upload_memory=settings.upload_memory_mib * 1024 * 1024,
        upload_run_memory=settings.upload_run_memory_mib * 1024 * 1024,
        upload_min_rate=settings.upload_min_rate_kib * 1024)


def _dependencies(settings: Settings, account: StorageAccount, tasks: TaskStore, queues: Queues,
                  definitions: Callable[[], Definitions]) -> Dependencies:
    """Passing a resolution on schedules the tasks that wait for it, which is defining's
    part: ``definitions`` is asked for once it exists (it needs ``dependencies`` itself)."""

    async def schedule(task_id: str, loaded: Stored, requeue: bool) -> Task:
        return await definitions().schedule(task_id, loaded, requeue)

    return Dependencies(
        tasks=tasks, dependents=DependentStore(account), queues=queues,
        queue_name=account.queue_name("dependencies"),
        recovery_delay=timedelta(seconds=settings.dependencies_recovery_delay),
        schedule=schedule)


def _broker_reachable(outbox: EventOutbox) -> Callable[[], bool] | None:
    """Whether the events' broker is connected now, for the heartbeat (None: events off)."""
    return (lambda: outbox.connected) if outbox.on else None


def _doorbell(settings: Settings, account: StorageAccount, waiting: Waiting,
              hints: PendingHints, replica: str) -> Doorbell:
    """The doorbell: through the broker with events on, else a table every replica reads."""
    idle_expiry = timedelta(seconds=settings.task_queue_idle_expiry)
    transport: Transport
    if settings.amqp_url:
        transport = BrokerTransport(BrokerBells(
            url=settings.amqp_url, exchange_prefix=settings.exchange_prefix,
            routing_key=settings.storage.prefix, replica=replica))
    else:
        transport = TableTransport(table=BellTable(account), replica=replica,
                                   interval=settings.doorbell_interval, ear_life=idle_expiry)
    return Doorbell(waiting=waiting, hints=hints, transport=transport, idle_expiry=idle_expiry)


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
    await services.changes.close()  # before what settling uses (the index, the doorbell)
    await services.doorbell.close()
    await services.index.close()
    await services.workers.close()
    await services.dependencies.close()
    await services.definitions.triggers.close()


EVENTS_OFF = "AZQUEUE_AMQP_URL is not set: task events are off"


async def allow_browsers(settings: Settings, services: Services) -> None:
    """The Blob service's CORS rule for AZQUEUE_BLOB_CORS_ORIGINS (none: the account's
    rules are left alone), so the dashboard served from those origins follows live logs;
    set as a server starts. A failure is one line, a ``StartupError``."""
    origins = settings.blob_cors_origins
    if not origins:
        return
    try:
        changed = await services.artifacts.blobs.allow_browsers(origins)
    except ConfigError:
        raise
    except Exception as e:
        log.debug("setting the Blob service's CORS rules failed", exc_info=True)
        first_line = (str(e).strip().splitlines() or [""])[0][:300]
        raise StartupError(f"could not set the Blob service's CORS rules for "
                           f"AZQUEUE_BLOB_CORS_ORIGINS: {type(e).__name__}: {first_line}; "
                           "leave it empty to keep the account's rules") from None
    log.info("blob storage %s pages of %s read artifacts (CORS)",
             "now lets" if changed else "lets", ", ".join(origins))


@asynccontextmanager
async def open_services(settings: Settings, events: EventSink | None = None,
                        events_off: str | None = EVENTS_OFF,
                        observers: tuple[ChangeObserver, ...] = ()) -> AsyncIterator[Services]:
    """The services on the settings' storage, closed on exit. Events go to ``events`` if
    given, else to the broker of ``settings.amqp_url``; with neither they are off, which
    is logged as ``events_off`` (None: the caller says so itself). Every change stored is
    told to ``observers``."""
    account = StorageAccount(settings.storage)
    metrics.STORAGE.watch(account)
    publisher = events
    outbox: EventOutbox = NullOutbox()
    try:
        if publisher is None and settings.amqp_url:
            publisher = Publisher(settings.amqp_url, settings.exchange_prefix)
        if publisher is not None:
            # Events on: every change publishes through this outbox (else the null one).
            outbox = Outbox(TaskStore(account), GroupStore(account), Queues(account), publisher,
                            account.queue_name("events"),
                            timedelta(seconds=settings.events_recovery_delay))
            await outbox.setup()
            await publisher.start()
            await outbox.start()
        elif events_off:
            log.warning("%s", events_off)
        services = build(settings, account, outbox, observers)
        await _setup(services)
        if settings.tip_form is TipForm.RUN:
            log.warning("AZQUEUE_TIP_FORM=run: tips are signed over the taskId and runId "
                        "alone, for replicas of 0.1.0 serving beside this "
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
        await outbox.close()
        if publisher is not None:
            await publisher.close()
        await account.close()
