"""docs/testing-workers.md as a downstream project reads it: every Python block of the page
is a test module (marked ``<!-- test: FILE -->``), and they all pass when run as written
in a project of their own, with the plugin's fixtures; the marker's settings listed there
are those of ``Settings``, with their types."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from azqueue.config import Settings
from tests.plugin.test_pytest_plugin import INI, run_pytest
from tests.worker.helpers import CHECKOUT

PAGE = Path(CHECKOUT) / "docs" / "testing-workers.md"
_MARKED = re.compile(r"<!-- test: (?P<name>[\w.]+) -->\s*\n```python\n(?P<body>.*?)^```",
                     re.S | re.M)
# Settings a server of the plugin always sets itself.
NOT_SETTABLE = {"storage", "root", "host", "port"}


def example_modules() -> dict[str, str]:
    text = PAGE.read_text()
    modules = {m["name"]: m["body"] for m in _MARKED.finditer(text)}
    assert text.count("```python") == len(modules), "a Python block without <!-- test: -->"
    return modules


def test_every_python_block_of_the_page_is_a_test_module() -> None:
    modules = example_modules()
    assert modules and all(name.startswith("test_") for name in modules), list(modules)
    assert all("def test_" in body for body in modules.values())


def test_the_markers_settings_are_listed_with_their_types() -> None:
    section = PAGE.read_text().split("## Settings of the server for one test", 1)[1]
    section = section.split("\n## ", 1)[0]
    for f in dataclasses.fields(Settings):
        if f.name in NOT_SETTABLE:
            continue
        assert f"`{f.name}`" in section, f"the marker's setting {f.name} is not listed"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_pages_examples_pass_as_written(tmp_path: Path) -> None:
    modules = example_modules()
    (tmp_path / "pytest.ini").write_text(INI)
    for name, body in modules.items():
        (tmp_path / name).write_text(body)
    tests = sum(len(re.findall(r"^(?:async )?def test_", b, re.M)) for b in modules.values())
    done = run_pytest(tmp_path, "-q", timeout=540)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert re.search(rf"\b{tests} passed\b", done.stdout), done.stdout[-3000:]
