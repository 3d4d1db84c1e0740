"""The web dashboard: static files served at ``/`` that read the queue's own API in the
browser, with the browser's (anonymous) scopes."""

from __future__ import annotations

from importlib import resources

from aiohttp import web

FILES = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
# Scripts only from here (nothing the API returns can run), data from anywhere (artifacts
# redirect to blob storage), never framed.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src *; img-src 'self' data:; "
                               "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return (resources.files(__package__) / name).read_bytes()


def add_routes(router: web.UrlDispatcher) -> None:
    """``GET /`` (the page) and ``GET /dashboard/<file>``."""
    contents = {name: _read(name) for name in FILES}

    def serve(name: str) -> web.Response:
        return web.Response(body=contents[name], content_type=FILES[name], charset="utf-8",
                            headers=HEADERS)

    async def page(request: web.Request) -> web.Response:
        return serve("index.html")

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in FILES:
            raise web.HTTPNotFound(text=f"no dashboard file {name!r}")
        return serve(name)

    router.add_get("/", page)
    router.add_get("/dashboard/{name}", asset)
