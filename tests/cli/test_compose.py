"""docker-compose.yml, checked without Docker: parsed, its settings read by the real
`Settings.from_env`, and its healthcheck commands run against a real Azurite and server."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from azqueue.config import Settings
from azqueue.errors import ConfigError
from azqueue.devstorage import Azurite
from tests.servers import IN_CI, Server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def _published(service: dict[str, Any]) -> set[int]:
    """The host ports a service publishes ("127.0.0.1:10000-10002:10000-10002",
    "127.0.0.1:8080:8080")."""
    ports: set[int] = set()
    for mapping in service.get("ports", []):
        host = str(mapping).split(":")[-2]
        low, _, high = host.partition("-")
        ports.update(range(int(low), int(high or low) + 1))
    return ports


def test_every_service_restarts_and_has_a_healthcheck(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"azurite", "rabbitmq", "azqueue"}
    for name, service in services.items():
        assert service.get("restart") in ("unless-stopped", "always"), name
        check = service["healthcheck"]
        assert check["test"][0] == "CMD" and check["retries"] >= 3, name
    assert services["azqueue"]["depends_on"] == {
        "azurite": {"condition": "service_healthy"},
        "rabbitmq": {"condition": "service_healthy"}}
    assert "--disableTelemetry" in services["azurite"]["command"]


def test_the_server_settings_are_complete_and_name_what_clients_reach(
        compose: dict[str, Any]) -> None:
    """The environment of the azqueue service is read by the real Settings.from_env;
    AMQP points at the rabbitmq service, storage at the azurite service, and the
    endpoints handed to clients at the ports published on the host."""
    services = compose["services"]
    # What the user puts in .env for the variables compose asks for (`${NAME:?why}`).
    given = {"AZQUEUE_TIP_SECRETS": "s" * 32, "AZQUEUE_ROOT_ACCESS_TOKEN": "t" * 32}
    env = {k: re.sub(r"\$\{(\w+):\?[^}]*\}", lambda m: given[m[1]], str(v))
           for k, v in services["azqueue"]["environment"].items()}
    settings = Settings.from_env(env)
    amqp = urlsplit(settings.amqp_url)
    assert (amqp.scheme, amqp.hostname, amqp.port) == ("amqp", "rabbitmq", 5672)
    assert 5672 in _published(services["rabbitmq"])
    conn = settings.storage.connection_string
    assert "BlobEndpoint=http://azurite:10000/" in conn
    assert "QueueEndpoint=http://azurite:10001/" in conn
    azurite_ports = _published(services["azurite"])
    for public, port in ((settings.storage.public_blob_endpoint, 10000),
                         (settings.storage.public_queue_endpoint, 10001)):
        url = urlsplit(public)
        assert (url.hostname, url.port, url.path) == ("localhost", port, "/devstoreaccount1")
        assert port in azurite_ports
    assert settings.storage_wait >= 60  # a bounded wait for Azurite at start-up
    root = urlsplit(settings.root_url)
    assert root.port in _published(services["azqueue"])
    assert "azqueue" in (ROOT / "Dockerfile").read_text().splitlines()[-1]  # CMD azqueue serve


def _run(argv: list[str]) -> int:
    return subprocess.run(argv, capture_output=True, timeout=60).returncode


async def test_the_azurite_healthcheck_passes_on_azurite_and_fails_without(
        compose: dict[str, Any], azurite: Azurite, refused_port: int) -> None:
    """The check's own command, with the ports of the test's Azurite put in."""
    if shutil.which("node") is None:
        if IN_CI:
            pytest.fail("node is needed (Azurite runs on it)")
        pytest.skip("no node")
    _, program, flag, script = compose["services"]["azurite"]["healthcheck"]["test"]
    assert "[10000,10001,10002]" in script
    ours = script.replace("[10000,10001,10002]",
                          f"[{azurite.blob_port},{azurite.queue_port},{azurite.table_port}]")
    closed = script.replace("[10000,10001,10002]", f"[{azurite.blob_port},{refused_port}]")
    assert await asyncio.to_thread(_run, [program, flag, ours]) == 0
    assert await asyncio.to_thread(_run, [program, flag, closed]) == 1


async def test_the_azqueue_healthcheck_passes_on_a_server(
        compose: dict[str, Any], server: Server, refused_port: int) -> None:
    _, program, flag, script = compose["services"]["azqueue"]["healthcheck"]["test"]
    assert program == "python" and "http://127.0.0.1:8080/" in script
    ours = script.replace("http://127.0.0.1:8080", server.root_url)
    nothing = script.replace("http://127.0.0.1:8080", f"http://127.0.0.1:{refused_port}")
    assert await asyncio.to_thread(_run, [sys.executable, flag, ours]) == 0
    assert await asyncio.to_thread(_run, [sys.executable, flag, nothing]) == 1


async def test_the_rabbitmq_healthcheck_passes_on_the_local_broker(
        compose: dict[str, Any]) -> None:
    """The check's own command, run where RabbitMQ runs (as in its container)."""
    command = compose["services"]["rabbitmq"]["healthcheck"]["test"]
    if shutil.which(command[1]) is None:
        if IN_CI:
            pytest.fail(f"{command[1]} is needed: RabbitMQ runs next to the tests under CI")
        pytest.skip(f"no {command[1]} (RabbitMQ) here")
    assert await asyncio.to_thread(_run, command[1:]) == 0


def test_the_image_runs_unprivileged_and_installs_pinned_versions() -> None:
    """The server runs as a user of its own, and `pip install` in the image is
    constrained to an exact version of every package azqueue needs at run time."""
    lines = [line.split() for line in (ROOT / "Dockerfile").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    users = [words[1] for words in lines if words[0] == "USER"]
    assert users and users[-1] not in ("root", "0")
    install = next(i for i, words in enumerate(lines) if words[:2] == ["RUN", "pip"])
    assert "-c" in lines[install] and lines.index(["USER", users[-1]]) > install
    pinned = dict(line.split("==") for line in
                  (ROOT / "deploy" / "constraints.txt").read_text().splitlines()
                  if line and not line.startswith("#"))
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from image_constraints import closure
    finally:
        sys.path.pop(0)
    assert set(closure("azqueue")) <= set(pinned), "deploy/constraints.txt lacks a package"


def test_the_example_clients_give_workers_their_own_task_queue_only(tmp_path: Path) -> None:
    example = json.loads((ROOT / "deploy" / "clients.example.json").read_text())
    given = tmp_path / "clients.json"
    env = {"AZQUEUE_TIP_SECRETS": "s" * 32, "AZQUEUE_ROOT_CLIENT_ID": "root",
           "AZQUEUE_ROOT_ACCESS_TOKEN": "t" * 32, "AZQUEUE_CLIENTS_FILE": str(given),
           "AZQUEUE_STORAGE_ACCOUNT_URL": "https://account.blob.core.windows.net"}
    given.write_text(json.dumps(example))
    with pytest.raises(ConfigError, match="AZQUEUE_CLIENTS_FILE"):  # example tokens
        Settings.from_env(env)
    for client in example:
        client["accessToken"] = "x" * 40
    given.write_text(json.dumps(example))
    clients = {c.client_id: c for c in Settings.from_env(env).clients}
    worker = clients["worker/ci-linux"]
    assert not any("*" in s.split(":")[-1] and s.startswith("queue:claim") for s in worker.scopes)
    assert {s.split(":")[1] for s in worker.scopes} <= {
        "claim-work", "claim-task", "poll-task-urls", "worker-id"}


def test_the_storage_account_compose_file_signs_in_with_azure_identity(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "deploy" / "compose" / "azure.yml").read_text())
    service = data["services"]["azqueue"]
    assert service["read_only"] is True
    assert all(str(p).startswith("127.0.0.1:") for p in service["ports"])
    given = {"AZQUEUE_STORAGE_ACCOUNT_URL": "https://account.blob.core.windows.net",
             "AZQUEUE_AMQP_URL": "amqps://u:p@broker/vhost", "AZQUEUE_TIP_SECRETS": "s" * 32,
             "AZQUEUE_ROOT_ACCESS_TOKEN": "t" * 32, "AZQUEUE_ROOT_URL": "https://queue.example"}
    env = {k: re.sub(r"\$\{(\w+):[?-][^}]*\}", lambda m: given.get(m[1], ""), str(v))
           for k, v in service["environment"].items()}
    clients = json.loads((ROOT / "deploy" / "clients.example.json").read_text())
    for client in clients:
        client["accessToken"] = "x" * 40
    (tmp_path / "clients.json").write_text(json.dumps(clients))
    env["AZQUEUE_CLIENTS_FILE"] = str(tmp_path / "clients.json")
    settings = Settings.from_env(env)
    assert "AccountKey" not in settings.storage.connection_string
    assert settings.amqp_url.startswith("amqps://") and settings.clients
