"""Where the state lives: one storage account (``StorageSettings``, from the storage
variables of ``SETTINGS``) and the connection string that names it."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from azqueue.errors import ConfigError

_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,15}$")
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
