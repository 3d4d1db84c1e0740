"""The test server and worker the plugin's fixtures hand out, driven directly: what a
stopped server leaves behind."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from azqueue.devstorage import Azurite
from azqueue.testing.background import BackgroundLoop
from azqueue.testing.harness import AzqueueServer, QueueWorker, new_prefix, server_settings
from azqueue.worker import TaskRun
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
