"""The test server and worker the plugin's fixtures hand out, driven directly: what a
stopped server leaves behind, and its events recorded without a broker."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from azqueue.devstorage import Azurite
from azqueue.testing.background import BackgroundLoop
from azqueue.testing import tasks
from azqueue.testing.events import RecordedEvents
from azqueue.testing.harness import AzqueueServer, QueueWorker, new_prefix, server_settings
from azqueue.testing.hawk import signed_session
from azqueue.worker import TaskFailed, TaskRun
from tests.events.consumers import Received, departures
from tests.waiting import stays


class Late(logging.Handler):
    """The records of azqueue's loggers emitted once ``stopped`` is set."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.stopped = False
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.stopped and record.name.startswith("azqueue"):
            self.records.append(f"{record.levelname} {record.name}: {record.getMessage()}")


@pytest.fixture
def late() -> Iterator[Late]:
    handler = Late()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture
def background() -> Iterator[BackgroundLoop]:
    loop = BackgroundLoop()
    yield loop
    loop.close()


async def test_a_stopped_server_logs_nothing_once_stop_returned(
        azurite: Azurite, background: BackgroundLoop, late: Late) -> None:
    """A drained worker's last claimWork call, given up, is still being answered when the
    test server stops: the bookkeeping it would write is dropped, not written to a closed
    storage session ("could not record worker ...: Session is closed")."""
    for _ in range(2):
        server = await background.run_async(AzqueueServer.start(
            server_settings(azurite.connection_string, new_prefix())))

        async def handler(run: TaskRun) -> None:
            pass

        await QueueWorker(background, server, "late/records", handler).drain_async()
        await background.run_async(server.stop())
        late.stopped = True
        await stays(lambda: list(late.records), lambda seen: not seen, for_=3.0,
                    what="no log record from the server after it stopped")
        late.stopped = False


async def test_recorded_events_are_taskclusters_messages_without_a_broker(
        azurite: Azurite, background: BackgroundLoop) -> None:
    """A server built with a RecordedEvents has events on and no broker: each change's
    messages are recorded in order, valid against Taskcluster's schema of their
    exchange, and ``wait_for`` returns the one asked for."""
    events = RecordedEvents()
    settings = server_settings(azurite.connection_string, new_prefix())
    server = await background.run_async(AzqueueServer.start(settings, events))
    try:
        async with signed_session(server.client_id, server.access_token) as http:
            api = f"{server.root_url}/api/queue/v1"
            done = await tasks.create(http, api, tasks.definition("recorded/events"))
            failed = await tasks.create(http, api, tasks.definition("recorded/events"))

            async def handler(run: TaskRun) -> None:
                if run.task_id == failed:
                    raise TaskFailed("asked to fail")

            await QueueWorker(background, server, "recorded/events", handler).drain_async()
        body = await events.wait_for_async("task-completed", done, timeout=30)
        assert (body["status"]["taskId"], body["status"]["state"], body["runId"]) == (
            done, "completed", 0)
        assert events.wait_for("exchange/taskcluster-queue/v1/task-failed",
                               failed)["status"]["state"] == "failed"
        assert [m.exchange for m in events.of(task_id=done)
                if not m.exchange.startswith("task-group-")] == [
            "task-defined", "task-pending", "task-running", "task-completed"]
        invalid = [problem for m in events.messages for problem in departures(
            Received(m.exchange, m.routing_key, m.body, list(m.cc)))]
        assert not invalid, invalid
        with pytest.raises(AssertionError, match=f"no task-exception message about {done}"):
            events.wait_for("task-exception", done, timeout=0.5)
        with pytest.raises(ValueError, match="'task-finished' is no exchange"):
            events.wait_for("task-finished", done)
    finally:
        await background.run_async(server.stop())
