"""Every user mistake seen in the command line ends in one line saying what is wrong and
how to fix it, with a non-zero exit status and no traceback."""

from __future__ import annotations

import os
import socket

import aiohttp
import pytest

from azqueue.devstorage import ACCOUNT, KEY, Azurite
from azqueue.testing.tasks import slugid
from tests.cli.helpers import azqueue, one_line_error
from tests.servers import ROOT, Server
from tests.worker.helpers import cli_env


def _server_env(connection_string: str, prefix: str, **more: str) -> dict[str, str]:
    """What `azqueue serve` needs, and nothing of the caller's AZQUEUE_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZQUEUE_")}
    return {**env, "AZQUEUE_STORAGE_CONNECTION_STRING": connection_string,
            "AZQUEUE_STORAGE_PREFIX": prefix, "AZQUEUE_TIP_SECRETS": "s" * 32,
            "AZQUEUE_ROOT_CLIENT_ID": ROOT.client_id,
            "AZQUEUE_ROOT_ACCESS_TOKEN": ROOT.access_token, **more}


async def test_every_missing_setting_is_named_at_once() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZQUEUE_")}
    done = await azqueue("serve", env=env)
    assert done.returncode == 2
    error = one_line_error(done)
    for variable in ("AZQUEUE_STORAGE_CONNECTION_STRING", "AZQUEUE_TIP_SECRETS",
                     "AZQUEUE_ROOT_CLIENT_ID", "AZQUEUE_ROOT_ACCESS_TOKEN"):
        assert variable in error, error


@pytest.mark.parametrize("argv, expected", [
    (("--log-level", "chatty", "serve"),
     "unknown log level 'chatty' (from --log-level, else AZQUEUE_LOG_LEVEL); use one of "
     "DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    (("worker", "--task-queue", "prov/w", "--capacity", "0"),
     "argument --capacity: 0 is out of range: use 1 to 32"),
    (("worker", "--task-queue", "no-slash"), "is not a task queue: write provisionerId/workerType"),
    (("task", "wait", "--timeout", "soon", "abc"), "'soon' is not a number of seconds over 0"),
    # A task command there is not is refused before anything is sent (it cancels nothing).
    (("task", "frob", "abc"), "argument TASK_COMMAND: invalid choice: 'frob'"),
])
async def test_arguments_that_do_not_fit_are_refused_in_one_line(
        argv: tuple[str, ...], expected: str) -> None:
    done = await azqueue(*argv, env={**os.environ, "TASKCLUSTER_ROOT_URL": "http://127.0.0.1:9"})
    assert done.returncode == 2
    assert expected in one_line_error(done)
    assert len(done.stderr.splitlines()) == 1, done.stderr  # not argparse's usage block
    assert done.stderr.rstrip().endswith("--help` explains)")


async def test_a_port_in_use_is_named(azurite: Azurite, storage_prefix: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = await azqueue("serve", env=_server_env(
            azurite.connection_string, storage_prefix, AZQUEUE_PORT=str(port)))
    assert done.returncode == 1
    assert one_line_error(done) == (
        f"azqueue: cannot listen on 127.0.0.1:{port}: the address is already in use; stop what "
        "listens there or choose another port (AZQUEUE_PORT, or `dev --port`)")


async def test_storage_unreachable_at_start_up_is_retried_then_named(refused_port: int) -> None:
    """`serve` waits for storage (compose starts it next to Azurite), logging each try,
    and gives up after AZQUEUE_STORAGE_WAIT seconds naming the endpoint."""
    port = refused_port
    endpoints = "".join(f"{service}Endpoint=http://127.0.0.1:{port}/{ACCOUNT};"
                        for service in ("Blob", "Queue", "Table"))
    conn = f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};{endpoints}"
    done = await azqueue("serve", env=_server_env(conn, "unreachable",
                                                  AZQUEUE_STORAGE_WAIT="1"))
    assert done.returncode == 1
    error = one_line_error(done)
    assert error.startswith(f"azqueue: storage unreachable: http://127.0.0.1:{port}/{ACCOUNT} "
                            "(Connect call failed"), error
    assert "storage at http://127.0.0.1" in done.stderr and "is not reachable yet" in done.stderr


async def test_a_data_dir_that_cannot_be_made_is_named(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = await azqueue("dev", "--data", str(blocker / "data"))
    assert done.returncode == 1
    assert one_line_error(done) == (
        f"azqueue: --data {blocker / 'data'}: cannot create it: Not a directory")
    done = await azqueue("dev", "--data", str(blocker))
    assert one_line_error(done) == f"azqueue: --data {blocker}: it exists and is not a directory"


async def test_a_root_url_that_is_no_queue_or_nothing_at_all(
        server: Server, azurite: Azurite, refused_port: int) -> None:
    """`task status` at a rootUrl where something else answers (here Azurite's blob
    service), or where nothing listens: the URL is named either way."""
    not_a_queue = f"http://127.0.0.1:{azurite.blob_port}"
    done = await azqueue("task", "status", slugid(), env={
        **cli_env(server), "TASKCLUSTER_ROOT_URL": not_a_queue})
    assert done.returncode == 1
    error = one_line_error(done)
    assert error.startswith(f"azqueue: {not_a_queue} answered 4"), error
    assert "not as an azqueue (Taskcluster) queue does" in error
    nothing = f"http://127.0.0.1:{refused_port}"
    for argv in (("task", "status", slugid()), ("task", "log", slugid()),
                 ("worker", "--task-queue", "prov/nothing")):
        done = await azqueue(*argv, env={**cli_env(server), "TASKCLUSTER_ROOT_URL": nothing})
        assert done.returncode == 1
        error = one_line_error(done)
        assert error.startswith(f"azqueue: cannot reach the queue at {nothing} ("), error
        assert "check TASKCLUSTER_ROOT_URL" in error


async def test_a_task_that_does_not_exist_is_the_queue_s_own_message(
        server: Server, http: aiohttp.ClientSession) -> None:
    done = await azqueue("task", "status", slugid(), env=cli_env(server))
    assert done.returncode == 1
    assert one_line_error(done).startswith("azqueue: 404 ResourceNotFound: ")
