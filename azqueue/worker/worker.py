"""The worker: claims tasks, runs a handler for each, reclaims, and reports.

Lifecycle (docs/workers/sdk.md): ``ready → running → stopping → stopped``. ``start()`` runs the
loop until ``stop()``; every wait in the loop is bounded, so stopping takes seconds.

* Capacity: up to ``capacity`` tasks run at once; the worker asks for exactly its free
  capacity (docs/workers/sas.md: the claims of one poll).
* Work comes from SAS URLs (``mode="sas"``, docs/workers/sas.md; see ``azqueue.worker.sas``
  for the order of polls and the sleeps between empty passes) or from claimWork
  (``mode="claim-work"``, docs/workers/sdk.md; ``azqueue.worker.claimwork``).
* Each task is reclaimed ``reclaim_margin`` seconds before ``takenUntil`` with its own
  credentials, which are then swapped for the new ones. A 409 on reclaim cancels the
  handler at once and forgets the task: no artifacts, no report (docs/workers/sdk.md).
* A cancel reaches the handler within ``status_interval`` seconds (10 by default), not
  at the next reclaim: every running task's status is read that often (one ``status``
  call, one table read on the server), and a run resolved by someone else (canceled,
  deadline-exceeded, claim-expired, ...) cancels the handler and is forgotten alike;
  a canceled one's log then ends with ``CANCELED``.
* Errors retrying cannot fix (the queue answers 400, 401, 403 or 404 when asked for
  work: an invalid task queue, wrong credentials, missing scopes, a rootUrl that is no
  queue) stop the worker: ``start()`` lets running tasks finish and raises
  ``QueueRefused``. Other failures to get work are retried with an exponential backoff
  (``idle_sleep`` doubled per failure in a row, up to ``MAX_RETRY_SLEEP``).
* Each task logs three lines at INFO: claimed, (the handler's own,) resolved.
* Outcomes: see ``azqueue.worker.errors``.
* ``stop()`` lets running tasks finish; ``stop(graceful=False)`` (and SIGTERM/SIGINT
  under ``run_until_signalled``) cancels them and reports each ``worker-shutdown``, so
  the queue retries it elsewhere.
* Handlers get the task's temporary credentials (``TaskRun.queue``), never the worker's.
* Failures the network and the queue are expected to produce (``client.EXPECTED``) are
  logged in one line and retried; anything else is logged with its traceback, so a bug
  cannot repeat silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import aiohttp

from azqueue.worker import client, errors
from azqueue.worker.claimwork import ClaimWorkSource
from azqueue.worker.client import Credentials
from azqueue.worker.config import WorkerConfig
from azqueue.worker.livelog import HandlerLog
from azqueue.worker.run import Handler, TaskRun, check_handler
from azqueue.worker.sas import SasSource

# ``WorkerConfig``, ``TaskRun`` and ``Handler`` live in modules of their own and are
# importable from here too.
__all__ = ["Handler", "TaskRun", "Worker", "WorkerConfig", "WorkerState"]

log = logging.getLogger(__name__)

SLOT_WAIT = 1.0
MAX_RETRY_SLEEP = 30.0
# Answers to a request for work that no retry can change.
FATAL_STATUSES = frozenset({400, 401, 403, 404})
# The last line of the log of a run whose task was canceled while it ran.
CANCELED = "canceled: the task was canceled (cancelTask) and its run stopped"


class WorkerState(StrEnum):
    """Where a ``Worker`` is in its lifecycle: ``ready → running → stopping → stopped``."""

    READY = "ready"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Worker:
    """Claims tasks of one task queue and runs ``handler`` for each (see the module's
    docstring for the rules it follows).

    :param config: the ``WorkerConfig``.
    :param handler: an async function of a ``TaskRun`` (anything else is refused here
        with a TypeError); returning reports the run completed, raising one of
        ``azqueue.worker.errors`` reports that outcome, and any other exception reports
        exception ``internal-error`` (``intermittent-task`` for a request to the queue
        that still failed after its retries).

    ``completed`` counts the runs reported completed; ``requests`` counts the requests
    made to get work (``azqueue.worker.sas.REQUEST_KINDS``, and ``"claimWork"``), and
    ``claimed`` the claims they brought: their ratio is what a task costs in polls.
    ``passes`` counts the times the worker asked for work and had its answer (claims, none,
    or an error), each counted once the claims it brought are running; ``running`` is how
    many runs it holds now (handler running, or outcome being reported). So once
    ``passes`` has grown past its value at some moment with ``claimed`` unchanged, no
    request for work that was under way then brought anything.
    """

    def __init__(self, config: WorkerConfig, handler: Handler) -> None:
        check_handler(handler)
        self.config = config
        self.handler = handler
        self.state = WorkerState.READY
        self._stop = asyncio.Event()
        self._stopped = asyncio.Event()
        self._running: dict[asyncio.Task[None], TaskRun] = {}
        self._shutdown = False
        self.completed = 0
        self.claimed = 0
        self.passes = 0
        self.requests: Counter[str] = Counter()
        self._refused: errors.QueueRefused | None = None
        self._status_credentials: Credentials | None = None
        self._status_refused = False

    async def start(self) -> None:
        """Run the loop until ``stop()``; ``QueueRefused`` if the queue refused work in a
        way no retry can change (after the running tasks are done)."""
        if self.state is not WorkerState.READY:
            raise RuntimeError(f"a worker starts once; this one is {self.state}")
        self.state = WorkerState.RUNNING
        try:
            async with aiohttp.ClientSession() as session:
                source = self._source(session)
                failures = 0
                while not self._stop.is_set():
                    free = self.config.capacity - len(self._running)
                    if free <= 0:
                        await self._wait_for_slot()
                        continue
                    try:
                        claims = await source(free)
                    except client.EXPECTED as e:
                        self.passes += 1
                        status = client.status_of(e)
                        if status in FATAL_STATUSES:
                            self._refused = errors.QueueRefused(
                                f"the queue at {self.config.root_url} refused to give work "
                                f"for {self.config.task_queue_id}: {client.describe(e)}",
                                status)
                            break
                        failures += 1
                        pause = self._retry_sleep(failures)
                        log.warning("getting work failed: %s; retrying in %.1f s",
                                    client.describe(e), pause)
                        await self._sleep(pause)
                        continue
                    except Exception:  # a bug: say where, and keep the worker alive
                        self.passes += 1
                        failures += 1
                        log.error("getting work failed unexpectedly; retrying", exc_info=True)
                        await self._sleep(self._retry_sleep(failures))
                        continue
                    failures = 0
                    self.claimed += len(claims)
                    for claim in claims:
                        self._spawn(session, claim)
                    self.passes += 1
                await self._finish_running()
        finally:
            self.state = WorkerState.STOPPED
            log.debug("worker %s/%s: %d claims for %s", self.config.worker_group,
                      self.config.worker_id, self.claimed, dict(self.requests))
            self._stopped.set()
        if self._refused is not None:
            raise self._refused

    @property
    def running(self) -> int:
        """How many runs the worker holds now."""
        return len(self._running)

    def _retry_sleep(self, failures: int) -> float:
        """Exponential backoff with jitter after ``failures`` failures in a row."""
        base = min(self.config.idle_sleep * 2 ** min(failures - 1, 16), MAX_RETRY_SLEEP)
        return float(base * random.uniform(1, 1.5))

    async def stop(self, graceful: bool = True) -> None:
        """Stop claiming; let running tasks finish (graceful) or report them
        ``worker-shutdown``; return once the loop has ended."""
        if self.state in (WorkerState.READY, WorkerState.STOPPED):
            self.state = WorkerState.STOPPED
            return
        self.state = WorkerState.STOPPING
        self._shutdown = self._shutdown or not graceful
        if not graceful:
            for task in self._running:
                task.cancel()
        self._stop.set()
        await self._stopped.wait()

    async def run_until_signalled(self) -> None:
        """``start()``, with SIGTERM/SIGINT meaning ``stop(graceful=False)``."""
        loop = asyncio.get_running_loop()
        stopping: list[asyncio.Task[None]] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: stopping.append(
                asyncio.ensure_future(self.stop(graceful=False))))
        try:
            await self.start()
        finally:
            if stopping:
                await asyncio.gather(*stopping)

    # -- getting work ----------------------------------------------------------------

    def _source(self, session: aiohttp.ClientSession) -> Callable[[int], Awaitable[list[Any]]]:
        c = self.config
        source: SasSource | ClaimWorkSource
        if c.mode == "sas":
            source = SasSource(session, c.root_url, c.credentials, c.task_queue_id,
                               c.worker_group, c.worker_id, c.idle_sleep,
                               max_idle_sleep=c.max_idle_sleep,
                               priority_recheck=c.priority_recheck, hints=c.hints,
                               requests=self.requests)
        else:
            source = ClaimWorkSource(session, c.root_url, c.credentials, c.task_queue_id,
                                     c.worker_group, c.worker_id, requests=self.requests)
        return lambda n: source.get(n, self._stop)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _wait_for_slot(self) -> None:
        if self._running:
            await asyncio.wait(list(self._running), timeout=SLOT_WAIT,
                               return_when=asyncio.FIRST_COMPLETED)

    async def _finish_running(self) -> None:
        while self._running:
            await asyncio.wait(list(self._running))

    # -- running one task ------------------------------------------------------------

    def _spawn(self, session: aiohttp.ClientSession, claim: dict[str, Any]) -> None:
        key = (claim["status"]["taskId"], int(claim["runId"]))
        if any((r.task_id, r.run_id) == key for r in self._running.values()):
            log.warning("task %s/%d was handed out twice; running it once", *key)
            return
        run = TaskRun(task_id=claim["status"]["taskId"], run_id=int(claim["runId"]),
                      task=claim["task"], taken_until=client.parse_time(claim["takenUntil"]),
                      credentials=Credentials.from_claim(claim["credentials"]),
                      root_url=self.config.root_url, session=session,
                      log_interval=self.config.log_interval)
        log.info("task %s/%d: claimed (%s)", run.task_id, run.run_id,
                 str(run.task.get("metadata", {}).get("name", ""))[:80])
        task = asyncio.ensure_future(self._run(run, HandlerLog(run)))
        self._running[task] = run
        task.add_done_callback(lambda t: self._running.pop(t, None))

    async def _call(self, run: TaskRun) -> None:
        """The handler, called in the run's own task: whatever it raises, even before it
        returns a coroutine, is the run's outcome."""
        await self.handler(run)

    async def _run(self, run: TaskRun, handler_log: HandlerLog) -> None:
        handler = asyncio.ensure_future(self._call(run))
        reclaimer = asyncio.ensure_future(self._reclaim(run, handler))
        watcher = asyncio.ensure_future(self._watch(run, handler))
        if self._shutdown:  # claimed while a forced stop was under way: hand it back
            handler.cancel()
        outcome: tuple[str, str] | None = None
        why = ""  # written at the end of the run's log
        try:
            try:
                await asyncio.shield(handler)
                outcome = ("completed", "")
            except asyncio.CancelledError:
                await _cancel(handler, f"task {run.task_id}/{run.run_id}: the handler")
                if run.lost:
                    log.warning("task %s/%d: %s; stopped it, no report", run.task_id,
                                run.run_id, run.lost_because)
                    await _close_log(run, handler_log)
                    if run.canceled:
                        await run.end_log(CANCELED)
                    return
                outcome = ("exception", "worker-shutdown")
            except errors.TaskFailed as e:
                outcome, why = ("failed", str(e)), f"failed: {e}"
            except errors.TaskException as e:
                log.info("task %s/%d: %s: %s", run.task_id, run.run_id, e.reason, e)
                outcome, why = ("exception", e.reason), f"exception ({e.reason}): {e}"
            except client.EXPECTED as e:  # the queue went away under the handler
                status = client.status_of(e)
                reason = "internal-error" if status and status < 500 else "intermittent-task"
                log.warning("task %s/%d: the handler could not reach the queue or storage: %s", run.task_id,
                            run.run_id, client.describe(e))
                outcome = ("exception", reason)
                why = f"exception ({reason}): {type(e).__name__}: {client.describe(e)}"
            except Exception as e:
                log.exception("task %s/%d: the handler failed (a worker bug)", run.task_id,
                              run.run_id)
                outcome = ("exception", "internal-error")
                why = f"exception (internal-error): {type(e).__name__}: {e}"
        finally:
            reclaimer.cancel()
            watcher.cancel()
            try:
                if outcome is not None and not run.lost:
                    # A forced stop must not cancel a report that is already due.
                    report = asyncio.ensure_future(self._end(run, handler_log, why,
                                                             *outcome))
                    try:
                        await asyncio.shield(report)
                    except asyncio.CancelledError:
                        await report
                        raise
            finally:
                await _cancel(reclaimer, f"task {run.task_id}/{run.run_id}: reclaiming")
                await _cancel(watcher, f"task {run.task_id}/{run.run_id}: watching")
                run.log.close()

    async def _end(self, run: TaskRun, handler_log: HandlerLog, why: str, state: str,
                   reason: str) -> None:
        """Append the rest of what the handler wrote to its log, and why the run ended
        after it, then report it."""
        await _close_log(run, handler_log)
        if why:
            try:
                await run.end_log(f"the run ended {why}")
            except Exception:  # a bug: the run is reported all the same
                log.error("task %s/%d: writing why it ended failed unexpectedly", run.task_id,
                          run.run_id, exc_info=True)
        await self._report(run, state, reason)

    async def _reclaim(self, run: TaskRun, handler: asyncio.Future[None]) -> None:
        while not handler.done():
            due = (run.taken_until - datetime.now(UTC)).total_seconds() - self.config.reclaim_margin
            await asyncio.sleep(max(0.5, due))
            try:
                answer = await run.queue.reclaimTask(run.task_id, run.run_id)
            except client.EXPECTED as e:
                if client.status_of(e) == 409:
                    run.lose("the claim was lost (reclaim answered 409)")
                    handler.cancel()
                    return
                log.warning("task %s/%d: reclaim failed (%s); retrying", run.task_id,
                            run.run_id, e)
                continue
            except Exception:
                log.error("task %s/%d: reclaim failed unexpectedly; retrying", run.task_id,
                          run.run_id, exc_info=True)
                continue
            run.taken_until = client.parse_time(answer["takenUntil"])
            run.credentials = Credentials.from_claim(answer["credentials"])

    async def _watch(self, run: TaskRun, handler: asyncio.Future[None]) -> None:
        """Read the run's status every ``status_interval`` seconds; once someone else
        resolved it, cancel the handler."""
        interval = self.config.status_interval
        while not handler.done():
            await asyncio.sleep(interval * random.uniform(0.9, 1.1))
            try:
                status = await self._status(run)
            except client.EXPECTED as e:
                log.warning("task %s/%d: reading its status failed: %s", run.task_id,
                            run.run_id, client.describe(e))
                continue
            if status is None:
                return
            runs = status.get("runs", [])
            state = runs[run.run_id]["state"] if run.run_id < len(runs) else "?"
            if state != "running" and not handler.done():
                reason = runs[run.run_id].get("reasonResolved", "") if state != "?" else ""
                if (state, reason) == ("exception", "canceled"):
                    run.lose("the task was canceled", canceled=True)
                else:
                    run.lose(f"resolved {state}{f' ({reason})' if reason else ''} by "
                             "someone else")
                handler.cancel()
                return

    async def _status(self, run: TaskRun) -> dict[str, Any] | None:
        """The task's status: asked anonymously, else with the worker's credentials;
        None once both were refused (the watch is then given up: the reclaim still
        notices, later)."""
        while not self._status_refused:
            queue = client.queue(self.config.root_url, self._status_credentials, run.session)
            try:
                answer: dict[str, Any] = (await queue.status(run.task_id))["status"]
                return answer
            except client.EXPECTED as e:
                if client.status_of(e) not in (401, 403):
                    raise
                if self._status_credentials is None and self.config.credentials is not None:
                    self._status_credentials = self.config.credentials
                    continue
                self._status_refused = True
                log.warning("reading task status is refused (%s): a canceled task runs on "
                            "until its next reclaim; grant queue:status:* to anonymous "
                            "requests or to this worker", client.describe(e))
        return None

    async def _report(self, run: TaskRun, state: str, reason: str) -> None:
        queue = run.queue
        try:
            if state == "completed":
                await queue.reportCompleted(run.task_id, run.run_id)
                self.completed += 1
            elif state == "failed":
                await queue.reportFailed(run.task_id, run.run_id)
            else:
                await queue.reportException(run.task_id, run.run_id, {"reason": reason})
            log.info("task %s/%d: resolved %s%s", run.task_id, run.run_id, state,
                     f" ({reason})" if reason else "")
        except client.EXPECTED as e:
            log.warning("task %s/%d: reporting %s failed: %s", run.task_id, run.run_id, state,
                        client.describe(e))
        except Exception:
            log.error("task %s/%d: reporting %s failed unexpectedly", run.task_id, run.run_id,
                      state, exc_info=True)


async def _cancel(task: asyncio.Future[None], what: str) -> None:
    """Cancel ``task`` and wait until it has ended; an exception it ended with instead
    is logged (our own cancellation still propagates)."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed while being cancelled", what, exc_info=task.exception())


async def _close_log(run: TaskRun, handler_log: HandlerLog) -> None:
    """Append the rest of what the handler wrote to ``run.log``; a bug in doing so is
    logged, and the run reported all the same."""
    try:
        await handler_log.close()
    except Exception:
        log.error("task %s/%d: writing the handler's log failed unexpectedly", run.task_id,
                  run.run_id, exc_info=True)
