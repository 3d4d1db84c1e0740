"""The release this process runs: its version (``azqueue.__version__``, the one place the
version is written; packaging and ``azqueue --version`` read it there), and the commit
and build it was made from.

An image records the commit and build in ``version.json`` beside this module when it is
built (the Dockerfile's ``COMMIT`` and ``BUILD`` arguments, Dockerflow's convention); a
git checkout's commit is read from git; otherwise they are empty.
"""

from __future__ import annotations

import functools
import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from azqueue import __version__

SOURCE = "https://github.com/azqueue/azqueue"
VERSION_FILE = Path(__file__).with_name("version.json")


@dataclass(frozen=True, slots=True)
class Release:
    """Dockerflow's ``version.json``: where the source is, the version, the commit and
    the build (a CI run's address, or empty)."""

    source: str
    version: str
    commit: str
    build: str

    def as_json(self) -> dict[str, str]:
        return asdict(self)


def _checkout_commit() -> str:
    """The commit of the git checkout this package is in, or "" if none."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return ""
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


@functools.cache
def current() -> Release:
    """This process's release, read once."""
    recorded: dict[str, object] = {}
    try:
        recorded = json.loads(VERSION_FILE.read_text())
    except (OSError, ValueError):
        pass
    commit = str(recorded.get("commit") or "") or _checkout_commit()
    return Release(source=SOURCE, version=__version__, commit=commit,
                   build=str(recorded.get("build") or ""))
