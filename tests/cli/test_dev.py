"""`azqueue dev` as a developer runs it: restarted on the same --data directory it keeps
its tasks, its credentials and its tip secrets; SIGHUP stops it and its Azurite."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import signal
import socket
import stat
import subprocess
from pathlib import Path

import aiohttp
import pytest

from azqueue.cli.server import DEV_STATE
from azqueue.devstorage import free_port
from azqueue.testing.hawk import hawk_signer
from azqueue.testing.processes import alive
from azqueue.testing.tasks import definition, slugid
from azqueue.worker import Credentials, Worker, WorkerConfig
from tests.cli.helpers import azqueue, one_line_error
from tests.waiting import eventually
from tests.worker.helpers import AZQUEUE, checkout_env, does_nothing, running

BANNER_TIMEOUT = 120.0


class Dev:
    """A running `azqueue dev --data DIR --port PORT` and what its banner said: by
    default on port 0, any free port, which its rootUrl names (a port picked here could
    be taken by another process before dev listens on it)."""

    def __init__(self, data: Path, port: int = 0, options: tuple[str, ...] = (),
                 dev_options: tuple[str, ...] = ()) -> None:
        env = {k: v for k, v in checkout_env().items() if not k.startswith("AZQUEUE_")}
        self.process = subprocess.Popen(
            [AZQUEUE, *options, "dev", "--data", str(data), "--port", str(port), *dev_options],
            env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.port = port
        self.root_url = ""
        self.token = ""
        self.banner: list[str] = []

    async def started(self) -> Dev:
        def read_banner() -> str:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self.banner.append(line)
                if m := re.search(r"export TASKCLUSTER_ROOT_URL=(\S+)", line):
                    self.root_url = m[1]
                if m := re.search(r"export TASKCLUSTER_ACCESS_TOKEN=(\S+)", line):
                    return m[1]
            return ""

        self.token = await asyncio.wait_for(asyncio.to_thread(read_banner), BANNER_TIMEOUT)
        assert self.token, f"no banner; stderr: {self.stop(signal.SIGKILL)}"
        port = str(self.port) if self.port else "[1-9][0-9]*"
        assert re.fullmatch(rf"http://127\.0\.0\.1:{port}", self.root_url), self.banner
        return self

    def children(self) -> list[int]:
        pid = self.process.pid
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    def child(self, running: str) -> int:
        """The pid of the one child process whose command line holds ``running``."""
        [pid] = [p for p in self.children()
                 if running.encode() in Path(f"/proc/{p}/cmdline").read_bytes()]
        return pid

    def stop(self, sig: int) -> str:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        _, err = self.process.communicate(timeout=60)
        return err


@pytest.mark.slow
@pytest.mark.crash
async def test_dev_restarted_on_its_data_dir_keeps_credentials_and_pending_tips(
        tmp_path: Path) -> None:
    """A task created before a restart is still pending after it, and its tip (signed
    with the first run's secret) is claimed and completed by a worker of the second run;
    the root credentials printed are the same. SIGHUP (a closed terminal) stops dev and
    its Azurite."""
    data = tmp_path / "not" / "yet"
    first = await Dev(data).started()
    try:
        state = data / DEV_STATE
        assert stat.S_IMODE(state.stat().st_mode) == 0o600
        azurite_pid = first.child("azurite/")
        task_id = slugid()
        async with aiohttp.ClientSession(middlewares=(hawk_signer("root", first.token),)) as http:
            async with http.put(f"{first.root_url}/api/queue/v1/task/{task_id}",
                                json=definition("prov/restarted")) as r:
                assert r.status == 200, await r.text()
        err = await asyncio.to_thread(first.stop, signal.SIGHUP)
        assert first.process.returncode == 0, err
        assert "Traceback" not in err
        assert not alive(azurite_pid), "Azurite outlived `azqueue dev` after SIGHUP"
    finally:
        if first.process.poll() is None:
            first.stop(signal.SIGKILL)

    second = await Dev(data).started()
    try:
        assert second.token == first.token
        worker = Worker(WorkerConfig(
            root_url=second.root_url, credentials=Credentials("root", second.token),
            task_queue_id="prov/restarted", worker_group="g", worker_id="after-restart",
            mode="sas", idle_sleep=0.2), does_nothing)
        async with running(worker):
            await eventually(lambda: worker.completed == 1, timeout=60,
                             what="the task created before the restart to be completed")
        async with aiohttp.ClientSession() as anonymous, anonymous.get(
                f"{second.root_url}/api/queue/v1/task/{task_id}/status") as r:
            runs = (await r.json())["status"]["runs"]
        assert [(run["state"], run["workerId"]) for run in runs] == [
            ("completed", "after-restart")]
    finally:
        err = await asyncio.to_thread(second.stop, signal.SIGTERM)
    assert second.process.returncode == 0, err


@pytest.mark.slow
async def test_the_banner_names_the_dashboard_and_requests_are_logged_only_when_asked(
        tmp_path: Path) -> None:
    """A request leaves no line by default; it does with `dev --access-log`, or with
    `--log-level DEBUG`."""
    for options, dev_options, logged in (((), (), False), ((), ("--access-log",), True),
                                         (("--log-level", "DEBUG"), (), True)):
        dev = await Dev(tmp_path / f"data-{logged}-{len(options)}", options=options,
                        dev_options=dev_options).started()
        try:
            assert any(re.fullmatch(rf"\s*dashboard:\s+{re.escape(dev.root_url)}/\s*", line)
                       for line in dev.banner), dev.banner
            async with aiohttp.ClientSession() as http, http.get(
                    f"{dev.root_url}/api/queue/v1/ping") as r:
                assert r.status == 200
        finally:
            err = await asyncio.to_thread(dev.stop, signal.SIGTERM)
        assert bool(re.search(r"azqueue.access: GET /api/queue/v1/ping 200", err)) is logged, (
            options, dev_options, err)


async def test_a_second_dev_on_the_same_data_dir_says_it_is_taken(tmp_path: Path) -> None:
    first = await Dev(tmp_path).started()
    try:
        second = Dev(tmp_path)
        try:
            _, err = await asyncio.to_thread(second.process.communicate, timeout=60)
        finally:
            if second.process.poll() is None:
                second.stop(signal.SIGKILL)
        assert second.process.returncode == 1, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        assert lines[0] == (f"azqueue: --data {tmp_path} is in use by another `azqueue dev` "
                            f"(pid {first.process.pid}); stop it first, or give another "
                            "directory"), err
        assert first.process.poll() is None
    finally:
        await asyncio.to_thread(first.stop, signal.SIGTERM)


@pytest.mark.crash
async def test_an_azurite_left_behind_by_a_killed_dev_is_stopped_by_the_next(
        tmp_path: Path) -> None:
    first = await Dev(tmp_path).started()
    orphan = first.child("azurite/")
    second: Dev | None = None
    try:
        os.kill(first.child("reaper.py"), signal.SIGKILL)  # as if it had been killed too
        await asyncio.to_thread(first.stop, signal.SIGKILL)
        assert alive(orphan)  # nothing stopped it: it runs in a session of its own
        second = await Dev(tmp_path).started()
        assert not alive(orphan), "the Azurite left behind still runs"
    finally:
        if alive(orphan):
            os.kill(orphan, signal.SIGKILL)
        err = await asyncio.to_thread(second.stop, signal.SIGTERM) if second else ""
    assert f"stopping the Azurite (pid {orphan}) that a previous `azqueue dev` left " \
           f"running on {tmp_path}" in err, err


async def test_a_killed_devs_azurite_is_stopped_by_its_reaper_and_its_data_kept(
        tmp_path: Path) -> None:
    first = await Dev(tmp_path).started()
    azurite_pid = first.child("azurite/")
    try:
        await asyncio.to_thread(first.stop, signal.SIGKILL)
        await eventually(lambda: not alive(azurite_pid), what="Azurite stopped by its reaper")
        assert (tmp_path / DEV_STATE).exists() and any(tmp_path.rglob("*azurite*"))
    finally:
        if alive(azurite_pid):
            os.kill(azurite_pid, signal.SIGKILL)


def _recording_azurite(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment of a dev whose Azurite only records that it ran (in the file
    returned)."""
    ran = tmp_path / "azurite-ran"
    fake = tmp_path / "azurite"
    fake.write_text(f"#!/bin/sh\ntouch {ran}\nexec sleep 600\n")
    fake.chmod(0o755)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AZQUEUE_")},
           "AZQUEUE_AZURITE_BIN": str(fake), "AZQUEUE_STORAGE_WAIT": "5"}
    return env, ran


async def test_dev_on_a_port_in_use_says_so_before_starting_azurite(tmp_path: Path) -> None:
    """`azqueue dev --port P` with P taken: one line naming the port and exit status 1,
    and no Azurite started for nothing (the Azurite given here only records that it ran)."""
    env, ran = _recording_azurite(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = await azqueue("dev", "--port", str(port), env=env, timeout=120)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"127.0.0.1:{port}" in one_line_error(done) and "in use" in one_line_error(done)
    assert not ran.exists(), "Azurite was started before the port was checked"


async def test_dev_on_any_free_port_serves_one_replica(tmp_path: Path) -> None:
    """`--port 0` with `--replicas 2`: the replicas take consecutive ports from the one
    given, so there is none to count from; one line saying so, exit status 2, before
    Azurite starts."""
    env, ran = _recording_azurite(tmp_path)
    done = await azqueue("dev", "--port", "0", "--replicas", "2", env=env, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert one_line_error(done) == ("azqueue: --port 0 (or AZQUEUE_PORT=0), any free port, "
                                    "serves one replica, not 2: give the port the replicas "
                                    "start from")
    assert not ran.exists()


@pytest.mark.slow
@pytest.mark.crash
async def test_dev_replicas_share_one_azurite(tmp_path: Path) -> None:
    """`dev --replicas 2` serves two replicas of one deployment, on the port asked for and
    the next: a task created through the first is claimed through the second, the
    banner names both, and SIGTERM stops both."""
    port = free_port()
    while not _free(port + 1):
        port = free_port()
    dev = await Dev(tmp_path / "data", port, dev_options=("--replicas", "2")).started()
    second = f"http://127.0.0.1:{port + 1}"
    try:
        assert any(second in line for line in dev.banner), dev.banner
        task_id, task_queue_id = slugid(), f"prov/replicas-{secrets.token_hex(3)}"
        async with aiohttp.ClientSession(middlewares=(hawk_signer("root", dev.token),)) as http:
            async with http.put(f"{dev.root_url}/api/queue/v1/task/{task_id}",
                                json=definition(task_queue_id)) as r:
                assert r.status == 200, await r.text()
            async with http.post(
                    f"{second}/api/queue/v1/claim-work/{task_queue_id.replace('/', '%2F')}",
                    json={"workerGroup": "g", "workerId": "w", "tasks": 1}) as r:
                claimed = (await r.json())["tasks"]
        assert [c["status"]["taskId"] for c in claimed] == [task_id]
    finally:
        err = await asyncio.to_thread(dev.stop, signal.SIGTERM)
    assert dev.process.returncode == 0, err
    assert _free(port + 1), "the second replica outlived `azqueue dev`"


def _free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0
