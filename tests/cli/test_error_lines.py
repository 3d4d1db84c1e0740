"""What a user gets wrong, or asks too early, is one line saying what to do: never the
queue's JSON, a library's internals or a settings error at a time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import aiohttp

from azqueue.testing.tasks import create, definition, slugid
from tests.cli.helpers import as_root, azqueue, one_line_error
from tests.servers import ROOT, Server
from tests.worker.helpers import cli_env


async def test_the_log_of_an_unknown_task_or_of_one_not_run_yet_says_so(
        server: Server, http: aiohttp.ClientSession) -> None:
    unknown = slugid()
    done = await as_root(server, "task", "log", unknown)
    assert done.returncode == 1
    error = one_line_error(done)
    assert "{" not in error, error
    assert error.startswith(f"azqueue: task log: there is no task {unknown}"), error
    pending = await create(http, server.api, definition("prov/log-pending"))
    done = await as_root(server, "task", "log", pending)
    assert done.returncode == 1
    error = one_line_error(done)
    assert "{" not in error, error
    assert error == (f"azqueue: task log: {pending} is pending: no worker has run it yet; "
                     f"`azqueue task log --follow {pending}` waits for its log"), error


async def test_a_sas_worker_with_a_wrong_token_says_so_in_words(server: Server) -> None:
    env = {**cli_env(server), "TASKCLUSTER_ACCESS_TOKEN": "not-the-token-of-root-at-all"}
    done = await azqueue("worker", "--mode", "sas", "--task-queue", "prov/sas-wrong-token",
                         env=env)
    assert done.returncode == 1
    error = one_line_error(done)
    assert "{" not in error and '"code"' not in error, error
    assert "401 AuthenticationFailed: " in error, error


async def test_a_root_url_without_a_scheme_is_named(server: Server) -> None:
    bare = server.root_url.removeprefix("http://")
    for argv in (("task", "status", slugid()), ("worker", "--task-queue", "prov/bare-url")):
        done = await azqueue(*argv, env={**cli_env(server), "TASKCLUSTER_ROOT_URL": bare})
        assert done.returncode == 1
        assert one_line_error(done) == (
            f"azqueue: TASKCLUSTER_ROOT_URL={bare!r} is not a URL: write it with its scheme, "
            f"e.g. http://{bare}"), argv


async def test_a_malformed_task_id_is_named_as_such() -> None:
    for argv in (("task", "status", "abc"), ("task", "log", "not/a/task"),
                 ("task", "rerun", "0" * 22), ("task", "status", "A" * 22)):
        done = await azqueue(*argv, env={**os.environ, "TASKCLUSTER_ROOT_URL": "http://x.invalid"})
        assert done.returncode == 2
        error = one_line_error(done)
        if len(argv[-1]) == 22:  # of the right characters: what is wrong is the kind
            assert f"{argv[-1]!r} is not a taskId: it has 22 characters of A-Z a-z 0-9 _ -, " \
                   "but it is not a v4 slugid" in error, error
        else:
            assert f"{argv[-1]!r} is not a taskId: a taskId is 22 characters" in error, error
        assert "slugid" not in error.split("taskId:")[0], error


async def test_a_refusal_without_credentials_is_whole_and_says_which_to_set(
        server: Server) -> None:
    env = {k: v for k, v in cli_env(server).items()
           if k not in ("TASKCLUSTER_CLIENT_ID", "TASKCLUSTER_ACCESS_TOKEN")}
    done = await azqueue("task", "create", "--task-queue", "prov/no-credentials", "--", "true",
                         env=env)
    assert done.returncode == 1
    error = one_line_error(done)
    assert "403 InsufficientScopes: " in error, error
    assert "queue:create-task:lowest:prov/no-credentials" in error, error
    assert error.endswith("(no credentials are set: set TASKCLUSTER_CLIENT_ID and "
                          "TASKCLUSTER_ACCESS_TOKEN, as `azqueue dev` prints them)"), error


async def test_every_wrong_setting_is_named_at_once_each_with_its_variable(
        tmp_path: Path) -> None:
    clients = tmp_path / "clients.json"
    clients.write_text(json.dumps([{"clientId": "ci", "accessToken": "short", "scopes": []}]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZQUEUE_")}
    done = await azqueue("serve", env={
        **env, "AZQUEUE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true",
        "AZQUEUE_TIP_SECRETS": "s" * 32, "AZQUEUE_ROOT_CLIENT_ID": ROOT.client_id,
        "AZQUEUE_ROOT_ACCESS_TOKEN": "too-short", "AZQUEUE_PORT": "eighty",
        "AZQUEUE_CLAIM_TIMEOUT": "soon", "AZQUEUE_CLIENTS_FILE": str(clients)})
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    for variable in ("AZQUEUE_ROOT_ACCESS_TOKEN", "AZQUEUE_PORT", "AZQUEUE_CLAIM_TIMEOUT",
                     "AZQUEUE_CLIENTS_FILE"):
        assert sum(variable in line for line in lines) == 1, (variable, lines)
    assert all(line.startswith("azqueue: ") for line in lines), lines
