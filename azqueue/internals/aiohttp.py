"""What azqueue relies on of aiohttp beyond its public API.

Read against aiohttp 3.14.5 (``pyproject.toml`` allows ``>=3.14,<4``).
``tests/unit/test_internals.py`` fails when a release changes any of it:

* **A request handler's progress** (``api.connections``, the header timeout): its
  ``_request_count`` counts the requests whose headers it has parsed, and its ``_waiter``
  is set while it waits for the next request. aiohttp says neither publicly.
* **How a TCP site starts** (``api.connections``, the connection cap): ``BaseSite.start``
  registers a site with its runner, and the site's ``_server`` is the listening server
  that ``stop`` closes. aiohttp takes no protocol of ours for a site's connections, so
  ``listen`` does what ``TCPSite.start`` does with one (and, given a bound socket, what
  ``SockSite.start`` does), with the site's ``_backlog``.
* **A client session's hidden retry** (``storage.account``): a session sends a GET, PUT
  or DELETE again, unseen, when a reused connection drops, unless its
  ``_retry_connection`` is false. There is no public switch for it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import aiohttp
from aiohttp import web


def requests_parsed(handler: web.RequestHandler) -> int:
    """How many requests' headers ``handler`` has parsed on its connection."""
    return handler._request_count


def awaiting_request(handler: web.RequestHandler) -> bool:
    """Whether ``handler`` waits for the next request on its connection (none is being
    handled, and none has been parsed that it has not taken up yet)."""
    return handler._waiter is not None


async def listen(site: web.TCPSite, protocol: Callable[[], asyncio.Protocol],
                 sock: socket.socket | None = None) -> None:
    """Start ``site`` as ``TCPSite.start`` does, each connection it accepts served by a
    ``protocol()`` instead of its runner's server; ``site.stop`` (and the runner's
    cleanup) stops it. Given ``sock``, a bound socket, it listens on that (which it then
    owns) rather than on the site's host and port."""
    await web.BaseSite.start(site)  # registers the site with its runner
    loop = asyncio.get_running_loop()
    if sock is not None:
        site._server = await loop.create_server(protocol, sock=sock, backlog=site._backlog)
        return
    site._server = await loop.create_server(
        protocol, site._host, site._port, backlog=site._backlog,
        reuse_address=site._reuse_address, reuse_port=site._reuse_port)


def without_hidden_retries(session: aiohttp.ClientSession) -> aiohttp.ClientSession:
    """``session``, which from now on gives a request whose reused connection dropped
    back as failed, rather than sending it again on a new connection."""
    session._retry_connection = False
    return session
