"""AZQUEUE_STORAGE_PUBLIC_QUEUE_ENDPOINT / _BLOB_ENDPOINT: the URLs the server hands out
(pollTaskUrls, artifact upload URLs and download redirects) name the storage endpoints
as the clients reach them, not as the server does (docker-compose: `azurite:10001`
inside the network, `localhost:10001` on the host)."""

from __future__ import annotations

import aiohttp
import pytest

from azqueue.config import ConfigError, StorageSettings
from azqueue.devstorage import ACCOUNT, Azurite
from azqueue.testing import sas
from azqueue.testing.tasks import create, definition
from tests.servers import ServerFactory


async def test_urls_handed_out_name_the_public_endpoints_and_work(
        make_server: ServerFactory, azurite: Azurite, storage_prefix: str,
        http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession) -> None:
    # The server reaches Azurite as 127.0.0.1; its clients are told "localhost".
    public_queue = f"http://localhost:{azurite.queue_port}/{ACCOUNT}"
    public_blob = f"http://localhost:{azurite.blob_port}/{ACCOUNT}"
    assert "localhost" not in azurite.connection_string
    server = await make_server(storage=StorageSettings(
        azurite.connection_string, storage_prefix, public_queue_endpoint=public_queue,
        public_blob_endpoint=public_blob))
    task_id = await create(http, server.api, definition("prov/public"))

    urls = await sas.poll_task_urls(http, server.api, "prov", "public")
    for q in urls["queues"]:
        assert q["signedPollUrl"].startswith(f"{public_queue}/"), q
        assert q["signedDeleteUrl"].startswith(f"{public_queue}/"), q
    [message] = await sas.poll_once(anonymous, urls)
    assert message.tip["taskId"] == task_id
    code, claim = await sas.claim(http, server.api, message)
    assert code == 200, claim

    artifact = f"{server.api}/task/{task_id}/runs/0/artifacts/public/hello.txt"
    code, made = await sas.post(http, artifact, {
        "storageType": "blob", "expires": claim["task"]["expires"], "contentType": "text/plain"})
    assert code == 200, made
    assert made["putUrl"].startswith(f"{public_blob}/"), made
    async with anonymous.put(made["putUrl"], data=b"hello", headers=made["headers"]) as r:
        assert r.status == 201, await r.text()
    async with http.put(artifact, json={}) as r:
        assert r.status == 200, await r.text()
    async with anonymous.get(artifact, allow_redirects=False) as r:
        assert r.status == 303
        location = r.headers["Location"]
    assert location.startswith(f"{public_blob}/"), location
    async with anonymous.get(location) as r:
        assert (r.status, await r.read()) == (200, b"hello")


def test_the_public_endpoints_are_read_from_the_environment_and_checked() -> None:
    conn = "UseDevelopmentStorage=true"
    read = StorageSettings.from_env({
        "AZQUEUE_STORAGE_CONNECTION_STRING": conn,
        "AZQUEUE_STORAGE_PUBLIC_QUEUE_ENDPOINT": "http://localhost:10001/devstoreaccount1",
        "AZQUEUE_STORAGE_PUBLIC_BLOB_ENDPOINT": "https://files.example.com/devstoreaccount1"})
    assert (read.public_queue_endpoint, read.public_blob_endpoint) == (
        "http://localhost:10001/devstoreaccount1", "https://files.example.com/devstoreaccount1")
    with pytest.raises(ConfigError, match="AZQUEUE_STORAGE_PUBLIC_BLOB_ENDPOINT='localhost:1' "
                                          "is not an http"):
        StorageSettings.from_env({"AZQUEUE_STORAGE_CONNECTION_STRING": conn,
                                  "AZQUEUE_STORAGE_PUBLIC_BLOB_ENDPOINT": "localhost:1"})
