"""A headless Chromium for the tests that drive one (Debian's ``chromium`` and
``chromium-driver``, through Selenium): the ``browser`` fixture, which a test module
imports. Skipped when Chromium is missing, except under CI (``scripts/bootstrap --test``
installs it there).

The driver keeps the console (``get_log("browser")``) and the DevTools network events
(``get_log("performance")``: every request the page made)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.servers import IN_CI

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        if IN_CI:
            raise
        pytest.skip("selenium is not installed (the test extra)")
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        if IN_CI:
            pytest.fail("Chromium and ChromeDriver are missing: scripts/bootstrap --test "
                        "installs Debian's chromium and chromium-driver")
        pytest.skip("Debian's chromium and chromium-driver are not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = await asyncio.to_thread(webdriver.Chrome, options=options,
                                     service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        await asyncio.to_thread(driver.quit)
