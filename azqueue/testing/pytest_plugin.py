"""pytest fixtures for projects that test their workers against azqueue on Azurite.

Installed with azqueue (entry point ``pytest11``); docs/testing-workers.md shows them at
work:

* ``azurite`` (session): a throwaway Azurite (data in RAM where there is some), with
  ``.connection_string``; found or installed as ``azqueue.devstorage.azurite_bin`` says.
* ``azqueue_server``: an azqueue on it, its own storage prefix per test (deleted after
  it), with ``.root_url``, ``.client_id``, ``.access_token``, ``.prefix``, ``.options()``,
  ``.queue()``, ``.create_task(task_queue_id, payload, **fields)`` (Taskcluster's
  defaults filled in), ``.wait(task_id, timeout)`` (the resolution) and
  ``.temporary_credentials(scopes)``. Events are off unless the test asks for
  ``azqueue_events`` (recorded) or ``--azqueue-events=AMQP_URL`` (or the ini setting
  ``azqueue_events``) is given.
* ``azqueue_worker``: ``azqueue_worker(task_queue_id, handler, **settings)`` makes a worker
  of the SDK (``azqueue.testing.queueworker.QueueWorker`` lists the settings); its
  ``.drain(timeout=60)`` (or ``await .drain_async()``) runs it until no task of the task
  queue is pending or running, and raises what its handler raised (an ``AssertionError``
  by default); ``azqueue_worker.drain(w1, w2)`` drains several at once.
* ``azqueue_worker_parameters``: settings of every ``azqueue_worker(...)``, {} unless a
  module or conftest.py overrides it.
* ``azqueue_events``: the events of ``azqueue_server``, on and recorded without a broker
  in the tests that ask for it; ``.wait_for(kind, task_id, timeout=30)`` returns the
  message as Taskcluster's schema has it.
* ``azure_storage_faults``: the server's storage behind a proxy that injects ServerBusy
  and lost answers on demand.
* ``@pytest.mark.azqueue(claim_timeout=5, clients={"builder": [scopes]}, ...)``: settings
  of ``azqueue_server`` for one test, any field of ``azqueue.config.Settings`` by name.

The server, the workers and the proxy run on an event loop in a thread of their own, so
synchronous tests use them as asyncio tests do (handlers run on that loop's thread). With
pytest-xdist each worker process has its own Azurite, ended by a reaper process
(``azqueue.reaper``) if pytest is killed. ``--azqueue-keep`` keeps storage (and
Azurite's data) and prints where it is.
"""

from __future__ import annotations

import logging
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from azqueue.devstorage import Azurite
    from azqueue.testing.background import BackgroundLoop
    from azqueue.testing.events import RecordedEvents
    from azqueue.testing.harness import AzqueueServer, StorageFaults
    from azqueue.testing.queueworker import QueueWorker

KEPT = "azqueue storage kept"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("azqueue", "azqueue test server")
    group.addoption("--azqueue-events", metavar="AMQP_URL", default=None,
                    help="run azqueue_server with events on, published to this AMQP broker "
                         "(default: the ini setting azqueue_events; none: events off)")
    group.addoption("--azqueue-keep", action="store_true", default=False,
                    help="keep each azqueue_server's storage and Azurite's data after the "
                         "session, and print where they are")
    parser.addini("azqueue_events", "AMQP URL azqueue_server publishes events to (default: "
                  "events off)", default="")


# Loggers of the Azure SDKs that log every request at INFO: quiet below WARNING unless the
# project set their level itself.
CHATTY = ("azure.core.pipeline.policies.http_logging_policy",)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "azqueue(**settings): settings of azqueue_server for "
                            "this test, e.g. claim_timeout=5 (seconds), clients={id: [scopes]}")
    for name in CHATTY:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def _azqueue_loop() -> Iterator[BackgroundLoop]:
    from azqueue.testing.background import BackgroundLoop

    loop = BackgroundLoop()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def azurite(_azqueue_loop: BackgroundLoop, pytestconfig: pytest.Config) -> Iterator[Azurite]:
    """A throwaway Azurite for the session (per xdist worker), stopped at its end. If none
    can be had, the session ends with one error saying why and what to install."""
    from azqueue.config import ConfigError
    from azqueue.devstorage import Azurite, scratch_dir

    def announce(line: str) -> None:  # on the terminal, past pytest's capture
        capture = pytestconfig.pluginmanager.getplugin("capturemanager")
        terminal = pytestconfig.pluginmanager.getplugin("terminalreporter")
        if capture is None or terminal is None:  # an xdist worker: its stderr is shown
            print(f"azqueue: {line}", file=sys.stderr, flush=True)
            return
        with capture.global_and_fixture_disabled():
            terminal.write_line(f"azqueue: {line}")

    keep = pytestconfig.getoption("azqueue_keep")
    data_dir = tempfile.mkdtemp(prefix="azqueue-azurite-", dir=scratch_dir()) if keep else None
    try:
        instance = _azqueue_loop.run(Azurite.start(data_dir=data_dir, announce=announce))
    except ConfigError as e:
        pytest.exit(f"azqueue: no Azurite for the azqueue fixtures: {e}",
                    returncode=pytest.ExitCode.USAGE_ERROR)
    yield instance
    _azqueue_loop.run(instance.stop())


@pytest.fixture
def azure_storage_faults(_azqueue_loop: BackgroundLoop, azurite: Azurite
                         ) -> Iterator[StorageFaults]:
    """A fault proxy in front of Azurite; ``azqueue_server`` reaches storage through it
    in the tests that ask for this fixture."""
    from azqueue.testing.harness import StorageFaults

    faults = StorageFaults.start(_azqueue_loop, azurite)
    yield faults
    faults.stop()


@pytest.fixture
def azqueue_events() -> RecordedEvents:
    """The events of ``azqueue_server`` in this test, recorded without a broker:
    ``.wait_for(kind, task_id, timeout=30)`` returns a message's body as Taskcluster's
    schema of its exchange has it; ``.messages`` lists them all."""
    from azqueue.testing.events import RecordedEvents

    return RecordedEvents()


@pytest.fixture
def azqueue_server(request: pytest.FixtureRequest, _azqueue_loop: BackgroundLoop,
                   azurite: Azurite) -> Iterator[AzqueueServer]:
    """A running azqueue with a storage prefix of its own, deleted after the test."""
    from azqueue.testing.harness import AzqueueServer, new_prefix, server_settings

    config = request.config
    connection_string = azurite.connection_string
    if "azure_storage_faults" in request.fixturenames:
        faults: StorageFaults = request.getfixturevalue("azure_storage_faults")
        connection_string = faults.connection_string
    amqp_url = config.getoption("azqueue_events") or str(config.getini("azqueue_events"))
    events: RecordedEvents | None = None
    if "azqueue_events" in request.fixturenames:
        events = request.getfixturevalue("azqueue_events")
        amqp_url = ""
    overrides: dict[str, Any] = {}
    for marker in reversed(list(request.node.iter_markers("azqueue"))):
        overrides.update(marker.kwargs)
    settings = server_settings(connection_string, new_prefix(), amqp_url, **overrides)
    server = _azqueue_loop.run(AzqueueServer.start(settings, events))
    yield server
    keep = bool(config.getoption("azqueue_keep"))
    _azqueue_loop.run(server.stop(keep_storage=keep))
    if keep:
        request.node.user_properties.append((KEPT, (
            f"{request.node.nodeid}: prefix {server.prefix}, Azurite data in "
            f"{azurite.workdir} (`azurite --location {azurite.workdir}` serves it again)")))


@pytest.fixture
def azqueue_worker_parameters() -> dict[str, Any]:
    """Settings of every ``azqueue_worker(...)`` of the tests that see this fixture: {} here;
    a module or conftest.py overrides it (e.g. ``{"status_interval": 0.5}``), and the
    arguments of ``azqueue_worker(...)`` override it in turn."""
    return {}


@pytest.fixture
def azqueue_worker(_azqueue_loop: BackgroundLoop, azqueue_server: AzqueueServer,
                   azqueue_worker_parameters: dict[str, Any]) -> WorkerFactory:
    """``azqueue_worker(task_queue_id, handler, **settings)``: a worker of the SDK on
    ``azqueue_server`` (``azqueue.testing.queueworker.QueueWorker`` lists the settings);
    ``azqueue_worker.drain(*workers)`` drains several at once."""
    from azqueue.testing.queueworker import DEPRECATED_MODES, normalize_mode

    parameters = dict(azqueue_worker_parameters)
    if parameters.get("mode") in DEPRECATED_MODES:
        parameters["mode"] = normalize_mode(parameters["mode"], 2)
    return WorkerFactory(_azqueue_loop, azqueue_server, parameters)


class WorkerFactory:
    """What the ``azqueue_worker`` fixture is: called, a new worker (``worker-1``,
    ``worker-2``, ... of the group ``azqueue-testing`` unless told otherwise); ``drain()``
    drains several at once. ``workers`` lists those made."""

    def __init__(self, loop: BackgroundLoop, server: AzqueueServer,
                 parameters: dict[str, Any]) -> None:
        self._loop = loop
        self._server = server
        self._parameters = parameters
        self.workers: list[QueueWorker] = []

    def __call__(self, task_queue_id: str, handler: Any, **settings: Any) -> QueueWorker:
        from azqueue.testing.queueworker import QueueWorker, normalize_mode

        if "mode" in settings:  # warned here, so that the warning names the test's line
            settings["mode"] = normalize_mode(settings["mode"], 3)
        merged = {"worker_id": f"worker-{len(self.workers) + 1}", **self._parameters,
                  **settings}
        worker = QueueWorker(self._loop, self._server, task_queue_id, handler, **merged)
        self.workers.append(worker)
        return worker

    def drain(self, *workers: QueueWorker, timeout: float = 60.0,
              propagate: Any = None) -> None:
        """Drain ``workers`` (all made so far if none is named) at once, on the background
        loop: the test needs no thread. Raises as ``QueueWorker.drain()`` does, once all
        are over."""
        from azqueue.testing.queueworker import drain_all

        drain_all(workers or self.workers, timeout, propagate=propagate)

    async def drain_async(self, *workers: QueueWorker, timeout: float = 60.0,
                          propagate: Any = None) -> None:
        """``drain()`` for a test on an event loop of its own, which keeps running."""
        from azqueue.testing.queueworker import drain_all_async

        await drain_all_async(workers or self.workers, timeout, propagate=propagate)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    kept = {value for reports in terminalreporter.stats.values() for report in reports
            for name, value in getattr(report, "user_properties", ()) if name == KEPT}
    if kept:
        terminalreporter.write_sep("-", KEPT)
        for line in sorted(kept):
            terminalreporter.write_line(line)
