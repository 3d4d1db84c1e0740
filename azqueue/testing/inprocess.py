"""An azqueue server on the running event loop, as the tests and the pytest plugin start
them: the application ``create_app`` builds (or one the caller built from it) behind the
same runner and listening site as ``azqueue serve``'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from azqueue.api.app import create_app
from azqueue.api.connections import ListeningSite, make_runner
from azqueue.api.routing import SERVICES_KEY
from azqueue.config import Settings
from azqueue.service.wiring import Services


@dataclass
class InProcessServer:
    """A running azqueue serving ``settings`` (on ``settings.host`` and ``settings.port``)
    with ``app``, until ``stop()``."""

    settings: Settings
    runner: web.AppRunner = field(repr=False)

    @property
    def root_url(self) -> str:
        return self.settings.public_root_url

    @property
    def api(self) -> str:
        return f"{self.root_url}/api/queue/v1"

    @property
    def app(self) -> web.Application:
        return self.runner.app

    @property
    def services(self) -> Services:
        return self.app[SERVICES_KEY]

    @classmethod
    async def start(cls, settings: Settings, app: web.Application | None = None, *,
                    shutdown_timeout: float | None = None,
                    handler_cancellation: bool = False) -> InProcessServer:
        """Serve ``app`` (default: ``create_app(settings)``). ``shutdown_timeout``: how
        long ``stop()`` lets the requests still being answered finish (default aiohttp's,
        a minute); with ``handler_cancellation``, a request whose client went away is
        cancelled rather than answered to nobody."""
        options: dict[str, Any] = {"handler_cancellation": handler_cancellation}
        if shutdown_timeout is not None:
            options["shutdown_timeout"] = shutdown_timeout
        runner = make_runner(create_app(settings) if app is None else app, settings, **options)
        await runner.setup()
        try:
            await ListeningSite(runner, settings.host, settings.port, settings).start()
        except BaseException:
            await runner.cleanup()
            raise
        return cls(settings, runner)

    async def stop(self) -> None:
        await self.runner.cleanup()
