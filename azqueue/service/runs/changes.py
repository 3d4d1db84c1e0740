"""The shared core of every state change: ``change`` writes one, ``settle`` brings the
run's message in line with it.

Every path that changes a task (createTask's insert aside: ``inserted``) goes through
``Changes.change``: ``TaskStore.modify`` (a pure transition of ``model.task``, written
conditionally on the ETag), with the change's events written to the outbox in the same
transaction and published after, a resolution passed on to the tasks that depend on the
task (``dependencies``), this process's copy of the task kept (``cache``), the
metrics counted, and the change told to the ``observers`` the server was built with (the
dashboard's recent changes); what the written entity keeps of its records of messages
is ``tips.records_after``'s to say. A path that may resolve a run calls ``settle`` after
it, which has ``tips`` bring the run's message in line with the Azure queue invariants
written there.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from datetime import timedelta

from azqueue import errors, metrics
from azqueue.events.outbox import EventOutbox
from azqueue.model import events
from azqueue.model.task import RunState, Task
from azqueue.service.dispatch.tips import KEEP, Keep, Tips, records_after
from azqueue.service.runs.cache import TaskCache
from azqueue.service.runs.claimindex import ClaimIndex
from azqueue.service.runs.dependencies import Dependencies
from azqueue.storage.taskrows import HeldMessage, Stored
from azqueue.storage.tasks import Change, TaskStore

log = logging.getLogger(__name__)

# How long a resolution whose run's message was taken by a poll waits for the retry to be
# claimed with it before queuing the retry another tip.
RETRY_TIP_WAIT = timedelta(seconds=10)

# At most this many resolutions' messages are settled after their answers at once
# (``Changes.settle_soon``): a settle is one storage request in the main (the delete, or
# the release for the retry), so this many at 10 ms a round trip settle thousands a
# second, more than a replica's reports make, and they hold at most a third of the
# storage connections (``storage.account.MAX_CONNECTIONS``) however many reports come
# at once. A report that finds them all busy settles its own before it is answered.
MAX_SETTLING = 64
# How long shutdown waits for the messages still being settled once the calls under
# way are answered: a settle's longest path (``RETRY_TIP_WAIT``, then a put and its
# record) with room to spare, and within the deployment's 90 s grace after the 5 s
# pause and claimWork's 20 s wait (docs/operating/deploying.md).
SETTLE_GRACE = 20.0

# Told ``(before, after)`` of every change this process stores (``before`` None: a new
# task), on the request's path: quick, and never failing.
ChangeObserver = Callable[[Task | None, Task], None]


@dataclass(frozen=True, slots=True)
class Changes:
    """Writing a task's changes, and settling its runs' messages after them.

    ``crash_after_commit`` (a test setting) exits the process right after each stored
    change, to test what a replica that dies there leaves."""

    tasks: TaskStore
    outbox: EventOutbox
    dependencies: Dependencies
    cache: TaskCache
    tips: Tips
    index: ClaimIndex
    crash_after_commit: bool = False
    observers: tuple[ChangeObserver, ...] = ()
    _settling: set[asyncio.Task[None]] = field(default_factory=set)

    async def change(self, task_id: str, fn: Callable[[Task], Task],
                     loaded: Stored | None = None, hold: HeldMessage | None | Keep = KEEP,
                     speculative: bool = False) -> Change:
        """``tasks.modify`` with the change's events written to the outbox and published,
        a resolution passed on to the tasks that depend on this one, and this process's
        copy of the task kept up to date."""
        watch = self.dependencies.watch(task_id)
        try:
            async with self.outbox.writing(task_id) as out:
                change = await self.tasks.modify(
                    task_id, fn, loaded, out.events_for(events.for_change), watch.before_write,
                    speculative, records=partial(records_after, hold=hold))
                if change.changed:
                    self._fault_point()
                # The events are a function of the change: published as written, from
                # memory.
                out.wrote(change.events, alone=change.after.alone_in_group)
        except BaseException:
            self.cache.drop(task_id)
            raise
        self.cache.put(change.stored)
        if change.changed:
            self._counted(change.before, change.after)
        await watch.after(change.before, change.after)
        return change

    def inserted(self, stored: Stored) -> None:
        """A new task was stored (createTask's insert): this process's copy of it, its
        metrics and the crash fault point, as for a change."""
        self.cache.put(stored)
        self._counted(None, stored.task)
        self._fault_point()

    def _counted(self, before: Task | None, after: Task) -> None:
        metrics.count_change(before, after)
        for observer in self.observers:
            observer(before, after)

    async def settle(self, change: Change, run_id: int) -> None:
        """Bring run ``run_id``'s message and claim index in line with the resolution that
        ``change`` wrote; nothing if the change did not resolve it (whoever did settles)."""
        if _resolves(change, run_id):
            await self._settle(change, run_id, self._unclaimed(change, run_id))

    def _unclaimed(self, change: Change, run_id: int) -> bool:
        """The run ``change`` resolved is no longer counted as claimed here, from now on
        (if it was running). Whether it may have a claim index row left to delete."""
        before = change.before.runs
        if run_id >= len(before) or before[run_id].state is not RunState.RUNNING:
            return False
        return self.index.forget(change.after.task_id, run_id,
                                 change.after.runs[run_id].started)

    async def _settle(self, change: Change, run_id: int, indexed: bool) -> None:
        """``settle`` once the run is no longer counted as claimed here: its message, then
        its claim index row if it may have one (``indexed``)."""
        task = change.after
        retry = task.runs[run_id + 1] if run_id + 1 < len(task.runs) else None
        retry_pending = retry is not None and retry.state is RunState.PENDING
        held = change.held_before
        if held is not None and not held.pop_receipt:
            held = None  # its receipt was lost: the message reappears at takenUntil
        tip_ready = False
        if held is not None and held.run_id == run_id:
            tip_ready = await self.tips.settle_resolved(task, held, retry_pending)
        if retry_pending and not tip_ready and not (
                held is not None and held.run_id == run_id
                and await self._claimed_soon(task.task_id, run_id + 1)):
            await self.tips.queue(change.stored, run_id + 1)
        if indexed:
            await self.index.unindex(task.task_id, run_id)

    async def settle_soon(self, change: Change, run_id: int) -> None:
        """``settle``, its requests after the caller has answered. Before the answer, the
        run leaves this process's claimed counts (its claim note dropped, at no cost), so
        a count asked after the answer does not count it. The change is stored, and what
        settling does after is only the run's message (and claim index row, if it is old
        enough to have one) kept in line with it, which holds without it (a message left
        behind reappears at ``takenUntil`` and its claim is refused, a retry's tip is
        repaired, see ``tips``; the claim resolver deletes a resolved run's row). At most
        ``MAX_SETTLING`` settle so at once; beyond them the caller settles before it
        answers, so that a burst of reports is slowed down to what storage takes instead
        of leaving an unbounded number of requests behind it. ``close`` waits for them.
        Never raises: a failure is logged."""
        if not _resolves(change, run_id):
            return
        indexed = self._unclaimed(change, run_id)
        if len(self._settling) >= MAX_SETTLING:
            await self._settle_logged(change, run_id, indexed)
            return
        job = asyncio.get_running_loop().create_task(
            self._settle_logged(change, run_id, indexed),
            name=f"{change.after.task_id}/{run_id}")
        self._settling.add(job)
        job.add_done_callback(self._settling.discard)

    @property
    def settling(self) -> int:
        """How many resolutions' messages are being settled after their answers."""
        return len(self._settling)

    async def _settle_logged(self, change: Change, run_id: int, indexed: bool) -> None:
        try:
            await self._settle(change, run_id, indexed)
        except (errors.StorageError, errors.QueueError) as e:
            log.warning("task %s run %d: its message was not settled after its resolution, "
                        "and reappears when its claim ends: %s", change.after.task_id, run_id, e)
        except Exception:
            log.exception("task %s run %d: settling its message failed", change.after.task_id,
                          run_id)

    async def close(self) -> None:
        """Wait up to ``SETTLE_GRACE`` seconds for the messages still being
        settled; those left are given up, and named in the log: their messages reappear
        when their claims end (and a retry's tip is repaired)."""
        if not self._settling:
            return
        _, left = await asyncio.wait(set(self._settling), timeout=SETTLE_GRACE)
        if not left:
            return
        names = sorted(job.get_name() for job in left)
        log.warning("shutting down with %d resolved run(s) whose message is not settled; "
                    "each reappears when its claim ends: %s%s", len(names),
                    ", ".join(names[:20]), " ..." if len(names) > 20 else "")
        for job in left:
            job.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    async def _claimed_soon(self, task_id: str, run_id: int) -> bool:
        """Whether pending run ``run_id`` is claimed within ``RETRY_TIP_WAIT``. Asked when
        the message of the run before could not be released: a poll took it, and the
        worker who holds it is claiming this run with it (it says ``run_id``), so a new
        tip would only cost it a refused claim; or it is gone, and the run needs one."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + RETRY_TIP_WAIT.total_seconds()
        while loop.time() < give_up:
            await asyncio.sleep(0.5)
            try:
                runs = (await self.tasks.get(task_id)).runs
            except errors.NotFound:
                return True
            if run_id >= len(runs) or runs[run_id].state is not RunState.PENDING:
                return True
        return False

    def _fault_point(self) -> None:
        if self.crash_after_commit:
            log.critical("AZQUEUE_TEST_CRASH_AFTER_COMMIT: exiting after a stored change")
            os._exit(70)


def _resolves(change: Change, run_id: int) -> bool:
    """Whether ``change`` resolved run ``run_id`` (it was unresolved before it)."""
    task, before = change.after, change.before.runs
    return change.changed and 0 <= run_id < len(task.runs) and \
        task.runs[run_id].state.resolved and \
        not (run_id < len(before) and before[run_id].state.resolved)
