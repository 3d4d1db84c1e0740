"""Tip repair: a pending run never stays without a tip much longer than the repair delay.

A pending run's tip can go missing when a request fails part-way and cannot finish what
it started: its client gave up or storage stayed unavailable past the request's budget
(``storage.retry``), or its replica died. For example a createTask whose task was stored
long after its tip (a worker's claim of that tip gave up waiting, and the worker deleted
it) that could not queue the second tip; a claim that rewrote the tip and could not
write the claim, nor give the tip back; a resolution that scheduled a retry and could
not put or release its tip. Each of these cases, when the request can finish, is
repaired in the request itself; this module repairs what is left.

The trigger costs nothing new: createTask already stores the task's deadline trigger
(``triggers``, several tasks to a message), to surface first ``tip_repair_delay`` after the task was created (or at the
deadline, if that comes first). The deadline resolver then reads the task and:

* resolved: drops the trigger (deletes the message, if it holds no other), which is all
  it would have done at the deadline (there is no rerun: a resolved task stays
  resolved);
* pending for at least the repair delay: queues another tip for the run (a duplicate of a
  tip that still exists is harmless: the claim is decided by the task, and the worker
  that draws the second tip is refused and deletes it) and looks again after as long as
  the run has been pending (at least the repair delay): a run waiting in a backlog gets
  a handful of extra tips, not one per repair delay;
* pending for less, running, or unscheduled: looks again when it could need a tip: the
  repair delay after the run became pending, after ``takenUntil`` (a claim that expires
  makes a retry pending), or, unscheduled, after as long as it has waited.

Every new look postpones the same message (one update, shared by the tasks it still
holds), until the deadline, when it
resolves the task as before. So a task resolved within the repair delay costs what it
did (one read and the message's delete, now instead of at the deadline); a task that
runs longer costs one read and one update per claim period; a pending one, a tip now
and then. A running run past ``takenUntil`` by the repair delay (its claim was never
indexed: the replica died) is expired here, which queues its retry's tip.

Whether the pending run's tip is alive cannot be asked of Azure (a message cannot be
read by its id), so a look does not know it; the alternatives weighed were:

* asking it anyway, with the pop receipt the tip's put returned (stored with its record,
  free): an update of the message with that receipt succeeds only if nobody received
  the tip since. It saves the duplicate for a run that waits in a backlog, and costs a
  message update and a write of the new receipt at every look; where the tip was
  received (the very case that can lose it) it knows nothing more;
* a trigger of its own for each run made pending (a retry, a scheduled dependent): an
  extra message put on those paths, and a trigger per task besides the deadline's.

A duplicate at a look spaced as long as the run has waited costs less than either.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from azqueue.model import task as model
from azqueue.model import timeutil
from azqueue.model.task import RunState, Task
from azqueue.service.dispatch.tips import Tips
from azqueue.service.runs.changes import Changes
from azqueue.storage.taskrows import Stored

log = logging.getLogger(__name__)


def next_check(task: Task, now: datetime, delay: timedelta) -> datetime | None:
    """When to look at ``task`` again for a missing tip (as of ``now``, after any repair
    due now was made); None once it is resolved."""
    last = task.last_run
    if last is None:
        created = timeutil.parse(task.definition["created"])
        return now + max(delay, now - created)
    if last.state is RunState.PENDING:
        pending = now - last.scheduled
        return last.scheduled + delay if pending < delay else now + max(delay, pending)
    if last.state is RunState.RUNNING:
        assert last.taken_until is not None
        return max(last.taken_until, now) + delay
    return None


def needs_tip(task: Task, now: datetime, delay: timedelta) -> bool:
    """Whether the task's last run has been pending for the repair delay."""
    last = task.last_run
    return last is not None and last.state is RunState.PENDING and now - last.scheduled >= delay


@dataclass(frozen=True, slots=True)
class Repair:
    """The tip repair's look at a task, when its deadline trigger surfaces before the
    deadline; ``delay`` is the repair delay (``tip_repair_delay``)."""

    changes: Changes
    tips: Tips
    delay: timedelta

    async def look(self, stored: Stored, now: datetime) -> datetime | None:
        """Repair what ``stored`` (read just now) may miss: a pending run's tip, a claim
        nobody expired; when to look again (None: resolved, never again)."""
        delay = self.delay
        task = stored.task
        last = task.last_run
        if last is not None and last.state is RunState.RUNNING and \
                last.taken_until is not None and last.taken_until + delay <= now:
            log.warning("task %s: run %d is running past takenUntil %s unexpired: expiring it",
                        task.task_id, last.run_id, timeutil.fmt(last.taken_until))
            change = await self.changes.change(
                task.task_id, lambda t: model.expire_claim(t, last.run_id, now), stored)
            await self.changes.settle(change, last.run_id)
            return next_check(change.after, now, delay)
        if needs_tip(task, now, delay):
            assert last is not None
            if await self.tips.still_waiting(stored):
                log.debug("task %s: run %d pending for %.0fs, its tip untouched in its queue",
                          task.task_id, last.run_id, (now - last.scheduled).total_seconds())
                # Nobody took it: if its ring was lost, the waiters hear of it now.
                self.tips.visible(task)
            else:
                log.info("task %s: run %d pending for %.0fs and its tip was received since it "
                         "was put (or is not known): queuing another in case it was lost",
                         task.task_id, last.run_id, (now - last.scheduled).total_seconds())
                await self.tips.queue(stored, last.run_id)
        return next_check(task, now, delay)
