"""The outbox: publishing what a change wrote, and recovering what a process left behind.

Whether events are on is decided once, where the services are built
(``service.wiring.open_services``): with a broker they get an ``Outbox``, without one a
``NullOutbox``, which writes and publishes nothing. A change goes through either the same
way, ``async with outbox.writing(partition) as out`` (``Writing``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import timedelta
from types import TracebackType
from typing import Protocol

from azqueue import errors
from azqueue.events.publisher import EventSink
from azqueue.model import events, timeutil
from azqueue.model.events import Event
from azqueue.storage.groups import ORPHAN_AGE, GroupStore
from azqueue.storage.queues import Message, Queues, decode_json, encode_json
from azqueue.storage.taskrows import OUTBOX, WRITER
from azqueue.storage.tasks import EventsFor, TaskStore

log = logging.getLogger(__name__)

# How long a request waits for its events to be confirmed before handing them over.
FAST_PATH_TIMEOUT = 3.0
# Why a request's events may not go out at once, besides a bug: handed over quietly.
_NOT_NOW: tuple[type[Exception], ...] = (*errors.TRANSIENT, TimeoutError)
# How long closing waits for the task group checks still going.
CLOSE_WAIT = 5.0
# Clocks of one process may step back a little: a lease covers this much before it says.
CLOCK_MARGIN_NS = 5_000_000_000
# A group check held back by young member rows of no task looks again this long after
# they are ``ORPHAN_AGE`` old (``Outbox._look_again``).
LOOK_AGAIN_MARGIN = timedelta(seconds=10)


def _after(since_ns: int) -> str:
    """The lowest outbox RowKey written at or after ``since_ns``."""
    return f"{OUTBOX}{max(since_ns, 0):020d}"


# Past every outbox RowKey (their times have 20 digits).
_NOTHING_AFTER = f"{OUTBOX}~"


def _may_have_written(e: BaseException) -> bool:
    """Whether a change that raised ``e`` may have been stored: not if a decision refused
    it (a ``QueueError``, the request's answer), before anything was written; a storage
    failure, or any other, may have come after the write."""
    return isinstance(e, errors.StorageError) or not isinstance(e, errors.QueueError)


class Writing:
    """The events of one change on their way out::

        async with outbox.writing(partition) as out:
            written = out.events(lambda: ...)  # to write with the change
            ...  # store the change with them
            out.wrote(written)  # what it stored

    This one is the null outbox's (events off): it makes no events, and leaving the block
    publishes nothing. ``Outbox.writing``'s (``_Publishing``) begins the change on
    entering (this process's lease covers its rows from then), and on leaving publishes
    what ``wrote`` said (or hands it over to recovery, ``Outbox.finish``). A block that
    raises before ``wrote`` abandons the change (``Outbox.abandon``: its rows are handed
    over unless a decision refused it, ``_may_have_written``); one that raises after
    ``wrote`` leaves it in flight (this process's lease covers its rows)."""

    def __init__(self) -> None:
        self.written: list[Event] | None = None
        self.alone: bool | None = None

    def events(self, make: Callable[[], Iterable[Event]]) -> list[Event]:
        """The events to write with the change, as ``make`` gives them; with events off
        none (``make`` is not called)."""
        return []

    def events_for(self, make: EventsFor) -> EventsFor | None:
        """``make`` for ``TaskStore.modify``, which writes the events it gives for each
        change it writes; with events off None (none written)."""
        return None

    def wrote(self, written: Iterable[Event], alone: bool | None = None) -> None:
        """The change was stored with ``written`` (its partition's outbox rows; nothing if
        it was not stored). ``alone``: whether the task, as written, was its group's only
        task (None: not known)."""
        self.written = list(written)
        self.alone = alone

    async def __aenter__(self) -> Writing:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, e: BaseException | None,
                        trace: TracebackType | None) -> None:
        return None


class _Publishing(Writing):
    """``Writing`` of an outbox that publishes (see ``Writing``)."""

    def __init__(self, outbox: Outbox, partition: str) -> None:
        super().__init__()
        self._outbox = outbox
        self._partition = partition
        self._token = -1

    def events(self, make: Callable[[], Iterable[Event]]) -> list[Event]:
        return list(make())

    def events_for(self, make: EventsFor) -> EventsFor | None:
        return make

    async def __aenter__(self) -> Writing:
        self._token = self._outbox.begin()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, e: BaseException | None,
                        trace: TracebackType | None) -> None:
        if self.written is None:
            # Failed before the change was stored, or not told what it wrote (then its
            # rows, if any, are handed over).
            await self._outbox.abandon(self._token, self._partition,
                                       written=e is None or _may_have_written(e))
        elif e is None:
            await self._outbox.finish(self._token, self._partition, self.written,
                                      alone=self.alone)
        # else stored, and failed after it: left in flight, this process's lease covers it.


class EventOutbox(Protocol):
    """What the services use of the outbox, with events on (``Outbox``) or off
    (``NullOutbox``)."""

    @property
    def on(self) -> bool:
        """Whether events are published."""

    @property
    def connected(self) -> bool:
        """Whether the broker takes events now (the heartbeat asks; False with events off)."""

    def writing(self, partition: str) -> Writing:
        """The events of a change in the tasks table's partition ``partition``."""

    async def setup(self) -> None: ...

    async def start(self) -> None: ...

    async def pending(self) -> int:
        """Changes handed over to the resolver, approximately (0 with events off)."""

    async def recover(self) -> int:
        """Publish what processes that stopped left behind (nothing with events off)."""

    async def close(self) -> None: ...


class NullOutbox:
    """The outbox with events off: it writes no event, publishes nothing, and makes no
    storage request."""

    on = False
    connected = False

    def writing(self, partition: str) -> Writing:
        return Writing()

    async def setup(self) -> None:
        return None

    async def start(self) -> None:
        return None

    async def pending(self) -> int:
        return 0

    async def recover(self) -> int:
        return 0

    async def close(self) -> None:
        return None


class Outbox:
    """Publishes the events a change wrote, and recovers those a process left behind."""

    on = True

    def __init__(self, tasks: TaskStore, groups: GroupStore, queues: Queues,
                 publisher: EventSink, trigger_queue: str, recovery_delay: timedelta,
                 lease_queue: str | None = None) -> None:
        self.tasks = tasks
        self.groups = groups
        self.queues = queues
        self.publisher = publisher
        self.trigger_queue = trigger_queue
        self.lease_queue = lease_queue or f"{trigger_queue}-leases"
        self.recovery_delay = recovery_delay
        self._tokens = itertools.count()
        self._in_flight: dict[int, int] = {}  # token -> when the change began (ns)
        self._lease: Message | None = None
        self._renewing: asyncio.Task[None] | None = None
        self._checking: dict[int, asyncio.Task[None]] = {}  # token -> its groups' check

    async def setup(self) -> None:
        await self.groups.ensure()
        await self.queues.ensure(self.trigger_queue)
        await self.queues.ensure(self.lease_queue)

    async def start(self) -> None:
        """Take this process's lease and keep renewing it."""
        self._lease = await self.queues.put(self.lease_queue, self._lease_text(),
                                            visible_in=self.recovery_delay, forever=True)
        self._renewing = asyncio.create_task(self._renew_forever())

    async def close(self) -> None:
        """Give the lease back, unless changes are still in flight (then it reappears and
        their events are recovered)."""
        if self._renewing is not None:
            self._renewing.cancel()
            self._renewing = None
        if self._checking:
            # Checks of task groups still going: a moment to end, else recovery redoes them.
            await asyncio.wait(list(self._checking.values()), timeout=CLOSE_WAIT)
            for check in list(self._checking.values()):
                check.cancel()
        lease, self._lease = self._lease, None
        if lease is not None and not self._in_flight:
            try:
                await self.queues.drop(lease.queue_name, lease.message_id, lease.pop_receipt)
            except (errors.QueueError, errors.StorageError) as e:
                log.warning("could not give the events lease back (%s); it expires", e)

    def _lease_text(self) -> str:
        since = min(self._in_flight.values(), default=time.time_ns()) - CLOCK_MARGIN_NS
        return encode_json({"writer": WRITER, "since": since})

    async def _renew_forever(self) -> None:
        every = self.recovery_delay.total_seconds() / 3
        while True:
            await asyncio.sleep(every)
            try:
                await self._renew()
            except (errors.QueueError, errors.StorageError) as e:
                log.warning("could not renew the events lease (%s); trying again in %.1fs",
                            e, every)

    async def _renew(self) -> None:
        text = self._lease_text()
        lease = self._lease
        if lease is not None:
            try:
                receipt = await self.queues.update(lease.queue_name, lease.message_id,
                                                   lease.pop_receipt, self.recovery_delay, text)
                self._lease = Message(lease.queue_name, lease.message_id, receipt, text, 0)
                return
            except errors.MessageGone:
                log.warning("the events lease of this process was taken over (it was not "
                            "renewed in time); taking a new one")
        self._lease = await self.queues.put(self.lease_queue, text,
                                            visible_in=self.recovery_delay, forever=True)

    async def pending(self) -> int:
        """Azure's approximate count of changes handed over to the resolver."""
        return await self.queues.approximate_count(self.trigger_queue)

    @property
    def connected(self) -> bool:
        return self.publisher.connected

    def writing(self, partition: str) -> Writing:
        """The events of a change in the tasks table's partition ``partition``: begun on
        entering, published or handed over on leaving (``Writing``)."""
        return _Publishing(self, partition)

    def begin(self) -> int:
        """Before a change that writes outbox rows: while it is in flight, this process's
        lease covers its rows. Ended by ``finish`` or ``abandon``."""
        token = next(self._tokens)
        self._in_flight[token] = time.time_ns()
        return token

    async def abandon(self, token: int, task_id: str, written: bool) -> None:
        """The change failed: nothing to publish if nothing was ``written``; else (it may
        have been stored) its rows are handed over to the resolver."""
        if not written or await self._hand_over(token, task_id):
            self._in_flight.pop(token, None)

    async def finish(self, token: int, task_id: str, written: list[Event],
                     alone: bool | None = None) -> None:
        """Publish the events the change wrote (in its partition ``task_id``); if that
        fails, hand them over to the resolver. ``alone``: whether the task, as written,
        was its group's only task (None: not known, the group's records are asked)."""
        if not written:
            self._in_flight.pop(token, None)
        elif await self._publish_or_hand_over(token, task_id, written, alone):
            self._in_flight.pop(token, None)

    async def _publish_or_hand_over(self, token: int, task_id: str,
                                    written: list[Event], alone: bool | None) -> bool:
        """False while the change stays in flight: published, with its groups still to
        check, or not handed over."""
        retry = self.recovery_delay.total_seconds()
        if not self.publisher.reachable:
            log.debug("broker away: events of task %s handed over", task_id)
        else:
            try:
                async with asyncio.timeout(FAST_PATH_TIMEOUT):  # no task of its own
                    await self._publish(token, task_id, written, alone)
                return False
            except _NOT_NOW as e:
                log.warning("events of task %s not published yet (%s: %s); they will be "
                            "retried within %ss", task_id, type(e).__name__, e, retry)
            except Exception:
                # The change is stored: the request succeeds, recovery retries the events.
                log.exception("publishing the events of task %s failed unexpectedly; they "
                              "will be retried within %ss", task_id, retry)
        return await self._hand_over(token, task_id)

    async def _hand_over(self, token: int, task_id: str) -> bool:
        """Leave the change's rows to the resolver with a trigger; False if that failed
        too (then the change stays in flight: this process's lease keeps covering it)."""
        since = self._in_flight.get(token, time.time_ns()) - CLOCK_MARGIN_NS
        try:
            await self.queues.put(self.trigger_queue,
                                  encode_json({"taskId": task_id, "after": _after(since)}),
                                  visible_in=self.recovery_delay, forever=True)
        except (errors.QueueError, errors.StorageError) as e:
            log.warning("could not hand the events of task %s over (%s); this process's "
                        "lease covers them", task_id, e)
            return False
        return True

    async def _publish(self, token: int, task_id: str, written: list[Event],
                       alone: bool | None) -> None:
        """Publish the task's events, in order; the checks of their groups go on after
        the answer (``_check_groups``), still under this process's lease."""
        for event in written:
            await self.publisher.publish(event)
        grouped = [event for event in written if event.group is not None]
        if grouped:
            check = asyncio.create_task(self._check_groups(token, task_id, grouped, alone))
            self._checking[token] = check
            check.add_done_callback(lambda _: self._checking.pop(token, None))
        else:
            self._in_flight.pop(token, None)

    async def _check_groups(self, token: int, task_id: str, grouped: list[Event],
                            alone: bool | None) -> None:
        """Whether the resolutions ``grouped`` resolved their groups, as Taskcluster
        tells after the resolution's answer, not in it. A failure hands the change over
        to recovery, which publishes its events again (at least once) and checks anew."""
        try:
            for event in grouped:
                assert event.group is not None
                await self._check_group(task_id, event, *event.group, alone=alone)
        except Exception as e:  # noqa: BLE001 - recovery retries the whole change
            log.warning("task group of task %s not checked (%s: %s); retried within %ss",
                        task_id, type(e).__name__, e, self.recovery_delay.total_seconds())
            if not await self._hand_over(token, task_id):
                return  # stays in flight: this process's lease covers it
        self._in_flight.pop(token, None)

    async def _alone(self, task_id: str, task_group_id: str) -> bool:
        """Whether ``task_id`` is its group's own task and the group has no other member:
        a group of one, when the resolution did not know it from the task. The group's
        record says so (one row); a group of an earlier version, whose record does not,
        is asked its member rows."""
        if task_group_id != task_id:
            return False
        joined = await self.groups.joined(task_group_id)
        if joined is None:
            return await self.groups.is_empty(task_group_id)
        return not joined

    async def deliver(self, task_id: str, after: str = OUTBOX) -> int:
        """Publish the task's outbox rows from ``after`` on, in order, and delete them;
        how many went out."""
        rows = await self.tasks.outbox(task_id, after)
        done: list[str] = []
        try:
            for row_key, event in rows:
                await self._republish(task_id, event)
                done.append(row_key)
        finally:
            if done:
                await self.tasks.delete_outbox(task_id, done)
        return len(done)

    async def _republish(self, task_id: str, event: Event) -> None:
        """Publish an outbox row's event of ``task_id`` and check its group, as recovery
        does it: not knowing whether the task was alone in its group."""
        await self.publisher.publish(event)
        if event.group is not None:
            await self._check_group(task_id, event, *event.group)

    async def _check_group(self, task_id: str, event: Event, task_group_id: str,
                           scheduler_id: str, alone: bool | None = None) -> None:
        """Publish task-group-resolved if ``event`` (of ``task_id``) resolved the last
        unresolved task of its group (``alone``: it was known to be the only one)."""
        expires = str(event.payload.get("status", {}).get("expires", ""))
        if alone if alone is not None else await self._alone(task_id, task_group_id):
            # A group of one (Taskcluster's default): its own task's resolution resolves
            # it. (A task joining later makes it unresolved again, and its resolution
            # announces the group anew.)
            await self.publisher.publish(
                events.task_group_resolved(task_group_id, scheduler_id, expires))
            return
        runs = event.payload.get("status", {}).get("runs", [])
        await self.groups.resolve(task_group_id, task_id, max(len(runs), 1))
        await self._announce_if_resolved(task_id, task_group_id, scheduler_id, expires)

    async def _announce_if_resolved(self, task_id: str, task_group_id: str,
                                    scheduler_id: str, expires: str) -> None:
        """Publish task-group-resolved if no member of the group is unresolved, after the
        resolution of ``task_id`` (whose ``expires`` it was). A member row whose task is
        not stored, written less than ``ORPHAN_AGE`` ago, may be a createTask under way,
        and one a rerun marked unresolved while its task is still resolved, a rerun under
        way: either holds the announcement back, and if nothing else does, the group is
        looked at again once that row is ``ORPHAN_AGE`` old (``_look_again``): its
        createTask or rerun may have died, and no resolution would come to announce the
        group."""
        now = timeutil.utcnow()
        young: timedelta | None = None  # how long until the youngest such row is old
        for row in await self.groups.unresolved(task_group_id):
            member, age = row.task_id, now - row.written
            try:
                task = await self.tasks.get(member)
            except errors.NotFound:
                if age > ORPHAN_AGE:
                    await self.groups.drop(task_group_id, member)
                else:
                    young = max(young or timedelta(0), ORPHAN_AGE - age)
                continue
            if task.definition["taskGroupId"] != task_group_id:
                # Left by a createTask refused as a conflicting redefinition.
                await self.groups.drop(task_group_id, member)
                continue
            if row.rerun is not None and task.state.resolved:
                # Marked by a rerun, and resolved: the rerun's run not stored yet (under
                # way while the mark is young: held back like a createTask under way), or
                # never (a rerun that died or was refused), or stored and resolved since;
                # once the mark is old, the task counts as the resolved task it is. A mark
                # on a row resolved with that rerun's run is taken off.
                if row.resolved and len(task.runs) >= row.rerun:
                    await self.groups.rerun_over(task_group_id, row)
                elif not row.resolved and age <= ORPHAN_AGE:
                    young = max(young or timedelta(0), ORPHAN_AGE - age)
                continue
            return  # a member is still unresolved (a rerun's run too, whatever its row
            # says: a resolution checked late may have marked it resolved): its resolution
            # checks again
        # The group's own task (taskGroupId = its taskId) has no member row until it is
        # resolved.
        own = await self.tasks.find(task_group_id)
        if own is not None and own.definition["taskGroupId"] == task_group_id and \
                not own.state.resolved:
            return
        if young is not None:
            await self._look_again(task_id, task_group_id, scheduler_id, expires, young)
            return
        announce, latest = await self.groups.claim_announcement(task_group_id, task_id)
        if announce:
            candidates = [e for e in (expires, latest,
                                      timeutil.fmt(own.expires) if own is not None else None)
                          if e]
            group_expires = max(candidates, key=timeutil.parse) if candidates else expires
            await self.publisher.publish(
                events.task_group_resolved(task_group_id, scheduler_id, group_expires))

    async def _look_again(self, task_id: str, task_group_id: str, scheduler_id: str,
                          expires: str, young: timedelta) -> None:
        """Leave a trigger that has the group checked again (``_announce_if_resolved``)
        by any replica's recovery, ``LOOK_AGAIN_MARGIN`` after its young member rows are
        ``ORPHAN_AGE`` old. Its ``after`` is past every outbox row: a replica of an
        earlier release, which knows no ``look``, finds nothing to publish and drops it."""
        text = encode_json({"taskId": task_id, "after": _NOTHING_AFTER, "look": {
            "taskGroupId": task_group_id, "schedulerId": scheduler_id, "expires": expires}})
        await self.queues.put(self.trigger_queue, text, visible_in=young + LOOK_AGAIN_MARGIN,
                              forever=True)

    async def recover(self) -> int:
        """Handle the leases of processes that died and the changes handed over that
        became visible: their events were not (all) published."""
        handled = 0
        for lease in await self.queues.receive(self.lease_queue, self.recovery_delay):
            try:
                data = decode_json(lease.text)
                writer, since = str(data["writer"]), int(data["since"])
            except (ValueError, KeyError):
                await self.queues.drop(lease.queue_name, lease.message_id, lease.pop_receipt)
                continue
            try:
                sent = await self._recover_writer(writer, since)
            except Exception as e:  # noqa: BLE001 - retried when the lease reappears
                log.warning("events of a process that stopped (%s) still not published "
                            "(%s: %s); retrying in %ss", writer, type(e).__name__, e,
                            self.recovery_delay.total_seconds())
                continue
            log.info("published %d event(s) that a process which stopped (%s) had written",
                     sent, writer)
            await self.queues.drop(lease.queue_name, lease.message_id, lease.pop_receipt)
            handled += 1
        for trigger in await self.queues.receive(self.trigger_queue, self.recovery_delay):
            try:
                data = decode_json(trigger.text)
                task_id = str(data["taskId"])
                after = str(data.get("after") or OUTBOX)
                look = data.get("look")
                group = None if look is None else (
                    str(look["taskGroupId"]), str(look["schedulerId"]), str(look["expires"]))
            except (ValueError, KeyError, TypeError):
                await self.queues.drop(trigger.queue_name, trigger.message_id,
                                       trigger.pop_receipt)
                continue
            try:
                if group is not None:
                    await self._announce_if_resolved(task_id, *group)
                sent = await self.deliver(task_id, after)
            except errors.TRANSIENT as e:
                log.warning("events of task %s still not published (%s: %s); retrying in %ss",
                            task_id, type(e).__name__, e, self.recovery_delay.total_seconds())
                continue
            except Exception:
                log.exception("publishing the recovered events of task %s failed unexpectedly; "
                              "retrying in %ss", task_id, self.recovery_delay.total_seconds())
                continue
            if sent:
                log.info("published %d recovered event(s) of task %s", sent, task_id)
            await self.queues.drop(trigger.queue_name, trigger.message_id, trigger.pop_receipt)
            handled += 1
        return handled

    async def _recover_writer(self, writer: str, since: int) -> int:
        """Publish the outbox rows ``writer`` wrote since ``since`` (ns), in order per
        partition."""
        by_partition: dict[str, list[tuple[str, Event]]] = defaultdict(list)
        for partition, row_key, event in await self.tasks.outbox_of(writer, _after(since)):
            by_partition[partition].append((row_key, event))
        sent = 0
        for partition, rows in by_partition.items():
            for _, event in sorted(rows, key=lambda r: r[0]):
                await self._republish(partition, event)
                sent += 1
        return sent
