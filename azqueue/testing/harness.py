"""A throwaway azqueue for tests of other projects: a server on its own storage prefix, a
worker of the SDK that runs until its task queue is drained, and Azure's failures on
demand. Each runs on a ``BackgroundLoop``, so plain synchronous tests can use them while
they block; ``azqueue.testing.pytest_plugin`` makes fixtures of them."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import aiohttp

from azqueue.api.app import create_app
from azqueue.config import Client, Settings, StorageSettings
from azqueue.devstorage import Azurite, free_port
from azqueue.storage.account import StorageAccount
from azqueue.testing.background import BackgroundLoop
from azqueue.testing.events import RecordedEvents
from azqueue.testing.faultproxy import FaultProxy, Faults
from azqueue.testing.inprocess import InProcessServer
from azqueue.worker import client
from azqueue.worker.client import Credentials
from azqueue.worker.config import WorkerConfig
from azqueue.worker.run import Handler, check_handler
from azqueue.worker.worker import Worker

if TYPE_CHECKING:
    import taskcluster

log = logging.getLogger(__name__)

ROOT_CLIENT_ID = "azqueue-test-root"
EVENTS_OFF = ("task events are off in this azqueue_server: ask for the azqueue_events "
              "fixture to record them, or give pytest --azqueue-events=AMQP_URL to publish "
              "them to a broker")
# The server's claimWork waits this long for work: a drained worker's last claimWork
# call, which drain() waits for, ends that much after the last task.
CLAIM_WORK_WAIT = 1.0
CLAIM_WORK_POLL_INTERVAL = 0.3
WORKER_GROUP = "azqueue-testing"
SHUTDOWN_TIMEOUT = 0.1
WorkerMode = Literal["claimwork", "claim-work", "sas"]


def new_prefix() -> str:
    """A fresh storage prefix: every queue, table and container of a server starts with it."""
    return "t" + uuid.uuid4().hex[:12]


def server_settings(connection_string: str, prefix: str, amqp_url: str = "",
                    **overrides: Any) -> Settings:
    """Settings of a throwaway server on its own port: a fresh root client (scope ``*``)
    and tip secret, claimWork answering within ``CLAIM_WORK_WAIT`` seconds, events on
    only with ``amqp_url``; ``overrides`` sets fields of ``Settings`` by name (TypeError
    naming the known ones for any other)."""
    known = {f.name for f in dataclasses.fields(Settings)} - {"storage", "root", "host", "port"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"unknown azqueue setting(s) {', '.join(unknown)}; the settings a test "
                        f"may set: {', '.join(sorted(known))}")
    settings = Settings(
        storage=StorageSettings(connection_string, prefix),
        tip_secrets=(secrets.token_urlsafe(24),),
        root=Client(ROOT_CLIENT_ID, secrets.token_urlsafe(24), ("*",)),
        host="127.0.0.1", port=free_port(), amqp_url=amqp_url,
        claim_work_wait=CLAIM_WORK_WAIT, claim_work_poll_interval=CLAIM_WORK_POLL_INTERVAL)
    return dataclasses.replace(settings, **overrides)


@dataclass
class AzqueueServer:
    """A running azqueue: ``root_url``, the root client's ``client_id`` and
    ``access_token``, ``options()`` for the official clients and ``queue()``, a
    ``taskcluster.Queue`` with them. Its state lives under ``prefix`` on its storage."""

    settings: Settings
    _server: InProcessServer = field(repr=False)

    @property
    def root_url(self) -> str:
        return self.settings.public_root_url

    @property
    def client_id(self) -> str:
        return self.settings.root.client_id

    @property
    def access_token(self) -> str:
        return self.settings.root.access_token

    @property
    def prefix(self) -> str:
        return self.settings.storage.prefix

    @property
    def credentials(self) -> Credentials:
        return Credentials(self.client_id, self.access_token)

    def options(self) -> dict[str, Any]:
        """What ``taskcluster.Queue(...)`` (and ``taskcluster.aio.Queue``) take."""
        return {"rootUrl": self.root_url,
                "credentials": {"clientId": self.client_id, "accessToken": self.access_token}}

    def queue(self) -> taskcluster.Queue:
        """The official synchronous client, with the root client's credentials."""
        try:
            import taskcluster
        except ImportError:
            raise RuntimeError("azqueue_server.queue() needs the official Taskcluster client: "
                               "pip install taskcluster") from None
        return taskcluster.Queue(self.options())

    @classmethod
    async def start(cls, settings: Settings, events: RecordedEvents | None = None
                    ) -> AzqueueServer:
        """Serve ``settings``; with ``events``, its events are on and recorded there
        rather than published to a broker."""
        if events is None and not settings.amqp_url:
            log.info("%s", EVENTS_OFF)
        # What is still being answered when the test is over (a worker's last claimWork
        # call, given up) is cancelled at once rather than waited for, and so is what a
        # client gave up before: nothing of a test's server runs on after its test.
        server = await InProcessServer.start(
            settings, create_app(settings, events=events, events_off=None),
            shutdown_timeout=SHUTDOWN_TIMEOUT, handler_cancellation=True)
        return cls(settings, server)

    async def stop(self, keep_storage: bool = False) -> None:
        """Stop serving; delete every queue, table and container of its prefix unless
        ``keep_storage``."""
        await self._server.stop()
        if not keep_storage:
            account = StorageAccount(self.settings.storage)
            try:
                await account.delete_all()
            finally:
                await account.close()


class DrainTimeout(AssertionError):
    """``drain()`` gave up: tasks were still pending or running."""


class QueueWorker:
    """A worker of the SDK (``azqueue.worker.Worker``) for one task queue, run by
    ``drain()`` until no task of it is pending or running.

    :param handler: the SDK's handler, an async function of a ``TaskRun``, run on the
        background loop: returning reports the run completed, raising
        ``azqueue.worker.TaskFailed`` reports it failed, any other exception reports
        exception ``internal-error``.
    :param capacity: how many tasks run at once.
    :param mode: ``"claimwork"`` (claimWork long polls) or ``"sas"`` (the Azure queues of
        pollTaskUrls).

    ``claimed`` and ``completed`` count the runs over every ``drain()``.
    """

    def __init__(self, loop: BackgroundLoop, server: AzqueueServer, task_queue_id: str,
                 handler: Handler, *, capacity: int = 1, mode: WorkerMode = "claimwork",
                 worker_id: str = "worker-1") -> None:
        if mode not in ("claimwork", "claim-work", "sas"):
            raise ValueError(f"mode must be 'claimwork' or 'sas', not {mode!r}")
        check_handler(handler)
        self._loop = loop
        self.server = server
        self.handler = handler
        self.config = WorkerConfig(
            root_url=server.root_url, credentials=server.credentials,
            task_queue_id=task_queue_id, worker_group=WORKER_GROUP, worker_id=worker_id,
            capacity=capacity, mode="sas" if mode == "sas" else "claim-work",
            idle_sleep=0.2, max_idle_sleep=1.0, priority_recheck=1.0)
        self.claimed = 0
        self.completed = 0

    @property
    def task_queue_id(self) -> str:
        return self.config.task_queue_id

    def drain(self, timeout: float = 60.0) -> None:
        """Run the worker until no task of its task queue is pending or running, then stop
        it; ``DrainTimeout`` after ``timeout`` seconds (its running handlers are then
        cancelled and their runs reported ``worker-shutdown``)."""
        self._loop.run(self._drain(timeout))

    async def drain_async(self, timeout: float = 60.0) -> None:
        """``drain()`` for a test on an event loop of its own, which keeps running."""
        await self._loop.run_async(self._drain(timeout))

    async def _drain(self, timeout: float) -> None:
        worker = Worker(self.config, self.handler)
        started = asyncio.ensure_future(worker.start())
        async with aiohttp.ClientSession() as session:
            queue = client.queue(self.server.root_url, self.server.credentials, session)
            drained = asyncio.ensure_future(self._until_drained(worker, queue))
            try:
                done, _ = await asyncio.wait({started, drained}, timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                if drained in done:
                    drained.result()
                    if self.claimed + worker.claimed == 0:
                        log.warning(
                            "drain(): nothing was pending in task queue %s, and the worker "
                            "ran no task; were the tasks created in another task queue (their "
                            "taskQueueId, or provisionerId/workerType)?", self.task_queue_id)
                    return
                if started in done:  # the queue refused it work: QueueRefused says why
                    started.result()
                    raise RuntimeError("the worker stopped by itself")
                try:
                    pending: object = await self._pending(queue) or "none listed"
                except client.EXPECTED as e:
                    pending = f"unknown (listing them failed: {client.describe(e)})"
                raise DrainTimeout(
                    f"the worker of {self.task_queue_id} did not drain it within "
                    f"{timeout:g} s: {worker.running} run(s) still running in it, pending: "
                    f"{pending}; a handler that never returns, or tasks created faster than "
                    "they run? (drain(timeout=...) waits longer)")
            finally:
                drained.cancel()
                await asyncio.wait({drained})
                graceful = not drained.cancelled() and drained.exception() is None
                await worker.stop(graceful=graceful)
                await asyncio.wait({started})
                if not started.cancelled():
                    started.exception()  # raised above when it ended first
                self.claimed += worker.claimed
                self.completed += worker.completed

    async def _until_drained(self, worker: Worker, queue: Any) -> None:
        """Return once nothing of the task queue is pending (listPendingTasks) or running
        in ``worker``, and a request for work that was under way while the pending tasks
        were listed has ended without claims (it may have hidden a tip from the listing)."""
        while True:
            claimed = worker.claimed
            if worker.running == 0 and not await self._pending(queue):
                passes = worker.passes
                while worker.passes <= passes:
                    await asyncio.sleep(0.05)
                if worker.claimed == claimed and worker.running == 0:
                    return
            else:
                await asyncio.sleep(0.1)

    async def _pending(self, queue: Any) -> list[str]:
        answer = await queue.listPendingTasks(self.task_queue_id, query={"limit": 10})
        return [str(t["taskId"]) for t in answer.get("tasks", [])]


class StorageFaults:
    """Azure's own failures in front of a server's storage (``FaultProxy``): ``set(busy,
    lost)`` injects them at those rates, ``once(method, path_contains, fault)`` into the
    next matching request, ``clear()`` stops; ``counts`` says what was done."""

    def __init__(self, loop: BackgroundLoop, proxy: FaultProxy) -> None:
        self._loop = loop
        self.proxy = proxy

    @classmethod
    def start(cls, loop: BackgroundLoop, azurite: Azurite) -> StorageFaults:
        proxy = FaultProxy(azurite.ports)
        loop.run(proxy.start())
        return cls(loop, proxy)

    @property
    def connection_string(self) -> str:
        """The storage account as seen through the proxy."""
        return self.proxy.connection_string()

    def set(self, busy: float = 0.0, lost: float = 0.0, drop_share: float = 0.5) -> None:
        """``busy``: the share of requests answered 503 ServerBusy (nothing applied);
        ``lost``: the share of writes applied whose answer is lost (500
        OperationTimedOut, or ``drop_share`` of them a dropped connection)."""
        faults = Faults(busy=busy, lost=lost, drop_share=drop_share)
        self._loop.call(setattr, self.proxy, "faults", faults)

    def clear(self) -> None:
        self.set()

    def once(self, method: str, path_contains: str, fault: str) -> None:
        """Inject ``fault`` ("busy", "timed out", "dropped", "refused" or "stalled") into
        the next request with ``method`` ("*": any) whose path contains ``path_contains``."""
        self._loop.call(self.proxy.once, method, path_contains, fault)

    @property
    def counts(self) -> dict[str, int]:
        """What was done to how many requests, e.g. ``{"queue busy": 3, ...}``."""
        return dict(self.proxy.counts)

    def stop(self) -> None:
        self._loop.run(self.proxy.stop())
