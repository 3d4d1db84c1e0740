"""Storage configuration: a connection string with a key, or azure-identity."""

from __future__ import annotations

import pytest

from azqueue.config import Client, ConfigError, Settings, StorageSettings
from azqueue.devstorage import KEY
from azqueue.storage.account import StorageAccount


async def test_an_account_url_signs_in_with_azure_identity_on_all_three_services() -> None:
    settings = StorageSettings.from_env(
        {"AZQUEUE_STORAGE_ACCOUNT_URL": "https://myaccount.queue.core.windows.net/"})
    assert settings.uses_identity
    account = StorageAccount(settings)
    try:
        assert account.account_name == "myaccount" and account.account_key is None
        assert account.tables.url.startswith("https://myaccount.table.core.windows.net")
        assert account.queues.url.startswith("https://myaccount.queue.core.windows.net")
        assert account.blobs.url.startswith("https://myaccount.blob.core.windows.net")
    finally:
        await account.close()


def test_a_connection_string_with_a_key_uses_the_key() -> None:
    conn = f"DefaultEndpointsProtocol=https;AccountName=myaccount;AccountKey={KEY};" \
           "EndpointSuffix=core.windows.net"
    assert not StorageSettings(conn).uses_identity
    keyless = "BlobEndpoint=https://b.example/acct;QueueEndpoint=https://q.example/acct;" \
              "TableEndpoint=https://t.example/acct;AccountName=acct"
    assert StorageSettings(keyless).uses_identity
    assert not StorageSettings("UseDevelopmentStorage=true").uses_identity


@pytest.mark.parametrize(("env", "names"), [
    ({}, "AZQUEUE_STORAGE_CONNECTION_STRING"),
    ({"AZQUEUE_STORAGE_CONNECTION_STRING": "AccountName=a;AccountKey=k",
      "AZQUEUE_STORAGE_ACCOUNT_URL": "https://a.blob.core.windows.net"}, "not both"),
    ({"AZQUEUE_STORAGE_ACCOUNT_URL": "https://example.com/storage"},
     "https://myaccount.blob.core.windows.net"),
    ({"AZQUEUE_STORAGE_CONNECTION_STRING": "just-a-key"}, "`Key=value` pairs"),
])
def test_storage_configuration_mistakes_say_what_to_set(env: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError) as info:
        StorageSettings.from_env(env)
    assert names in info.value.message


def test_azure_identity_needs_https_endpoints() -> None:
    with pytest.raises(ConfigError) as info:
        StorageAccount(StorageSettings("AccountName=a;QueueEndpoint=http://127.0.0.1:1/a;"
                                       "TableEndpoint=https://t/a;BlobEndpoint=https://b/a"))
    assert "http://127.0.0.1:1/a is not https" in info.value.message


_REQUIRED = {"AZQUEUE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true",
             "AZQUEUE_TIP_SECRETS": "a-secret-of-16-chars", "AZQUEUE_ROOT_CLIENT_ID": "root",
             "AZQUEUE_ROOT_ACCESS_TOKEN": "a-token-of-22-characters"}


def test_unset_and_empty_variables_keep_the_documented_defaults() -> None:
    written = Settings(StorageSettings("UseDevelopmentStorage=true"), ("a-secret-of-16-chars",),
                       Client("root", "a-token-of-22-characters", ("*",)))
    assert Settings.from_env(_REQUIRED) == written
    empty = {name: "" for name in ("AZQUEUE_HOST", "AZQUEUE_PORT", "AZQUEUE_CLAIM_TIMEOUT",
                                   "AZQUEUE_EXCHANGE_PREFIX", "AZQUEUE_STORAGE_PREFIX")}
    assert Settings.from_env({**_REQUIRED, **empty}) == written
    assert (written.port, written.claim_timeout, written.storage.prefix) == (8080, 1200, "azq")
    assert written.exchange_prefix == "exchange/taskcluster-queue/v1/"


def test_variables_override_the_defaults() -> None:
    settings = Settings.from_env({
        **_REQUIRED, "AZQUEUE_HOST": "0.0.0.0", "AZQUEUE_PORT": "9000", "AZQUEUE_CLAIM_TIMEOUT": "60",
        "AZQUEUE_EXPIRY_INTERVAL": "0.5", "AZQUEUE_STORAGE_PREFIX": "other",
        "AZQUEUE_ANONYMOUS_SCOPES": "", "AZQUEUE_TIP_FORM": "run"})
    assert (settings.host, settings.port, settings.claim_timeout) == ("0.0.0.0", 9000, 60.0)
    assert settings.expiry_interval == 0.5 and settings.storage.prefix == "other"
    assert settings.anonymous_scopes == ()
    assert settings.tip_form == "run" and Settings.from_env(_REQUIRED).tip_form == "task-queue"


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("AZQUEUE_PORT", "http", "is not a port number"),
    ("AZQUEUE_CLAIM_TIMEOUT", "20m", "is not a number of seconds"),
    ("AZQUEUE_SAS_LIFETIME", "-1", "must be greater than zero"),
    ("AZQUEUE_TIP_FORM", "old", "is not a tip form; write one of task-queue, run"),
])
def test_malformed_variables_are_named(variable: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({**_REQUIRED, variable: value})
    assert info.value.message == f"{variable}={value!r} {says}"


def test_the_upload_read_timeout_is_read_from_its_variable_and_defaults_to_the_receivers() -> None:
    from azqueue.service.artifacts.uploads import READ_TIMEOUT

    env = {"AZQUEUE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true",
           "AZQUEUE_TIP_SECRETS": "0123456789abcdef", "AZQUEUE_ROOT_CLIENT_ID": "root",
           "AZQUEUE_ROOT_ACCESS_TOKEN": "a-root-token-long-enough"}
    assert Settings.from_env(env).upload_read_timeout == READ_TIMEOUT
    assert Settings.from_env({**env, "AZQUEUE_UPLOAD_READ_TIMEOUT": "5"}).upload_read_timeout == 5


def test_the_upload_rate_and_run_share_are_read_from_their_variables_and_default_to_the_receivers(
        ) -> None:
    from azqueue.service.artifacts.uploads import MIN_RATE, RUN_MEMORY

    env = {"AZQUEUE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true",
           "AZQUEUE_TIP_SECRETS": "0123456789abcdef", "AZQUEUE_ROOT_CLIENT_ID": "root",
           "AZQUEUE_ROOT_ACCESS_TOKEN": "a-root-token-long-enough"}
    settings = Settings.from_env(env)
    assert settings.upload_min_rate_kib * 1024 == MIN_RATE
    assert settings.upload_run_memory_mib * 1024 * 1024 == RUN_MEMORY
    changed = Settings.from_env({**env, "AZQUEUE_UPLOAD_MIN_RATE_KIB": "4",
                                 "AZQUEUE_UPLOAD_RUN_MEMORY_MIB": "32"})
    assert (changed.upload_min_rate_kib, changed.upload_run_memory_mib) == (4, 32)
    with pytest.raises(ConfigError, match="AZQUEUE_UPLOAD_MIN_RATE_KIB"):
        Settings.from_env({**env, "AZQUEUE_UPLOAD_MIN_RATE_KIB": "0"})
