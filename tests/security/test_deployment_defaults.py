"""What an operator starts with is not open to others: `serve` refuses the example
secrets and short ones, docker-compose publishes its development services on the
host's loopback only, and `dev --data` keeps its directory to its user."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from azqueue.config import ConfigError, Settings
from azqueue.devstorage import Azurite
from tests.cli.helpers import azqueue, one_line_error
from tests.servers import ROOT

REPO = Path(__file__).resolve().parents[2]


def _serve_env(azurite: Azurite, prefix: str, **more: str) -> dict[str, str]:
    """What `azqueue serve` needs (this checkout's azqueue), none of the caller's AZQUEUE_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZQUEUE_")}
    return {**env, "PYTHONPATH": str(REPO),
            "AZQUEUE_STORAGE_CONNECTION_STRING": azurite.connection_string,
            "AZQUEUE_STORAGE_PREFIX": prefix, "AZQUEUE_TIP_SECRETS": "s" * 32,
            "AZQUEUE_ROOT_CLIENT_ID": ROOT.client_id,
            "AZQUEUE_ROOT_ACCESS_TOKEN": ROOT.access_token, **more}


@pytest.mark.parametrize("variable, value", [
    ("AZQUEUE_TIP_SECRETS", "change-me-to-a-long-random-secret"),
    ("AZQUEUE_TIP_SECRETS", "a-good-long-random-secret-0123,CHANGEME-0123456789abc"),
    ("AZQUEUE_ROOT_ACCESS_TOKEN", "change-me-to-a-long-random-token"),
    ("AZQUEUE_ROOT_ACCESS_TOKEN", "short-token"),
])
async def test_serve_refuses_an_example_or_short_secret_naming_its_variable(
        azurite: Azurite, storage_prefix: str, variable: str, value: str) -> None:
    done = await azqueue("serve", env=_serve_env(azurite, storage_prefix, **{variable: value}))
    assert done.returncode == 2
    error = one_line_error(done)
    assert error.startswith(f"azqueue: {variable} "), error
    assert value not in error  # a secret, even a poor one, is never printed


def test_a_placeholder_in_the_clients_file_is_refused(tmp_path: Path) -> None:
    clients = tmp_path / "clients.json"
    clients.write_text('[{"clientId": "builder", "accessToken": "change-me-builder-token-00", '
                       '"scopes": []}]')
    with pytest.raises(ConfigError, match=r"AZQUEUE_CLIENTS_FILE=.*: the accessToken of "
                                          r"client 'builder' is an example value"):
        Settings.from_env({"AZQUEUE_STORAGE_CONNECTION_STRING": "AccountName=a",
                           "AZQUEUE_TIP_SECRETS": "s" * 32, "AZQUEUE_ROOT_CLIENT_ID": "root",
                           "AZQUEUE_ROOT_ACCESS_TOKEN": ROOT.access_token,
                           "AZQUEUE_CLIENTS_FILE": str(clients)})


def test_compose_publishes_storage_and_broker_on_the_loopback_only() -> None:
    """Azurite's key is public and RabbitMQ's guest/guest is everyone's: their ports are
    published on 127.0.0.1, and compose asks for the secrets instead of holding
    examples of them."""
    compose: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        for mapping in service.get("ports", []):
            assert str(mapping).startswith("127.0.0.1:"), (name, mapping)
    env = compose["services"]["azqueue"]["environment"]
    for variable in ("AZQUEUE_TIP_SECRETS", "AZQUEUE_ROOT_ACCESS_TOKEN"):
        assert str(env[variable]).startswith(f"${{{variable}:?"), env[variable]
