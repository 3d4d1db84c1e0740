"""An azqueue installed from a wheel (no checkout) finds its pinned Azurite in the user's
cache, installing it there with npm first, or says what to install."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from azqueue import devstorage
from azqueue.config import ConfigError
from azqueue.devstorage import AZURITE_DIR, PIN_FILES, AzuritePin

REPO = Path(__file__).resolve().parents[2]


def shipped_pin(package: Path) -> Path:
    """A package folder holding the pin as the wheel build copies it (setup.py)."""
    (package / "azurite").mkdir(parents=True)
    for name in PIN_FILES:
        shutil.copyfile(AZURITE_DIR / name, package / "azurite" / name)
    return package


def test_the_pin_shipped_in_the_package_is_the_checkouts_azurite_version(tmp_path: Path) -> None:
    pin = devstorage.pinned_azurite(shipped_pin(tmp_path))
    assert pin is not None
    assert pin.version == "3.35.0"
    assert pin.files["package-lock.json"] == (AZURITE_DIR / "package-lock.json").read_bytes()
    assert devstorage.pinned_azurite(tmp_path / "elsewhere") is None


def test_the_cache_is_per_user_and_per_version_and_npm_installs_the_locked_tree() -> None:
    assert devstorage.cache_dir("3.35.0", {"XDG_CACHE_HOME": "/c"}) == \
        Path("/c/azqueue/azurite-3.35.0")
    assert devstorage.cache_dir("3.35.0", {}) == \
        Path.home() / ".cache" / "azqueue" / "azurite-3.35.0"
    assert devstorage.npm_command("npm", Path("/c/x"))[:4] == ["npm", "ci", "--prefix", "/c/x"]


def test_the_build_ships_the_pin_and_declares_the_plugin() -> None:
    assert "azurite/package.json" in (REPO / "MANIFEST.in").read_text()
    assert '"package.json", "package-lock.json"' in (REPO / "setup.py").read_text()
    assert 'azqueue = "azqueue.testing.pytest_plugin"' in (REPO / "pyproject.toml").read_text()


def test_without_npm_the_error_says_to_install_nodejs(tmp_path: Path) -> None:
    pin = AzuritePin("3.35.0", {name: (AZURITE_DIR / name).read_bytes() for name in PIN_FILES})
    with pytest.raises(ConfigError, match=r"install Node\.js 20 or newer with npm.*"
                                          r"AZQUEUE_AZURITE_BIN"):
        devstorage.install_into_cache(pin, {"PATH": str(tmp_path), "XDG_CACHE_HOME":
                                            str(tmp_path / "cache")})
    assert not (tmp_path / "cache" / "azqueue" / "azurite-3.35.0").exists()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_first_start_installs_the_pinned_azurite_into_the_cache(tmp_path: Path) -> None:
    """One real install from the npm registry (about half a minute)."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    pin = devstorage.pinned_azurite(shipped_pin(tmp_path / "package"))
    assert pin is not None
    env = {"PATH": os.environ["PATH"], "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "HOME": os.environ.get("HOME", str(tmp_path))}
    said: list[str] = []
    binary = devstorage.install_into_cache(pin, env, said.append)
    assert said == [f"installing Azurite 3.35.0 (the storage emulator azqueue runs on) with "
                    f"npm into {tmp_path / 'cache' / 'azqueue' / 'azurite-3.35.0'}, once for "
                    "this user; npm takes 20 s to a minute"]
    assert binary == tmp_path / "cache" / "azqueue" / "azurite-3.35.0" / "node_modules" / \
        ".bin" / "azurite"
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                             timeout=60)
    assert version.stdout.strip() == "3.35.0"
    assert devstorage.install_into_cache(pin, env, said.append) == binary  # installed once
    assert len(said) == 1
    assert [p.name for p in (tmp_path / "cache" / "azqueue").iterdir()
            if not p.name.endswith(".lock")] == ["azurite-3.35.0"]
