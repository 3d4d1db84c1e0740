"""The pytest plugin as a downstream project uses it: a project of its own (no import
from tests/), run with `python -m pytest` in a directory of its own, sync and asyncio
tests, pytest-asyncio in auto mode and warnings as errors."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
PLUGIN = "azqueue.testing.pytest_plugin"
INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
filterwarnings = error
"""


def pytest_command(cwd: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    """`python -m pytest` in ``cwd`` with this checkout's azqueue importable, loading the
    plugin as its entry point does (explicitly when azqueue is installed without it): the
    command and its environment."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    declared = subprocess.run(
        [sys.executable, "-c", "from importlib.metadata import entry_points; print(any("
         f"e.value == {PLUGIN!r} for e in entry_points(group='pytest11')))"],
        cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()
    plugin = [] if declared == "True" else ["-p", PLUGIN]
    return [sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider", *args], env


def run_pytest(cwd: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    command, env = pytest_command(cwd, *args)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def make_dir(path: Path) -> Path:
    path.mkdir()
    return path


def downstream_project(path: Path, tests: str) -> Path:
    (path / "pytest.ini").write_text(INI)
    (path / "test_downstream.py").write_text(tests)
    return path


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_downstream_project_tests_its_worker_with_the_plugins_fixtures(tmp_path: Path) -> None:
    """Tasks created with the official client are run by the handler (claimWork and SAS
    workers), a raising handler fails its run, a second test sees none of the first's
    tasks, an asyncio test drives the same fixtures while its own loop runs on, and
    tasks complete while storage is throttled; drain gives up after its timeout; a plain
    function handler is refused, artifacts arrive through 30% ServerBusy and a lost PUT,
    the reason a run failed ends its log, the marker makes a claim expire in seconds,
    nothing of a test's server logs in the next test, and events are awaited without a
    broker."""
    project = downstream_project(tmp_path, (Path(__file__).parent / "downstream_tests.py")
                                 .read_text())
    done = run_pytest(project, "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b13 passed\b", done.stdout), done.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_keep_leaves_a_tests_storage_and_says_where_it_is(tmp_path: Path) -> None:
    project = downstream_project(tmp_path, """
import taskcluster

def test_creates_a_task(azqueue_server):
    azqueue_server.queue().createTask(taskcluster.slugId(), {
        "taskQueueId": "kept/tasks", "created": taskcluster.fromNowJSON("0 seconds"),
        "deadline": taskcluster.fromNowJSON("1 hour"), "payload": {},
        "metadata": {"name": "kept", "description": "kept", "owner": "dev@example.com",
                     "source": "https://example.com"}})
""")
    done = run_pytest(project, "-q", "--azqueue-keep")
    assert done.returncode == 0, done.stdout + done.stderr
    kept = re.search(r"test_creates_a_task: prefix (t[0-9a-f]+), Azurite data in (\S+)",
                     done.stdout)
    assert kept, done.stdout
    data = Path(kept[2])
    try:
        assert any(data.rglob("*")), f"nothing kept in {data}"
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_azqueues_own_suite_keeps_its_fixtures_with_the_plugin_loaded() -> None:
    """tests/conftest.py's `azurite` overrides the plugin's: the whole suite collects, and
    a test on the conftest's fixtures passes."""
    collected = run_pytest(REPO, "--collect-only", "-q", "tests")
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr
    sample = run_pytest(REPO, "-q", "tests/integration/test_create_task.py", "-k",
                        "idempotent")
    assert sample.returncode == 0, sample.stdout[-3000:] + sample.stderr
    assert re.search(r"\b[1-9]\d* passed\b", sample.stdout), sample.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_xdist_worker_gets_an_azqueue_of_its_own(tmp_path: Path) -> None:
    """With pytest-xdist, tests running at once in two processes each see only their own
    task queue's tasks and servers, and all of them pass."""
    project = downstream_project(tmp_path, """
import os
import pytest
import taskcluster

from azqueue.worker import TaskRun


@pytest.mark.parametrize("n", range(4))
def test_runs_its_own_tasks(azqueue_server, azqueue_worker, n):
    queue = azqueue_server.queue()
    ran = []

    async def handler(run: TaskRun) -> None:
        ran.append(run.task_id)

    ids = [taskcluster.slugId() for _ in range(3)]
    for task_id in ids:
        queue.createTask(task_id, {
            "taskQueueId": "xdist/tasks", "created": taskcluster.fromNowJSON("0 seconds"),
            "deadline": taskcluster.fromNowJSON("1 hour"), "payload": {},
            "metadata": {"name": "x", "description": "x", "owner": "dev@example.com",
                         "source": "https://example.com"}})
    azqueue_worker("xdist/tasks", handler).drain(timeout=60)
    assert sorted(ran) == sorted(ids), os.environ.get("PYTEST_XDIST_WORKER")
""")
    done = run_pytest(project, "-q", "-n", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b4 passed\b", done.stdout), done.stdout


def gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
async def test_azurite_ends_with_a_pytest_killed_mid_test(tmp_path: Path,
                                                          how: signal.Signals) -> None:
    """A pytest killed while a test runs (what CI does at its time limit) leaves no Azurite
    running and none of its data behind."""
    seen = tmp_path / "azurite-seen"
    project = downstream_project(make_dir(tmp_path / "project"), f"""
import pathlib
import threading

def test_waits_to_be_killed(azurite):
    pathlib.Path({str(seen)!r}).write_text(f"{{azurite.process.pid}} {{azurite.workdir}}")
    threading.Event().wait()
""")
    command, env = pytest_command(project, "-q")
    with open(tmp_path / "pytest.log", "wb") as output:
        pytest_process = subprocess.Popen(command, cwd=project, env=env, stdout=output,
                                          stderr=subprocess.STDOUT)
    try:
        await eventually(lambda: seen.exists() and seen.read_text(),
                         what="the downstream test started, on an Azurite")
        pid, workdir = seen.read_text().split(" ", 1)
        assert not gone(int(pid))
        pytest_process.send_signal(how)
        assert pytest_process.wait(60) == -how
        await eventually(lambda: gone(int(pid)), what=f"Azurite (pid {pid}) ended")
        await eventually(lambda: not Path(workdir).exists(),
                         what=f"Azurite's data ({workdir}) removed")
    finally:
        if pytest_process.poll() is None:
            pytest_process.kill()
            pytest_process.wait()


@pytest.mark.timeout(300)
def test_without_azurite_the_session_ends_with_one_clear_error(tmp_path: Path) -> None:
    project = downstream_project(tmp_path, """
import pytest

@pytest.mark.parametrize("n", range(3))
def test_needs_a_server(azqueue_server, n):
    pass
""")
    command, env = pytest_command(project, "-q")
    done = subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=240,
                          env={**env, "AZQUEUE_AZURITE_BIN": str(tmp_path / "no-azurite")})
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, output
    assert output.count("no Azurite for the azqueue fixtures: cannot run Azurite") == 1, output
    assert "AZQUEUE_AZURITE_BIN" in output and "Traceback" not in output, output


@pytest.mark.timeout(300)
def test_azure_sdk_requests_are_not_logged_at_info(tmp_path: Path) -> None:
    """With --log-level=INFO a test's captured log holds the server's own lines, not one
    per storage request of the Azure SDKs."""
    project = downstream_project(tmp_path, """
import logging

def test_fails_to_show_its_log(azqueue_server):
    azqueue_server.queue().ping()
    logging.getLogger("downstream").info("the test ran")
    assert False
""")
    done = run_pytest(project, "-q", "--log-level=INFO")
    assert "the test ran" in done.stdout, done.stdout
    assert "Request URL" not in done.stdout, done.stdout[-3000:]


@pytest.mark.timeout(300)
def test_old_mode_spelling_warns_and_propagate_chooses_what_a_drain_raises(
        tmp_path: Path) -> None:
    """`mode="claimwork"` still works with a DeprecationWarning (from the test's own line);
    a drain raises a handler's bug only with propagate=True, and a pytest.fail() in a
    handler by default; unknown worker settings are a TypeError naming the known ones."""
    project = downstream_project(tmp_path, """
import pytest

from azqueue.worker import TaskRun


async def crash(run: TaskRun) -> None:
    raise RuntimeError("a bug in the handler")


def test_the_old_spelling_warns(azqueue_server, azqueue_worker):
    azqueue_server.create_task("old/mode")
    with pytest.deprecated_call(match="mode='claimwork' is deprecated: write "
                                      "mode='claim-work'") as seen:
        worker = azqueue_worker("old/mode", crash, mode="claimwork")
    assert seen[0].filename == __file__
    assert worker.config.mode == "claim-work"
    worker.drain()  # a bug is the run's internal-error, not the test's, by default
    assert [type(e.error) for e in worker.errors] == [RuntimeError]


def test_propagate_true_raises_a_bug(azqueue_server, azqueue_worker):
    azqueue_server.create_task("bug/raised")
    with pytest.raises(RuntimeError, match="a bug in the handler") as raised:
        azqueue_worker("bug/raised", crash, propagate=True).drain()
    assert "reported exception internal-error" in "".join(raised.value.__notes__)


def test_pytest_fail_in_a_handler_fails_the_test(azqueue_server, azqueue_worker):
    azqueue_server.create_task("fail/raised")

    async def handler(run: TaskRun) -> None:
        pytest.fail("the handler saw something wrong")

    with pytest.raises(pytest.fail.Exception, match="saw something wrong"):
        azqueue_worker("fail/raised", handler).drain()


def test_unknown_settings_are_named(azqueue_worker):
    with pytest.raises(TypeError, match="unknown worker setting.s. status_intervall; .*"
                                        "status_interval"):
        azqueue_worker("any/queue", crash, status_intervall=1)
""")
    done = run_pytest(project, "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b4 passed\b", done.stdout), done.stdout
