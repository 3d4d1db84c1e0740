"""The worker: claims tasks, runs a handler for each, reclaims, and reports.

Lifecycle (docs/workers/sdk.md): ``ready → running → stopping → stopped``. ``start()`` runs the
loop until ``stop()``; every wait in the loop is bounded, so stopping takes seconds.

* Capacity: up to ``capacity`` tasks run at once; the worker asks for exactly its free
  capacity (docs/workers/sas.md: the claims of one poll).
* Work comes from SAS URLs (``mode="sas"``, documents 000/001; see ``azqueue.worker.sas``
  for the order of polls and the sleeps between empty passes) or from claimWork
  (``mode="claim-work"``, docs/workers/sdk.md).
* Each task is reclaimed ``reclaim_margin`` seconds before ``takenUntil`` with its own
  credentials, which are then swapped for the new ones. A 409 on reclaim cancels the
  handler at once and forgets the task: no artifacts, no report (docs/workers/sdk.md).
* A cancel reaches the handler within ``status_interval`` seconds (10 by default), not
  at the next reclaim: every running task's status is read that often (one ``status``
  call, one table read on the server), and a run resolved by someone else (canceled,
  deadline-exceeded, claim-expired, ...) cancels the handler and is forgotten alike.
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
import re
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, BinaryIO, Literal

import aiohttp
import taskcluster.aio

from azqueue.worker import client, errors
from azqueue.worker.client import Credentials
from azqueue.worker.sas import SasSource

log = logging.getLogger(__name__)

CLAIM_WORK_TIMEOUT = 25.0
SLOT_WAIT = 1.0
MAX_RETRY_SLEEP = 30.0
# Answers to a request for work that no retry can change.
FATAL_STATUSES = frozenset({400, 401, 403, 404})
CLAIM_WORK = "claimWork"  # the key of ``Worker.requests`` counting claimWork calls

Mode = Literal["sas", "claim-work"]
TASK_QUEUE_ID = re.compile(r"[a-zA-Z0-9_-]{1,38}/[a-zA-Z0-9_-]{1,38}")


class WorkerState(StrEnum):
    """Where a ``Worker`` is in its lifecycle: ``ready → running → stopping → stopped``."""

    READY = "ready"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What a ``Worker`` is and how it gets work.

    :param root_url: the queue's rootUrl, e.g. ``http://127.0.0.1:8080``.
    :param credentials: the worker's own credentials (scopes: claim-task or claim-work
        on the task queue, ``queue:worker-id:<workerGroup>/<workerId>``, and
        ``queue:poll-task-urls:<taskQueueId>`` in ``sas`` mode); None for anonymous.
    :param task_queue_id: ``<provisionerId>/<workerType>``.
    :param worker_group: the ``workerGroup`` the worker claims as.
    :param worker_id: the ``workerId`` the worker claims as, unique in its group.
    :param capacity: how many tasks run at once, 1–32 (the most one Azure poll returns),
        default 1. The worker asks for exactly its free capacity.
    :param mode: ``"claim-work"`` (default): long-poll claimWork; ``"sas"``: poll the
        Azure queues of pollTaskUrls directly.
    :param reclaim_margin: seconds before ``takenUntil`` at which a task is reclaimed,
        default 60 (docs/workers/sdk.md: "a few minutes prior to expiration" for the default
        20-minute claims).
    :param idle_sleep: ``sas`` mode: seconds slept after an empty pass over the queues,
        default 1 ("sleep a second or so", docs/workers/sas.md), with ±25% jitter; doubled
        after each further empty pass in a row, up to ``max_idle_sleep``.
    :param max_idle_sleep: ``sas`` mode: the longest sleep between empty passes (on
        average; ±25% jitter), default 5. An idle worker asks the queue which queues
        hold tips once per pass (no Azure request when none does; seven per pass without
        ``hints``); a task created while it sleeps waits up to 1.25 × ``max_idle_sleep``
        seconds for it.
    :param priority_recheck: ``sas`` mode: a worker that keeps finding work in one queue
        keeps polling that queue, and goes back to the top of the list (highest priority
        first) when that queue is empty or when its last pass from the top is this many
        seconds old, default 5. So a higher-priority task waits at most this much longer
        for this worker than if every poll started at the top; with W workers sticky on
        a lower queue, about ``priority_recheck / (W + 1)`` seconds on average. The
        default equals ``max_idle_sleep``: a higher-priority task waits about as long
        for busy workers as any task may wait for idle ones.
    :param hints: ``sas`` mode: every pass from the top first asks the queue which of
        the seven queues hold visible tips (pollTaskUrls with ``?pending=true``, answered
        from a sample at most 2 s old that all the queue's workers share) and polls only
        those, default True. False: every pass polls the queues in order until one has
        work (six empty polls per recheck at a ``lowest`` backlog).
    :param status_interval: seconds between two reads of each running task's status,
        default 10 (with ±10% jitter): a run canceled or resolved by someone else stops
        its handler that much later at most (plus the time of one status call). It
        costs one ``status`` call per running task per interval; the call is made
        without credentials (anonymous ``queue:status:*``, as in Taskcluster), with the
        worker's own when that is refused.
    :param log_interval: seconds between two appends of a running command's new output
        to its live log (``azqueue.worker.shell``), default 2: readers see output that
        much later at most. Only an interval with new output costs a request (one Append
        Block per 4 MiB).
    """

    root_url: str
    credentials: Credentials | None
    task_queue_id: str
    worker_group: str
    worker_id: str
    capacity: int = 1
    mode: Mode = "claim-work"
    reclaim_margin: float = 60.0
    idle_sleep: float = 1.0
    max_idle_sleep: float = 5.0
    priority_recheck: float = 5.0
    hints: bool = True
    status_interval: float = 10.0
    log_interval: float = 2.0

    def __post_init__(self) -> None:
        if not TASK_QUEUE_ID.fullmatch(self.task_queue_id):
            raise ValueError(f"task_queue_id must be <provisionerId>/<workerType>, each 1-38 "
                             f"letters, digits, - or _; not {self.task_queue_id!r}")
        if self.mode not in ("sas", "claim-work"):
            raise ValueError(f"mode must be 'sas' or 'claim-work', not {self.mode!r}")
        if not 1 <= self.capacity <= 32:
            raise ValueError(f"capacity must be 1-32, not {self.capacity}")
        if self.reclaim_margin < 0:
            raise ValueError(f"reclaim_margin must be 0 or more seconds, not {self.reclaim_margin}")
        if not 0 < self.idle_sleep <= self.max_idle_sleep:
            raise ValueError(f"idle_sleep ({self.idle_sleep}) must be over 0 and at most "
                             f"max_idle_sleep ({self.max_idle_sleep})")
        if self.status_interval <= 0:
            raise ValueError(f"status_interval must be over 0 seconds, not "
                             f"{self.status_interval}")
        if self.log_interval <= 0:
            raise ValueError(f"log_interval must be over 0 seconds, not {self.log_interval}")
        if self.priority_recheck <= 0:
            raise ValueError(f"priority_recheck must be over 0 seconds, not "
                             f"{self.priority_recheck}")


@dataclass(slots=True)
class TaskRun:
    """One claimed run, as a handler sees it.

    ``task`` is the task definition and ``payload`` its payload; ``queue`` is a client
    with the run's temporary credentials, swapped for new ones at every reclaim;
    ``upload_artifact`` creates, uploads and finishes a blob artifact; ``log_interval``
    is the worker's (seconds between appends to a live log). ``lost`` becomes
    True when the run is no longer this worker's (a reclaim answered 409, or its status
    shows it resolved by someone else; ``lost_because`` says which): the handler is
    then cancelled.
    """

    task_id: str
    run_id: int
    task: dict[str, Any]
    taken_until: datetime
    credentials: Credentials
    root_url: str
    session: aiohttp.ClientSession
    log_interval: float = 2.0
    lost: bool = False
    lost_because: str = ""

    def lose(self, because: str) -> None:
        self.lost, self.lost_because = True, because

    @property
    def payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = self.task.get("payload", {})
        return payload

    @property
    def queue(self) -> taskcluster.aio.Queue:
        """A queue client with the task's current temporary credentials."""
        return client.queue(self.root_url, self.credentials, self.session)

    async def upload_artifact(self, name: str, data: bytes | BinaryIO,
                              content_type: str) -> None:
        """A blob artifact expiring with the task: created, PUT, finished. ``data`` may be
        an open file (read from its current position): it is streamed in chunks, never
        held whole in memory."""
        made = await self.queue.createArtifact(self.task_id, self.run_id, name, {
            "storageType": "blob", "expires": self.task["expires"], "contentType": content_type})
        async with self.session.put(made["putUrl"], data=data, headers=made["headers"]) as r:
            if r.status not in (200, 201):
                raise RuntimeError(f"uploading {name} answered {r.status}: {await r.text()}")
        await self.queue.finishArtifact(self.task_id, self.run_id, name, {})


Handler = Callable[[TaskRun], Awaitable[None]]


class Worker:
    """Claims tasks of one task queue and runs ``handler`` for each (see the module's
    docstring for the rules it follows).

    :param config: the ``WorkerConfig``.
    :param handler: an async function of a ``TaskRun``; returning reports the run
        completed, raising one of ``azqueue.worker.errors`` reports that outcome, and any
        other exception reports exception ``internal-error``.

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
        if c.mode == "sas":
            sas = SasSource(session, c.root_url, c.credentials, c.task_queue_id,
                            c.worker_group, c.worker_id, c.idle_sleep,
                            max_idle_sleep=c.max_idle_sleep,
                            priority_recheck=c.priority_recheck, hints=c.hints,
                            requests=self.requests)
            return lambda n: sas.get(n, self._stop)
        queue = client.queue(c.root_url, c.credentials, session)

        async def claim_work(n: int) -> list[Any]:
            """Up to ``n`` claims: claimWork's ``tasks``, "the number of tasks it is
            willing to process", is the free capacity."""
            self.requests[CLAIM_WORK] += 1
            call = asyncio.ensure_future(queue.claimWork(c.task_queue_id, {
                "workerGroup": c.worker_group, "workerId": c.worker_id, "tasks": n}))
            stop = asyncio.ensure_future(self._stop.wait())
            done, _ = await asyncio.wait({call, stop}, timeout=CLAIM_WORK_TIMEOUT,
                                         return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if call not in done:
                # Stopping (or stuck): give up the call. A task the server claimed for us
                # just now expires and is retried; one answered while we gave up is run.
                call.cancel()
                await asyncio.wait({call})
                if call.cancelled():
                    return []
            return list(call.result()["tasks"])

        return claim_work

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
        task = asyncio.ensure_future(self._run(run))
        self._running[task] = run
        task.add_done_callback(lambda t: self._running.pop(t, None))

    async def _run(self, run: TaskRun) -> None:
        handler = asyncio.ensure_future(self.handler(run))
        reclaimer = asyncio.ensure_future(self._reclaim(run, handler))
        watcher = asyncio.ensure_future(self._watch(run, handler))
        if self._shutdown:  # claimed while a forced stop was under way: hand it back
            handler.cancel()
        outcome: tuple[str, str] | None = None
        try:
            try:
                await asyncio.shield(handler)
                outcome = ("completed", "")
            except asyncio.CancelledError:
                await _cancel(handler, f"task {run.task_id}/{run.run_id}: the handler")
                if run.lost:
                    log.warning("task %s/%d: %s; stopped it, no report", run.task_id,
                                run.run_id, run.lost_because)
                    return
                outcome = ("exception", "worker-shutdown")
            except errors.TaskFailed as e:
                outcome = ("failed", str(e))
            except errors.TaskException as e:
                log.info("task %s/%d: %s: %s", run.task_id, run.run_id, e.reason, e)
                outcome = ("exception", e.reason)
            except client.EXPECTED as e:  # the queue went away under the handler
                log.warning("task %s/%d: the handler could not reach the queue: %s",
                            run.task_id, run.run_id, client.describe(e))
                outcome = ("exception", "internal-error")
            except Exception:
                log.exception("task %s/%d: the handler failed (a worker bug)", run.task_id,
                              run.run_id)
                outcome = ("exception", "internal-error")
        finally:
            reclaimer.cancel()
            watcher.cancel()
            try:
                if outcome is not None and not run.lost:
                    # A forced stop must not cancel a report that is already due.
                    report = asyncio.ensure_future(self._report(run, *outcome))
                    try:
                        await asyncio.shield(report)
                    except asyncio.CancelledError:
                        await report
                        raise
            finally:
                await _cancel(reclaimer, f"task {run.task_id}/{run.run_id}: reclaiming")
                await _cancel(watcher, f"task {run.task_id}/{run.run_id}: watching")

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
                run.lose(f"resolved {state}{f' ({reason})' if reason else ''} by someone else")
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
