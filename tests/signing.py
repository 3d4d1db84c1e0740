"""Hawk signing for plain aiohttp sessions, done by mohawk (what the official client uses)."""

from __future__ import annotations

import base64
import json

import aiohttp
import mohawk


def hawk_signer(client_id: str, access_token: str,
               certificate: str | None = None) -> aiohttp.ClientMiddlewareType:
    """Sign requests to the queue API (not those to Azure) as the official client does."""

    async def sign(request: aiohttp.ClientRequest,
                   handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
        if request.url.path.startswith("/api/queue/"):
            ext = None
            if certificate:
                ext = base64.urlsafe_b64encode(
                    json.dumps({"certificate": json.loads(certificate)}).encode()).decode()
            sender = mohawk.Sender({"id": client_id, "key": access_token, "algorithm": "sha256"},
                                   str(request.url), request.method, always_hash_content=False,
                                   ext=ext)
            request.headers["Authorization"] = sender.request_header
        return await handler(request)

    return sign
