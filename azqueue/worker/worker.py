"""The worker: claims tasks, runs a handler for each, reclaims, and reports.

Lifecycle (document 002): ``ready → running → stopping → stopped``. ``start()`` runs the
loop until ``stop()``; every wait in the loop is bounded, so stopping takes seconds.

* Capacity: up to ``capacity`` tasks run at once; the worker asks for exactly its free
  capacity (document 001's remark on multiple messages).
* Work comes from SAS URLs (``mode="sas"``, documents 000/001) or from claimWork
  (``mode="claim-work"``, document 003).
* Each task is reclaimed ``reclaim_margin`` seconds before ``takenUntil`` with its own
  credentials, which are then swapped for the new ones. A 409 on reclaim cancels the
  handler at once and forgets the task: no artifacts, no report (document 003).
* Outcomes: see ``azqueue.worker.errors``.
* ``stop()`` lets running tasks finish; ``stop(graceful=False)`` (and SIGTERM/SIGINT
  under ``run_until_signalled``) cancels them and reports each ``worker-shutdown``, so
  the queue retries it elsewhere.
* Handlers get the task's temporary credentials (``TaskRun.queue``), never the worker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import aiohttp
import taskcluster.aio

from azqueue.worker import client, errors
from azqueue.worker.client import Credentials
from azqueue.worker.sas import SasSource

log = logging.getLogger(__name__)

CLAIM_WORK_TIMEOUT = 25.0
SLOT_WAIT = 1.0


class WorkerState(StrEnum):
    READY = "ready"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    root_url: str
    credentials: Credentials | None
    task_queue_id: str
    worker_group: str
    worker_id: str
    capacity: int = 1
    mode: str = "claim-work"  # or "sas"
    reclaim_margin: float = 60.0
    idle_sleep: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in ("sas", "claim-work"):
            raise ValueError(f"mode must be 'sas' or 'claim-work', not {self.mode!r}")
        if not 1 <= self.capacity <= 32:
            raise ValueError("capacity must be 1-32")


@dataclass
class TaskRun:
    """One claimed run, as a handler sees it."""

    task_id: str
    run_id: int
    task: dict[str, Any]
    taken_until: datetime
    credentials: Credentials
    root_url: str
    session: aiohttp.ClientSession
    lost: bool = False

    @property
    def payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = self.task.get("payload", {})
        return payload

    @property
    def queue(self) -> taskcluster.aio.Queue:
        """A queue client with the task's current temporary credentials."""
        return client.queue(self.root_url, self.credentials, self.session)

    async def upload_artifact(self, name: str, data: bytes, content_type: str) -> None:
        """A blob artifact expiring with the task: created, PUT, finished."""
        made = await self.queue.createArtifact(self.task_id, self.run_id, name, {
            "storageType": "blob", "expires": self.task["expires"], "contentType": content_type})
        async with self.session.put(made["putUrl"], data=data, headers=made["headers"]) as r:
            if r.status not in (200, 201):
                raise RuntimeError(f"uploading {name} answered {r.status}: {await r.text()}")
        await self.queue.finishArtifact(self.task_id, self.run_id, name, {})


Handler = Callable[[TaskRun], Awaitable[None]]


class Worker:
    def __init__(self, config: WorkerConfig, handler: Handler) -> None:
        self.config = config
        self.handler = handler
        self.state = WorkerState.READY
        self._stop = asyncio.Event()
        self._stopped = asyncio.Event()
        self._running: dict[asyncio.Task[None], TaskRun] = {}
        self._shutdown = False
        self.completed = 0

    async def start(self) -> None:
        """Run the loop until ``stop()``."""
        if self.state is not WorkerState.READY:
            raise RuntimeError(f"a worker starts once; this one is {self.state}")
        self.state = WorkerState.RUNNING
        try:
            async with aiohttp.ClientSession() as session:
                source = self._source(session)
                while not self._stop.is_set():
                    free = self.config.capacity - len(self._running)
                    if free <= 0:
                        await self._wait_for_slot()
                        continue
                    try:
                        claims = await source(free)
                    except Exception as e:  # the loop must survive any one failure
                        log.warning("getting work failed: %s; retrying", e)
                        await self._sleep(self.config.idle_sleep * random.uniform(1, 2))
                        continue
                    for claim in claims:
                        self._spawn(session, claim)
                await self._finish_running()
        finally:
            self.state = WorkerState.STOPPED
            self._stopped.set()

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
        await self.start()
        if stopping:
            await asyncio.gather(*stopping)

    # -- getting work ----------------------------------------------------------------

    def _source(self, session: aiohttp.ClientSession) -> Callable[[int], Awaitable[list[Any]]]:
        c = self.config
        if c.mode == "sas":
            sas = SasSource(session, c.root_url, c.credentials, c.task_queue_id,
                            c.worker_group, c.worker_id, c.idle_sleep)
            return lambda n: sas.get(n, self._stop)
        queue = client.queue(c.root_url, c.credentials, session)

        async def claim_work(n: int) -> list[Any]:
            call = asyncio.ensure_future(queue.claimWork(c.task_queue_id, {
                "workerGroup": c.worker_group, "workerId": c.worker_id, "tasks": n}))
            stop = asyncio.ensure_future(self._stop.wait())
            done, _ = await asyncio.wait({call, stop}, timeout=CLAIM_WORK_TIMEOUT,
                                         return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if call not in done:
                # Stopping (or stuck): give up the call. A task the server claimed for us
                # just now expires and is retried.
                call.cancel()
                with contextlib.suppress(BaseException):
                    await call
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
                      root_url=self.config.root_url, session=session)
        task = asyncio.ensure_future(self._run(run))
        self._running[task] = run
        task.add_done_callback(lambda t: self._running.pop(t, None))

    async def _run(self, run: TaskRun) -> None:
        handler = asyncio.ensure_future(self.handler(run))
        reclaimer = asyncio.ensure_future(self._reclaim(run, handler))
        if self._shutdown:  # claimed while a forced stop was under way: hand it back
            handler.cancel()
        outcome: tuple[str, str] | None = None
        try:
            try:
                await asyncio.shield(handler)
                outcome = ("completed", "")
            except asyncio.CancelledError:
                handler.cancel()
                with contextlib.suppress(BaseException):
                    await handler
                if run.lost:
                    log.warning("task %s/%d: the claim was lost (reclaim answered 409); "
                                "forgetting it", run.task_id, run.run_id)
                    return
                outcome = ("exception", "worker-shutdown")
            except errors.TaskFailed as e:
                outcome = ("failed", str(e))
            except errors.TaskException as e:
                log.info("task %s/%d: %s: %s", run.task_id, run.run_id, e.reason, e)
                outcome = ("exception", e.reason)
            except Exception:
                log.exception("task %s/%d: the handler failed (a worker bug)", run.task_id,
                              run.run_id)
                outcome = ("exception", "internal-error")
        finally:
            reclaimer.cancel()
            with contextlib.suppress(BaseException):
                await reclaimer
            if outcome is not None and not run.lost:
                # A forced stop must not cancel a report that is already due.
                report = asyncio.ensure_future(self._report(run, *outcome))
                try:
                    await asyncio.shield(report)
                except asyncio.CancelledError:
                    await report
                    raise

    async def _reclaim(self, run: TaskRun, handler: asyncio.Future[None]) -> None:
        while not handler.done():
            due = (run.taken_until - datetime.now(UTC)).total_seconds() - self.config.reclaim_margin
            await asyncio.sleep(max(0.5, due))
            try:
                answer = await run.queue.reclaimTask(run.task_id, run.run_id)
            except Exception as e:
                if client.status_of(e) == 409:
                    run.lost = True
                    handler.cancel()
                    return
                log.warning("task %s/%d: reclaim failed (%s); retrying", run.task_id,
                            run.run_id, e)
                continue
            run.taken_until = client.parse_time(answer["takenUntil"])
            run.credentials = Credentials.from_claim(answer["credentials"])

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
            log.info("task %s/%d: reported %s%s", run.task_id, run.run_id, state,
                     f" ({reason})" if reason else "")
        except Exception as e:
            log.warning("task %s/%d: reporting %s failed: %s", run.task_id, run.run_id, state, e)
