"""Everything a process needs to act on the queue, declared in one place, started and
stopped together.

Both the HTTP server and the stand-alone resolvers (``azqueue resolve``) get their
services here, so a state change made anywhere writes and publishes its events. Each
component is declared once below (``common.components``): a function that makes it,
whose parameters name the components it needs, with how it starts and stops; the start
order follows from those needs (what a component needs starts before it), the stop order
is its reverse. One store of each kind serves them all (the outbox too). This is the only
module that knows how they fit together. The handlers reach a component as
``call.services.<component>``, the resolver loops are given the components they use.
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
from azqueue.model.tip import TipForm, TipSigner
from azqueue.model.upload import UploadSigner
from azqueue.service.artifacts.artifacts import ArtifactService
from azqueue.service.common.components import Components
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
from azqueue.storage.tasks import TaskStore
from azqueue.storage.workers import TaskQueueStore, WorkerStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Services:
    """The components of one process, each built once (see their modules): what the
    handlers and the resolvers use. A test drives a server through its API and its own
    storage clients, and through one of these only where neither can."""

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
    outbox: EventOutbox  # with events off, a NullOutbox


# What a process is given: its settings, where its events go (None: the broker of
# AZQUEUE_AMQP_URL, or none), what to log with events off (None: the caller says it), and
# whom to tell of every stored change.
COMPONENTS = Components(settings="Settings", events="EventSink | None",
                        events_off="str | None", observers="tuple[ChangeObserver, ...]")
component = COMPONENTS.add


# -- storage ---------------------------------------------------------------------------------

@component(stop=StorageAccount.close)
def account(settings: Settings) -> StorageAccount:
    account = StorageAccount(settings.storage)
    metrics.STORAGE.watch(account)
    return account


@component
def tasks(account: StorageAccount) -> TaskStore:
    return TaskStore(account)


@component
def group_store(account: StorageAccount) -> GroupStore:
    return GroupStore(account)


@component
def queues(account: StorageAccount) -> Queues:
    return Queues(account)


@component
def pending(account: StorageAccount, queues: Queues) -> PendingQueues:
    return PendingQueues(account=account, queues=queues)


@component(start=ClaimStore.ensure)
def claim_store(account: StorageAccount) -> ClaimStore:
    return ClaimStore(account)


@component(start=ClaimNotes.ensure)
def claim_notes(account: StorageAccount) -> ClaimNotes:
    return ClaimNotes(account)


@component
def dependents(account: StorageAccount) -> DependentStore:
    return DependentStore(account)


@component
def worker_store(account: StorageAccount) -> WorkerStore:
    return WorkerStore(account)


@component
def task_queue_store(account: StorageAccount) -> TaskQueueStore:
    return TaskQueueStore(account)


# -- events ----------------------------------------------------------------------------------

async def _start_publisher(publisher: EventSink | None) -> None:
    if publisher is not None:
        await publisher.start()


async def _close_publisher(publisher: EventSink | None) -> None:
    if publisher is not None:
        await publisher.close()


@component(start=_start_publisher, stop=_close_publisher)
def publisher(settings: Settings, events: EventSink | None,
              events_off: str | None) -> EventSink | None:
    """Where events go: ``events`` if given, else the broker of AZQUEUE_AMQP_URL; with
    neither they are off (logged as ``events_off``)."""
    if events is None and settings.amqp_url:
        return Publisher(settings.amqp_url, settings.exchange_prefix)
    if events is None and events_off:
        log.warning("%s", events_off)
    return events


async def _start_outbox(outbox: EventOutbox) -> None:
    await outbox.setup()
    await outbox.start()


async def _close_outbox(outbox: EventOutbox) -> None:
    await outbox.close()


@component(start=_start_outbox, stop=_close_outbox)
def outbox(settings: Settings, account: StorageAccount, tasks: TaskStore,
           group_store: GroupStore, queues: Queues, publisher: EventSink | None) -> EventOutbox:
    """Events on: every change publishes through this outbox (else the null one)."""
    if publisher is None:
        return NullOutbox()
    return Outbox(tasks, group_store, queues, publisher, account.queue_name("events"),
                  timedelta(seconds=settings.events_recovery_delay))


# -- dispatch: how pending work reaches workers ----------------------------------------------

@component
def signer(settings: Settings) -> TipSigner:
    return TipSigner(secrets=settings.tip_secrets, form=settings.tip_form)


@component
def hints(settings: Settings, queues: Queues, pending: PendingQueues) -> PendingHints:
    return PendingHints(queues=queues, pending=pending,
                        fallback=settings.claim_work_fallback_interval)


@component
def waiting() -> Waiting:
    return Waiting()


@component(start=Doorbell.start, stop=Doorbell.close)
def doorbell(settings: Settings, account: StorageAccount, waiting: Waiting,
             hints: PendingHints, index: ClaimIndex) -> Doorbell:
    """The doorbell: through the broker with events on, else a table every replica reads."""
    idle_expiry = timedelta(seconds=settings.task_queue_idle_expiry)
    transport: Transport
    if settings.amqp_url:
        transport = BrokerTransport(BrokerBells(
            url=settings.amqp_url, exchange_prefix=settings.exchange_prefix,
            routing_key=settings.storage.prefix, replica=index.replica))
    else:
        transport = TableTransport(table=BellTable(account), replica=index.replica,
                                   interval=settings.doorbell_interval, ear_life=idle_expiry)
    return Doorbell(waiting=waiting, hints=hints, transport=transport, idle_expiry=idle_expiry)


@component(stop=Tips.close)
def tips(signer: TipSigner, queues: Queues, pending: PendingQueues, tasks: TaskStore,
         waiting: Waiting, doorbell: Doorbell) -> Tips:
    return Tips(signer=signer, queues=queues, pending=pending, tasks=tasks, waiting=waiting,
                doorbell=doorbell)


@component
def task_urls(settings: Settings, pending: PendingQueues, hints: PendingHints,
              doorbell: Doorbell) -> TaskUrls:
    return TaskUrls(pending=pending, hints=hints, doorbell=doorbell,
                    sas_lifetime=timedelta(seconds=settings.sas_lifetime))


# -- workers and artifacts -------------------------------------------------------------------

@component(start=WorkerInfo.setup, stop=WorkerInfo.close)
def workerinfo(worker_store: WorkerStore, task_queue_store: TaskQueueStore) -> WorkerInfo:
    return WorkerInfo(workers=worker_store, task_queues=task_queue_store)


@component(start=ArtifactService.setup)
def artifacts(settings: Settings, account: StorageAccount, tasks: TaskStore,
              outbox: EventOutbox) -> ArtifactService:
    return ArtifactService(
        account=account, tasks=tasks, signer=UploadSigner(settings.tip_secrets),
        root_url=settings.public_root_url, outbox=outbox,
        upload_read_timeout=settings.upload_read_timeout,
        upload_memory=settings.upload_memory_mib * 1024 * 1024,
        upload_run_memory=settings.upload_run_memory_mib * 1024 * 1024,
        upload_min_rate=settings.upload_min_rate_kib * 1024)


# -- runs: a run's life ----------------------------------------------------------------------

def _claim_timeout(settings: Settings) -> timedelta:
    return timedelta(seconds=settings.claim_timeout)


def _repair_delay(settings: Settings) -> timedelta:
    return timedelta(seconds=settings.tip_repair_delay)


def _legacy_deadline_queue(account: StorageAccount) -> str:
    """Where releases before the deadline triggers put their deadline messages."""
    return account.queue_name("deadline")


@component
def cache() -> TaskCache:
    return TaskCache()


async def _start_index(index: ClaimIndex) -> None:
    index.start()


@component(start=_start_index, stop=ClaimIndex.close)
def index(settings: Settings, claim_store: ClaimStore, claim_notes: ClaimNotes,
          tasks: TaskStore) -> ClaimIndex:
    return ClaimIndex(store=claim_store, notes=claim_notes, tasks=tasks,
                      claim_timeout=_claim_timeout(settings))


@component(stop=DeadlineTriggers.close)
def triggers(settings: Settings, account: StorageAccount, queues: Queues) -> DeadlineTriggers:
    return DeadlineTriggers(queues, account.queue_name("deadline-batches"),
                            budget=settings.request_budget)


@component(start=Dependencies.setup)
def dependencies(settings: Settings, account: StorageAccount, tasks: TaskStore,
                 dependents: DependentStore, queues: Queues) -> Dependencies:
    """Without its scheduler yet: ``dependency_passing`` gives it that."""
    return Dependencies(
        tasks=tasks, dependents=dependents, queues=queues,
        queue_name=account.queue_name("dependencies"),
        recovery_delay=timedelta(seconds=settings.dependencies_recovery_delay))


@component(stop=Changes.close)
def changes(settings: Settings, tasks: TaskStore, outbox: EventOutbox,
            dependencies: Dependencies, cache: TaskCache, tips: Tips,
            index: ClaimIndex, observers: tuple[ChangeObserver, ...]) -> Changes:
    return Changes(tasks=tasks, outbox=outbox, dependencies=dependencies, cache=cache,
                   tips=tips, index=index,
                   crash_after_commit=settings.crash_after_commit, observers=observers)


@component
def claims(settings: Settings, tasks: TaskStore, signer: TipSigner, cache: TaskCache,
           changes: Changes, tips: Tips,
           index: ClaimIndex, workerinfo: WorkerInfo) -> Claims:
    root = settings.root
    return Claims(
        tasks=tasks, signer=signer, cache=cache,
        changes=changes, tips=tips, index=index, workerinfo=workerinfo,
        issuer=credentials.Principal(root.client_id, root.access_token, root.scopes),
        claim_timeout=_claim_timeout(settings))


@component
def work(settings: Settings, tips: Tips, claims: Claims,
         workerinfo: WorkerInfo, waiting: Waiting, doorbell: Doorbell) -> WorkClaimer:
    return WorkClaimer(tips=tips, claims=claims, workerinfo=workerinfo,
                       waiting=waiting, doorbell=doorbell, wait=settings.claim_work_wait,
                       poll_interval=settings.claim_work_poll_interval,
                       fallback_interval=settings.claim_work_fallback_interval)


@component(start=Resolution.setup)
def resolution(settings: Settings, account: StorageAccount, tasks: TaskStore, queues: Queues,
               cache: TaskCache, changes: Changes, claim_store: ClaimStore,
               triggers: DeadlineTriggers, tips: Tips) -> Resolution:
    return Resolution(
        tasks=tasks, queues=queues, cache=cache, changes=changes, claim_store=claim_store,
        deadline_queue=triggers.queue_name,
        legacy_deadline_queue=_legacy_deadline_queue(account),
        repair=Repair(changes=changes, tips=tips, delay=_repair_delay(settings)))


@component
def priority(tasks: TaskStore, changes: Changes, tips: Tips) -> TaskPriority:
    return TaskPriority(tasks=tasks, changes=changes, tips=tips)


@component
def rerun(settings: Settings, tasks: TaskStore, group_store: GroupStore, changes: Changes,
          tips: Tips, triggers: DeadlineTriggers, outbox: EventOutbox) -> Rerun:
    return Rerun(tasks=tasks, groups=group_store, changes=changes, tips=tips,
                 triggers=triggers, repair_delay=_repair_delay(settings), events_on=outbox.on)


# -- tasks: definitions, groups, reads -------------------------------------------------------

@component
def owners(tasks: TaskStore, group_store: GroupStore) -> GroupOwners:
    return GroupOwners(tasks=tasks, groups=group_store)


@component(start=Definitions.setup, stop=Definitions.close)
def definitions(settings: Settings, tasks: TaskStore,
                group_store: GroupStore, owners: GroupOwners,
                triggers: DeadlineTriggers, dependencies: Dependencies, tips: Tips,
                changes: Changes, outbox: EventOutbox, workerinfo: WorkerInfo) -> Definitions:
    return Definitions(
        tasks=tasks, groups=group_store, owners=owners, triggers=triggers,
        repair_delay=_repair_delay(settings), dependencies=dependencies, tips=tips,
        changes=changes, outbox=outbox, workerinfo=workerinfo,
        claim_timeout=_claim_timeout(settings))


@component(stop=Dependencies.close)
def dependency_passing(dependencies: Dependencies, definitions: Definitions) -> Dependencies:
    """``dependencies``, now able to pass a resolution on: the tasks that waited for it
    are scheduled by ``definitions`` (its ``schedule``).

    The two need each other at run time, not only to be built: scheduling a dependent is
    a change (``changes``, which ``definitions`` uses), and every change is watched by
    ``dependencies`` in case it resolves a task others wait for. So ``dependencies`` is
    built without its scheduler and given it here, once both exist. As a component of its
    own this link starts after both and stops before either and before all they use: its
    stop waits for the resolutions still being passed on in the background, which change
    tasks, before the changes, the index, the outbox and the storage stop."""
    dependencies.schedules_with(definitions.schedule)
    return dependencies


@component(start=TaskGroups.setup)
def task_groups(account: StorageAccount, tasks: TaskStore, group_store: GroupStore,
                owners: GroupOwners, queues: Queues, outbox: EventOutbox, changes: Changes,
                definitions: Definitions, priority: TaskPriority) -> TaskGroups:
    return TaskGroups(tasks=tasks, groups=group_store, owners=owners, queues=queues,
                      passes=account.queue_name("group-passes"), outbox=outbox,
                      changes=changes, definitions=definitions, priority=priority)


@component
def batch(tasks: TaskStore) -> BatchReads:
    return BatchReads(tasks)


@component
def counts(tasks: TaskStore, queues: Queues, pending: PendingQueues, signer: TipSigner,
           cache: TaskCache, index: ClaimIndex) -> TaskQueueCounts:
    return TaskQueueCounts(tasks=tasks, queues=queues, pending_queues=pending,
                           signer=signer, cache=cache, running=RunningClaims(index))


# -- upkeep ----------------------------------------------------------------------------------

@component
def expiry(tasks: TaskStore, claim_store: ClaimStore, dependents: DependentStore,
           group_store: GroupStore, workerinfo: WorkerInfo, artifacts: ArtifactService,
           pending: PendingQueues, task_queue_store: TaskQueueStore) -> Expiry:
    return Expiry(tasks=tasks, claim_store=claim_store, dependents=dependents,
                  groups=group_store, workerinfo=workerinfo, artifacts=artifacts,
                  idle_queues=IdleQueues(pending=pending, task_queues=task_queue_store))


def _broker_reachable(outbox: EventOutbox) -> Callable[[], bool] | None:
    """Whether the events' broker is connected now, for the heartbeat (None: events off)."""
    return (lambda: outbox.connected) if outbox.on else None


@component
def health(settings: Settings, account: StorageAccount, tasks: TaskStore,
           outbox: EventOutbox) -> Health:
    return Health(account=account, tasks=tasks, broker=_broker_reachable(outbox),
                  private_metrics=bool(settings.metrics_token))


# -- what the API and the resolvers hold -----------------------------------------------------

@component
def services(definitions: Definitions, claims: Claims, work: WorkClaimer,
             resolution: Resolution, task_groups: TaskGroups, priority: TaskPriority,
             rerun: Rerun, batch: BatchReads, counts: TaskQueueCounts,
             workerinfo: WorkerInfo, task_urls: TaskUrls, artifacts: ArtifactService,
             expiry: Expiry, health: Health, dependency_passing: Dependencies,
             index: ClaimIndex, outbox: EventOutbox) -> Services:
    return Services(
        definitions=definitions, claims=claims, work=work, resolution=resolution,
        groups=task_groups, priority=priority, rerun=rerun, batch=batch, counts=counts,
        workers=workerinfo, task_urls=task_urls, artifacts=artifacts, expiry=expiry,
        health=health, dependencies=dependency_passing, index=index, outbox=outbox)


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
    """The services on the settings' storage, started in the order of their needs and
    stopped in the reverse on exit. Events go to ``events`` if given, else to the broker
    of ``settings.amqp_url``; with neither they are off, which is logged as
    ``events_off`` (None: the caller says so itself). Every change stored is told to
    ``observers``."""
    async with COMPONENTS.running(settings=settings, events=events, events_off=events_off,
                                  observers=observers) as built:
        services: Services = built["services"]
        account: StorageAccount = built["account"]
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
        yield services
