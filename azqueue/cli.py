"""The command line: arguments -> Settings -> run."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable

from aiohttp import web

from azqueue import __version__, logs
from azqueue.api.app import create_app
from azqueue.background import resolvers
from azqueue.config import ConfigError, Settings, new_secret
from azqueue.devstorage import Azurite
from azqueue.service.wiring import open_services
from azqueue.worker import commands

log = logging.getLogger("azqueue")


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _serve(settings: Settings, banner: Callable[[Settings], None] | None = None) -> None:
    runner = web.AppRunner(create_app(settings), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
        log.info("serving %s on %s:%d", settings.public_root_url, settings.host, settings.port)
        if banner:
            banner(settings)
        await _until_signalled()
    finally:
        await runner.cleanup()


def _dev_banner(settings: Settings) -> None:
    root = settings.public_root_url
    print(f"""
azqueue {__version__} is running on an embedded Azurite (Ctrl-C stops both).

  rootUrl:      {root}
  clientId:     {settings.root.client_id}   (scope *)
  accessToken:  {settings.root.access_token}

Point the official taskcluster client (or any worker) at it:

  export TASKCLUSTER_ROOT_URL={root}
  export TASKCLUSTER_CLIENT_ID={settings.root.client_id}
  export TASKCLUSTER_ACCESS_TOKEN={settings.root.access_token}
""", flush=True)


async def _dev(args: argparse.Namespace) -> None:
    azurite = await Azurite.start(data_dir=args.data)
    try:
        env = dict(os.environ)
        env["AZQUEUE_STORAGE_CONNECTION_STRING"] = azurite.connection_string
        env.setdefault("AZQUEUE_TIP_SECRETS", new_secret())
        env.setdefault("AZQUEUE_ROOT_CLIENT_ID", "root")
        env.setdefault("AZQUEUE_ROOT_ACCESS_TOKEN", new_secret())
        if args.port is not None:
            env["AZQUEUE_PORT"] = str(args.port)
        settings = Settings.from_env(env)
        await _serve(settings, _dev_banner)
    finally:
        await azurite.stop()


async def _resolve(which: str) -> None:
    settings = Settings.from_env()
    async with open_services(settings) as services:
        if which == "events" and services.outbox is None:
            raise ConfigError("`azqueue resolve events` needs AZQUEUE_AMQP_URL")
        async with resolvers.running(services, settings,
                                     resolvers.NAMES if which == "all" else (which,)):
            await _until_signalled()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="azqueue", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get("AZQUEUE_LOG_LEVEL") or "INFO")
    parser.add_argument("--log-format", choices=logs.FORMATS,
                        default=os.environ.get("AZQUEUE_LOG_FORMAT") or "text",
                        help="text, or json: one JSON object per line (AZQUEUE_LOG_FORMAT)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="serve the API and run the resolvers (configured by AZQUEUE_*)")
    dev = sub.add_parser("dev", help="serve on a private Azurite started and stopped with it")
    dev.add_argument("--data", metavar="DIR", help="keep Azurite's data in DIR (default: in memory)")
    dev.add_argument("--port", type=int, help="HTTP port (default: AZQUEUE_PORT, or its default)")
    resolve = sub.add_parser("resolve", help="run background resolvers alone, for scaling out")
    resolve.add_argument("which", choices=[*resolvers.NAMES, "all"])
    commands.add_parsers(sub)
    args = parser.parse_args(argv)

    logs.configure(args.log_level, args.log_format)
    if args.command in ("worker", "task"):
        return commands.run(args)
    try:
        if args.command == "serve":
            asyncio.run(_serve(Settings.from_env()))
        elif args.command == "dev":
            asyncio.run(_dev(args))
        else:
            asyncio.run(_resolve(args.which))
    except ConfigError as e:
        print(f"azqueue: {e.message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
