"""`azqueue task …`, `queue list`, `worker list`, `--help` and `--version`, run as a user
runs them: the installed entry point, against a real server on Azurite."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import aiohttp
import pytest

from azqueue import __version__
from azqueue.cli.exitcodes import WAIT_EXIT_CODES
from azqueue.cli.parser import Parser, parser
from azqueue.testing import sas
from azqueue.testing.tasks import create, definition
from tests.cli.helpers import as_root, azqueue
from tests.servers import Server, ServerFactory
from tests.worker.helpers import (AZQUEUE, checkout_env, cli_env, ctrl_c_reaches_it, running,
                                  shell_worker, wait_status)

SERVER_STACK = ("azure", "azqueue.api", "azqueue.service", "azqueue.storage",
                "azqueue.background", "azqueue.cli.server")


def _imported_by(*argv: str, env: dict[str, str] | None = None) -> list[str]:
    """The modules of the server stack that running ``azqueue ARGV`` imported."""
    probe = ("import json, sys\n"
             "from azqueue.cli import main\n"
             "try:\n"
             f"    main({list(argv)!r})\n"
             "except SystemExit:\n"
             "    pass\n"
             f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({SERVER_STACK!r}))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=checkout_env(env), timeout=60)
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


async def test_help_version_and_task_status_do_not_import_the_server_stack(
        server: Server, http: aiohttp.ClientSession) -> None:
    """The command line answers `--help` and `task status` at once: neither loads the
    Azure SDKs nor the server (which took seconds per call)."""
    task_id = await create(http, server.api, definition("prov/imports"))
    assert await asyncio.to_thread(_imported_by, "--help") == []
    assert await asyncio.to_thread(_imported_by, "serve", "--help") == []
    assert await asyncio.to_thread(_imported_by, "task", "status", task_id,
                                   env=cli_env(server)) == []
    version = await azqueue("--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"azqueue {__version__}")


def test_every_option_says_what_it_is_and_serve_help_names_the_variables() -> None:
    """`--help` explains every option, with its unit and default where it has them."""
    def commands(p: Parser) -> Iterator[Parser]:
        yield p
        for sub in p.commands.values():
            yield from commands(sub)

    for command in commands(parser()):
        for action in command.arguments:
            if action.dest == "help":
                continue
            assert action.help, f"{command.prog} {action.option_strings or action.dest}: no help"
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                assert "default" in action.help, f"{command.prog} {action.option_strings}"
    serve_help = subprocess.run([AZQUEUE, "serve", "--help"], env=checkout_env(),
                                capture_output=True, text=True,
                                timeout=60).stdout
    for variable in ("AZQUEUE_STORAGE_CONNECTION_STRING", "AZQUEUE_TIP_SECRETS",
                     "AZQUEUE_ROOT_CLIENT_ID", "AZQUEUE_ROOT_ACCESS_TOKEN", "AZQUEUE_PORT",
                     "AZQUEUE_AMQP_URL", "AZQUEUE_STORAGE_PUBLIC_QUEUE_ENDPOINT"):
        assert variable in serve_help, variable
    worker_help = subprocess.run([AZQUEUE, "worker", "--help"], env=checkout_env(),
                                 capture_output=True, text=True,
                                 timeout=60).stdout
    assert re.search(r"--status-interval SECONDS\s+check each running task's status", worker_help)
    assert "(default: 10;" in worker_help


async def test_task_wait_prints_progress_and_exits_by_outcome(
        server: Server, http: aiohttp.ClientSession) -> None:
    """`task wait`: a line per state change with the elapsed time; exit 0 completed,
    3 failed, 4 exception, 5 when --timeout passes first."""
    ok = await create(http, server.api, definition(
        "prov/wait", payload={"command": ["sh", "-c", "sleep 1"]}))
    failing = await create(http, server.api, definition(
        "prov/wait", payload={"command": ["false"]}))
    malformed = await create(http, server.api, definition("prov/wait", payload={"command": 1}))
    nobody = await create(http, server.api, definition("prov/nobody-works-here"))
    following = subprocess.Popen([AZQUEUE, "task", "wait", ok], env=cli_env(server),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert following.stdout is not None
        first = await asyncio.to_thread(following.stdout.readline)  # before any worker runs
        timed_out = await as_root(server, "task", "wait", "--timeout", "1", nobody)
        async with running(shell_worker(server, "prov/wait", "waited-for")):
            done_failing, done_malformed = await asyncio.gather(
                as_root(server, "task", "wait", failing),
                as_root(server, "task", "wait", malformed))
            rest, _ = await asyncio.to_thread(following.communicate, timeout=60)
    finally:
        if following.poll() is None:
            following.kill()
    assert (following.returncode, done_failing.returncode, done_malformed.returncode) == (
        WAIT_EXIT_CODES["completed"], WAIT_EXIT_CODES["failed"], WAIT_EXIT_CODES["exception"])
    assert (following.returncode, done_failing.returncode, done_malformed.returncode) == (0, 3, 4)
    assert re.fullmatch(rf"\[\s*\d+s\] {ok} pending: run 0 pending\n", first), first
    lines = rest.splitlines()
    assert any(re.fullmatch(rf"\[\s*\d+s\] {ok} running: run 0 running on tests/waited-for",
                            line) for line in lines), lines
    assert re.fullmatch(rf"\[\s*\d+s\] {ok} completed: run 0 completed", lines[-1]), lines
    assert done_malformed.stdout.splitlines()[-1].endswith("run 0 exception (malformed-payload)")
    assert timed_out.returncode == WAIT_EXIT_CODES["timeout"] == 5
    assert f"{nobody} is still pending after --timeout 1s" in timed_out.stderr


async def test_task_wait_json_and_ctrl_c_exits_quietly(
        server: Server, http: aiohttp.ClientSession) -> None:
    """Ctrl-C ends `task wait` with status 130 and no traceback; `--json` prints the
    status as the API answers it."""
    task_id = await create(http, server.api, definition("prov/ctrl-c"))
    waiting = subprocess.Popen([AZQUEUE, "task", "wait", task_id], env=cli_env(server),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=ctrl_c_reaches_it)
    try:
        assert waiting.stdout is not None
        first = await asyncio.to_thread(waiting.stdout.readline)
        assert f"{task_id} pending" in first
        waiting.send_signal(signal.SIGINT)
        _, err = await asyncio.to_thread(waiting.communicate, timeout=30)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert (waiting.returncode, err) == (130, "")
    status = await as_root(server, "task", "status", "--json", task_id)
    assert json.loads(status.stdout)["taskId"] == task_id
    assert json.loads(status.stdout)["runs"][0]["state"] == "pending"


async def test_task_list_of_a_group_in_lines_and_json(
        server: Server, http: aiohttp.ClientSession) -> None:
    """`task list --group` reads listTaskGroup, every page of it."""
    group = await create(http, server.api, definition("prov/listed", metadata={
        "name": "the group's own", "description": "", "owner": "me@example.com",
        "source": "https://example.com"}))
    members = [await create(http, server.api, definition("prov/listed", taskGroupId=group))
               for _ in range(3)]
    listed = await as_root(server, "task", "list", "--group", group)
    assert listed.returncode == 0, listed.stderr
    ids = {line.split()[0] for line in listed.stdout.splitlines()}
    assert ids == {group, *members}
    assert any(line.split()[1] == "pending" and line.endswith("the group's own")
               for line in listed.stdout.splitlines())
    as_json = await as_root(server, "task", "list", "--group", group, "--json")
    assert {json.loads(line)["status"]["taskId"] for line in as_json.stdout.splitlines()} == ids


async def _offers(http: aiohttp.ClientSession, url: str) -> bool:
    async with http.get(url) as r:
        return not (r.status == 501 or r.status == 404
                    and "no such API endpoint" in await r.text())


@pytest.mark.parametrize("argv, path", [
    (("queue", "list"), "task-queues"),
    (("worker", "list", "--task-queue", "prov/lister"),
     "provisioners/prov/worker-types/lister/workers"),
    (("task", "list", "--task-queue", "prov/lister"), "task-queues/prov%2Flister/pending"),
])
async def test_listings_of_queues_workers_and_pending_tasks(
        make_server: ServerFactory, http: aiohttp.ClientSession, argv: tuple[str, ...],
        path: str) -> None:
    """`queue list`, `worker list`, `task list --task-queue` call listTaskQueues,
    listWorkers and listPendingTasks with the official client's shapes; a queue without
    those endpoints is told in one line."""
    server = await make_server(claim_work_wait=1.0)
    task_id = await create(http, server.api, definition("prov/lister"))
    async with running(shell_worker(server, "prov/lister", "lister-1")):
        await wait_status(http, server, task_id, lambda s: s["state"] == "completed")
    pending = await create(http, server.api, definition("prov/lister"))
    listed = await as_root(server, *argv)
    if not await _offers(http, f"{server.api}/{path}"):
        assert listed.returncode == 1
        assert "does not offer this listing" in listed.stderr, listed.stderr
        pytest.skip(f"this queue does not offer GET {path} yet")
    assert listed.returncode == 0, listed.stderr
    expected = {"queue": "prov/lister", "worker": "tests/lister-1", "task": pending}[argv[0]]
    assert expected in listed.stdout
    as_json = await as_root(server, *argv, "--json")
    assert [json.loads(line) for line in as_json.stdout.splitlines()]


def test_each_command_the_parser_offers_has_its_handler_and_no_other() -> None:
    """The command line runs a command by the handler its table names: a command the
    parser offers without one, or a handler of no command, is caught here."""
    from azqueue.cli import client

    top = parser()
    assert set(top.commands) - {"serve", "dev", "resolve"} == set(client.COMMANDS)
    assert set(top.commands["task"].commands) == set(client.TASK_COMMANDS)


def test_the_parser_keeps_every_command_and_option_it_offers() -> None:
    """The two tests above read the commands and options from what the parser keeps as
    they are added: argparse's own ways to add commands and option groups, which would
    keep nothing, are refused."""
    p = Parser(prog="p")
    commands = p.add_commands(dest="command")
    one = commands.add_parser("one", aliases=["1"])
    which = one.add_exclusive(required=True)
    a, b = which.add_argument("--a"), which.add_argument("--b")
    assert p.commands == {"one": one, "1": one}
    assert [action.dest for action in p.arguments] == ["help", "command"]
    assert one.arguments[1:] == [a, b]
    with pytest.raises(TypeError, match="add_commands"):
        p.add_subparsers()
    with pytest.raises(TypeError, match="add_exclusive"):
        p.add_mutually_exclusive_group()


def test_a_command_without_a_handler_is_one_line_naming_it(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The parser offers no such command; if a namespace names one anyway, nothing is
    sent: the command line says which (exit status 1)."""
    from azqueue.cli import client

    monkeypatch.setenv("TASKCLUSTER_ROOT_URL", "http://127.0.0.1:9")
    args = argparse.Namespace(command="task", task_command="frob", task_id="x", json=False)
    assert client.run(args) == 1
    assert capsys.readouterr().err == ("azqueue: task frob: no such command "
                                       "(`azqueue task --help` lists them)\n")


def test_resolve_offers_exactly_the_resolvers_there_are() -> None:
    """`azqueue resolve` lists the resolvers without importing them (for a fast --help):
    the list must be the one the server runs."""
    from azqueue.background import resolvers
    from azqueue.cli.parser import RESOLVERS

    assert sorted(RESOLVERS) == sorted(resolvers.NAMES)


async def test_task_list_of_a_task_queue_by_state(
        server: Server, http: aiohttp.ClientSession) -> None:
    """`task list --task-queue Q --state running|unscheduled|resolved` lists the task
    queue's running runs, its tasks waiting on dependencies and those resolved lately."""
    queue = "prov/by-state"
    done, failed, claimed, blocker = [await create(http, server.api, definition(queue))
                                      for _ in range(4)]
    waiting = await create(http, server.api, definition(queue, dependencies=[blocker]))
    for task_id in (done, failed, claimed):
        code, body = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/claim",
                                    {"workerGroup": "wg", "workerId": "w1"})
        assert code == 200, body
    for task_id, outcome in ((done, "completed"), (failed, "failed")):
        code, body = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/{outcome}")
        assert code == 200, body

    async def listed(state: str) -> dict[str, str]:
        done_ = await as_root(server, "task", "list", "--task-queue", queue, "--state", state)
        assert done_.returncode == 0, done_.stderr
        return {line.split()[0]: line for line in done_.stdout.splitlines()}

    running_ = await listed("running")
    assert set(running_) == {claimed} and "on wg/w1" in running_[claimed]
    assert set(await listed("unscheduled")) == {waiting}
    resolved = await listed("resolved")
    assert set(resolved) == {done, failed}
    assert resolved[done].split()[1] == "completed" and resolved[failed].split()[1] == "failed"
    assert set(await listed("pending")) == {blocker}
    mixed = await as_root(server, "task", "list", "--group", blocker, "--state", "running")
    assert mixed.returncode == 2 and "with --task-queue" in mixed.stderr
