"""An embedded Azurite for development and tests: found or installed on first use (see
``azurite_bin``), started on free ports, stopped on exit; a reaper (``azqueue.reaper``)
ends it, and removes its data, when the process that started it is gone without
stopping it (killed by SIGTERM or SIGKILL)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from azqueue import reaper
from azqueue.config import ConfigError

ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public, documented by Microsoft).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
# A checkout's pinned Azurite; a wheel carries a copy of its PIN_FILES in azqueue/azurite/.
AZURITE_DIR = Path(__file__).resolve().parent.parent / "azurite"
PIN_FILES = ("package.json", "package-lock.json")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def azurite_bin(announce: Callable[[str], None] = _say) -> Path:
    """The pinned Azurite: ``AZQUEUE_AZURITE_BIN`` if set; in a checkout, ``azurite/``
    (installed there with ``npm ci`` if missing); otherwise (azqueue installed from a
    wheel) the per-user cache, ``~/.cache/azqueue/azurite-<version>``, installed there
    with npm on first use. An install is announced first (one line, to stderr unless
    ``announce`` says it elsewhere)."""
    override = os.environ.get("AZQUEUE_AZURITE_BIN")
    if override:
        return Path(override)
    if (AZURITE_DIR / "package-lock.json").exists():
        return _installed(AZURITE_DIR, announce)
    pin = pinned_azurite()
    if pin is None:
        raise ConfigError("no Azurite: this azqueue has no pinned Azurite version (neither "
                          f"{AZURITE_DIR} nor the package's own copy exists); reinstall "
                          "azqueue, or set AZQUEUE_AZURITE_BIN to an azurite executable")
    return install_into_cache(pin, announce=announce)


@dataclass(frozen=True, slots=True)
class AzuritePin:
    """The pinned Azurite as shipped in the package: its version, and the ``package.json``
    and ``package-lock.json`` that ``npm ci`` installs exactly."""

    version: str
    files: dict[str, bytes]


def pinned_azurite(package: Traversable | None = None) -> AzuritePin | None:
    """The pin copied into the package from ``azurite/`` when the wheel is built (see
    setup.py); None in a checkout, which uses ``azurite/`` itself."""
    folder = (package or resources.files("azqueue")) / "azurite"
    files: dict[str, bytes] = {}
    for name in PIN_FILES:
        entry = folder / name
        if not entry.is_file():
            return None
        files[name] = entry.read_bytes()
    version = json.loads(files["package.json"])["dependencies"]["azurite"]
    return AzuritePin(str(version), files)


def cache_dir(version: str, env: Mapping[str, str] = os.environ) -> Path:
    """Where the pinned Azurite is installed for this user: ``$XDG_CACHE_HOME/azqueue`` (by
    default ``~/.cache/azqueue``), one folder per version."""
    root = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "azqueue" / f"azurite-{version}"


def npm_command(npm: str, prefix: Path) -> list[str]:
    """The command that installs the pinned tree (its lock file) into ``prefix``."""
    return [npm, "ci", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error"]


def install_into_cache(pin: AzuritePin, env: Mapping[str, str] = os.environ,
                       announce: Callable[[str], None] = _say) -> Path:
    """The cached Azurite of ``pin``, installed with npm first if missing. Installs run
    one at a time per user (a lock file) and into a fresh folder renamed into place, so
    parallel test processes and an interrupted install leave no half-installed tree."""
    target = cache_dir(pin.version, env)
    binary = target / "node_modules" / ".bin" / "azurite"
    if binary.exists():
        return binary
    npm = shutil.which("npm", path=env.get("PATH"))
    if npm is None:
        raise ConfigError(
            f"Azurite {pin.version} (the storage emulator azqueue runs on) is installed with "
            "npm on first use, and npm is not on PATH: install Node.js 20 or newer with npm "
            "(https://nodejs.org, or e.g. `apt install nodejs npm`), or set "
            "AZQUEUE_AZURITE_BIN to an azurite executable")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".azurite-{pin.version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be installing it now
        if binary.exists():
            return binary
        announce(f"installing Azurite {pin.version} (the storage emulator azqueue runs on) "
                 f"with npm into {target}, once for this user; npm takes 20 s to a minute")
        staging = Path(tempfile.mkdtemp(prefix=f".azurite-{pin.version}-", dir=target.parent))
        try:
            for name, content in pin.files.items():
                (staging / name).write_bytes(content)
            done = subprocess.run(npm_command(npm, staging), capture_output=True, text=True)
            if done.returncode != 0:
                raise ConfigError(f"installing Azurite {pin.version} with npm into {target} "
                                  f"failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return binary


def _installed(folder: Path, announce: Callable[[str], None]) -> Path:
    """``folder``'s Azurite (a checkout's ``azurite/``), installed with ``npm ci`` if missing."""
    binary = folder / "node_modules" / ".bin" / "azurite"
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        raise ConfigError("Azurite needs Node.js and npm (Node 20 or newer); install them first")
    announce(f"installing Azurite with npm into {folder}; npm takes 20 s to a minute")
    subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=folder,
                   check=True)
    return binary


def scratch_dir() -> str | None:
    """Where a throwaway Azurite keeps its data: RAM (``/dev/shm``) where there is one,
    else the system's temporary directory.

    Not Azurite's ``--inMemoryPersistence``: its in-memory store sweeps the extents of
    deleted queue messages once a minute in time quadratic in their number, answering
    nothing meanwhile (6,000 messages put and deleted: every request stalled for 33 s).
    On files the same sweep takes milliseconds."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


@dataclass
class Azurite:
    """A running Azurite: ``await Azurite.start()``, later ``await azurite.stop()``."""

    process: asyncio.subprocess.Process
    blob_port: int
    queue_port: int
    table_port: int
    workdir: str
    owns_workdir: bool
    scheme: str = "http"
    # Ends Azurite if this process is gone without stopping it: its process and pipe.
    _reaper: tuple[subprocess.Popen[bytes], int] | None = None

    @property
    def ports(self) -> dict[str, int]:
        """Each service's port: ``{"blob": ..., "queue": ..., "table": ...}``."""
        return {"blob": self.blob_port, "queue": self.queue_port, "table": self.table_port}

    @property
    def endpoints(self) -> str:
        base = f"{self.scheme}://127.0.0.1"
        return (f"BlobEndpoint={base}:{self.blob_port}/{ACCOUNT};"
                f"QueueEndpoint={base}:{self.queue_port}/{ACCOUNT};"
                f"TableEndpoint={base}:{self.table_port}/{ACCOUNT};")

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol={self.scheme};AccountName={ACCOUNT};AccountKey={KEY};"
                + self.endpoints)

    @property
    def identity_connection_string(self) -> str:
        """The same endpoints without the key: requests then sign in with a token."""
        return f"AccountName={ACCOUNT};" + self.endpoints

    @classmethod
    async def start(cls, data_dir: str | None = None, timeout: float = 60.0,
                    tls: tuple[str, str] | None = None, memory: bool = False,
                    announce: Callable[[str], None] = _say) -> Azurite:
        """Start Azurite; with ``tls`` (certificate and key PEM files) it serves HTTPS and
        accepts OAuth bearer tokens too (``--oauth basic``: claims checked, signature not).
        With ``memory`` it keeps its data in its own in-memory store
        (``--inMemoryPersistence``) rather than in files in ``data_dir``: faster by a
        tenth to a fifth, but see ``scratch_dir`` for what it costs."""
        binary = await asyncio.to_thread(azurite_bin, announce)
        workdir = data_dir or tempfile.mkdtemp(prefix="azqueue-azurite-", dir=scratch_dir())
        ports = [free_port(), free_port(), free_port()]
        args = [str(binary), "--silent", "--skipApiVersionCheck", "--disableProductStyleUrl",
                "--disableTelemetry",
                "--blobHost", "127.0.0.1", "--queueHost", "127.0.0.1", "--tableHost", "127.0.0.1",
                "--blobPort", str(ports[0]), "--queuePort", str(ports[1]),
                "--tablePort", str(ports[2])]
        args += ["--inMemoryPersistence"] if memory else ["--location", workdir]
        if tls:
            args += ["--cert", tls[0], "--key", tls[1], "--oauth", "basic"]
        with open(Path(workdir) / "azurite.log", "ab") as log:
            try:
                process = await asyncio.create_subprocess_exec(
                    *args, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                    cwd=workdir, start_new_session=True)
            except OSError as e:
                if data_dir is None:
                    shutil.rmtree(workdir, ignore_errors=True)
                raise ConfigError(f"cannot run Azurite ({binary}): {e.strerror or e}; unset "
                                  "AZQUEUE_AZURITE_BIN to use the pinned one, or point it at "
                                  "an azurite executable") from None
        azurite = cls(process, ports[0], ports[1], ports[2], workdir, owns_workdir=data_dir is None,
                      scheme="https" if tls else "http")
        try:
            azurite._reaper = reaper.watch(process.pid, workdir if data_dir is None else None)
        except BaseException:
            await azurite.stop()
            raise
        try:
            await azurite._wait_ready(timeout)
        except BaseException:
            await azurite.stop()
            raise
        return azurite

    async def _wait_ready(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for port in (self.blob_port, self.queue_port, self.table_port):
            while True:
                if self.process.returncode is not None:
                    output = (Path(self.workdir) / "azurite.log").read_text(errors="replace")
                    raise ConfigError(f"Azurite exited with {self.process.returncode}: "
                                      f"{output[-2000:]}")
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    await writer.wait_closed()
                    break
                except OSError:
                    if loop.time() > deadline:
                        raise ConfigError(f"Azurite did not listen on port {port} within "
                                          f"{timeout:.0f}s") from None
                    await asyncio.sleep(0.1)

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self._reaper is not None:
            watching, self._reaper = self._reaper, None
            await asyncio.to_thread(reaper.release, *watching)
