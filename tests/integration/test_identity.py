"""Storage signed in with azure-identity instead of the account key (DESIGN §3), against an
Azurite that serves HTTPS and checks OAuth bearer tokens.

"With azure-identity alone, blob URLs still work through a user delegation key, while
pollTaskUrls cannot be offered; the server must say so at start-up and answer pollTaskUrls
with a clear error, and claimWork keeps working."
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import HttpResponseError
from azure.storage.queue.aio import QueueServiceClient

from azqueue.config import StorageSettings
from azqueue.devstorage import Azurite
from azqueue.testing.tasks import definition, iso, slugid
from tests.servers import ServerFactory
from tests.tls import self_signed


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class EntraShapedTokens:
    """An async TokenCredential issuing bearer tokens with the claims Microsoft Entra ID
    puts in a storage token (issuer, audience, lifetime). Azurite's ``--oauth basic``
    checks those claims, not the signature, so this stands in for the identity provider
    that a deployment reaches through DefaultAzureCredential."""

    def __init__(self, audience: str = "https://storage.azure.com") -> None:
        self.audience = audience
        self.tenant, self.object_id = str(uuid.uuid4()), str(uuid.uuid4())
        self.requests = 0

    async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.requests += 1
        now = int(time.time())
        claims = {"aud": self.audience, "iss": f"https://sts.windows.net/{self.tenant}/",
                  "tid": self.tenant, "oid": self.object_id,
                  "iat": now, "nbf": now - 60, "exp": now + 3600}
        header = {"alg": "RS256", "typ": "JWT"}
        token = ".".join((_b64url(json.dumps(header).encode()),
                          _b64url(json.dumps(claims).encode()), _b64url(b"unsigned")))
        return AccessToken(token, now + 3600)

    async def close(self) -> None:
        pass

    async def __aenter__(self) -> EntraShapedTokens:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


@pytest.fixture
async def tls_azurite(tmp_path: Path) -> AsyncIterator[tuple[Azurite, str]]:
    cert, key = map(str, self_signed(tmp_path))
    azurite = await Azurite.start(tls=(cert, key))
    try:
        yield azurite, cert
    finally:
        await azurite.stop()


async def test_azurite_refuses_tokens_for_another_audience(
        tls_azurite: tuple[Azurite, str]) -> None:
    """The check that makes the next test mean something: the token is what lets us in."""
    azurite, ca = tls_azurite
    url = f"https://127.0.0.1:{azurite.queue_port}/devstoreaccount1"
    async with QueueServiceClient(url, credential=EntraShapedTokens("https://example.com"),
                                  connection_verify=ca) as queues:
        with pytest.raises(HttpResponseError) as info:
            await queues.create_queue("refused")
    assert info.value.status_code in (401, 403)


async def test_signed_in_with_azure_identity_claim_work_and_artifacts_work_poll_urls_say_why(
        tls_azurite: tuple[Azurite, str], make_server: ServerFactory,
        http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    azurite, ca = tls_azurite
    tokens = EntraShapedTokens()
    caplog.set_level(logging.WARNING, logger="azqueue")
    server = await make_server(storage=StorageSettings(
        azurite.identity_connection_string, "azqid", ca_file=ca, credential=tokens))
    assert tokens.requests > 0  # the tables, queues and container were made with tokens
    assert any("azure-identity" in r.getMessage() and "pollTaskUrls" in r.getMessage()
               for r in caplog.records)

    # pollTaskUrls cannot be offered: a clear 503, not a 500.
    async with http.get(f"{server.api}/poll-task-url/prov/wt") as r:
        assert r.status == 503
        message = (await r.json())["message"]
        assert "account key" in message and "claimWork" in message
    assert not any("incident" in r.getMessage() for r in caplog.records)  # said at start-up

    # claimWork claims through the queue it reaches with tokens.
    task_id = slugid()
    async with http.put(f"{server.api}/task/{task_id}", json=definition("prov/wt")) as r:
        assert r.status == 200, await r.text()
    async with http.post(f"{server.api}/claim-work/prov%2Fwt",
                         json={"workerGroup": "g", "workerId": "w", "tasks": 1}) as r:
        claims = (await r.json())["tasks"]
    assert [c["status"]["taskId"] for c in claims] == [task_id]

    # Blob artifacts: URLs signed with a user delegation key, up- and downloaded over HTTPS.
    name = "public/build/out.txt"
    content = b"made with a user delegation key\n" * 100
    tls = ssl.create_default_context(cafile=ca)
    async with http.post(f"{server.api}/task/{task_id}/runs/0/artifacts/{name}",
                         json={"storageType": "blob", "contentType": "text/plain",
                               "expires": iso(datetime.now(UTC) + timedelta(days=1))}) as r:
        assert r.status == 200, await r.text()
        made = await r.json()
    assert "skoid=" in made["putUrl"] and "sig=" in made["putUrl"]  # delegation SAS
    async with anonymous.put(made["putUrl"], data=content, headers=made["headers"],
                             ssl=tls) as r:
        assert r.status == 201, await r.text()
    async with http.put(f"{server.api}/task/{task_id}/runs/0/artifacts/{name}", json={}) as r:
        assert r.status == 200, await r.text()
    async with anonymous.get(f"{server.api}/task/{task_id}/runs/0/artifacts/{name}",
                             allow_redirects=False) as r:
        assert r.status == 303
        location = r.headers["Location"]
    # Readers get a read-only snapshot taken at finishArtifact, through a delegation SAS
    # for that snapshot alone. Azurite 3.35 cannot check such a SAS (its string to sign
    # for a snapshot leaves out the blob's name and the snapshot's time, which Azure and
    # the SDK include), so the URL's shape is checked here, and reading a snapshot
    # through its SAS by the tests of tests/security/test_artifacts.py with the key.
    query = parse_qs(urlsplit(location).query)
    assert query["sr"] == ["bs"] and query["sp"] == ["r"] and "skoid" in query
    assert query["snapshot"] and query["rsct"] == ["text/plain"]
    # A read URL cannot write.
    async with anonymous.put(location, data=b"overwrite", headers=made["headers"],
                             ssl=tls) as r:
        assert r.status == 403

    async with http.post(f"{server.api}/task/{task_id}/runs/0/completed", json={}) as r:
        assert r.status == 200
        assert (await r.json())["status"]["state"] == "completed"
