#!/usr/bin/env python3
"""Writes the method table of docs/api/index.md from the route declarations.

Each route (``azqueue/api/endpoints/*.py``) declares its title, description and
stability, and its module's table its category; the page gets one table per category,
one row per route, between the two marker comments; everything else on the page is left
as it is. `--check` writes nothing and exits 1 when the page's tables are not the ones
the declarations make (tests/unit/test_api_doc.py checks the same).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from azqueue.api.app import ROUTES  # noqa: E402
from azqueue.api.routing import API, Route  # noqa: E402
from azqueue.model.scopes import Template  # noqa: E402
from doctable import Generated  # noqa: E402


def scopes(template: Template | None, nested: bool = False) -> str:
    """The scope expression a route declares, in words."""
    if template is None:
        return "none"
    if isinstance(template, str):
        return f"`{template}`"
    if "AllOf" in template or "AnyOf" in template:
        joint, parts = ("and", template["AllOf"]) if "AllOf" in template else \
            ("or", template["AnyOf"])
        assert isinstance(parts, list)
        said = f" {joint} ".join(scopes(p, nested=True) for p in parts)
        return f"({said})" if nested and len(parts) > 1 else said
    if "for" in template:
        return f"{scopes(_template(template['each']))} for each of `{template['in']}`"
    return f"{scopes(_template(template['then']))} if {template['if']}"


def _template(value: object) -> Template:
    assert isinstance(value, str | Mapping), value
    return value  # type: ignore[return-value]


def row(route: Route) -> str:
    path = route.path.removeprefix(f"{API}/")
    method = route.name if route.stability == "stable" else f"{route.name} ({route.stability})"
    what = f"{route.title}: {route.description}" if route.description else route.title
    return f"| `{route.method} {path}` | {method} | {scopes(route.scopes)} | {what} |"


def table() -> str:
    """A table for each category, its routes in the order they are declared."""
    categories = list(dict.fromkeys(r.category for r in ROUTES))
    return "\n\n".join(
        "\n".join([f"### {category}", "", "| route | method | scopes | what it does |",
                   "| --- | --- | --- | --- |",
                   *(row(r) for r in ROUTES if r.category == category)])
        for category in categories)


GENERATED = Generated(
    page=ROOT / "docs" / "api" / "index.md",
    begin="<!-- method table: written by scripts/api_table.py from the route declarations -->",
    end="<!-- end of method table -->", table=table, script="scripts/api_table.py")
with_table = GENERATED.with_table


if __name__ == "__main__":
    sys.exit(GENERATED.main(sys.argv[1:]))
