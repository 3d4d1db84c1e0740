"""Every ``AZQUEUE_*`` variable once (``SETTINGS``): the field it sets, how its value is
parsed, what it means.

``Settings.from_env`` reads by it, `azqueue serve --help` lists it, and
scripts/settings_table.py writes the table of docs/operating/settings.md from it
(tests/unit/test_settings_doc.py fails when that table or the code's reads drift from it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from azqueue.config.clients import Client, load_clients
from azqueue.errors import ConfigError
from azqueue.model import scopes
from azqueue.model.tip import TipForm

_ORIGIN_RE = re.compile(r"^https?://[^/?#\s,]+$")


def _seconds(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} must be greater than zero")
    return value


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


def _count(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} is not a whole number greater than zero")
    return value


def _clients_file(name: str, raw: str) -> tuple[Client, ...]:
    return load_clients(raw)


def _origins(name: str, raw: str) -> tuple[str, ...]:
    origins = tuple(o.strip().rstrip("/") for o in raw.split(",") if o.strip())
    check_origins(origins)
    return origins


def _scopes(name: str, raw: str) -> tuple[str, ...]:
    given = tuple(s.strip() for s in raw.split(",") if s.strip())
    for scope in given:
        if (problem := scopes.ungrantable(scope)) is not None:
            raise ConfigError(f"{name}: {problem}")
    return given


def _flag(name: str, raw: str) -> bool:
    return raw == "1"


def _tip_form(name: str, raw: str) -> TipForm:
    try:
        return TipForm(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a tip form; write one of "
                          f"{', '.join(f.value for f in TipForm)}") from None


def check_origins(origins: tuple[str, ...]) -> None:
    """ConfigError unless each of ``origins`` is ``scheme://host[:port]`` or ``*``."""
    for origin in origins:
        if origin != "*" and not _ORIGIN_RE.match(origin):
            raise ConfigError(f"AZQUEUE_BLOB_CORS_ORIGINS: {origin!r} is not an origin; "
                              "write scheme://host[:port] with no path (the dashboard's "
                              "address, e.g. https://queue.example.com), or *")


@dataclass(frozen=True, slots=True)
class Setting:
    """One ``AZQUEUE_*`` variable.

    ``field`` is the Settings field it sets (``storage.x``: StorageSettings'; "" for one
    read elsewhere, such as the log level by the command line). ``parse(variable, raw)``
    turns a set value into the field's, raising ConfigError naming the variable; without
    it the variable is read by code of its own (the required secrets, the storage account).
    ``default`` is the default as the docs write it; "" shows the field's own
    (``azqueue.config.settings.shown_default``).
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


_FAILURES = "[When Azure Storage fails](failures.md)"
_CONNECTIONS = "[Slow and idle connections](running.md#slow-and-idle-connections)"

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
            meaning="the root client's clientId (letters, digits and `!@/:.+|_-`): scope `*`, "
                    "and the issuer of claim credentials"),
    Setting("AZQUEUE_ROOT_ACCESS_TOKEN", "required", field="root",
            default="(required; `dev` makes it)",
            meaning="the root client's access token: ≥ 22 printable ASCII characters, no "
                    "spaces; an example value is refused at start-up"),
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
            meaning="JSON list of static clients (`clientId` of letters, digits and "
                    "`!@/:.+|_-`, `accessToken` of ≥ 22 printable ASCII characters and no "
                    "spaces, `scopes`)"),
    Setting("AZQUEUE_ANONYMOUS_SCOPES", "clients", field="anonymous_scopes", parse=_scopes,
            empty_is_a_value=True, note="read-only by default; empty: none",
            meaning="comma-separated scopes of requests without credentials (empty: none), "
                    "which signed-in callers hold too, as in Taskcluster: by default every read "
                    "of tasks, task groups, public artifacts, task queues and workers (what the "
                    "dashboard shows), nothing that changes anything"),
    Setting("AZQUEUE_HOST", "listening", field="host", parse=_text,
            meaning="the address to listen on"),
    Setting("AZQUEUE_PORT", "listening", field="port", parse=_port,
            meaning="the port to listen on; `0`: any free port, which the start-up log line "
                    "and the default rootUrl name"),
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
    Setting("AZQUEUE_METRICS_TOKEN", "metrics", field="metrics_token", parse=_text,
            default="none", note="a bearer token /metrics requires",
            meaning="with a token, `GET /metrics` answers 401 unless the request sends it as "
                    "`Authorization: Bearer <token>` (Prometheus: `authorization: "
                    "{credentials_file: ...}` in the scrape config), and the API's "
                    "`__metrics__` answers signed-in callers only; without it, whoever "
                    "reaches the listener may read the metrics"),
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
            meaning="seconds between a task queue's looks at all its Azure queues while claimWork "
                    "callers or SAS workers wait and the doorbell cannot be relied on (the "
                    "broker away, the doorbell table unreadable)"),
    Setting("AZQUEUE_CLAIM_WORK_FALLBACK_INTERVAL", "timing",
            field="claim_work_fallback_interval", parse=_seconds,
            meaning="seconds between a task queue's looks at all its Azure queues while callers "
                    "wait and the doorbell works (it wakes them when a tip is put): what catches "
                    "a tip whose ring was lost"),
    Setting("AZQUEUE_DOORBELL_INTERVAL", "timing", field="doorbell_interval", parse=_seconds,
            meaning="with events off, seconds between a replica's reads of the doorbell table "
                    "(one storage request each), how long a tip put on another replica may wait "
                    "to wake a caller here"),
    Setting("AZQUEUE_TASK_QUEUE_IDLE_EXPIRY", "timing", field="task_queue_idle_expiry",
            parse=_seconds,
            meaning="seconds after which what a replica keeps of a task queue nobody used since "
                    "is dropped: with events off, its ears in the doorbell table (rewritten "
                    "while its callers wait) and the rows nobody wrote for that long; its "
                    "series of `azqueue_task_pending_seconds` (see "
                    "[Metrics and logs](monitoring.md))"),
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
                    "tasks (then workers and task queues, and the empty Azure queues of task "
                    "queues whose record expired)"),
    Setting("AZQUEUE_REQUEST_BUDGET", "timing", field="request_budget", parse=_seconds,
            meaning="seconds the storage requests of one API request may take in all, retries "
                    "included (claimWork: on top of its wait); then the request is answered 503 "
                    f"with `Retry-After` (see {_FAILURES})"),
    Setting("AZQUEUE_TIP_REPAIR_DELAY", "timing", field="tip_repair_delay", parse=_seconds,
            meaning="seconds after which a pending run whose tip went missing gets a new one "
                    f"(see {_FAILURES})"),
    Setting("AZQUEUE_TIP_FORM", "upgrades", field="tip_form", parse=_tip_form,
            note="run: beside replicas of 0.1.0",
            meaning="what the signature of the tips this replica puts covers: `task-queue` "
                    "(the task queue, taskId and runId) or `run` (the taskId and runId alone, "
                    "all that 0.1.0 checks); both are claimed. Set `run` only "
                    "while replicas of such a release serve beside this one (see "
                    "[Upgrades](upgrades.md))"),
    Setting("AZQUEUE_UPLOAD_READ_TIMEOUT", "uploads", field="upload_read_timeout",
            parse=_seconds, note="seconds a putUrl PUT may send nothing",
            meaning="seconds a PUT to an `s3` artifact's `putUrl` may send nothing before it is "
                    "answered 400 with nothing stored (see Uploading an `s3` artifact)"),
    Setting("AZQUEUE_UPLOAD_MEMORY_MIB", "uploads", field="upload_memory_mib", parse=_count,
            meaning="MiB the PUTs to `s3` artifacts' `putUrl`s under way in a process may hold "
                    "in all (each its length up to 4 MiB, 20 MiB for a body over 4 MiB); a PUT that "
                    "would take more is answered 503 `ServerBusy` with `Retry-After`, before "
                    "its body is read (see Uploading an `s3` artifact)"),
    Setting("AZQUEUE_UPLOAD_RUN_MEMORY_MIB", "uploads", field="upload_run_memory_mib",
            parse=_count,
            meaning="MiB of `AZQUEUE_UPLOAD_MEMORY_MIB` the PUTs to `putUrl`s of one run may "
                    "hold in a process, so that one worker cannot take it all; a PUT that "
                    "would take more is answered 503 `ServerBusy` with `Retry-After`, before "
                    "its body is read (a run's first upload is always let in) (see Uploading "
                    "an `s3` artifact)"),
    Setting("AZQUEUE_UPLOAD_MIN_RATE_KIB", "uploads", field="upload_min_rate_kib",
            parse=_count, note="KiB/s a putUrl PUT must average",
            meaning="KiB/s a PUT to an `s3` artifact's `putUrl` must average, with "
                    "`AZQUEUE_UPLOAD_READ_TIMEOUT` seconds to spare, counted while the "
                    "server waits for its body; one that falls further behind is answered "
                    "400 with nothing stored and its buffers freed (see Uploading an `s3` "
                    "artifact)"),
    Setting("AZQUEUE_HEADER_TIMEOUT", "connections", field="header_timeout", parse=_seconds,
            meaning="seconds within which a request's headers must be complete, counted from "
                    f"their first byte; then the connection is closed (see {_CONNECTIONS})"),
    Setting("AZQUEUE_IDLE_TIMEOUT", "connections", field="idle_timeout", parse=_seconds,
            meaning="seconds a connection may send nothing of a request, from its start or "
                    "the answer before (keep-alive); then it is closed "
                    f"(see {_CONNECTIONS})"),
    Setting("AZQUEUE_BODY_TIMEOUT", "connections", field="body_timeout", parse=_seconds,
            meaning="seconds within which an API request's body must have arrived whole, "
                    "counted from its headers; then it is answered 408 and the connection "
                    "closed. A PUT to an `s3` `putUrl` has `AZQUEUE_UPLOAD_READ_TIMEOUT` "
                    f"instead (see {_CONNECTIONS})"),
    Setting("AZQUEUE_SEND_TIMEOUT", "connections", field="send_timeout", parse=_seconds,
            meaning="while more than 64 KiB of an answer wait unsent, seconds within which "
                    "its client must take 64 KiB more of it; then the connection is dropped "
                    f"with the rest of the answer (see {_CONNECTIONS})"),
    Setting("AZQUEUE_MAX_CONNECTIONS", "connections", field="max_connections", parse=_count,
            meaning="connections one process keeps open at once; one more is answered 503 "
                    "with `Retry-After` and closed, and the log says so (at most once a "
                    f"minute) (see {_CONNECTIONS})"),
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
    _text, _flag, _seconds, _count, _port, _clients_file, _origins, _scopes, _tip_form)


def read_in_order() -> list[Setting]:
    """The settings ``from_env`` parses, in the order it reads them."""
    return sorted((s for s in SETTINGS if s.parse is not None),
                  key=lambda s: _PHASES.index(s.parse))
