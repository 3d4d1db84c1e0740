"""The worker the ``azqueue_worker`` fixture hands out: a ``Worker`` of the SDK for one
task queue, run by ``drain()`` until nothing of it is pending or running, whose handler's
failures fail the test that drains it (``HandlerError``); ``drain_all`` drains several at
once.

Threads: the worker and its handler run on the ``BackgroundLoop``'s thread, whatever
thread the test runs on. ``drain()`` blocks the calling thread until it is over (a test's
asyncio loop too: an asyncio test awaits ``drain_async()`` instead), so what a handler
wrote is the test's to read once it returns; while it runs, state a handler shares with
code on another thread (an asyncio test's loop) needs a lock."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from azqueue.testing.background import BackgroundLoop
from azqueue.worker import client
from azqueue.worker.client import Credentials
from azqueue.worker.config import WorkerConfig
from azqueue.worker.errors import WorkerError
from azqueue.worker.run import Handler, TaskRun, check_handler
from azqueue.worker.worker import Worker

if TYPE_CHECKING:
    from azqueue.testing.server import AzqueueServer

log = logging.getLogger(__name__)

WORKER_GROUP = "azqueue-testing"
MODES = ("claim-work", "sas")
DEPRECATED_MODES = {"claimwork": "claim-work"}
# What a test worker runs with unless told otherwise (a deployment's defaults are the
# WorkerConfig's): a cancel or a deadline stops the handler within about a second, and a
# test that is idle costs little time.
TEST_DEFAULTS: dict[str, Any] = {"status_interval": 1.0, "idle_sleep": 0.2,
                                 "max_idle_sleep": 1.0, "priority_recheck": 1.0}
# The reclaim margin is the WorkerConfig's (60 s), or a third of a shorter claim_timeout
# of the server, so that a claim of a few seconds is not reclaimed in a loop.
RECLAIM_SHARE = 3.0
# What a handler raises that fails the test draining it, by default.
PROPAGATE: tuple[type[BaseException], ...] = (AssertionError,)
# The WorkerConfig fields a test sets by name (the others come from the server and the
# fixture's own arguments).
SETTINGS = frozenset(f.name for f in dataclasses.fields(WorkerConfig)) - {
    "root_url", "credentials", "task_queue_id", "worker_group", "worker_id", "capacity",
    "mode"}

Propagate = bool | type[BaseException] | tuple[type[BaseException], ...]


def normalize_mode(mode: str, stacklevel: int = 3) -> str:
    """``mode`` as WorkerConfig spells it; the old spelling with a DeprecationWarning."""
    if mode in DEPRECATED_MODES:
        new = DEPRECATED_MODES[mode]
        warnings.warn(f"mode={mode!r} is deprecated: write mode={new!r}", DeprecationWarning,
                      stacklevel=stacklevel)
        return new
    if mode not in MODES:
        raise ValueError(f"mode must be 'claim-work' or 'sas', not {mode!r}")
    return mode


@dataclass(frozen=True, slots=True)
class HandlerError:
    """What a handler raised in one run (other than the SDK's outcomes, ``TaskFailed``
    and ``TaskException``): the run was reported exception ``internal-error``."""

    task_id: str
    run_id: int
    error: BaseException


class DrainTimeout(AssertionError):
    """``drain()`` gave up: tasks were still pending or running."""


class QueueWorker:
    """A worker of the SDK (``azqueue.worker.Worker``) for one task queue, run by
    ``drain()`` until no task of it is pending or running.

    :param handler: the SDK's handler, an async function of a ``TaskRun``, run on the
        background loop: returning reports the run completed, raising ``TaskFailed``
        reports it failed, any other exception reports exception ``internal-error``.
    :param capacity: how many tasks run at once.
    :param mode: ``"claim-work"`` (claimWork long polls) or ``"sas"`` (the Azure queues of
        pollTaskUrls); ``"claimwork"`` is the deprecated spelling of the first.
    :param worker_group, worker_id: what the worker claims as.
    :param credentials: the worker's: None for the root client's, a ``Credentials``, or
        the id of a client the server knows (``@pytest.mark.azqueue(clients=...)``).
    :param scopes: if given, the worker uses temporary credentials of the root client
        holding only these scopes.
    :param propagate: the exceptions of the handler that ``drain()`` raises once it is
        over: those of these types (``AssertionError`` by default, and pytest's own
        ``pytest.fail()``), all (True) or none (False); each is in ``errors`` either way.
    :param settings: any other field of ``WorkerConfig`` by name (``status_interval``,
        ``reclaim_margin``, ``log_interval``, ...); the test defaults are ``TEST_DEFAULTS``.

    ``claimed`` and ``completed`` count the runs over every ``drain()``.
    """

    def __init__(self, loop: BackgroundLoop, server: AzqueueServer, task_queue_id: str,
                 handler: Handler, *, capacity: int = 1, mode: str = "claim-work",
                 worker_id: str = "worker-1", worker_group: str = WORKER_GROUP,
                 credentials: Credentials | str | None = None,
                 scopes: Sequence[str] | None = None, propagate: Propagate = PROPAGATE,
                 **settings: Any) -> None:
        unknown = sorted(set(settings) - SETTINGS)
        if unknown:
            raise TypeError(f"unknown worker setting(s) {', '.join(unknown)}; a test worker "
                            f"takes capacity, mode, worker_group, worker_id, credentials, "
                            f"scopes, propagate and {', '.join(sorted(SETTINGS))}")
        check_handler(handler)
        self._loop = loop
        self.server = server
        self.handler = handler
        self.propagate = propagate
        if scopes is not None:
            found = server.temporary_credentials(scopes)
        else:
            found = server.credentials_of(credentials)
        margin = min(60.0, server.settings.claim_timeout / RECLAIM_SHARE)
        self.config = WorkerConfig(
            root_url=server.root_url, credentials=found, task_queue_id=task_queue_id,
            worker_group=worker_group, worker_id=worker_id, capacity=capacity,
            mode="sas" if normalize_mode(mode) == "sas" else "claim-work",
            **{**TEST_DEFAULTS, "reclaim_margin": margin, **settings})
        self.claimed = 0
        self.completed = 0
        self.errors: list[HandlerError] = []
        self._raised = 0  # errors already raised by a drain

    @property
    def task_queue_id(self) -> str:
        return self.config.task_queue_id

    def drain(self, timeout: float = 60.0, *, propagate: Propagate | None = None) -> None:
        """Run the worker until no task of its task queue is pending or running, then stop
        it; ``DrainTimeout`` after ``timeout`` seconds (its running handlers are then
        cancelled and their runs reported ``worker-shutdown``). Then raise what the
        handler raised that ``propagate`` (the worker's by default) names."""
        drain_all([self], timeout, propagate=propagate)

    async def drain_async(self, timeout: float = 60.0, *,
                          propagate: Propagate | None = None) -> None:
        """``drain()`` for a test on an event loop of its own, which keeps running."""
        await drain_all_async([self], timeout, propagate=propagate)

    async def _guarded(self, run: TaskRun) -> None:
        """The handler, its failures noted for the test (and reported as the SDK does)."""
        try:
            await self.handler(run)
        except (WorkerError, asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # pytest.fail() and the like are BaseExceptions
            self.errors.append(HandlerError(run.task_id, run.run_id, e))
            if isinstance(e, Exception):
                raise
            raise RuntimeError(f"{type(e).__name__}: {e}") from e

    def handler_error(self, propagate: Propagate | None) -> BaseException | None:
        """The first handler error since the last drain that ``propagate`` names, with a
        note on where it was raised and what else was."""
        new, self._raised = self.errors[self._raised:], len(self.errors)
        wanted = self.propagate if propagate is None else propagate
        if wanted is False:
            return None
        chosen = [e for e in new if wanted is True or isinstance(e.error, wanted)
                  or not isinstance(e.error, Exception)]
        if not chosen:
            return None
        first = chosen[0]
        others = "; ".join(f"{type(e.error).__name__} in task {e.task_id}/{e.run_id}"
                           for e in chosen[1:])
        first.error.add_note(
            f"raised by the handler of {self.task_queue_id} in task {first.task_id} run "
            f"{first.run_id}, reported exception internal-error"
            + (f"; also raised: {others}" if others else "")
            + "; a test that expects it drains with propagate=False and reads .errors")
        return first.error

    async def _drain(self, timeout: float) -> None:
        worker = Worker(self.config, self._guarded)
        started = asyncio.ensure_future(worker.start())
        async with aiohttp.ClientSession() as session:
            queue = client.queue(self.server.root_url, self.server.credentials, session)
            drained = asyncio.ensure_future(self._until_drained(worker, queue))
            over = False  # drained: a refusal the worker ended with is still raised
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
                    over = True
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
                if not started.cancelled() and started.exception() is not None and over:
                    started.result()  # the queue refused it work as the drain ended
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


def _one_loop(workers: Sequence[QueueWorker]) -> BackgroundLoop:
    loops = {id(w._loop): w._loop for w in workers}
    if len(loops) != 1:
        raise ValueError("drain_all() drains workers of one background loop (of one "
                         "session's fixtures), at least one")
    return next(iter(loops.values()))


async def _drain_together(workers: Sequence[QueueWorker], timeout: float
                          ) -> list[BaseException | None]:
    done = await asyncio.gather(*(w._drain(timeout) for w in workers), return_exceptions=True)
    return [d if isinstance(d, BaseException) else None for d in done]


def _raise_first(workers: Iterable[QueueWorker], outcomes: Sequence[BaseException | None],
                 propagate: Propagate | None) -> None:
    """A handler's error first (it says why a drain timed out, too), then a drain's own."""
    errors = [e for w in workers if (e := w.handler_error(propagate)) is not None]
    failed = [o for o in outcomes if o is not None]
    if errors:
        raise errors[0] from (failed[0] if failed else None)
    if failed:
        raise failed[0]


def drain_all(workers: Sequence[QueueWorker], timeout: float = 60.0, *,
              propagate: Propagate | None = None) -> None:
    """``drain()`` the ``workers`` at once, on their background loop: no thread of the
    test's. Each stops once its own task queue is drained; the first failure is raised
    once all are over."""
    workers = list(workers)
    outcomes = _one_loop(workers).run(_drain_together(workers, timeout))
    _raise_first(workers, outcomes, propagate)


async def drain_all_async(workers: Sequence[QueueWorker], timeout: float = 60.0, *,
                          propagate: Propagate | None = None) -> None:
    """``drain_all()`` for a test on an event loop of its own, which keeps running."""
    workers = list(workers)
    outcomes = await _one_loop(workers).run_async(_drain_together(workers, timeout))
    _raise_first(workers, outcomes, propagate)
