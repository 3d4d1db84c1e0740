"""One list of settings (azqueue.config.SETTINGS): the settings page's table is the one
scripts/settings_table.py writes from it, and it names exactly the AZQUEUE_ variables the
code reads."""

from __future__ import annotations

import dataclasses
import re
import runpy
from pathlib import Path

from azqueue.config import SETTINGS, Settings, StorageSettings

ROOT = Path(__file__).resolve().parents[2]
VARIABLE = re.compile(r"AZQUEUE_[A-Z0-9_]*[A-Z0-9]")


def test_the_settings_table_is_the_one_the_list_of_settings_makes() -> None:
    script = runpy.run_path(str(ROOT / "scripts" / "settings_table.py"))
    page = (ROOT / "docs" / "operating" / "settings.md").read_text(encoding="utf-8")
    assert page == script["with_table"](page), \
        "docs/operating/settings.md is out of date: run scripts/settings_table.py"


def test_every_variable_azqueue_names_is_in_the_list_of_settings() -> None:
    """In the package and in the scripts (a benchmark that sets a variable the server
    does not read measures something else than it says)."""
    sources = [*(ROOT / "azqueue").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]
    named = {n for p in sources for n in VARIABLE.findall(p.read_text())}
    missing = named - {s.variable for s in SETTINGS}
    assert not missing, f"add these to SETTINGS in azqueue/config/variables.py: {sorted(missing)}"


def test_every_setting_is_read() -> None:
    """One that from_env does not parse is read by code of its own: named again there."""
    text = "".join(p.read_text() for p in (ROOT / "azqueue").rglob("*.py"))
    unread = [s.variable for s in SETTINGS if s.parse is None and text.count(s.variable) < 2]
    assert not unread, f"SETTINGS lists variables azqueue never reads: {unread}"


def test_every_setting_names_a_field_that_exists() -> None:
    names = {f.name for f in dataclasses.fields(Settings)} | {
        f"storage.{f.name}" for f in dataclasses.fields(StorageSettings)}
    assert not [s.variable for s in SETTINGS if s.field and s.field not in names]
    assert all(s.field for s in SETTINGS if s.parse is not None)


def test_test_only_variables_are_not_presented_as_settings() -> None:
    """AZQUEUE_TEST_* variables are the tests' (Contributing lists them), not a deployment's."""
    page = (ROOT / "docs" / "operating" / "settings.md").read_text(encoding="utf-8")
    contributing = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    for setting in SETTINGS:
        assert setting.test_only == setting.variable.startswith("AZQUEUE_TEST_")
        if setting.test_only:
            assert setting.variable not in page
            assert f"`{setting.variable}`" in contributing, setting.variable
