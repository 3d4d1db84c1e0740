"""Hawk-signed requests to the queue API from a plain aiohttp session, signed by mohawk
(the library the official client signs with), for tests and benchmarks that speak HTTP
themselves rather than through a client."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import mohawk


def hawk_signer(client_id: str, access_token: str,
                certificate: str | None = None) -> aiohttp.ClientMiddlewareType:
    """An aiohttp client middleware that signs each request to the queue API (a path under
    ``/api/queue/``; not those to Azure through SAS URLs) as the official client does;
    ``certificate`` (the JSON of temporary credentials' certificate) goes in Hawk's ``ext``."""
    ext = None
    if certificate:
        ext = base64.urlsafe_b64encode(
            json.dumps({"certificate": json.loads(certificate)}).encode()).decode()

    async def sign(request: aiohttp.ClientRequest,
                   handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
        if request.url.path.startswith("/api/queue/"):
            sender = mohawk.Sender({"id": client_id, "key": access_token, "algorithm": "sha256"},
                                   str(request.url), request.method, always_hash_content=False,
                                   ext=ext)
            request.headers["Authorization"] = sender.request_header
        return await handler(request)

    return sign


@asynccontextmanager
async def signed_session(client_id: str, access_token: str,
                         connections: int = 100) -> AsyncIterator[aiohttp.ClientSession]:
    """An aiohttp session signing as ``client_id``, at most ``connections`` at once."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections),
                                     middlewares=(hawk_signer(client_id, access_token),)) as http:
        yield http
