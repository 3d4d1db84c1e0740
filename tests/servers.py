"""What tests know about the servers the fixtures of ``tests/conftest.py`` start."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from azqueue.api.routing import SERVICES_KEY
from azqueue.config import Client, Settings
from azqueue.service.wiring import Services

# Under CI a missing service (RabbitMQ) fails the tests that need it instead of skipping them.
IN_CI = os.environ.get("CI", "").lower() == "true"
# The root client of every test server.
ROOT = Client("root", "root-access-token-for-tests-0123456789", ("*",))


@dataclass
class Server:
    root_url: str
    app: web.Application
    settings: Settings

    @property
    def api(self) -> str:
        return f"{self.root_url}/api/queue/v1"

    @property
    def services(self) -> Services:
        return self.app[SERVICES_KEY]


# make_server(**settings overrides) -> a started Server.
ServerFactory = Callable[..., Awaitable[Server]]
