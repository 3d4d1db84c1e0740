"""AZQUEUE_BLOB_CORS_ORIGINS: `azqueue serve` lets pages of those origins read blobs (the
dashboard following a live log), keeping the account's other CORS rules."""

from __future__ import annotations

import os

import aiohttp
from azure.storage.blob import CorsRule
from azure.storage.blob.aio import BlobServiceClient

from azqueue.devstorage import ACCOUNT, Azurite, free_port
from tests.cli.helpers import azqueue, one_line_error
from tests.servers import ROOT
from tests.serving import serve


async def _preflight(azurite: Azurite, origin: str) -> str | None:
    """The origin blob storage allows for a Range GET from a page of ``origin``."""
    async with aiohttp.ClientSession() as session, session.options(
            f"http://127.0.0.1:{azurite.blob_port}/{ACCOUNT}/any/blob", headers={
                "Origin": origin, "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "range"}) as r:
        return r.headers.get("Access-Control-Allow-Origin")


async def test_serve_sets_a_cors_rule_for_the_origins_and_keeps_the_other_rules(
        azurite: Azurite, storage_prefix: str) -> None:
    dashboard = "https://dash.example.com"
    async with BlobServiceClient.from_connection_string(azurite.connection_string) as blobs:
        await blobs.set_service_properties(cors=[CorsRule(["https://other.example.com"], ["PUT"])])
        try:
            assert await _preflight(azurite, dashboard) is None
            for _ in range(2):  # a restart finds the rule there and leaves it
                async with serve(azurite, storage_prefix, "", free_port(),
                                 AZQUEUE_BLOB_CORS_ORIGINS=f"{dashboard}/, http://127.0.0.1:9"):
                    pass
            rules = (await blobs.get_service_properties())["cors"]
            assert [(r.allowed_origins, r.allowed_methods) for r in rules] == [
                ("https://other.example.com", "PUT"),
                (f"{dashboard},http://127.0.0.1:9", "GET,HEAD")]
            assert "content-range" in rules[1].exposed_headers
            assert await _preflight(azurite, dashboard) == dashboard
        finally:
            await blobs.set_service_properties(cors=[])


async def test_an_origin_that_is_no_origin_is_refused_in_one_line(azurite: Azurite) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZQUEUE_")}
    done = await azqueue("serve", env={
        **env, "AZQUEUE_STORAGE_CONNECTION_STRING": azurite.connection_string,
        "AZQUEUE_TIP_SECRETS": "s" * 32, "AZQUEUE_ROOT_CLIENT_ID": ROOT.client_id,
        "AZQUEUE_ROOT_ACCESS_TOKEN": ROOT.access_token,
        "AZQUEUE_BLOB_CORS_ORIGINS": "https://dash.example.com/dashboard"})
    assert done.returncode == 2
    assert one_line_error(done) == (
        "azqueue: AZQUEUE_BLOB_CORS_ORIGINS: 'https://dash.example.com/dashboard' is not an "
        "origin; write scheme://host[:port] with no path (the dashboard's address, e.g. "
        "https://queue.example.com), or *")
