"""The settings page lists exactly the AZQUEUE_ variables the code reads."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VARIABLE = re.compile(r"AZQUEUE_[A-Z0-9_]*[A-Z0-9]")


def _documented() -> set[str]:
    """The variables named in the first column of docs/operating/settings.md's table."""
    names: set[str] = set()
    for line in (ROOT / "docs" / "operating" / "settings.md").read_text().splitlines():
        if line.startswith("| `AZQUEUE_"):
            names.update(VARIABLE.findall(line.split("|")[1]))
    return names


def _read_by(paths: list[Path]) -> set[str]:
    return {name for path in paths for name in VARIABLE.findall(path.read_text())
            if not name.startswith("AZQUEUE_TEST_")}


def test_every_setting_of_config_py_is_in_the_settings_table() -> None:
    missing = _read_by([ROOT / "azqueue" / "config.py"]) - _documented()
    assert not missing, f"add these to docs/operating/settings.md: {sorted(missing)}"


def test_every_variable_of_the_settings_table_is_read_by_azqueue() -> None:
    read = _read_by(sorted((ROOT / "azqueue").rglob("*.py")))
    unknown = _documented() - read
    assert not unknown, f"docs/operating/settings.md names variables azqueue never reads: " \
                        f"{sorted(unknown)}"


def test_test_only_variables_are_not_presented_as_settings() -> None:
    """AZQUEUE_TEST_* variables are the tests' (Contributing lists them), not a deployment's."""
    assert not {n for n in _documented() if n.startswith("AZQUEUE_TEST_")}
    contributing = (ROOT / "docs" / "contributing.md").read_text()
    read = {n for p in (ROOT / "azqueue").rglob("*.py") for n in VARIABLE.findall(p.read_text())}
    for name in sorted(n for n in read if n.startswith("AZQUEUE_TEST_")):
        assert f"`{name}`" in contributing, name
