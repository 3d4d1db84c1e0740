"""The server's settings (``Settings``), parsed once from ``AZQUEUE_*`` environment
variables by ``Settings.from_env`` and passed down; how `azqueue serve --help` lists the
variables.

What each variable sets and means is ``azqueue.config.variables.SETTINGS``; the storage
account's settings are ``azqueue.config.storage``, the clients' ``azqueue.config.clients``.
"""

from __future__ import annotations

import functools
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TypeVar

from azqueue.config.clients import MIN_ACCESS_TOKEN, Client, example_value, is_placeholder
from azqueue.config.storage import StorageSettings
from azqueue.config.variables import SETTINGS, Setting, check_origins, read_in_order
from azqueue.errors import ConfigError
from azqueue.model.tip import TipForm

T = TypeVar("T")


def _check_tip_secrets(tip_secrets: tuple[str, ...]) -> None:
    if not tip_secrets or any(len(s) < 16 for s in tip_secrets):
        raise ConfigError(
            "AZQUEUE_TIP_SECRETS must hold at least one secret of 16 or more characters "
            "(comma-separated; the first signs new tips, all verify)"
        )


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
    # What the signature of the tips put covers; `run` only beside releases that read no other.
    tip_form: TipForm = TipForm.TASK_QUEUE
    clients: tuple[Client, ...] = ()
    anonymous_scopes: tuple[str, ...] = DEFAULT_ANONYMOUS_SCOPES
    host: str = "127.0.0.1"
    port: int = 8080
    # `GET /metrics` on a listener of its own (0: on the API's, to anyone who asks).
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    # The bearer token `GET /metrics` requires (empty: none).
    metrics_token: str = field(default="", repr=False)
    root_url: str = ""
    claim_timeout: float = 20 * 60
    sas_lifetime: float = 30 * 60
    claim_resolver_interval: float = 10.0
    deadline_resolver_interval: float = 5.0
    # claimWork: how long a call waits for work; how often a waiting task queue's queues
    # are all looked at without a doorbell, and with one (a fallback for lost rings).
    claim_work_wait: float = 20.0
    claim_work_poll_interval: float = 2.0
    claim_work_fallback_interval: float = 3600.0
    # Events off: how often a replica reads the doorbell table.
    doorbell_interval: float = 1.0
    # What a replica keeps of a task queue nobody used for this long is dropped: doorbell
    # ears and rows, metric series.
    task_queue_idle_expiry: float = 3600.0
    # Events: off without an AMQP URL.
    amqp_url: str = field(default="", repr=False)  # may hold the broker's password
    exchange_prefix: str = "exchange/taskcluster-queue/v1/"
    events_recovery_delay: float = 30.0
    events_resolver_interval: float = 5.0
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
    # storing nothing (azqueue.service.artifacts.uploads.READ_TIMEOUT).
    upload_read_timeout: float = 60.0
    # What the PUTs to putUrls under way in a process may hold in all (MiB); one more is
    # answered 503 (azqueue.service.artifacts.uploads.MEMORY).
    upload_memory_mib: int = 256
    # The average rate (KiB/s) a PUT to a putUrl must keep up, with upload_read_timeout
    # seconds to spare, or be cut off (azqueue.service.artifacts.uploads.MIN_RATE).
    upload_min_rate_kib: int = 16
    # What the PUTs to putUrls of one run may hold in a process (MiB); one more is answered
    # 503 (azqueue.service.artifacts.uploads.RUN_MEMORY).
    upload_run_memory_mib: int = 64
    # Slow and half-open connections (azqueue.api.connections): a request's headers must
    # be complete within header_timeout of its first byte, an API request's body whole
    # within body_timeout of its headers; a connection that sends nothing of a request for
    # idle_timeout (from its start or the answer before) is closed; a client that takes
    # less than 64 KiB of an answer waiting unsent in send_timeout is cut off; at most max_connections connections
    # are open at once in a process, further ones are answered 503 and closed.
    header_timeout: float = 5.0
    idle_timeout: float = 60.0
    body_timeout: float = 10.0
    send_timeout: float = 10.0
    max_connections: int = 1000
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
        check_origins(self.blob_cors_origins)
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
            errors.append(example_value("AZQUEUE_ROOT_ACCESS_TOKEN").message)
        elif len(root_token) < MIN_ACCESS_TOKEN:
            errors.append(f"AZQUEUE_ROOT_ACCESS_TOKEN is {len(root_token)} characters long: "
                          f"the root client's token (scope `*`) needs at least "
                          f"{MIN_ACCESS_TOKEN}, e.g. the output of `python -c 'import secrets; "
                          "print(secrets.token_urlsafe(32))'`")
        if any(is_placeholder(s) for s in tip_secrets):
            errors.append(example_value("AZQUEUE_TIP_SECRETS").message)
        else:
            checked(lambda: _check_tip_secrets(tip_secrets))
        given: dict[str, object] = {}
        for setting in read_in_order():
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


def shown_default(setting: Setting) -> str:
    """The default of ``setting`` as the docs table shows it (markdown): its own
    ``default``, else that of the field it sets."""
    if setting.default or not setting.field:
        return setting.default or "none"
    owner: type = Settings
    name = setting.field
    if name.startswith("storage."):
        owner, name = StorageSettings, name.removeprefix("storage.")
    value = next(f.default for f in fields(owner) if f.name == name)
    if isinstance(value, tuple):
        value = ",".join(value)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`" if value not in ("", None) else "none"


def variables_help() -> str:
    """The variables as `azqueue serve --help` lists them, a line or more per group."""
    lines = ["Configured entirely by environment variables (docs/operating/settings.md "
             "describes each):"]
    groups: dict[str, list[str]] = {}
    for s in SETTINGS:
        if s.test_only:
            continue
        default = shown_default(s)
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
