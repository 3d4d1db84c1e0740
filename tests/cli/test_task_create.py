"""`azqueue task create` submits what createTask accepts (a payload, env, group,
dependencies, times, routes, scopes, metadata, or a whole definition file) with defaults
that are true, and `azqueue task rerun` reruns a resolved task."""

from __future__ import annotations

import getpass
import json
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from azqueue.model.identifiers import SLUGID
from azqueue.testing.tasks import create, definition, iso, slugid
from tests.cli.helpers import as_root, azqueue, one_line_error
from tests.servers import Server
from tests.waiting import eventually
from tests.worker.helpers import running, shell_worker, wait_status


async def _task(http: aiohttp.ClientSession, server: Server, task_id: str) -> dict[str, Any]:
    async with http.get(f"{server.api}/task/{task_id}") as r:
        assert r.status == 200, await r.text()
        task: dict[str, Any] = await r.json()
        return task


def _created(done: Any) -> str:
    assert done.returncode == 0, done.stderr
    return str(done.stdout.strip())


def _when(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def test_create_takes_every_part_of_a_definition_from_options(
        server: Server, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    group = slugid()
    first = await create(http, server.api, definition("prov/create-options", taskGroupId=group))
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps({"command": ["echo", "hi"], "maxRunTime": 60}))
    task_id = _created(await as_root(
        server, "task", "create", "--task-queue", "prov/create-options", "--payload",
        str(payload), "--env", "GREETING=hello", "--env", "EMPTY=", "--group", group,
        "--dependency", first, "--priority", "high", "--deadline", "2h", "--expires", "3d",
        "--route", "index.a.b", "--route", "notify.c", "--retries", "2",
        "--scope", "queue:get-artifact:private/*", "--name", "options",
        "--owner", "ops@example.com", "--source", "https://example.com/ci/42"))
    task = await _task(http, server, task_id)
    assert task["payload"] == {"command": ["echo", "hi"], "maxRunTime": 60,
                               "env": {"GREETING": "hello", "EMPTY": ""}}
    assert task["taskGroupId"] == group
    assert task["dependencies"] == [first]
    assert task["priority"] == "high"
    assert task["routes"] == ["index.a.b", "notify.c"]
    assert task["retries"] == 2
    assert task["scopes"] == ["queue:get-artifact:private/*"]
    assert task["metadata"]["name"] == "options"
    assert task["metadata"]["owner"] == "ops@example.com"
    assert task["metadata"]["source"] == "https://example.com/ci/42"
    created = _when(task["created"])
    assert _when(task["deadline"]) - created == timedelta(hours=2)
    assert _when(task["expires"]) - created == timedelta(days=3)


async def test_create_reads_the_payload_from_stdin_and_times_in_iso(
        server: Server, http: aiohttp.ClientSession) -> None:
    deadline = iso(datetime.now(UTC) + timedelta(minutes=45))
    task_id = _created(await as_root(
        server, "task", "create", "--task-queue", "prov/create-stdin", "--payload", "-",
        "--deadline", "30m", stdin='{"command": ["true"]}'))
    task = await _task(http, server, task_id)
    assert task["payload"] == {"command": ["true"]}
    assert _when(task["deadline"]) - _when(task["created"]) == timedelta(minutes=30)
    task_id = _created(await as_root(
        server, "task", "create", "--task-queue", "prov/create-stdin", "--deadline", deadline,
        "--", "true"))
    assert (await _task(http, server, task_id))["deadline"] == deadline


async def test_the_default_owner_and_source_are_true(
        server: Server, http: aiohttp.ClientSession) -> None:
    task_id = _created(await as_root(server, "task", "create", "--task-queue",
                                     "prov/create-defaults", "--", "echo", "hi"))
    metadata = (await _task(http, server, task_id))["metadata"]
    assert metadata["owner"] == f"{getpass.getuser()}@{socket.gethostname()}"
    assert metadata["name"] == "echo hi"
    assert "github" not in metadata["source"] and "example" not in metadata["source"]
    assert metadata["source"].startswith(f"ssh://{socket.gethostname()}/"), metadata["source"]


async def test_create_from_a_definition_file_or_stdin(
        server: Server, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    body = definition("prov/create-definition", routes=["index.x"])
    body["metadata"]["name"] = "from a file"
    path = tmp_path / "task.json"
    path.write_text(json.dumps(body))
    task_id = _created(await as_root(server, "task", "create", "--definition", str(path)))
    task = await _task(http, server, task_id)
    assert (task["metadata"]["name"], task["routes"]) == ("from a file", ["index.x"])
    del body["created"], body["deadline"]  # filled in: now, and --deadline's default
    task_id = _created(await as_root(server, "task", "create", "--definition", "-",
                                     stdin=json.dumps(body)))
    task = await _task(http, server, task_id)
    assert _when(task["deadline"]) - _when(task["created"]) == timedelta(hours=1)


async def test_rerun_gives_a_resolved_task_a_new_run(
        server: Server, http: aiohttp.ClientSession) -> None:
    task_id = await create(http, server.api, definition("prov/rerun-cli"))
    async with running(shell_worker(server, "prov/rerun-cli", "w")):
        await wait_status(http, server, task_id, lambda s: s["state"] == "completed")
    done = await as_root(server, "task", "rerun", task_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{task_id} pending: run 0 completed, run 1 pending"


async def test_what_create_cannot_use_is_one_line_saying_why(
        server: Server, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cases = [
        (("--payload", str(bad)), f"task create: --payload {bad} is not JSON: "),
        (("--payload", str(tmp_path / "missing.json")),
         f"task create: --payload {tmp_path / 'missing.json'}: cannot read it"),
        (("--env", "NOEQUALS", "--", "true"),
         "task create: --env NOEQUALS is not NAME=VALUE"),
        (("--deadline", "soon", "--", "true"),
         "--deadline: 'soon' is neither a duration (30m, 1h, 2d; over 0) nor an ISO time"),
        (("--payload", str(bad), "--", "true"), "task create: give a CMD or --payload, not both"),
        ((), "task create: give a CMD (after --), --payload FILE or --definition FILE"),
        (("--dependency", "not-a-task-id", "--", "true"),
         "--dependency: 'not-a-task-id' is not a taskId"),
    ]
    for extra, expected in cases:
        done = await as_root(server, "task", "create", "--task-queue", "prov/create-bad", *extra)
        assert done.returncode in (1, 2), done
        error = one_line_error(done)
        assert expected in error, (extra, error)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.slow
async def test_create_for_a_task_queue_no_worker_asked_says_so_and_what_was_meant(
        server: Server, http: aiohttp.ClientSession) -> None:
    """A typo in the task queue leaves the task waiting forever: stderr says that no worker
    asked that task queue for work, and names the task queues it may have meant; a task
    queue a worker asks says nothing."""
    async with running(shell_worker(server, "typo/hello", "w")):
        async def asked() -> list[str]:
            async with http.get(f"{server.api}/provisioners/typo/worker-types/hello/workers"
                                ) as r:
                return [w["workerId"] for w in (await r.json())["workers"]]

        await eventually(asked, what="the worker recorded as asking typo/hello")
        quiet = await as_root(server, "task", "create", "--task-queue", "typo/hello", "--",
                              "true")
        typo = await as_root(server, "task", "create", "--task-queue", "typo/helo", "--", "true")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert typo.returncode == 0, typo.stderr
    assert SLUGID.fullmatch(typo.stdout.strip())
    assert typo.stderr == (
        "azqueue: no worker has asked typo/helo for work in the last day: the task waits "
        "until one does (`azqueue worker --task-queue typo/helo`); did you mean "
        "typo/hello?\n")


async def test_create_with_a_definition_names_every_option_it_would_ignore(
        tmp_path: Path) -> None:
    """--definition is the whole task: the options that would set a part of it (and
    CMD) are refused, each named, in the order --help lists them; those it still
    reads (--deadline, --expires) and those left at their defaults are not named."""
    whole = tmp_path / "task.json"
    whole.write_text(json.dumps(definition("prov/create-definition")))
    done = await azqueue("task", "create", "--definition", str(whole), "--priority", "high",
                         "--deadline", "2h", "--group", slugid(), "--retries", "5",
                         "--route", "r.1", "--", "true")
    assert done.returncode == 2, done
    assert one_line_error(done) == (
        f"azqueue task create: --definition {whole} is the whole task: write what --group, "
        "--priority, --route, CMD would set in it instead (`azqueue task create --help` "
        "explains)")
