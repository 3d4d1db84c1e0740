"""The release a replica runs, named alike wherever a deployer looks: ``azqueue
--version``, the package's metadata, ``GET __version__`` (under the API and at the root,
Dockerflow's place), the ``azqueue_build_info`` metric, and the release notes."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version as installed_version
from pathlib import Path

import aiohttp

from azqueue import __version__
from azqueue.config import StorageSettings
from azqueue.testing.faultproxy import FaultProxy, Faults
from tests.ops.test_metrics import scrape
from tests.servers import Server, ServerFactory

ROOT = Path(__file__).resolve().parents[2]


def _git_head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


async def test_every_place_names_the_release_this_replica_runs(
        server: Server, anonymous: aiohttp.ClientSession, http: aiohttp.ClientSession) -> None:
    cli = subprocess.run([str(Path(sys.executable).with_name("azqueue")), "--version"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert cli == f"azqueue {__version__}"
    assert installed_version("azqueue") == __version__
    origin = server.root_url.removesuffix("/")
    answers = []
    for url in (f"{server.root_url}/api/queue/v1/__version__", f"{origin}/__version__"):
        async with anonymous.get(url) as r:
            assert r.status == 200, await r.text()
            answers.append(await r.json())
    assert answers[0] == answers[1]
    assert answers[0]["version"] == __version__
    assert answers[0]["commit"] == _git_head()  # a checkout's own commit
    assert set(answers[0]) == {"source", "version", "commit", "build"}
    samples = await scrape(http, server)
    builds = [dict(labels) for (name, labels), n in samples.items()
              if name == "azqueue_build_info" and n == 1]
    assert builds == [{"version": __version__, "commit": _git_head()}]


async def test_dockerflow_heartbeats_answer_at_the_root_too(
        server: Server, anonymous: aiohttp.ClientSession) -> None:
    origin = server.root_url.removesuffix("/")
    for path in ("__heartbeat__", "__lbheartbeat__"):
        async with anonymous.get(f"{origin}/{path}") as r:
            assert (r.status, await r.json()) == (200, {}), path


def test_the_release_notes_start_with_this_release_and_the_upgrades_name_theirs() -> None:
    """CHANGELOG.md has a section per release, this one first; every release the upgrade
    notes name has a section, and no step is keyed to a bare commit."""
    changelog = (ROOT / "CHANGELOG.md").read_text()
    released = re.findall(r"^## (\d+\.\d+\.\d+)\b", changelog, re.M)
    assert released and released[0] == __version__
    assert len(set(released)) == len(released)
    upgrades = (ROOT / "docs" / "operating" / "upgrades.md").read_text()
    named = set(re.findall(r"^## From (\d+\.\d+\.\d+)\b", upgrades, re.M))
    assert named and named <= set(released), named - set(released)
    assert not re.search(r"^## .*\b[0-9a-f]{7}\b", upgrades, re.M)


async def test_the_heartbeat_fails_naming_storage_while_storage_fails(
        make_server: ServerFactory, proxy: FaultProxy, storage_prefix: str,
        anonymous: aiohttp.ClientSession) -> None:
    """Dockerflow's 500 with what failed, within the heartbeat's own time bound; the load
    balancer's heartbeat answers at once all the same (events are off here)."""
    server = await make_server(storage=StorageSettings(proxy.connection_string(),
                                                       storage_prefix))
    proxy.faults = Faults(busy=1.0)
    try:
        async with anonymous.get(f"{server.api}/__heartbeat__") as r:
            assert r.status == 500, await r.text()
            checks = (await r.json())["checks"]
        assert checks["storage"].startswith("storage does not answer") and checks[
            "broker"] == "off"
        async with anonymous.get(f"{server.api}/__lbheartbeat__") as r:
            assert r.status == 200
    finally:
        proxy.faults = Faults()
