"""Task dependencies, through the official client. From the Taskcluster task definition:
"dependencies: List of dependent tasks. These must either be _completed_ or _resolved_
before this task is scheduled", as `requires` says: "all-completed" or "all-resolved"."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import aiohttp
import pytest
import taskcluster.aio
from taskcluster.exceptions import TaskclusterRestFailure

from azqueue import errors
from azqueue.config import Client, StorageSettings
from azqueue.devstorage import Azurite, free_port
from azqueue.model import timeutil
from azqueue.testing import sas
from azqueue.testing.faultproxy import FaultProxy
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import definition, slugid
from tests.servers import ROOT, Server, ServerFactory
from tests.serving import serve
from tests.waiting import eventually

GROUP = slugid()
SCHEDULER = Client("scheduler", "scheduler-access-token-012345678", (
    "queue:create-task:*", "queue:scheduler-id:*", f"queue:schedule-task:-/{GROUP}/*",
    "queue:status:*"))


def _queue(server: Server | str, client: Client = ROOT) -> taskcluster.aio.Queue:
    root_url = server if isinstance(server, str) else server.root_url
    return taskcluster.aio.Queue({"rootUrl": root_url, "maxRetries": 0, "credentials": {
        "clientId": client.client_id, "accessToken": client.access_token}})


async def _task(queue: taskcluster.aio.Queue, task_queue: str, **extra: Any) -> str:
    task_id = slugid()
    await queue.createTask(task_id, definition(task_queue, **extra))
    return task_id


async def _run(queue: taskcluster.aio.Queue, task_id: str, outcome: str = "completed") -> None:
    """Claim run 0 (without a message) and report ``outcome``."""
    await queue.claimTask(task_id, 0, {"workerGroup": "g", "workerId": "w"})
    if outcome == "completed":
        await queue.reportCompleted(task_id, 0)
    else:
        await queue.reportFailed(task_id, 0)


async def _state(queue: taskcluster.aio.Queue, task_id: str) -> str:
    return str((await queue.status(task_id))["status"]["state"])


async def _tips(http: aiohttp.ClientSession, server: Server, task_queue: str) -> list[str]:
    """The taskIds of the tips a worker finds in the task queue's lowest-priority queue."""
    urls = await sas.poll_task_urls(http, server.api, *task_queue.split("/"))
    return [m.tip["taskId"] for m in await sas.get_messages(http, urls["queues"][6]["signedPollUrl"],
                                                            32)]


async def test_a_task_waits_unscheduled_until_all_its_dependencies_complete(
        server: Server, http: aiohttp.ClientSession) -> None:
    queue = _queue(server)
    first, second = await _task(queue, "prov/deps-a"), await _task(queue, "prov/deps-a")
    waiting, body = slugid(), definition("prov/deps-b", dependencies=[first, second])
    created = await queue.createTask(waiting, body)
    assert created["status"]["state"] == "unscheduled" and created["status"]["runs"] == []
    assert await _tips(http, server, "prov/deps-b") == []  # nothing for a worker to find

    await _run(queue, first)
    assert await _state(queue, waiting) == "unscheduled"
    await _run(queue, second)
    status = (await queue.status(waiting))["status"]
    assert [(r["state"], r["reasonCreated"]) for r in status["runs"]] == [("pending", "scheduled")]
    assert await _tips(http, server, "prov/deps-b") == [waiting]

    listed = await queue.listDependentTasks(first)
    assert listed["taskId"] == first
    assert [(t["status"]["taskId"], t["status"]["state"], t["task"]["requires"])
            for t in listed["tasks"]] == [(waiting, "pending", "all-completed")]
    assert (await queue.createTask(waiting, body))["status"] == status  # idempotent


async def test_requires_all_completed_or_all_resolved(server: Server) -> None:
    """'all-completed': a failed dependency keeps the task unscheduled; 'all-resolved':
    any resolution lets it go."""
    queue = _queue(server)
    failing = await _task(queue, "prov/deps-req")
    strict = await _task(queue, "prov/deps-req", dependencies=[failing])
    lenient = await _task(queue, "prov/deps-req", dependencies=[failing], requires="all-resolved")
    await _run(queue, failing, "failed")
    assert await _state(queue, strict) == "unscheduled"
    assert await _state(queue, lenient) == "pending"
    # Created after the failure: the same decision at once.
    assert await _state(queue, await _task(queue, "prov/deps-req", dependencies=[failing])) \
        == "unscheduled"
    assert await _state(queue, await _task(queue, "prov/deps-req", dependencies=[failing],
                                           requires="all-resolved")) == "pending"


async def test_dependencies_must_exist_and_outlive_the_deadline_and_a_refusal_lists_nothing(
        server: Server, storage: StorageInspector) -> None:
    queue = _queue(server)
    done = await _task(queue, "prov/deps-check")
    await _run(queue, done)
    later = await _task(queue, "prov/deps-check", dependencies=[done])
    assert await _state(queue, later) == "pending"
    assert [t["status"]["taskId"] for t in (await queue.listDependentTasks(done))["tasks"]] \
        == [later]  # listed although it never had to wait
    ghost, refused = slugid(), slugid()
    with pytest.raises(TaskclusterRestFailure) as info:
        await queue.createTask(refused, definition("prov/deps-check", dependencies=[done, ghost]))
    assert info.value.status_code == 400 and ghost in info.value.body["message"]
    # The rows written while they were read: the one under the dependency that does not
    # exist is taken back (nothing would ever remove it); the one under the dependency
    # that exists goes with it, and lists nothing meanwhile.
    assert await storage.row_keys("dependents", ghost) == []
    assert [t["status"]["taskId"] for t in (await queue.listDependentTasks(done))["tasks"]] \
        == [later]
    short_lived, body = slugid(), definition("prov/deps-check")
    await queue.createTask(short_lived, {**body, "expires": body["deadline"]})
    with pytest.raises(TaskclusterRestFailure) as info:
        await queue.createTask(refused, definition("prov/deps-check", dependencies=[short_lived],
                                                   deadline=timedelta(hours=2)))
    assert info.value.status_code == 400 and "expire" in info.value.body["message"]
    with pytest.raises(TaskclusterRestFailure) as info:
        await queue.status(refused)
    assert info.value.status_code == 404
    assert (await queue.listDependentTasks(short_lived))["tasks"] == []


async def test_a_task_that_depends_on_itself_waits_for_schedule_task(
        make_server: ServerFactory) -> None:
    server = await make_server(clients=(SCHEDULER,), anonymous_scopes=())
    scheduler = _queue(server, SCHEDULER)
    mine, theirs = slugid(), slugid()
    await scheduler.createTask(mine, definition("prov/deps-self", taskGroupId=GROUP,
                                                dependencies=[mine]))
    await scheduler.createTask(theirs, definition("prov/deps-self", dependencies=[theirs]))
    assert await _state(scheduler, mine) == "unscheduled"
    with pytest.raises(TaskclusterRestFailure) as info:
        await scheduler.scheduleTask(theirs)
    assert info.value.status_code == 403
    assert f"queue:schedule-task:-/{theirs}/{theirs}" in info.value.body["message"]
    assert await _state(scheduler, theirs) == "unscheduled"
    assert (await scheduler.scheduleTask(mine))["status"]["state"] == "pending"
    assert (await scheduler.scheduleTask(mine))["status"]["state"] == "pending"  # again: same


async def test_schedule_and_cancel_past_the_deadline_are_conflicts(
        make_server: ServerFactory) -> None:
    """Past its deadline a task is the deadline's: "deadline-exceeded", not scheduled or
    canceled (the deadline resolver is off here, to catch the moment before it acts)."""
    server = await make_server(run_resolvers=False)
    queue = _queue(server)
    waiting = slugid()
    await queue.createTask(waiting, definition("prov/deps-late", dependencies=[waiting],
                                               deadline=timedelta(seconds=1)))
    running = await _task(queue, "prov/deps-late", deadline=timedelta(seconds=1))
    await queue.claimTask(running, 0, {"workerGroup": "g", "workerId": "w"})
    deadline = max([timeutil.parse((await queue.task(t))["deadline"]) for t in (waiting, running)])
    await eventually(timeutil.utcnow, lambda now: now > deadline, interval=0.1,
                     what="the deadlines to pass")
    for call, task_id in ((queue.scheduleTask, waiting), (queue.cancelTask, running)):
        with pytest.raises(TaskclusterRestFailure) as info:
            await call(task_id)
        assert info.value.status_code == 409 and "deadline" in info.value.body["message"]
    assert await _state(queue, waiting) == "unscheduled"
    assert await _state(queue, running) == "running"


async def test_a_refused_redefinition_racing_the_definition_neither_blocks_nor_frees_it(
        make_server: ServerFactory) -> None:
    """Two createTasks of one taskId with different definitions, on two replicas: the
    refused one, held up between checking and writing, writes its rows after the winner's
    dependency already completed. The winner still starts when its `requires` says."""
    replicas = [await make_server(), await make_server()]
    queue = _queue(replicas[0])
    done, failing = await _task(queue, "prov/deps-race"), await _task(queue, "prov/deps-race")
    task_id = slugid()
    winner = definition("prov/deps-race", dependencies=[done, failing], requires="all-resolved")
    loser = {**winner, "requires": "all-completed", "payload": {"other": True}}
    held, release = asyncio.Event(), asyncio.Event()
    dependencies = replicas[1].services.dependencies
    track = dependencies.track

    async def held_up_track(*args: Any) -> None:  # the loser stalls just before writing
        held.set()
        await release.wait()
        await track(*args)

    dependencies.track = held_up_track  # type: ignore[method-assign]
    refused = asyncio.ensure_future(replicas[1].services.definitions.create_task(task_id, loser))
    await held.wait()
    await queue.createTask(task_id, winner)
    await _run(queue, done)  # the winner stops waiting for `done`...
    release.set()  # ...and the loser writes that it waits for `done`, then is refused
    with pytest.raises(Exception, match="different definition"):
        await refused
    await _run(queue, failing, "failed")
    assert await _state(queue, task_id) == "pending"  # all resolved: it goes


async def test_dependencies_resolving_at_once_on_two_replicas_schedule_the_task_once(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    replicas = [await make_server(), await make_server()]
    queues = [_queue(r) for r in replicas]
    required = [await _task(queues[0], "prov/deps-many") for _ in range(20)]
    waiting = await _task(queues[0], "prov/deps-join", dependencies=required)
    # More than createTask writes rows for while it reads them: written after, all listed.
    for task_id in (required[0], required[-1]):
        listed = (await queues[1].listDependentTasks(task_id))["tasks"]
        assert [t["status"]["taskId"] for t in listed] == [waiting]
    for i, task_id in enumerate(required):
        await queues[i % 2].claimTask(task_id, 0, {"workerGroup": "g", "workerId": "w"})
    await asyncio.gather(*(queues[i % 2].reportCompleted(task_id, 0)
                           for i, task_id in enumerate(required)))
    status = (await queues[1].status(waiting))["status"]
    assert [(r["runId"], r["state"]) for r in status["runs"]] == [(0, "pending")]
    assert await _tips(http, replicas[0], "prov/deps-join") == [waiting]  # one tip, not two


async def test_an_unscheduled_task_at_its_deadline_is_resolved_and_passes_that_on(
        make_server: ServerFactory) -> None:
    server = await make_server(deadline_resolver_interval=0.3)
    queue = _queue(server)
    never = await _task(queue, "prov/deps-deadline")
    doomed = await _task(queue, "prov/deps-deadline", dependencies=[never],
                         deadline=timedelta(seconds=3))
    after = await _task(queue, "prov/deps-deadline", dependencies=[doomed],
                        requires="all-resolved")
    await eventually(lambda: _state(queue, after), lambda state: state == "pending",
                     what="the deadline's resolution passed on")
    status = (await queue.status(doomed))["status"]
    assert [(r["state"], r["reasonCreated"], r["reasonResolved"]) for r in status["runs"]] == [
        ("exception", "exception", "deadline-exceeded")]
    assert await _state(queue, after) == "pending"


@pytest.mark.crash
async def test_a_resolution_stored_just_before_a_crash_is_passed_on_after_it(
        azurite: Azurite, make_server: ServerFactory, storage_prefix: str) -> None:
    survivor = await make_server(dependencies_recovery_delay=1.0,
                                 dependency_resolver_interval=0.3)
    queue = _queue(survivor)
    required = await _task(queue, "prov/deps-crash")
    waiting = await _task(queue, "prov/deps-crash", dependencies=[required])
    await queue.claimTask(required, 0, {"workerGroup": "g", "workerId": "w"})
    port = free_port()
    async with serve(azurite, storage_prefix, "", port, AZQUEUE_TEST_CRASH_AFTER_COMMIT="1",
                     AZQUEUE_DEPENDENCIES_RECOVERY_DELAY="3") as doomed:
        with pytest.raises(Exception):  # the connection dies with the process
            await _queue(f"http://127.0.0.1:{port}").reportCompleted(required, 0)
        assert await asyncio.to_thread(doomed.process.wait, 10) == 70
    assert await _state(queue, required) == "completed"
    assert await _state(queue, waiting) == "unscheduled"  # nobody told it before the crash
    await eventually(lambda: _state(queue, waiting), lambda state: state == "pending",
                     what="the waiting task scheduled")


async def _dying_beside_a_survivor(make_server: ServerFactory
                                   ) -> tuple[Server, taskcluster.aio.Queue]:
    """A replica whose definitions "die" (no resolvers of its own), and a client of another
    whose dependency resolver looks at definition triggers a second after they were put."""
    survivor = await make_server(dependencies_recovery_delay=1.0,
                                 dependency_resolver_interval=0.3)
    dying = await make_server(dependencies_recovery_delay=1.0, run_resolvers=False)
    return dying, _queue(survivor)


async def test_a_definition_that_dies_before_reading_its_dependencies_again_is_finished(
        make_server: ServerFactory) -> None:
    """The dependency completes while the dependent is being defined (after the check,
    before the dependent is stored, so the completion finds nothing to tell), and the
    defining process dies before reading its dependencies again: the dependency resolver
    finishes the definition."""
    dying, queue = await _dying_beside_a_survivor(make_server)
    required = await _task(queue, "prov/deps-dying")
    dependencies = dying.services.dependencies
    track = dependencies.track

    async def track_then_complete(*args: Any) -> None:
        await track(*args)
        await _run(queue, required)  # on the other replica, before the task is stored

    async def die(*args: Any) -> None:
        raise RuntimeError("the process dies here")

    dependencies.track = track_then_complete  # type: ignore[method-assign]
    dependencies.recheck = die  # type: ignore[method-assign]
    waiting = slugid()
    with pytest.raises(Exception):  # a 500: the "process" is gone
        await _queue(dying).createTask(waiting, definition("prov/deps-dying",
                                                           dependencies=[required]))
    assert await _state(queue, waiting) == "unscheduled"
    await eventually(lambda: _state(queue, waiting), lambda state: state == "pending",
                     what="the waiting task scheduled")


async def _created_as_its_dependency_completes(server: Server, queue: taskcluster.aio.Queue,
                                               required: str, task_queue: str) -> str:
    """createTask on ``server`` of a task waiting for ``required``, whose insert waits
    until its dependencies were read beside it (``Dependencies.resolved_meanwhile``) and
    ``required`` was then completed through ``queue``: the completion finds no task to
    tell, and the read saw nothing resolved, so the answer says unscheduled. Its taskId."""
    dependencies, tasks = server.services.dependencies, server.services.definitions.tasks
    resolved_meanwhile, insert = dependencies.resolved_meanwhile, tasks.insert
    read = asyncio.Event()

    async def noted(*args: Any) -> bool:
        try:
            return await resolved_meanwhile(*args)
        finally:
            read.set()

    async def held_up_insert(*args: Any, **kwargs: Any) -> Any:
        tasks.insert = insert  # type: ignore[method-assign]
        await asyncio.wait_for(read.wait(), 30)
        await _run(queue, required)
        return await insert(*args, **kwargs)

    dependencies.resolved_meanwhile = noted  # type: ignore[method-assign]
    tasks.insert = held_up_insert  # type: ignore[method-assign]
    waiting = slugid()
    try:
        created = await _queue(server).createTask(waiting, definition(
            task_queue, dependencies=[required]))
    finally:
        dependencies.resolved_meanwhile = resolved_meanwhile  # type: ignore[method-assign]
        tasks.insert = insert  # type: ignore[method-assign]
    assert created["status"]["state"] == "unscheduled"  # answered before that last read
    return waiting


async def test_a_dependency_completed_while_its_dependent_is_inserted_schedules_it(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """createTask of a task that waits reads its dependencies again while it inserts the
    task, and once more after its answer (docs/concepts.md). A dependency that completes
    after the first of those reads, before the task is stored, finds no task to tell: the
    read after the answer schedules the task (no resolver runs here to do it)."""
    server = await make_server(run_resolvers=False)
    queue = _queue(server)
    required = await _task(queue, "prov/deps-meanwhile")
    waiting = await _created_as_its_dependency_completes(server, queue, required,
                                                         "prov/deps-meanwhile")
    await eventually(lambda: _state(queue, waiting), lambda state: state == "pending",
                     what="the waiting task scheduled")
    # Its tip is put once its pending run is stored, a moment after.
    await eventually(lambda: _tips(http, server, "prov/deps-meanwhile"),
                     lambda tips: waiting in tips, what="the waiting task's tip queued")


async def test_a_definition_that_dies_after_its_answer_before_its_last_read_is_finished(
        make_server: ServerFactory) -> None:
    """As above, but the defining process dies after its answer, before reading the
    dependencies once more: its definition trigger stays, and the dependency resolver of
    another replica schedules the task."""
    dying, queue = await _dying_beside_a_survivor(make_server)
    required = await _task(queue, "prov/deps-dying-after")
    dependencies = dying.services.dependencies

    async def die(*args: Any) -> bool:
        raise asyncio.CancelledError  # the process stops here

    dependencies.recheck = die  # type: ignore[method-assign]
    waiting = await _created_as_its_dependency_completes(dying, queue, required,
                                                         "prov/deps-dying-after")
    await eventually(lambda: _state(queue, waiting), lambda state: state == "pending",
                     what="the waiting task scheduled by the other replica's resolver")


async def test_a_tip_the_read_after_the_answer_could_not_queue_is_queued_by_the_resolver(
        make_server: ServerFactory, http: aiohttp.ClientSession) -> None:
    """As above, but the read after the answer schedules the task and its tip's put
    fails: the task's definition trigger stays, and the dependency resolver of another
    replica queues the tip (the tip repair would only in minutes)."""
    dying, queue = await _dying_beside_a_survivor(make_server)
    required = await _task(queue, "prov/deps-untipped")
    pending = dying.services.definitions.tips.pending
    put = pending.put

    async def busy(*args: Any, **kwargs: Any) -> None:
        raise errors.StorageUnavailable("Azure Storage stayed busy")

    pending.put = busy  # type: ignore[method-assign]
    try:
        waiting = await _created_as_its_dependency_completes(dying, queue, required,
                                                             "prov/deps-untipped")
        await eventually(lambda: _state(queue, waiting), lambda state: state == "pending",
                         what="the waiting task scheduled, its tip not queued")
    finally:
        pending.put = put  # type: ignore[method-assign]
    await eventually(lambda: _tips(http, dying, "prov/deps-untipped"),
                     lambda found: waiting in found, what="the tip queued by the resolver")


async def test_a_task_whose_dependency_is_resolved_is_stored_after_its_dependents_row(
        proxy: FaultProxy, make_server: ServerFactory, storage_prefix: str,
        storage: StorageInspector) -> None:
    """A task whose dependencies are all resolved waits for nothing: the row that lists it
    among its dependency's dependents (listDependentTasks) is written while its
    dependencies are read, before the task is stored, and its tip goes with its insert:
    while the row is held, the task is neither stored nor tipped."""
    server = await make_server(storage=StorageSettings(proxy.connection_string(),
                                                       storage_prefix))
    queue = _queue(server)
    dependency = await _task(queue, "prov/dependedon")
    await _run(queue, dependency)
    task_id = slugid()
    row = proxy.hold("*", f"dependents(PartitionKey='{dependency}',RowKey='{task_id}')")
    creating = asyncio.create_task(queue.createTask(
        task_id, definition("prov/resolveddep", dependencies=[dependency])))
    try:
        await asyncio.wait_for(row.reached.wait(), 30)
        with pytest.raises(TaskclusterRestFailure) as missing:
            await queue.status(task_id)
        assert missing.value.status_code == 404
        assert await storage.message_count(storage.pending_queue("prov/resolveddep")) == 0
        assert not creating.done()
    finally:
        row.release()
    await creating
    assert await _state(queue, task_id) == "pending"
    assert await storage.message_count(storage.pending_queue("prov/resolveddep")) == 1
    listed = await queue.listDependentTasks(dependency)
    assert [t["status"]["taskId"] for t in listed["tasks"]] == [task_id]


async def test_a_refused_definition_racing_the_definition_of_its_task_id_leaves_its_rows(
        server: Server) -> None:
    """Two createTasks of one taskId: the first, of a member of a group with a
    dependency, is held up just before its insert; the second names a dependency that
    does not exist and is refused. What the refused one takes back must not be the rows
    the first one's task, stored after, is listed and told by."""
    queue = _queue(server)
    group = slugid()
    await _task(queue, "prov/deps-rows", taskGroupId=group)
    required = await _task(queue, "prov/deps-rows")
    task_id = slugid()
    winner = definition("prov/deps-rows", taskGroupId=group, dependencies=[required])
    loser = {**winner, "dependencies": [required, slugid()]}
    tasks = server.services.definitions.tasks
    insert = tasks.insert
    held, release = asyncio.Event(), asyncio.Event()

    async def held_up_insert(*args: Any, **kwargs: Any) -> Any:
        held.set()
        await release.wait()
        return await insert(*args, **kwargs)

    tasks.insert = held_up_insert  # type: ignore[method-assign]
    creating = asyncio.ensure_future(queue.createTask(task_id, winner))
    await asyncio.wait_for(held.wait(), 30)
    tasks.insert = insert  # type: ignore[method-assign]
    with pytest.raises(TaskclusterRestFailure) as info:
        await queue.createTask(task_id, loser)
    assert info.value.status_code == 400
    release.set()
    assert (await creating)["status"]["state"] == "unscheduled"
    listed = [t["status"]["taskId"] for t in (await queue.listDependentTasks(required))["tasks"]]
    members = [t["status"]["taskId"] for t in (await queue.listTaskGroup(group))["tasks"]]
    await _run(queue, required)
    state = await _state(queue, task_id)
    assert (listed, task_id in members, state) == ([task_id], True, "pending")
