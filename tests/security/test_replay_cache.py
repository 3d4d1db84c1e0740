"""What the Hawk replay cache may hold: nonces of a bounded length, only of requests whose
signature verified, each as a digest of fixed size, and at most a fixed number of them."""

from __future__ import annotations

import gc
import time
import tracemalloc

import aiohttp
import mohawk
import pytest

from azqueue.api import hawk
from azqueue.api.routing import AUTH_KEY
from azqueue.config import Client
from tests.servers import Server, ServerFactory

# A client with credentials and no scopes at all.
NOBODY = Client("nobody", "nobody-access-token-0123456789", ())


def _header(server: Server, nonce: str, access_token: str = NOBODY.access_token) -> str:
    sender = mohawk.Sender({"id": NOBODY.client_id, "key": access_token, "algorithm": "sha256"},
                           f"{server.api}/ping", "GET", always_hash_content=False, nonce=nonce)
    return str(sender.request_header)


async def _ping(http: aiohttp.ClientSession, server: Server, authorization: str) -> tuple[int, str]:
    async with http.get(f"{server.api}/ping", headers={"Authorization": authorization}) as r:
        return r.status, (await r.json()).get("message", "")


def _remembered(server: Server) -> int:
    return len(server.app[AUTH_KEY].replays)


async def test_a_hawk_nonce_longer_than_64_characters_is_refused_and_not_remembered(
        make_server: ServerFactory, anonymous: aiohttp.ClientSession) -> None:
    server = await make_server(clients=(NOBODY,), run_resolvers=False)
    for i in range(50):
        status, message = await _ping(anonymous, server, _header(server, f"{i:04d}" + "n" * 7600))
        assert status == 401, message
        assert "at most 64" in message, message
    assert _remembered(server) == 0
    status, message = await _ping(anonymous, server, _header(server, "n" * 64))
    assert status == 200, message
    assert _remembered(server) == 1


async def test_requests_whose_signature_does_not_verify_are_not_remembered(
        make_server: ServerFactory, anonymous: aiohttp.ClientSession) -> None:
    server = await make_server(clients=(NOBODY,), run_resolvers=False)
    for i in range(50):
        status, message = await _ping(anonymous, server, _header(
            server, f"nonce-{i}", access_token="not-the-access-token-0123456789"))
        assert status == 401 and "does not match" in message, message
    assert _remembered(server) == 0
    authorization = _header(server, "once")
    assert (await _ping(anonymous, server, authorization))[0] == 200
    status, message = await _ping(anonymous, server, authorization)
    assert status == 401 and "replayed" in message, message
    assert _remembered(server) == 1


def test_the_replay_cache_holds_at_most_its_cap_dropping_the_entries_closest_to_their_end(
        ) -> None:
    cache = hawk.ReplayCache(max_entries=100)
    now = int(time.time())
    # Timestamps from 10 minutes ago to now: the oldest end first.
    headers = [hawk.HawkHeader(id="c", ts=str(now - 600 + i * 600 // 1000), nonce=f"n{i}",
                               mac="m") for i in range(1000)]
    for h in headers:
        cache.check_and_add(h, now)
    assert len(cache) == 100
    with pytest.raises(hawk.AuthenticationFailed, match="replayed"):
        cache.check_and_add(headers[-1], now)  # the newest are kept
    cache.check_and_add(headers[0], now)  # the oldest went first
    assert len(cache) == 100


def test_the_replay_cache_forgets_a_request_once_its_timestamp_leaves_the_skew_window() -> None:
    cache = hawk.ReplayCache()
    now = int(time.time())
    cache.check_and_add(hawk.HawkHeader(id="c", ts=str(now), nonce="n", mac="m"), now)
    assert len(cache) == 1
    cache.check_and_add(hawk.HawkHeader(id="c", ts=str(now + 901), nonce="m", mac="m"),
                        now + hawk.SKEW_SECONDS + 1)
    assert len(cache) == 1  # the first is gone; the server refuses its ts by now anyway


def test_an_entry_of_the_replay_cache_has_a_fixed_size_whatever_the_client_sent() -> None:
    cache = hawk.ReplayCache()
    now = int(time.time())
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(2000):
            cache.check_and_add(hawk.HawkHeader(
                id=f"client-{i}-" + "c" * 2000, ts=str(now), nonce=f"{i:06d}" + "n" * 58,
                mac="m"), now)
        per_entry = (tracemalloc.get_traced_memory()[0] - before) / 2000
    finally:
        tracemalloc.stop()
    assert per_entry < 400, per_entry
