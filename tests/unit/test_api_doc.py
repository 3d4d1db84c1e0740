"""The API reference (docs/api/index.md) is written from the route declarations, as
Taskcluster's is from its own: its method tables are the ones scripts/api_table.py makes,
and what a route declares of its stability is what Taskcluster's reference says."""

from __future__ import annotations

import runpy
from pathlib import Path

from taskcluster.generated.queue import Queue

from azqueue.api.app import ROUTES
from azqueue.api.routing import API

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "api" / "index.md"


def test_the_method_tables_are_the_ones_the_route_declarations_make() -> None:
    script = runpy.run_path(str(ROOT / "scripts" / "api_table.py"))
    page = PAGE.read_text(encoding="utf-8")
    assert page == script["with_table"](page), \
        "docs/api/index.md is out of date: run scripts/api_table.py"


def test_every_route_is_in_the_method_tables() -> None:
    page = PAGE.read_text(encoding="utf-8")
    missing = [r.name for r in ROUTES
               if f"| `{r.method} {r.path.removeprefix(API + '/')}` | {r.name}" not in page]
    assert not missing, f"docs/api/index.md does not list {missing}"


def test_each_method_declares_the_stability_taskcluster_gives_it() -> None:
    differ = {r.name: (r.stability, Queue.funcinfo[r.name]["stability"]) for r in ROUTES
              if r.name in Queue.funcinfo and r.stability != Queue.funcinfo[r.name]["stability"]}
    assert not differ, f"declared stability, Taskcluster's: {differ}"


def test_every_route_has_a_title_and_a_category() -> None:
    untitled = [r.name for r in ROUTES if not r.title.strip() or not r.category.strip()]
    assert not untitled
