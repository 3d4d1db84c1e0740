"""Deadline triggers, several tasks to a message: every task keeps its own, a refused
createTask's is taken back, the resolver looks at each task of a message, and the
one-task messages of earlier releases are still handled (``service.runs.triggers``)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta

import aiohttp

from azqueue.background.deadlines import INVISIBLE_FOR
from azqueue.model import timeutil
from azqueue.service.runs.triggers import STORE_GRACE, DeadlineTriggers, Entry, encode, parse
from azqueue.storage.queues import Queues, encode_json
from azqueue.testing import sas
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import create, definition, slugid, status
from tests.servers import ServerFactory
from tests.waiting import eventually

BATCHES = "deadline-batches"


async def test_createTasks_at_once_each_store_their_own_trigger(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector) -> None:
    # Resolvers off, triggers due a second after createTask: then all are visible.
    server = await make_server(run_resolvers=False, tip_repair_delay=1.0)
    created = await asyncio.gather(*(create(http, server.api, definition("prov/batched"))
                                     for _ in range(30)))
    name = storage.queue_name(BATCHES)
    assert await storage.message_count(name) <= len(created)

    def triggered(messages: list[object]) -> dict[str, str]:
        return {e.task_id: timeutil.fmt(e.deadline) for m in messages
                for e in parse(m.text).entries if e.deadline}  # type: ignore[attr-defined]

    messages = await eventually(lambda: storage.peek(name),
                                lambda m: len(triggered(m)) >= len(created),
                                what="every task's trigger due")
    assert triggered(messages) == {
        task_id: (await status(http, server.api, task_id))["deadline"] for task_id in created}


async def test_triggers_asked_for_together_share_a_message_that_a_withdrawn_one_leaves(
        make_server: ServerFactory, storage: StorageInspector, queues: Queues) -> None:
    await make_server(run_resolvers=False)
    name = storage.queue_name(BATCHES)
    triggers = DeadlineTriggers(queues, name, budget=10.0, puts=1)
    now = timeutil.utcnow()
    deadline = timeutil.parse(timeutil.fmt(now + timedelta(hours=1)))  # as tasks have it
    # Asked for in one turn of the event loop: all wait for the one put.
    first, second, third = await asyncio.gather(
        *(triggers.add(task_id, deadline, now) for task_id in ("t1", "t2", "t3")))
    assert await storage.message_count(name) == 1

    await triggers.withdraw(second)
    [message] = await storage.peek(name)
    assert [(e.task_id, e.deadline) for e in parse(message.text).entries] == [
        ("t1", deadline), ("t3", deadline)]

    await triggers.withdraw(first)
    await triggers.withdraw(third)
    assert await storage.message_count(name) == 0
    await triggers.close()


async def test_the_resolver_keeps_of_a_message_only_the_tasks_still_to_look_at(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector, queues: Queues) -> None:
    """A message's tasks: one pending (looked at again once the repair delay has passed),
    one resolved, one never stored and a trigger whose deadline is not its task's (a
    refused createTask's): the message comes back holding the pending task alone."""
    server = await make_server(run_resolvers=False, tip_repair_delay=1.0)
    pending = await create(http, server.api, definition("prov/mixed"))
    canceled = await create(http, server.api, definition("prov/mixed"))
    code, answer = await sas.post(http, f"{server.api}/task/{canceled}/cancel")
    assert code == 200, answer
    deadlines = {t: timeutil.parse((await status(http, server.api, t))["deadline"])
                 for t in (pending, canceled)}
    now = timeutil.utcnow()
    name = await _queue(queues, storage, "mixed-triggers")
    await queues.put(name, encode([
        Entry(pending, deadlines[pending], now), Entry(canceled, deadlines[canceled], now),
        Entry(slugid(), deadlines[pending], now),
        Entry(pending, deadlines[pending] + timedelta(minutes=1), now)],
        put=now - STORE_GRACE))  # the task never stored had all its time
    resolution = dataclasses.replace(server.services.resolution, deadline_queue=name)

    assert await resolution.resolve_deadlines(INVISIBLE_FOR) == 4  # tasks looked at
    [message] = await eventually(lambda: storage.peek(name),
                                 what="the message back at the pending task's next look")
    assert [(e.task_id, e.deadline) for e in parse(message.text).entries] == [
        (pending, deadlines[pending])]
    assert (await status(http, server.api, pending))["state"] == "pending"


async def test_a_task_is_looked_at_when_its_own_look_is_due_and_one_not_stored_yet_is_kept(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector, queues: Queues) -> None:
    """A message surfaces when its first task is due: the others wait for their own time
    (a task past its deadline whose look is not due is not resolved yet), and a task not
    stored yet is looked for again until ``STORE_GRACE`` after the message was put (the
    createTasks that shared it may still be storing theirs)."""
    server = await make_server(run_resolvers=False)
    late = await create(http, server.api, definition("prov/own-time",
                                                     deadline=timedelta(seconds=2)))
    deadline = timeutil.parse((await status(http, server.api, late))["deadline"])
    await eventually(timeutil.utcnow, lambda now: now > deadline, what="the deadline passing")
    now = timeutil.utcnow()
    coming = slugid()
    name = await _queue(queues, storage, "own-time-triggers")
    await queues.put(name, encode([Entry(late, deadline, now + timedelta(hours=1)),
                                   Entry(coming, deadline, now)],
                                  put=now - STORE_GRACE + timedelta(seconds=2)))
    resolution = dataclasses.replace(server.services.resolution, deadline_queue=name)

    assert await resolution.resolve_deadlines(INVISIBLE_FOR) == 1  # the one due
    assert (await status(http, server.api, late))["state"] == "pending"
    [message] = await eventually(lambda: storage.peek(name),
                                 what="the message back when the grace of the task not found "
                                      "ends")
    assert [e.task_id for e in parse(message.text).entries] == [late, coming]
    # The grace over, the task still not found is dropped; the other waits for its look.
    assert await resolution.resolve_deadlines(INVISIBLE_FOR) == 1
    assert await storage.peek(name) == [] and await storage.message_count(name) == 1
    assert (await status(http, server.api, late))["state"] == "pending"


async def test_an_earlier_releases_one_task_messages_are_handled_and_keep_their_form(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        storage: StorageInspector, queues: Queues) -> None:
    server = await make_server(run_resolvers=False, tip_repair_delay=1.0)
    late = await create(http, server.api, definition("prov/legacy", deadline=timedelta(seconds=2)))
    waiting = await create(http, server.api, definition("prov/legacy"))
    legacy = storage.queue_name("deadline")
    for task_id in (late, waiting):
        await queues.put(legacy, encode_json({"taskId": task_id}))
    deadline = timeutil.parse((await status(http, server.api, late))["deadline"])
    await eventually(timeutil.utcnow, lambda now: now > deadline, what="the deadline passing")

    resolution = server.services.resolution
    assert await resolution.resolve_deadlines(INVISIBLE_FOR, legacy=True) == 2
    s = await status(http, server.api, late)
    assert s["state"] == "exception" and s["runs"][0]["reasonResolved"] == "deadline-exceeded"
    # The waiting task's message is postponed to its next look, as it was.
    [message] = await eventually(lambda: storage.peek(legacy),
                                 what="the waiting task's message back at its next look")
    assert message.text == encode_json({"taskId": waiting})
    assert parse(message.text).put is None


async def _queue(queues: Queues, storage: StorageInspector, suffix: str) -> str:
    name = storage.queue_name(suffix)
    await queues.ensure(name)
    return name
