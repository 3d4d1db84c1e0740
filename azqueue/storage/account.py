"""The storage account: clients built from one connection string, and request counts."""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import aiohttp
from azure.core.exceptions import ServiceResponseError
from azure.core.pipeline.transport import AioHttpTransport
from azure.data.tables.aio import TableServiceClient
from azure.identity.aio import DefaultAzureCredential
from azure.storage.blob import UserDelegationKey
from azure.storage.blob.aio import BlobServiceClient
from azure.storage.queue.aio import QueueServiceClient

from azqueue.config import ConfigError, StorageSettings, connection_settings
from azqueue.internals.aiohttp import without_hidden_retries
from azqueue.storage.errors import translate
from azqueue.storage.rest import RestClient, Signer
from azqueue.storage.retry import DEFAULT, RetryPolicy, send

log = logging.getLogger(__name__)

# A user delegation key may last 7 days; ask for one a day, renew it when it has less
# than the longest-lived SAS URL made from it (an hour is plenty) left.
DELEGATION_KEY_LIFETIME = timedelta(days=1)
DELEGATION_KEY_MARGIN = timedelta(hours=2)
DELEGATION_KEY_START_SLACK = timedelta(minutes=5)
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                   "all_proxy")
MAX_CONNECTIONS = 200
# Idle connections are closed before the 5 s after which Azurite (Node) closes them:
# a request sent on a connection just as the other side closes it is lost.
KEEPALIVE = 4.0


class SharedSession:
    """One aiohttp session for the clients of all three services, made on first use.

    It reads proxy settings from the environment only when some are set: aiohttp's
    ``trust_env`` looks them (and ``.netrc``) up again on every request, which costs more
    CPU than the request itself on a busy server.
    """

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def get(self) -> aiohttp.ClientSession:
        if self._session is None:
            proxied = any(os.environ.get(v) for v in PROXY_VARIABLES)
            # aiohttp sends a GET, PUT or DELETE again, unseen, when a reused connection
            # drops: every retry is ours (``storage.retry``), so that we know when an
            # attempt may have been applied unanswered (an update of a message whose new
            # receipt is then unknown).
            self._session = without_hidden_retries(aiohttp.ClientSession(
                trust_env=proxied, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
                connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS,
                                               keepalive_timeout=KEEPALIVE)))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class CountingTransport(AioHttpTransport):  # type: ignore[misc]
    """The SDK's aiohttp transport on the shared session, counting every HTTP request it
    sends, and retrying as ``storage.retry`` says (the SDK clients' own retry policies
    are switched off: one policy for every storage request)."""

    def __init__(self, counter: Counter[str], service: str, shared: SharedSession,
                 policy: RetryPolicy = DEFAULT, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._counter = counter
        self._service = service
        self._shared = shared
        self._policy = policy

    async def open(self) -> None:
        if self.session is None:
            self.session: aiohttp.ClientSession | None = self._shared.get()
        await super().open()

    async def close(self) -> None:
        """Nothing to close: the session is shared, and the account closes it
        (``StorageAccount.close``)."""

    async def send(self, request: Any, **kwargs: Any) -> Any:
        """Send the request as signed (a signature holds for 15 minutes), again while the
        policy allows; the last answer, or the last failure raised."""
        async def attempt(timeout: float, number: int) -> tuple[int, Mapping[str, str], Any]:
            self._counter[f"{self._service} {request.method}"] += 1
            try:
                async with asyncio.timeout(timeout):
                    response = await super(CountingTransport, self).send(request, **kwargs)
            except TimeoutError as e:
                log.info("%s %s: no answer within %.1fs (attempt %d)", request.method,
                         request.url.split("?")[0], timeout, number + 1)
                raise ServiceResponseError(f"no answer within {timeout:.1f}s", error=e)
            return response.status_code, response.headers, response

        def discard(response: Any) -> None:
            response.internal_response.close()  # a body nobody will read

        _, _, response = await send(attempt, self._policy,
                                    discard=discard if kwargs.get("stream") else None)
        return response


def service_endpoint(conn: dict[str, str], service: str) -> str:
    """The endpoint of ``service`` (blob, queue, table) named by a connection string."""
    explicit = conn.get(f"{service}endpoint")
    if explicit:
        return explicit.rstrip("/")
    if "accountname" not in conn:
        raise ConfigError(f"AZQUEUE_STORAGE_CONNECTION_STRING gives neither "
                          f"{service.capitalize()}Endpoint nor AccountName")
    return (f"{conn.get('defaultendpointsprotocol', 'https')}://{conn['accountname']}."
            f"{service}.{conn.get('endpointsuffix', 'core.windows.net')}")


@dataclass
class StorageAccount:
    """Clients for the account's Table, Queue and Blob services, opened and closed together.

    With an account key every SAS is signed with it. With azure-identity there is no key:
    blob SAS URLs are signed with a user delegation key, queue SAS URLs cannot be made.
    """

    settings: StorageSettings
    requests: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        conn = self.settings.connection_string
        options: dict[str, Any] = {}
        if self.settings.ca_file:
            options["connection_verify"] = self.settings.ca_file

        self._session = SharedSession()

        def transport(service: str) -> CountingTransport:
            return CountingTransport(self.requests, service, self._session, **options)

        # The clients are made with ``retry_total=0``: no retries of the SDK's own, the
        # transport retries (see CountingTransport).
        self._own_credential: Any = None
        credential: Any = None
        self._delegation_key: UserDelegationKey | None = None
        self._delegation_expiry = datetime.min.replace(tzinfo=UTC)
        self._delegation_lock = asyncio.Lock()
        self.uses_identity = self.settings.uses_identity
        if self.uses_identity:
            parts = connection_settings(conn)
            url = {s: service_endpoint(parts, s) for s in ("table", "queue", "blob")}
            for service, endpoint in url.items():
                if not endpoint.lower().startswith("https://"):
                    raise ConfigError(
                        f"the {service} endpoint {endpoint} is not https: azure-identity tokens "
                        "are only sent over TLS; use https endpoints, or a connection string "
                        "with AccountKey")
            credential = self.settings.credential
            if credential is None:
                credential = self._own_credential = DefaultAzureCredential()
            self.tables = TableServiceClient(url["table"], credential=credential,
                                             transport=transport("table"), retry_total=0)
            self.queues = QueueServiceClient(url["queue"], credential=credential,
                                             transport=transport("queue"), retry_total=0)
            self.blobs = BlobServiceClient(url["blob"], credential=credential,
                                           transport=transport("blob"), retry_total=0)
            self.account_name: str = parts.get("accountname") or self.queues.account_name or ""
            self.account_key: str | None = None
        else:
            self.tables = TableServiceClient.from_connection_string(
                conn, transport=transport("table"), retry_total=0)
            self.queues = QueueServiceClient.from_connection_string(
                conn, transport=transport("queue"), retry_total=0)
            self.blobs = BlobServiceClient.from_connection_string(
                conn, transport=transport("blob"), retry_total=0)
            self.account_name = self.queues.account_name or ""
            self.account_key = getattr(self.queues.credential, "account_key", None)
        if not self.account_name:
            raise ConfigError("AZQUEUE_STORAGE_CONNECTION_STRING names no AccountName")
        self.rest = RestClient(
            self._session, Signer(self.account_name, self.account_key, credential,
                                  connection_settings(conn).get("sharedaccesssignature")),
            self.tables.url, self.queues.url, self.requests, self.settings.ca_file)

    def public_url(self, service: Literal["queue", "blob"], url: str) -> str:
        """``url``, on the ``service`` endpoint of the connection string, as the clients of
        the API reach it: on ``public_<service>_endpoint`` when that is set. A SAS signs the
        account and the resource, never the host, so it holds on either."""
        public = (self.settings.public_queue_endpoint if service == "queue"
                  else self.settings.public_blob_endpoint)
        internal = (self.queues.url if service == "queue" else self.blobs.url).rstrip("/")
        if not public or not url.startswith(internal):
            return url
        return public.rstrip("/") + url[len(internal):]

    async def user_delegation_key(self, now: datetime) -> UserDelegationKey:
        """A user delegation key (azure-identity only) valid at least until
        ``now + DELEGATION_KEY_MARGIN``; fetched once a day or so, shared by all callers."""
        async with self._delegation_lock:
            if self._delegation_key is None or self._delegation_expiry < now + DELEGATION_KEY_MARGIN:
                expiry = now + DELEGATION_KEY_LIFETIME
                with translate("getting a user delegation key to sign blob SAS URLs"):
                    self._delegation_key = await self.blobs.get_user_delegation_key(
                        now - DELEGATION_KEY_START_SLACK, expiry)
                self._delegation_expiry = expiry
            return self._delegation_key

    def table_name(self, kind: str) -> str:
        return f"{self.settings.prefix}{kind}"

    def queue_name(self, suffix: str) -> str:
        return f"{self.settings.prefix}-{suffix}"

    async def delete_all(self) -> None:
        """Delete every queue, table and blob container of this prefix (a throwaway
        deployment's, in tests): all its state."""
        prefix = self.settings.prefix
        with translate(f"deleting the storage of prefix {prefix}"):
            async for queue in self.queues.list_queues(name_starts_with=f"{prefix}-"):
                await self.queues.delete_queue(queue.name)
            async for table in self.tables.list_tables():
                if table.name.startswith(prefix):
                    await self.tables.delete_table(table.name)
            async for container in self.blobs.list_containers(name_starts_with=f"{prefix}-"):
                await self.blobs.delete_container(container.name)

    async def close(self) -> None:
        await self.tables.close()
        await self.queues.close()
        await self.blobs.close()
        await self._session.close()
        if self._own_credential is not None:
            await self._own_credential.close()
