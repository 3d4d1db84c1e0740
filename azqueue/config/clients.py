"""The clients the server knows (``Client``: the root client and those of
``AZQUEUE_CLIENTS_FILE``) and the checks their secrets pass: long enough, and not an
example's stand-in such as ``change-me-...``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from azqueue.errors import ConfigError
from azqueue.model import scopes

MIN_ACCESS_TOKEN = 22
# Taskcluster's auth service's pattern of a clientId; what a Hawk header's `id` carries.
CLIENT_ID_RE = re.compile(r"[A-Za-z0-9!@/:.+|_-]+")
# An access token is printable ASCII without spaces: what a deployer can copy and paste.
ACCESS_TOKEN_RE = re.compile(r"[!-~]+")


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
        if not CLIENT_ID_RE.fullmatch(self.client_id):
            raise ConfigError(f"client {self.client_id!r}: a clientId holds only letters, "
                              "digits and !@/:.+|_- (as Taskcluster's do)")
        if not ACCESS_TOKEN_RE.fullmatch(self.access_token):
            raise ConfigError(f"client {self.client_id!r}: an accessToken holds only printable "
                              "ASCII characters, no spaces, such as the output of `python -c "
                              "'import secrets; print(secrets.token_urlsafe(32))'`")


# What examples write where a secret goes ("change-me-to-a-long-random-token"): a server
# started with one is open to everyone who read the example.
_PLACEHOLDER_RE = re.compile(r"change[-_ ]?me|replace[-_ ]?me|placeholder|your[-_ ]?(secret|token)",
                             re.IGNORECASE)


def is_placeholder(secret: str) -> bool:
    """Whether ``secret`` is an example's stand-in for one, such as ``change-me-...``."""
    return _PLACEHOLDER_RE.search(secret) is not None


def example_value(variable: str) -> ConfigError:
    """The error for ``variable`` holding an example's stand-in for a secret."""
    return ConfigError(f"{variable} holds an example value (such as change-me-...), not a "
                       "secret: set a long random one, e.g. the output of `python -c 'import "
                       "secrets; print(secrets.token_urlsafe(32))'`")


_FORM = 'it must be a JSON list of {"clientId": ..., "accessToken": ..., "scopes": [...]}'


def _client(entry: object, index: int) -> Client:
    """The client of entry ``index`` of a clients file, or ConfigError naming what is
    wrong with it."""
    if not isinstance(entry, dict):
        raise ConfigError(f"entry {index} is {json.dumps(entry)[:80]}, not an object; {_FORM}")
    client_id, token, held = (entry.get(k) for k in ("clientId", "accessToken", "scopes"))
    if not isinstance(client_id, str):
        raise ConfigError(f"entry {index}: `clientId` must be a string")
    name = f"client {client_id!r} (entry {index})"
    if not isinstance(token, str):
        raise ConfigError(f"{name}: `accessToken` must be a string")
    if not isinstance(held, list):
        raise ConfigError(f"{name}: `scopes` must be a list of scopes, such as "
                          f'["queue:status:*"], not {json.dumps(held)[:80]}')
    for n, scope in enumerate(held):
        if (problem := scopes.ungrantable(scope)) is not None:
            raise ConfigError(f"{name}: scope {n} of `scopes`: {problem}")
    return Client(client_id, token, tuple(held))


def load_clients(path: str) -> tuple[Client, ...]:
    """The clients of an ``AZQUEUE_CLIENTS_FILE``: a JSON list of ``{clientId, accessToken,
    scopes}``, each scope valid as Taskcluster's auth takes one."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, list):
            raise ConfigError(f"it holds {json.dumps(data)[:80]}, not a list; {_FORM}")
        clients = tuple(_client(entry, n) for n, entry in enumerate(data))
    except ConfigError as e:  # a malformed entry, a short token, scopes that are not scopes
        raise ConfigError(f"AZQUEUE_CLIENTS_FILE={path!r}: {e.message}") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"AZQUEUE_CLIENTS_FILE={path!r}: {e}; {_FORM}") from None
    for client in clients:
        if is_placeholder(client.access_token):
            raise ConfigError(f"AZQUEUE_CLIENTS_FILE={path!r}: the accessToken of client "
                              f"{client.client_id!r} is an example value (such as "
                              "change-me-...): give it a long random one")
    return clients
