"""The clients file and the anonymous scopes take what Taskcluster's auth takes as
scopes, and refuse the rest at start, naming the client and the entry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from azqueue.config import ConfigError, Settings
from azqueue.config.clients import load_clients

TOKEN = "a-token-of-at-least-22-characters"
_REQUIRED = {"AZQUEUE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true",
             "AZQUEUE_TIP_SECRETS": "a-secret-of-16-chars", "AZQUEUE_ROOT_CLIENT_ID": "root",
             "AZQUEUE_ROOT_ACCESS_TOKEN": "a-token-of-22-characters"}


def _load(tmp_path: Path, entries: Any) -> Any:
    path = tmp_path / "clients.json"
    path.write_text(json.dumps(entries))
    return load_clients(str(path))


@pytest.mark.parametrize(("scopes", "says"), [
    ("queue:status:*", "`scopes` must be a list of scopes"),  # not read char by char
    (None, "`scopes` must be a list of scopes"),
    ([["queue:status:*"]], "scope 0 of `scopes`: [\'queue:status:*\'] is not a string"),
    (["queue:status:*", 7], "scope 1 of `scopes`: 7 is not a string"),
    (["queue:é"], "scope 0 of `scopes`: 'queue:é' holds 'é'"),
    (["queue:a\nb"], "holds '\\n'"),
    (["queue:**"], "ends in `**`"),
])
def test_a_client_whose_scopes_are_not_scopes_is_refused_naming_it(
        tmp_path: Path, scopes: Any, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, [{"clientId": "good", "accessToken": TOKEN, "scopes": []},
                         {"clientId": "ci", "accessToken": TOKEN, "scopes": scopes}])
    assert "client 'ci' (entry 1)" in info.value.message and says in info.value.message


@pytest.mark.parametrize(("entries", "says"), [
    ({"clientId": "ci"}, 'it holds {"clientId": "ci"}, not a list; it must be a JSON list'),
    (["ci"], "entry 0 is \"ci\", not an object"),
    ([{"clientId": 7, "accessToken": TOKEN, "scopes": []}], "`clientId` must be a string"),
    ([{"clientId": "ci", "accessToken": None, "scopes": []}], "`accessToken` must be a string"),
    ([{"clientId": "ci", "accessToken": TOKEN}], "`scopes` must be a list"),
    ([{"clientId": "c\ni", "accessToken": TOKEN, "scopes": []}], "a clientId holds only"),
    ([{"clientId": "c\u202ei", "accessToken": TOKEN, "scopes": []}], "a clientId holds only"),
    ([{"clientId": "ci", "accessToken": " " * 22, "scopes": []}], "no spaces"),
    ([{"clientId": "ci", "accessToken": TOKEN + "é", "scopes": []}], "printable ASCII"),
])
def test_a_malformed_clients_file_is_refused_saying_what_is_wrong(
        tmp_path: Path, entries: Any, says: str) -> None:
    with pytest.raises(ConfigError, match="AZQUEUE_CLIENTS_FILE=") as info:
        _load(tmp_path, entries)
    assert says in info.value.message


def test_valid_scopes_load_as_given(tmp_path: Path) -> None:
    (client,) = _load(tmp_path, [{"clientId": "ci", "accessToken": TOKEN,
                                  "scopes": ["queue:status:*", "a b ~", ""]}])
    assert client.scopes == ("queue:status:*", "a b ~", "")


@pytest.mark.parametrize("value", ["queue:status:*,queue:é", "queue:**"])
def test_anonymous_scopes_that_are_not_scopes_are_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="AZQUEUE_ANONYMOUS_SCOPES"):
        Settings.from_env({**_REQUIRED, "AZQUEUE_ANONYMOUS_SCOPES": value})
