"""Settings, parsed once from ``AZQUEUE_*`` environment variables and passed down.

Every variable is documented in docs/operating/settings.md; tests/unit/test_settings_doc.py
keeps the two in step.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from azqueue.errors import ConfigError as ConfigError  # where callers of from_env find it


T = TypeVar("T")
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,15}$")
_ORIGIN_RE = re.compile(r"^https?://[^/?#\s,]+$")


def _seconds(env: Mapping[str, str], name: str) -> float:
    raw = env[name]
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} must be greater than zero")
    return value


_ACCOUNT_URL_RE = re.compile(
    r"^(?P<scheme>https?)://(?P<account>[a-z0-9]{3,24})\.(?:blob|queue|table|dfs|file)\."
    r"(?P<suffix>[a-z0-9.-]+?)/?$")


def connection_settings(conn: str) -> dict[str, str]:
    """The ``key=value`` pairs of a storage connection string, keys lowercased."""
    pairs = [part.split("=", 1) for part in conn.strip().rstrip(";").split(";") if part]
    if not pairs or any(len(pair) != 2 for pair in pairs):
        raise ConfigError("AZQUEUE_STORAGE_CONNECTION_STRING is malformed: it is a list of "
                          "`Key=value` pairs separated by `;`")
    return {key.strip().lower(): value.strip() for key, value in pairs}


@dataclass(frozen=True, slots=True)
class StorageSettings:
    """Where the state lives: one storage account, names prefixed by ``prefix``.

    A connection string with ``AccountKey`` (or ``SharedAccessSignature``) carries its own
    credential; one with neither authenticates with azure-identity: ``credential`` if given
    (an async ``TokenCredential``), else ``DefaultAzureCredential``. ``ca_file`` is a CA
    bundle to trust for the storage endpoints (an emulator with its own certificate).
    """

    connection_string: str = field(repr=False)  # may hold the account key
    prefix: str = "azq"
    ca_file: str | None = None
    credential: object | None = field(default=None, compare=False, repr=False)
    # The queue and blob endpoints as the clients of the API reach them (a proxy, a
    # published port), used in the URLs handed out (pollTaskUrls, artifact put and read
    # URLs) instead of those of the connection string; "" keeps those.
    public_queue_endpoint: str = ""
    public_blob_endpoint: str = ""

    def __post_init__(self) -> None:
        if not _PREFIX_RE.match(self.prefix):
            raise ConfigError(
                f"AZQUEUE_STORAGE_PREFIX={self.prefix!r}: use 1-16 lowercase letters and digits, "
                "starting with a letter (it becomes part of Azure queue and table names)"
            )
        connection_settings(self.connection_string)
        for variable, url in (("AZQUEUE_STORAGE_PUBLIC_QUEUE_ENDPOINT", self.public_queue_endpoint),
                              ("AZQUEUE_STORAGE_PUBLIC_BLOB_ENDPOINT", self.public_blob_endpoint)):
            if url and not re.match(r"^https?://[^/?#]+(/[^?#]*)?$", url):
                raise ConfigError(f"{variable}={url!r} is not an http(s) URL such as "
                                  "http://localhost:10001/devstoreaccount1")

    @property
    def uses_identity(self) -> bool:
        """True when requests are authenticated with azure-identity, not the account key."""
        conn = connection_settings(self.connection_string)
        return not {"accountkey", "sharedaccesssignature", "usedevelopmentstorage"} & conn.keys()

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> StorageSettings:
        conn = env.get("AZQUEUE_STORAGE_CONNECTION_STRING", "")
        url = env.get("AZQUEUE_STORAGE_ACCOUNT_URL", "")
        if conn and url:
            raise ConfigError("set AZQUEUE_STORAGE_CONNECTION_STRING or "
                              "AZQUEUE_STORAGE_ACCOUNT_URL, not both")
        if url:
            m = _ACCOUNT_URL_RE.match(url.strip().lower())
            if m is None:
                raise ConfigError(
                    f"AZQUEUE_STORAGE_ACCOUNT_URL={url!r} is not a storage account URL such as "
                    "https://myaccount.blob.core.windows.net; for other endpoints give a "
                    "connection string with BlobEndpoint, QueueEndpoint and TableEndpoint")
            conn = (f"DefaultEndpointsProtocol={m['scheme']};AccountName={m['account']};"
                    f"EndpointSuffix={m['suffix']}")
        if not conn:
            raise ConfigError(
                "AZQUEUE_STORAGE_CONNECTION_STRING is not set: give the storage account's "
                "connection string, or AZQUEUE_STORAGE_ACCOUNT_URL to sign in with "
                "azure-identity (or run `azqueue dev` for an embedded Azurite)"
            )
        prefix = env.get("AZQUEUE_STORAGE_PREFIX")
        return cls(connection_string=conn, ca_file=env.get("AZQUEUE_STORAGE_CA_FILE") or None,
                   public_queue_endpoint=env.get("AZQUEUE_STORAGE_PUBLIC_QUEUE_ENDPOINT", ""),
                   public_blob_endpoint=env.get("AZQUEUE_STORAGE_PUBLIC_BLOB_ENDPOINT", ""),
                   **({"prefix": prefix} if prefix else {}))


MIN_ACCESS_TOKEN = 22


@dataclass(frozen=True, slots=True)
class Client:
    """A permanent client: Hawk id, access token and the scopes it holds."""

    client_id: str
    access_token: str = field(repr=False)
    scopes: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.client_id or len(self.access_token) < MIN_ACCESS_TOKEN:
            raise ConfigError(f"client {self.client_id!r}: needs a clientId and an accessToken "
                              "of at least 22 characters")


# What examples write where a secret goes ("change-me-to-a-long-random-token"): a server
# started with one is open to everyone who read the example.
_PLACEHOLDER_RE = re.compile(r"change[-_ ]?me|replace[-_ ]?me|placeholder|your[-_ ]?(secret|token)",
                             re.IGNORECASE)
def is_placeholder(secret: str) -> bool:
    """Whether ``secret`` is an example's stand-in for one, such as ``change-me-...``."""
    return _PLACEHOLDER_RE.search(secret) is not None


def _example_value(variable: str) -> ConfigError:
    return ConfigError(f"{variable} holds an example value (such as change-me-...), not a "
                       "secret: set a long random one, e.g. the output of `python -c 'import "
                       "secrets; print(secrets.token_urlsafe(32))'`")


def _check_tip_secrets(tip_secrets: tuple[str, ...]) -> None:
    if not tip_secrets or any(len(s) < 16 for s in tip_secrets):
        raise ConfigError(
            "AZQUEUE_TIP_SECRETS must hold at least one secret of 16 or more characters "
            "(comma-separated; the first signs new tips, all verify)"
        )


def _check_origins(origins: tuple[str, ...]) -> None:
    for origin in origins:
        if origin != "*" and not _ORIGIN_RE.match(origin):
            raise ConfigError(f"AZQUEUE_BLOB_CORS_ORIGINS: {origin!r} is not an origin; "
                              "write scheme://host[:port] with no path (the dashboard's "
                              "address, e.g. https://queue.example.com), or *")


def _load_clients(path: str) -> tuple[Client, ...]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        clients = tuple(Client(str(c["clientId"]), str(c["accessToken"]),
                               tuple(str(s) for s in c.get("scopes", []))) for c in data)
    except ConfigError as e:  # a client without an id or with a short token
        raise ConfigError(f"AZQUEUE_CLIENTS_FILE={path!r}: {e.message}") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"AZQUEUE_CLIENTS_FILE={path!r}: {e}; it must be a JSON list of "
            '{"clientId": ..., "accessToken": ..., "scopes": [...]}') from None
    for client in clients:
        if is_placeholder(client.access_token):
            raise ConfigError(f"AZQUEUE_CLIENTS_FILE={path!r}: the accessToken of client "
                              f"{client.client_id!r} is an example value (such as "
                              "change-me-...): give it a long random one")
    return clients


# Reading tasks, public artifacts, task groups and what the queue knows of task queues
# and workers (what the dashboard shows); nothing that changes anything.
DEFAULT_ANONYMOUS_SCOPES = (
    "queue:get-task:*", "queue:status:*", "queue:list-artifacts:*",
    "queue:get-artifact:public/*", "queue:list-dependent-tasks:*", "queue:list-task-group:*",
    "queue:list-provisioners", "queue:get-provisioner:*", "queue:list-worker-types:*",
    "queue:get-worker-type:*", "queue:list-task-queues", "queue:get-task-queue:*",
    "queue:list-workers:*", "queue:get-worker:*", "queue:pending-count:*",
    "queue:claimed-count:*", "queue:pending-list:*", "queue:claimed-list:*")


@dataclass(frozen=True, slots=True)
class Settings:
    storage: StorageSettings
    # Secrets for signing tips; the first signs, all verify (rotation).
    tip_secrets: tuple[str, ...] = field(repr=False)
    # The root client (scope `*`); it also issues the credentials handed out with claims.
    root: Client
    clients: tuple[Client, ...] = ()
    anonymous_scopes: tuple[str, ...] = DEFAULT_ANONYMOUS_SCOPES
    host: str = "127.0.0.1"
    port: int = 8080
    # `GET /metrics` on a listener of its own (0: on the API's, to anyone who asks).
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    root_url: str = ""
    claim_timeout: float = 20 * 60
    sas_lifetime: float = 30 * 60
    claim_resolver_interval: float = 1.0
    deadline_resolver_interval: float = 5.0
    # claimWork: how long a call waits for work, and how often it polls while waiting.
    claim_work_wait: float = 20.0
    claim_work_poll_interval: float = 2.0
    # Events: off without an AMQP URL.
    amqp_url: str = field(default="", repr=False)  # may hold the broker's password
    exchange_prefix: str = "exchange/taskcluster-queue/v1/"
    events_recovery_delay: float = 30.0
    events_resolver_interval: float = 2.0
    # Dependencies: when a resolution that its process did not pass on is recovered.
    dependencies_recovery_delay: float = 30.0
    dependency_resolver_interval: float = 5.0
    # How often the rest of a large cancelTaskGroup / changeTaskGroupPriority is looked for.
    group_resolver_interval: float = 5.0
    # Expiry: how often expired artifacts and tasks are looked for (a scan of the tasks table).
    expiry_interval: float = 3600.0
    # How long the storage calls of one client request may take in all, retries included
    # (claimWork: on top of its wait); then the request is answered 503 with Retry-After.
    request_budget: float = 10.0
    # A pending run that has had no live tip for this long gets a new one (see docs/operating/failures.md).
    tip_repair_delay: float = 180.0
    # How long a PUT to an s3 artifact's putUrl may send nothing before it is cut off,
    # storing nothing (azqueue.service.uploads.READ_TIMEOUT).
    upload_read_timeout: float = 60.0
    # Test-only fault injection: exit the process right after a state change is stored,
    # before its events are published (AZQUEUE_TEST_CRASH_AFTER_COMMIT=1).
    crash_after_commit: bool = False
    # Runs the background resolvers in the serving process.
    run_resolvers: bool = True
    # How long `serve`, `dev` and `resolve` wait for the storage endpoints at start-up.
    storage_wait: float = 60.0
    # Origins (scheme://host[:port], or *) whose pages may read artifact blobs: `serve`
    # sets a CORS rule for them on the account's Blob service at start-up.
    blob_cors_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_tip_secrets(self.tip_secrets)
        _check_origins(self.blob_cors_origins)
        ids = [c.client_id for c in (self.root, *self.clients)]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"clientIds must be unique; got {sorted(ids)}")

    @property
    def public_root_url(self) -> str:
        return (self.root_url or f"http://{self.host}:{self.port}").rstrip("/")

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """Settings from ``AZQUEUE_*`` variables; an unset or empty one keeps its default.

        Every wrong variable is reported at once: one ConfigError whose message has a
        line per variable."""
        check_required(env)
        errors: list[str] = []

        def checked(step: Callable[[], T]) -> T | None:
            try:
                return step()
            except ConfigError as e:
                errors.append(e.message)
                return None

        raw_secrets = env.get("AZQUEUE_TIP_SECRETS", "")
        tip_secrets = tuple(s.strip() for s in raw_secrets.split(",") if s.strip())
        root_id = env.get("AZQUEUE_ROOT_CLIENT_ID", "")
        root_token = env.get("AZQUEUE_ROOT_ACCESS_TOKEN", "")
        if not root_id or not root_token:
            errors.append("AZQUEUE_ROOT_CLIENT_ID and AZQUEUE_ROOT_ACCESS_TOKEN must be set: "
                          "the root client holds scope `*` and signs claim credentials")
        elif is_placeholder(root_token):
            errors.append(_example_value("AZQUEUE_ROOT_ACCESS_TOKEN").message)
        elif len(root_token) < MIN_ACCESS_TOKEN:
            errors.append(f"AZQUEUE_ROOT_ACCESS_TOKEN is {len(root_token)} characters long: "
                          f"the root client's token (scope `*`) needs at least "
                          f"{MIN_ACCESS_TOKEN}, e.g. the output of `python -c 'import secrets; "
                          "print(secrets.token_urlsafe(32))'`")
        if any(is_placeholder(s) for s in tip_secrets):
            errors.append(_example_value("AZQUEUE_TIP_SECRETS").message)
        else:
            checked(lambda: _check_tip_secrets(tip_secrets))
        given: dict[str, object] = {
            name: env[variable] for name, variable in _TEXT_VARIABLES.items() if env.get(variable)}
        for name, variable in _SECONDS_VARIABLES.items():
            if env.get(variable):
                seconds = checked(functools.partial(_seconds, env, variable))
                if seconds is not None:
                    given[name] = seconds
        for name, variable in (("port", "AZQUEUE_PORT"), ("metrics_port", "AZQUEUE_METRICS_PORT")):
            port_raw = env.get(variable)
            if port_raw:
                try:
                    port = int(port_raw)
                except ValueError:
                    port = -1
                if not 0 <= port < 65536:
                    errors.append(f"{variable}={port_raw!r} is not a port number")
                else:
                    given[name] = port
        clients_file = env.get("AZQUEUE_CLIENTS_FILE", "")
        if clients_file:
            clients = checked(lambda: _load_clients(clients_file))
            if clients is not None:
                given["clients"] = clients
        origins = env.get("AZQUEUE_BLOB_CORS_ORIGINS", "")
        if origins.strip():
            given["blob_cors_origins"] = tuple(o.strip().rstrip("/") for o in origins.split(",")
                                               if o.strip())
            checked(lambda: _check_origins(given["blob_cors_origins"]))  # type: ignore[arg-type]
        anonymous = env.get("AZQUEUE_ANONYMOUS_SCOPES")
        if anonymous is not None:  # set but empty: no anonymous scopes at all
            given["anonymous_scopes"] = tuple(s.strip() for s in anonymous.split(",")
                                              if s.strip())
        storage = checked(lambda: StorageSettings.from_env(env))
        if errors or storage is None:
            raise ConfigError("\n".join(errors))
        return cls(
            storage=storage,
            tip_secrets=tip_secrets,
            root=Client(root_id, root_token, ("*",)),
            crash_after_commit=env.get("AZQUEUE_TEST_CRASH_AFTER_COMMIT", "") == "1",
            **given,  # type: ignore[arg-type]
        )


# The settings read as they are written, and those in seconds; the rest are special.
_TEXT_VARIABLES = {
    "host": "AZQUEUE_HOST",
    "metrics_host": "AZQUEUE_METRICS_HOST",
    "root_url": "AZQUEUE_ROOT_URL",
    "amqp_url": "AZQUEUE_AMQP_URL",
    "exchange_prefix": "AZQUEUE_EXCHANGE_PREFIX",
}
_SECONDS_VARIABLES = {
    "claim_timeout": "AZQUEUE_CLAIM_TIMEOUT",
    "sas_lifetime": "AZQUEUE_SAS_LIFETIME",
    "storage_wait": "AZQUEUE_STORAGE_WAIT",
    "claim_resolver_interval": "AZQUEUE_CLAIM_RESOLVER_INTERVAL",
    "deadline_resolver_interval": "AZQUEUE_DEADLINE_RESOLVER_INTERVAL",
    "claim_work_wait": "AZQUEUE_CLAIM_WORK_WAIT",
    "claim_work_poll_interval": "AZQUEUE_CLAIM_WORK_POLL_INTERVAL",
    "events_recovery_delay": "AZQUEUE_EVENTS_RECOVERY_DELAY",
    "events_resolver_interval": "AZQUEUE_EVENTS_RESOLVER_INTERVAL",
    "dependencies_recovery_delay": "AZQUEUE_DEPENDENCIES_RECOVERY_DELAY",
    "dependency_resolver_interval": "AZQUEUE_DEPENDENCY_RESOLVER_INTERVAL",
    "group_resolver_interval": "AZQUEUE_GROUP_RESOLVER_INTERVAL",
    "expiry_interval": "AZQUEUE_EXPIRY_INTERVAL",
    "request_budget": "AZQUEUE_REQUEST_BUDGET",
    "tip_repair_delay": "AZQUEUE_TIP_REPAIR_DELAY",
    "upload_read_timeout": "AZQUEUE_UPLOAD_READ_TIMEOUT",
}


def check_required(env: Mapping[str, str]) -> None:
    """ConfigError naming every required variable that is unset, all at once."""
    missing = [name for name in ("AZQUEUE_TIP_SECRETS", "AZQUEUE_ROOT_CLIENT_ID",
                                 "AZQUEUE_ROOT_ACCESS_TOKEN") if not env.get(name, "").strip()]
    if not env.get("AZQUEUE_STORAGE_CONNECTION_STRING") and not env.get(
            "AZQUEUE_STORAGE_ACCOUNT_URL"):
        missing.insert(0, "AZQUEUE_STORAGE_CONNECTION_STRING (or AZQUEUE_STORAGE_ACCOUNT_URL)")
    if len(missing) > 1:  # one alone gets the message of its own check, with its advice
        raise ConfigError(f"{len(missing)} required settings are not set: {', '.join(missing)}; "
                          "docs/operating/settings.md describes each, or run `azqueue dev` for a "
                          "development server that needs none")


def new_secret() -> str:
    """A fresh random secret, for development set-ups that have none configured."""
    return secrets.token_urlsafe(32)
