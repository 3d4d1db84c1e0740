"""``azqueue serve``, ``dev`` and ``resolve``: the server side of the command line.

Each fails in one line that names what is wrong (``ConfigError``, exit status 2, or
``StartupError``, exit status 1), never with a traceback: a setting, a port in use, a
data directory that cannot be made, storage that stays unreachable. Each stops on
SIGINT, SIGTERM and SIGHUP (a closed terminal); ``dev`` then stops its Azurite too.

``serve`` hands its settings to the server, which sets the Blob service's CORS rule for
AZQUEUE_BLOB_CORS_ORIGINS as it starts (``service.wiring.allow_browsers``); ``dev`` sets
them to its own rootUrl on its Azurite, so its dashboard follows live logs.

``dev --data DIR`` keeps Azurite's data, the tip secrets and the root credentials in DIR
(``DEV_STATE``, mode 0600), so a restart keeps every stored task and every pending tip
valid. DIR is made 0700 (Azurite's own files are readable by all). One ``dev`` at a time
uses DIR: it holds a lock on ``DEV_LOCK`` (which names its pid) while it runs, and a
second one says so and exits. Azurite's pid is kept in ``AZURITE_PID``: an Azurite that a
killed ``dev`` left running on DIR is stopped by the next one before it starts its own.

``dev --replicas N`` serves N replicas on its one Azurite (``azqueue.cli.replicas``).
``dev --port 0`` binds a free port before anything starts and serves on that socket
(``_any_port``), so no other process can take the port in between; ``serve`` with
AZQUEUE_PORT=0 does the same, and its log line and default rootUrl name the port.

``dev`` logs no line per request unless asked (``--access-log``, or ``--log-level
DEBUG``): its terminal is for what the developer is doing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import socket
import stat
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from azqueue import __version__
from azqueue.config import ConfigError, Settings, connection_settings, new_secret
from azqueue.cli.replicas import replicas, serving
from azqueue.devstorage import Azurite
from azqueue.errors import StartupError

# The server stack (aiohttp, the Azure SDKs: a second to import) is imported where it is
# first needed, so that what fails before it, such as a `dev --data` directory another
# `dev` holds, fails at once.

log = logging.getLogger("azqueue")

DEV_STATE = "azqueue-dev.json"
DEV_LOCK = "azqueue-dev.lock"
AZURITE_PID = "azurite.pid"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
CONNECT_TIMEOUT = 5.0
T = TypeVar("T")


def run(args: argparse.Namespace) -> int:
    if args.command in ("serve", "dev"):
        from azqueue.api import heap
        heap.fix_mmap_threshold()
    try:
        if args.command == "serve":
            asyncio.run(_stopping(lambda stop: _serve_anywhere(Settings.from_env(), stop)))
        elif args.command == "dev":
            asyncio.run(_stopping(lambda stop: _dev(args, stop)))
        else:
            asyncio.run(_stopping(lambda stop: _resolve(args.which, stop)))
    except StartupError as e:
        print(f"azqueue: {e}", file=sys.stderr)
        return 1
    return 0


async def _stopping(body: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``body(stop)`` with ``stop`` set by SIGINT, SIGTERM or SIGHUP, caught from the
    start: what ``body`` waits for while starting it waits for ``_unless(stop, ...)``."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        await body(stop)
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


async def _unless(stop: asyncio.Event, step: Awaitable[T]) -> T | None:
    """``step``'s result; or, if ``stop`` is set first, None after cancelling ``step``."""
    work = asyncio.ensure_future(step)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not work.done():
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return None
    return work.result()


async def wait_for_storage(settings: Settings) -> None:
    """Connect to each storage endpoint until it answers, for up to ``storage_wait``
    seconds, logging each failed try; then ``StartupError`` naming the endpoint."""
    from azqueue.storage.account import service_endpoint
    try:
        conn = connection_settings(settings.storage.connection_string)
        endpoints = [service_endpoint(conn, s) for s in ("table", "queue", "blob")]
    except ConfigError:
        return  # a form the account itself reports on (e.g. UseDevelopmentStorage)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.storage_wait
    for endpoint in endpoints:
        url = urlsplit(endpoint)
        port = url.port or (443 if url.scheme == "https" else 80)
        while True:
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(url.hostname, port), CONNECT_TIMEOUT)
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
                break
            except (OSError, TimeoutError) as e:
                why = (e.strerror or str(e)) if isinstance(e, OSError) else "no answer"
                left = deadline - loop.time()
                if left <= 0:
                    raise StartupError(
                        f"storage unreachable: {endpoint} ({why}) for "
                        f"{settings.storage_wait:g} s; check AZQUEUE_STORAGE_CONNECTION_STRING "
                        "(or AZQUEUE_STORAGE_WAIT to wait longer)") from None
                log.warning("storage at %s is not reachable yet (%s); retrying for %.0f s more",
                            endpoint, why, left)
                await asyncio.sleep(min(2.0, left))


async def _serve(settings: Settings, stop: asyncio.Event,
                 banner: Callable[[Settings], None] | None = None,
                 sock: socket.socket | None = None) -> None:
    """Serve ``settings`` until ``stop``; with ``sock``, on that socket (bound already to
    ``settings.host`` and ``settings.port``)."""
    await _unless(stop, wait_for_storage(settings))
    if stop.is_set():
        return
    from azqueue.api.app import create_app
    from azqueue.api.connections import ListeningSite, make_runner
    runner = make_runner(create_app(settings), settings)
    try:
        try:
            await runner.setup()
        except (ConfigError, StartupError):
            raise
        except Exception as e:  # storage refused us: one line, the traceback at DEBUG
            log.debug("start-up failed", exc_info=True)
            raise StartupError(f"could not start: {type(e).__name__}: {_first_line(e)} "
                               "(--log-level DEBUG shows the traceback)") from None
        site = ListeningSite(runner, settings.host, settings.port, settings, sock)
        try:
            await site.start()
        except OSError as e:
            raise StartupError(_listen_error(settings, e)) from None
        log.info("serving %s on %s:%d", settings.public_root_url, settings.host, settings.port)
        if banner:
            banner(settings)
        await stop.wait()
    finally:
        await runner.cleanup()


async def _serve_anywhere(settings: Settings, stop: asyncio.Event) -> None:
    """``_serve``; with port 0 on a free port bound first (``_any_port``), the port of
    every setting from there on: the log line and the default rootUrl name it."""
    if settings.port != 0:
        await _serve(settings, stop)
        return
    with _any_port(settings, 1) as held:
        await _serve(settings.with_(port=held.getsockname()[1]), stop, sock=held)


def _check_can_listen(settings: Settings) -> None:
    """StartupError if the server could not listen where ``settings`` say, found out by
    binding that address once (as the server will: reusing one in TIME_WAIT), before
    ``dev`` starts anything."""
    try:
        infos = socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise StartupError(f"cannot listen on {settings.host}:{settings.port}: "
                           f"{e.strerror or e}; check AZQUEUE_HOST") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as e:
                raise StartupError(_listen_error(settings, e)) from None


def _any_port(settings: Settings, count: int) -> socket.socket:
    """A socket bound to a port of ``settings.host`` that no one uses (``dev --port 0``),
    held until the server listens on it: no other process can take the port meanwhile.
    ConfigError for more than one replica (``count``): theirs are consecutive ports."""
    if count > 1:
        raise ConfigError(f"--port 0 (or AZQUEUE_PORT=0), any free port, serves one replica, "
                          f"not {count}: give the port the replicas start from")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            settings.host, 0, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise StartupError(f"cannot listen on {settings.host}: {e.strerror or e}; check "
                           "AZQUEUE_HOST") from None
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise StartupError(_listen_error(settings, e)) from None
    return sock


def _listen_error(settings: Settings, e: OSError) -> str:
    where = f"{settings.host}:{settings.port}"
    if e.errno == errno.EADDRINUSE:
        return (f"cannot listen on {where}: the address is already in use; stop what listens "
                "there or choose another port (AZQUEUE_PORT, or `dev --port`)")
    return f"cannot listen on {where}: {e.strerror or e}; check AZQUEUE_HOST and AZQUEUE_PORT"


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


def _dev_banner(group: list[Settings]) -> None:
    settings = group[0]
    root = settings.public_root_url
    others = "".join(f"\n  replica {i}:    {r.public_root_url}   (port {r.port}, its dashboard "
                     f"at /)" for i, r in enumerate(group[1:], 2))
    what = f"{len(group)} replicas are" if len(group) > 1 else "it is"
    print(f"""
azqueue {__version__}: {what} running on an embedded Azurite (Ctrl-C stops all).

  rootUrl:      {root}
  dashboard:    {root}/{others}
  clientId:     {settings.root.client_id}   (scope *)
  accessToken:  {settings.root.access_token}

Point the official taskcluster client (or any worker) at it:

  export TASKCLUSTER_ROOT_URL={root}
  export TASKCLUSTER_CLIENT_ID={settings.root.client_id}
  export TASKCLUSTER_ACCESS_TOKEN={settings.root.access_token}
""", flush=True)


def dev_state(data_dir: Path | None) -> dict[str, str]:
    """The tip secrets and root credentials of ``dev``: kept in ``data_dir/DEV_STATE``
    (made with mode 0600 on first use) when there is a data directory, fresh otherwise."""
    fresh = {"AZQUEUE_TIP_SECRETS": new_secret(), "AZQUEUE_ROOT_CLIENT_ID": "root",
             "AZQUEUE_ROOT_ACCESS_TOKEN": new_secret()}
    if data_dir is None:
        return fresh
    path = data_dir / DEV_STATE
    try:
        with open(path, encoding="utf-8") as f:
            kept = json.load(f)
        if not isinstance(kept, dict) or set(kept) != set(fresh) or not all(
                isinstance(v, str) and v for v in kept.values()):
            raise ValueError(f"it must hold exactly {sorted(fresh)}")
        return kept
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as e:
        raise StartupError(f"cannot read {path}: {e}; repair it, or delete it to start with "
                           "new credentials (tips pending in DIR then become invalid)") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(fresh, f, indent=2)
    except OSError as e:
        raise StartupError(f"cannot write {path}: {e.strerror or e}") from None
    return fresh


def _data_dir(raw: str | None) -> Path | None:
    if raw is None:
        return None
    path = Path(raw).expanduser()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise StartupError(f"--data {raw}: it exists and is not a directory") from None
    except OSError as e:
        raise StartupError(f"--data {raw}: cannot create it: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise StartupError(f"--data {raw}: not writable by this user")
    _make_private(path, raw)
    return path


def _make_private(path: Path, raw: str) -> None:
    """Make the data directory 0700: Azurite's files in it (every payload and artifact)
    are readable by all, so the directory is what keeps other users out. A directory
    shared with others (sticky, as /tmp) is refused rather than closed to them."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & stat.S_ISVTX:
            raise StartupError(f"--data {raw}: a directory shared with other users (sticky, as "
                               f"/tmp); give a directory of its own, such as {raw}/azqueue")
        if mode & 0o077:
            path.chmod(0o700)
            log.warning("--data %s was open to other users (mode %04o); made it 0700",
                        raw, mode)
    except OSError as e:
        raise StartupError(f"--data {raw}: cannot make it private to this user (mode 0700): "
                           f"{e.strerror or e}") from None


def _lock(data_dir: Path, raw: str) -> int:
    """Hold ``DEV_LOCK`` in ``data_dir`` (released when the process ends, however it
    ends), writing this pid in it; StartupError naming the holder if another has it."""
    path = data_dir / DEV_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise StartupError(f"--data {raw}: cannot create {DEV_LOCK}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StartupError(f"--data {raw} is in use by another `azqueue dev` (pid {holder}); "
                           "stop it first, or give another directory") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _azurite_left_behind(data_dir: Path) -> int | None:
    """The pid recorded in ``AZURITE_PID`` if that process still runs Azurite on
    ``data_dir`` (a ``dev`` killed before it could stop it); None otherwise."""
    try:
        pid = int((data_dir / AZURITE_PID).read_text().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0")]
    except (OSError, ValueError):
        return None
    if not any("azurite" in a for a in argv[:2]) or "--location" not in argv[:-1]:
        return None
    location = argv[argv.index("--location") + 1]
    return pid if os.path.realpath(location) == os.path.realpath(data_dir) else None


async def _stop_left_behind(data_dir: Path) -> None:
    pid = _azurite_left_behind(data_dir)
    if pid is None:
        return
    log.warning("stopping the Azurite (pid %d) that a previous `azqueue dev` left running on %s",
                pid, data_dir)
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        while _azurite_left_behind(data_dir) == pid and loop.time() < end:
            await asyncio.sleep(0.1)
        if _azurite_left_behind(data_dir) != pid:
            return
    raise StartupError(f"the Azurite (pid {pid}) left running on --data {data_dir} does not "
                       "stop; stop it yourself")


def _record_azurite(data_dir: Path, pid: int | None) -> None:
    path = data_dir / AZURITE_PID
    with contextlib.suppress(OSError):
        if pid is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(f"{pid}\n")


def _quiet_requests(args: argparse.Namespace) -> None:
    """No line per request unless ``--access-log`` or the log level is DEBUG."""
    if not args.access_log and logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("azqueue.access").setLevel(logging.WARNING)


def _replicas_log_level(args: argparse.Namespace) -> str:
    """The log level of the replicas ``dev`` starts: its own, but WARNING while it logs no
    line per request (``_quiet_requests``)."""
    level = logging.getLogger().getEffectiveLevel()
    quiet = not args.access_log and level > logging.DEBUG
    return "WARNING" if quiet else logging.getLevelName(level)


async def _dev(args: argparse.Namespace, stop: asyncio.Event) -> None:
    data_dir = _data_dir(args.data)
    lock = _lock(data_dir, args.data) if data_dir else None
    try:
        await _dev_locked(args, data_dir, stop)
    finally:
        if lock is not None:
            os.close(lock)


async def _dev_locked(args: argparse.Namespace, data_dir: Path | None,
                      stop: asyncio.Event) -> None:
    _quiet_requests(args)
    env = dict(os.environ)
    for name, value in dev_state(data_dir).items():
        env.setdefault(name, value)
    if args.port is not None:
        env["AZQUEUE_PORT"] = str(args.port)
    # Check the other settings before Azurite starts (its connection string is not
    # known yet: any well-formed one stands in for it).
    env.pop("AZQUEUE_STORAGE_ACCOUNT_URL", None)
    env["AZQUEUE_STORAGE_CONNECTION_STRING"] = "AccountName=checked-later"
    group = replicas(Settings.from_env(env), args.replicas)
    held = _any_port(group[0], len(group)) if group[0].port == 0 else None
    try:
        if held is None:
            for replica in group:
                _check_can_listen(replica)
        else:  # the port it got is the port of every setting from here on
            env["AZQUEUE_PORT"] = str(held.getsockname()[1])
        await _dev_on_azurite(args, data_dir, env, stop, held)
    finally:
        if held is not None:
            held.close()


async def _dev_on_azurite(args: argparse.Namespace, data_dir: Path | None,
                          env: dict[str, str], stop: asyncio.Event,
                          sock: socket.socket | None) -> None:
    """Start Azurite (stopping one a killed ``dev`` left on ``data_dir`` first), then
    serve the replicas on it, with ``env``'s settings, until ``stop``; the first on
    ``sock`` if given."""
    if data_dir:
        await _stop_left_behind(data_dir)
    azurite = await _unless(stop, Azurite.start(data_dir=str(data_dir) if data_dir else None))
    if azurite is None:
        return
    if data_dir:
        _record_azurite(data_dir, azurite.process.pid)
    try:
        env["AZQUEUE_STORAGE_CONNECTION_STRING"] = azurite.connection_string
        if not env.get("AZQUEUE_BLOB_CORS_ORIGINS"):  # its Azurite: the dashboards read logs
            env["AZQUEUE_BLOB_CORS_ORIGINS"] = ",".join(
                origin for replica in replicas(Settings.from_env(env), args.replicas)
                for origin in _dev_origins(replica.public_root_url))
        group = replicas(Settings.from_env(env), args.replicas)
        async with serving({**env, "AZQUEUE_LOG_LEVEL": _replicas_log_level(args)}, group[1:]):
            await _serve(group[0], stop, lambda settings: _dev_banner(group), sock)
    finally:
        await azurite.stop()
        if data_dir:
            _record_azurite(data_dir, None)


def _dev_origins(root_url: str) -> tuple[str, ...]:
    """The origins of ``dev``'s dashboard: its rootUrl's, and that of the same port on
    localhost when it is 127.0.0.1 (or the other way round)."""
    url = urlsplit(root_url)
    origins = [f"{url.scheme}://{url.netloc}"]
    for mine, other in (("127.0.0.1", "localhost"), ("localhost", "127.0.0.1")):
        if url.hostname == mine:
            origins.append(f"{url.scheme}://{other}" + (f":{url.port}" if url.port else ""))
    return tuple(origins)


async def _resolve(which: str, stop: asyncio.Event) -> None:
    settings = Settings.from_env()
    await _unless(stop, wait_for_storage(settings))
    if stop.is_set():
        return
    from azqueue.background import resolvers
    from azqueue.service.wiring import open_services
    async with open_services(settings) as services:
        if which == "events" and not services.outbox.on:
            raise ConfigError("`azqueue resolve events` needs AZQUEUE_AMQP_URL")
        async with resolvers.running(services, settings,
                                     resolvers.NAMES if which == "all" else (which,)):
            await stop.wait()
