"""The documentation site as a reader gets it: built as CI builds it (mkdocs.yml, with this
checkout's mkdocs), it loads nothing from elsewhere, so an offline reader sees the same
pages and diagrams; and its Getting started page holds README's quickstart, the blocks
``test_readme_quickstart.py`` runs, as they are written there."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from azqueue.config.variables import SETTINGS
from tests.browser import browser  # noqa: F401 - the fixture
from tests.docs.test_readme_quickstart import README, quickstart_blocks
from tests.waiting import eventually
from tests.worker.helpers import CHECKOUT

MKDOCS = Path(sys.executable).parent / "mkdocs"
# A URL that names its own scheme (https:, http:, ftp:, …) or host (//host/…) leads
# elsewhere; data: stays in the page, a path (404.html's are absolute) on the site's host.
ELSEWHERE = re.compile(r"^\s*(//|(?!data:)[a-zA-Z][a-zA-Z0-9+.-]*:)")
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+['"]([^'"]+)""")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as .ci/run builds it."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--quiet", "--site-dir", str(out)], cwd=CHECKOUT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 0, f"mkdocs build failed:\n{done.stdout}\n{done.stderr}"
    return out


class _Loads(HTMLParser):
    """What a page makes the browser fetch: every ``src``/``srcset``/``poster``/``data``,
    a ``<link>``'s ``href``, and ``url()`` in inline styles. Not ``<a href>``: a link is
    followed only if the reader clicks it."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("src", "poster", "data") or (name == "href" and tag == "link"):
                self.urls.append(value)
            elif name == "srcset":
                self.urls.extend(part.split()[0] for part in value.split(",") if part.strip())
            elif name == "style":
                self.urls.extend(a or b for a, b in CSS_URL.findall(value))


def loaded_from_elsewhere(site: Path) -> Iterator[str]:
    for page in sorted(site.rglob("*.html")):
        parser = _Loads()
        parser.feed(page.read_text())
        for url in parser.urls:
            if ELSEWHERE.match(url):
                yield f"{page.relative_to(site)}: {url}"
    for sheet in sorted(site.rglob("*.css")):
        for a, b in CSS_URL.findall(sheet.read_text()):
            if ELSEWHERE.match(a or b):
                yield f"{sheet.relative_to(site)}: {a or b}"


def test_every_page_loads_only_the_sites_own_files(site: Path) -> None:
    """No page names a font, script, style sheet or image elsewhere (Google Fonts, a CDN's
    Mermaid), and what the pages name relatively is in the site."""
    assert list(loaded_from_elsewhere(site)) == []
    index = (site / "index.html").read_text()
    scripts = re.findall(r'<script src="([^"]+)"', index)
    assert "javascripts/mermaid.tiny.js" in scripts, scripts
    for src in scripts:
        assert (site / src).is_file(), f"index.html loads {src}, which the site lacks"


def code_blocks(page: str) -> list[str]:
    """The text of each ``<pre>`` of a built page, as a reader copies it."""
    return [html.unescape(re.sub(r"<[^>]+>", "", block))
            for block in re.findall(r"<pre\b[^>]*>(.*?)</pre>", page, re.S)]


def test_getting_started_holds_readmes_quickstart_as_it_is_run(site: Path) -> None:
    """Every block README's quickstart test runs is on the site's Getting started page, in
    the same order, word for word: the page a newcomer lands on runs end to end."""
    shown = code_blocks((site / "getting-started" / "index.html").read_text())
    run = [block.body for block in quickstart_blocks(README.read_text())]
    assert len(run) >= 4, run
    at = 0
    for body in run:
        found = [i for i, text in enumerate(shown) if i >= at and text.strip() == body.strip()]
        assert found, f"Getting started lacks (after block {at}) README's block:\n{body}"
        at = found[0] + 1


@pytest.fixture
async def served(site: Path) -> AsyncIterator[str]:
    """The built site on a local HTTP server, as a reader's web server would serve it."""
    app = web.Application()

    async def index(request: web.Request) -> web.StreamResponse:
        path = site / request.match_info["path"]
        return web.FileResponse(path / "index.html" if path.is_dir() else path)

    app.router.add_get("/{path:.*}", index)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/"
    finally:
        await runner.cleanup()


def requested(driver: Any) -> list[str]:
    """The URLs the pages asked for since the last call (DevTools' network events)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


@pytest.mark.browser
async def test_pages_draw_their_diagrams_asking_nothing_of_other_hosts(
        served: str, browser: Any) -> None:  # noqa: F811 - the fixture
    """In Chromium, the home page draws its sequence diagram (Mermaid replaces the block of
    text with a drawing) and every request of the pages goes to the site's own server."""
    urls: list[str] = []
    for page in ("", "getting-started/", "operating/azure-storage/"):
        await asyncio.to_thread(browser.get, served + page)
        urls += await asyncio.to_thread(requested, browser)
    await asyncio.to_thread(browser.get, served)

    def drawn() -> bool:
        return bool(browser.execute_script(
            "const d = document.querySelector('div.mermaid');"
            "return d !== null && d.getBoundingClientRect().height > 100"))

    await eventually(lambda: asyncio.to_thread(drawn), lambda ok: ok,
                     what="the home page's sequence diagram drawn by Mermaid")
    urls += await asyncio.to_thread(requested, browser)
    assert urls and all(u.startswith((served, "data:", "blob:")) for u in urls), [
        u for u in urls if not u.startswith((served, "data:", "blob:"))]


def test_the_operating_pages_name_only_variables_that_exist() -> None:
    """Every ``AZQUEUE_*`` the pages of *Operating it* name is a setting of the server."""
    known = {s.variable for s in SETTINGS}
    named = {(page.name, v) for page in (Path(CHECKOUT) / "docs" / "operating").glob("*.md")
             for v in re.findall(r"\bAZQUEUE_[A-Z_]*[A-Z]\b", page.read_text())}
    assert {(page, v) for page, v in named if v not in known} == set()
