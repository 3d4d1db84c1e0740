"""Settings, parsed once from ``AZQUEUE_*`` environment variables and passed down.

``SETTINGS`` lists every variable once: the field it sets, how it is read, what it means.
``Settings.from_env`` reads by it, `azqueue serve --help` lists it, and
scripts/settings_table.py writes the table of docs/operating/settings.md from it
(tests/unit/test_settings_doc.py fails when that table or the code's reads drift from it).
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TypeVar

from azqueue.errors import ConfigError as ConfigError  # where callers of from_env find it


T = TypeVar("T")
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,15}$")
_ORIGIN_RE = re.compile(r"^https?://[^/?#\s,]+$")


def _seconds(name: str, raw: str) -> float:
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
        given: dict[str, object] = {}
        for setting in _read_in_order():
            raw = env.get(setting.variable)
            if raw or (raw is not None and setting.empty_is_a_value):
                assert setting.parse is not None
                value = checked(functools.partial(setting.parse, setting.variable, raw))
                if value is not None:
                    given[setting.field] = value
        storage = checked(lambda: StorageSettings.from_env(env))
        if errors or storage is None:
            raise ConfigError("\n".join(errors))
        return cls(
            storage=storage,
            tip_secrets=tip_secrets,
            root=Client(root_id, root_token, ("*",)),
            **given,  # type: ignore[arg-type]
        )


def _text(name: str, raw: str) -> str:
    return raw


def _port(name: str, raw: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 0 <= port < 65536:
        raise ConfigError(f"{name}={raw!r} is not a port number")
    return port


def _clients_file(name: str, raw: str) -> tuple[Client, ...]:
    return _load_clients(raw)


def _origins(name: str, raw: str) -> tuple[str, ...]:
    origins = tuple(o.strip().rstrip("/") for o in raw.split(",") if o.strip())
    _check_origins(origins)
    return origins


def _scopes(name: str, raw: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in raw.split(",") if s.strip())


def _flag(name: str, raw: str) -> bool:
    return raw == "1"


@dataclass(frozen=True, slots=True)
class Setting:
    """One ``AZQUEUE_*`` variable.

    ``field`` is the Settings field it sets (``storage.x``: StorageSettings'; "" for one
    read elsewhere, such as the log level by the command line). ``parse(variable, raw)``
    turns a set value into the field's, raising ConfigError naming the variable; without
    it the variable is read by code of its own (the required secrets, the storage account).
    ``default`` is the default as the docs write it; "" shows the field's own.
    ``meaning`` is the docs' one-line description (markdown), ``note`` what `serve --help`
    adds in brackets (else the default). ``group`` is the line of `serve --help` it is on.
    """

    variable: str
    group: str
    meaning: str
    field: str = ""
    parse: Callable[[str, str], object] | None = None
    default: str = ""
    note: str = ""
    empty_is_a_value: bool = False  # set but empty means "none", not "the default"
    test_only: bool = False

    def shown_default(self) -> str:
        """The default as the docs table shows it (markdown)."""
        if self.default or not self.field:
            return self.default or "none"
        owner: type = Settings
        name = self.field
        if name.startswith("storage."):
            owner, name = StorageSettings, name.removeprefix("storage.")
        value = next(f.default for f in fields(owner) if f.name == name)
        if isinstance(value, tuple):
            value = ",".join(value)
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        return f"`{value}`" if value not in ("", None) else "none"


_FAILURES = "[When Azure Storage fails](failures.md)"

# Every variable, in the order of the docs table.
SETTINGS: tuple[Setting, ...] = (
    Setting("AZQUEUE_STORAGE_CONNECTION_STRING", "required", field="storage.connection_string",
            default="(this or the next is required)",
            meaning="storage account connection string; with `AccountKey` everything works; "
                    "with neither `AccountKey` nor `SharedAccessSignature` the server signs in "
                    "with azure-identity (below)"),
    Setting("AZQUEUE_STORAGE_ACCOUNT_URL", "required", note="instead of a connection string",
            meaning="instead of a connection string: the account's URL, e.g. "
                    "`https://myaccount.blob.core.windows.net` (any of its service URLs), "
                    "signed in with azure-identity"),
    Setting("AZQUEUE_TIP_SECRETS", "required", field="tip_secrets",
            default="(required; `dev` makes one)",
            meaning="comma-separated secrets (≥ 16 chars) for signing tips; the first signs, "
                    "all verify, so add a new one in front to rotate and drop the old one after "
                    "the longest deadline (5 days). An example value (`change-me-…`, "
                    "`placeholder`, …) is refused at start-up"),
    Setting("AZQUEUE_ROOT_CLIENT_ID", "required", field="root",
            default="(required; `dev` makes it)",
            meaning="the root client's clientId: scope `*`, and the issuer of claim credentials"),
    Setting("AZQUEUE_ROOT_ACCESS_TOKEN", "required", field="root",
            default="(required; `dev` makes it)",
            meaning="the root client's access token: ≥ 22 characters; an example value is "
                    "refused at start-up"),
    Setting("AZQUEUE_STORAGE_CA_FILE", "storage", field="storage.ca_file", default="system CAs",
            meaning="a CA bundle to trust for the storage endpoints (an emulator or proxy with "
                    "its own certificate)"),
    Setting("AZQUEUE_STORAGE_PUBLIC_QUEUE_ENDPOINT", "storage",
            field="storage.public_queue_endpoint", default="that of the connection string",
            meaning="the queue endpoint as the API's clients reach it, e.g. "
                    "`http://localhost:10001/devstoreaccount1` (Azurite) or a proxy: "
                    "pollTaskUrls' SAS URLs name it instead (a SAS signs the account and "
                    "resource, not the host, so it holds)"),
    Setting("AZQUEUE_STORAGE_PUBLIC_BLOB_ENDPOINT", "storage",
            field="storage.public_blob_endpoint", default="that of the connection string",
            meaning="the blob endpoint as the API's clients reach it, e.g. "
                    "`http://localhost:10000/devstoreaccount1` (Azurite) or a proxy: artifact "
                    "upload URLs and download redirects name it instead"),
    Setting("AZQUEUE_BLOB_CORS_ORIGINS", "storage", field="blob_cors_origins", parse=_origins,
            note="pages that may read artifacts: the dashboard",
            meaning="comma-separated origins (`scheme://host[:port]`, e.g. "
                    "`https://queue.example.com`, or `*`) whose pages may read artifact content "
                    "from Blob storage, so that the dashboard served there follows live logs. "
                    "**It changes the storage account's Blob service CORS rules**: at start-up "
                    "`serve` adds a rule for these origins (GET and HEAD, the `Range` header, "
                    "exposing `Content-Range` and `Content-Length`), replacing an earlier rule "
                    "for exactly these origins and keeping all others (refused if the account "
                    "has Azure's 5 rules already). Empty: the rules are left alone and the "
                    "dashboard links to logs instead"),
    Setting("AZQUEUE_STORAGE_WAIT", "storage", field="storage_wait", parse=_seconds,
            note="seconds to wait for storage at start-up",
            meaning="seconds `serve`, `dev` and `resolve` wait for the storage endpoints to "
                    "accept connections at start-up (trying every 2 s, logging each failure) "
                    "before giving up"),
    Setting("AZQUEUE_STORAGE_PREFIX", "storage", field="storage.prefix",
            meaning="prefix of every table and queue name (1–16 lowercase letters/digits), to "
                    "share an account"),
    Setting("AZQUEUE_CLIENTS_FILE", "clients", field="clients", parse=_clients_file,
            meaning="JSON list of static clients (`clientId`, `accessToken` ≥ 22 chars, "
                    "`scopes`)"),
    Setting("AZQUEUE_ANONYMOUS_SCOPES", "clients", field="anonymous_scopes", parse=_scopes,
            empty_is_a_value=True, note="read-only by default; empty: none",
            meaning="comma-separated scopes of requests without credentials (empty: none): by "
                    "default every read of tasks, task groups, public artifacts, task queues "
                    "and workers (what the dashboard shows), nothing that changes anything"),
    Setting("AZQUEUE_HOST", "listening", field="host", parse=_text,
            meaning="the address to listen on"),
    Setting("AZQUEUE_PORT", "listening", field="port", parse=_port,
            meaning="the port to listen on"),
    Setting("AZQUEUE_ROOT_URL", "listening", field="root_url", parse=_text,
            default="`http://<host>:<port>`",
            meaning="the public rootUrl; its scheme sets the port Hawk assumes when `Host` has "
                    "none (80/443); `s3` artifacts' `putUrl`s point there"),
    Setting("AZQUEUE_METRICS_HOST", "metrics", field="metrics_host", parse=_text,
            meaning="the address of the metrics listener (with `AZQUEUE_METRICS_PORT`)"),
    Setting("AZQUEUE_METRICS_PORT", "metrics", field="metrics_port", parse=_port,
            default="none", note="/metrics on a listener of its own, not the API's",
            meaning="with a port, `GET /metrics` is served on a listener of its own there, and "
                    "no longer on the API's port (where anyone who reaches the API may read it)"),
    Setting("AZQUEUE_CLAIM_TIMEOUT", "timing", field="claim_timeout", parse=_seconds,
            meaning="seconds a claim lasts (`takenUntil − now`)"),
    Setting("AZQUEUE_SAS_LIFETIME", "timing", field="sas_lifetime", parse=_seconds,
            meaning="seconds pollTaskUrls' URLs are reported valid (they work 5 minutes longer)"),
    Setting("AZQUEUE_CLAIM_RESOLVER_INTERVAL", "timing", field="claim_resolver_interval",
            parse=_seconds, meaning="seconds between scans for expired claims nobody polled"),
    Setting("AZQUEUE_DEADLINE_RESOLVER_INTERVAL", "timing", field="deadline_resolver_interval",
            parse=_seconds, meaning="seconds between checks of the deadline queue"),
    Setting("AZQUEUE_CLAIM_WORK_WAIT", "timing", field="claim_work_wait", parse=_seconds,
            meaning="seconds a claimWork call waits for work before answering `{tasks: []}`"),
    Setting("AZQUEUE_CLAIM_WORK_POLL_INTERVAL", "timing", field="claim_work_poll_interval",
            parse=_seconds,
            meaning="seconds between a waiting claimWork call's polls of the Azure queues"),
    Setting("AZQUEUE_AMQP_URL", "events", field="amqp_url", parse=_text,
            default="none (events off)", note="events off without it",
            meaning="RabbitMQ URL, e.g. `amqp://guest:guest@127.0.0.1:5672/`"),
    Setting("AZQUEUE_EXCHANGE_PREFIX", "events", field="exchange_prefix", parse=_text,
            meaning="prefix of the exchange names"),
    Setting("AZQUEUE_EVENTS_RECOVERY_DELAY", "events", field="events_recovery_delay",
            parse=_seconds,
            meaning="seconds after which the events of a change that its process did not "
                    "publish are published by the events resolver"),
    Setting("AZQUEUE_EVENTS_RESOLVER_INTERVAL", "events", field="events_resolver_interval",
            parse=_seconds, meaning="seconds between the events resolver's checks"),
    Setting("AZQUEUE_DEPENDENCIES_RECOVERY_DELAY", "timing", field="dependencies_recovery_delay",
            parse=_seconds,
            meaning="seconds after which a resolution that its process did not pass on to the "
                    "tasks depending on it is passed on by the dependency resolver"),
    Setting("AZQUEUE_DEPENDENCY_RESOLVER_INTERVAL", "timing", field="dependency_resolver_interval",
            parse=_seconds, meaning="seconds between the dependency resolver's checks"),
    Setting("AZQUEUE_GROUP_RESOLVER_INTERVAL", "timing", field="group_resolver_interval",
            parse=_seconds,
            meaning="seconds between the groups resolver's looks for the rest of a large "
                    "cancelTaskGroup or changeTaskGroupPriority"),
    Setting("AZQUEUE_EXPIRY_INTERVAL", "timing", field="expiry_interval", parse=_seconds,
            meaning="seconds between the expiry resolver's scans for expired artifacts and "
                    "tasks"),
    Setting("AZQUEUE_REQUEST_BUDGET", "timing", field="request_budget", parse=_seconds,
            meaning="seconds the storage requests of one API request may take in all, retries "
                    "included (claimWork: on top of its wait); then the request is answered 503 "
                    f"with `Retry-After` (see {_FAILURES})"),
    Setting("AZQUEUE_TIP_REPAIR_DELAY", "timing", field="tip_repair_delay", parse=_seconds,
            meaning="seconds after which a pending run whose tip went missing gets a new one "
                    f"(see {_FAILURES})"),
    Setting("AZQUEUE_UPLOAD_READ_TIMEOUT", "uploads", field="upload_read_timeout",
            parse=_seconds, note="seconds a putUrl PUT may send nothing",
            meaning="seconds a PUT to an `s3` artifact's `putUrl` may send nothing before it is "
                    "answered 400 with nothing stored (see Uploading an `s3` artifact)"),
    Setting("AZQUEUE_LOG_LEVEL", "logging", default="`INFO`",
            meaning="log level (at INFO, one line per API request)"),
    Setting("AZQUEUE_LOG_FORMAT", "logging", default="`text`",
            meaning="`json`: one JSON object per log line"),
    Setting("AZQUEUE_AZURITE_BIN", "development",
            default="`azurite/node_modules/.bin/azurite` in a checkout, else "
                    "`~/.cache/azqueue/azurite-<version>/node_modules/.bin/azurite` (installed "
                    "with npm on first use)",
            meaning="the Azurite that `azqueue dev`, the tests and the pytest plugin start"),
    # Fault injection for the tests: exit right after a state change is stored, before its
    # events are published (docs/contributing.md lists it, not the settings page).
    Setting("AZQUEUE_TEST_CRASH_AFTER_COMMIT", "tests", field="crash_after_commit", parse=_flag,
            meaning="`1`: exit right after a state change is stored, before its events are "
                    "published", test_only=True),
)

# The order from_env reads in, so that its error lines keep theirs.
_PHASES: tuple[Callable[[str, str], object], ...] = (
    _text, _flag, _seconds, _port, _clients_file, _origins, _scopes)


def _read_in_order() -> list[Setting]:
    return sorted((s for s in SETTINGS if s.parse is not None),
                  key=lambda s: _PHASES.index(s.parse))


def variables_help() -> str:
    """The variables as `azqueue serve --help` lists them, a line or more per group."""
    lines = ["Configured entirely by environment variables (docs/operating/settings.md "
             "describes each):"]
    groups: dict[str, list[str]] = {}
    for s in SETTINGS:
        if s.test_only:
            continue
        default = s.shown_default()
        short = default.strip("`") if default.startswith("`") and len(default) <= 20 else ""
        note = ", ".join(n for n in (s.note, short) if n)
        groups.setdefault(s.group, []).append(f"{s.variable} ({note})" if note else s.variable)
    for group, names in groups.items():
        line = f"  {group + ':':12} "
        for i, name in enumerate(names):
            piece = name + ("," if i < len(names) - 1 else "")
            if len(line) + len(piece) > 92 and line.strip() != f"{group}:":
                lines.append(line.rstrip())
                line = " " * 15
            line += piece + " "
        lines.append(line.rstrip())
    return "\n".join(lines)


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
