#!/usr/bin/env python3
"""Writes the table of docs/operating/settings.md from ``azqueue.config.SETTINGS``.

The table sits between the two marker comments of that page; everything else on the page
is left as it is. `--check` writes nothing and exits 1 when the page's table is not the one
the settings make (tests/unit/test_settings_doc.py checks the same).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from azqueue.config import SETTINGS, shown_default  # noqa: E402

PAGE = ROOT / "docs" / "operating" / "settings.md"
BEGIN = "<!-- settings table: written by scripts/settings_table.py from azqueue/config/variables.py -->"
END = "<!-- end of settings table -->"


def table() -> str:
    """The markdown table of every setting a deployment may set (not the tests' own)."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{s.variable}` | {shown_default(s)} | {s.meaning} |"
             for s in SETTINGS if not s.test_only]
    return "\n".join(rows)


def with_table(page: str) -> str:
    """``page`` with the text between its markers replaced by the table."""
    if page.count(BEGIN) != 1 or page.count(END) != 1:
        raise SystemExit(f"{PAGE}: needs the lines {BEGIN} and {END} once each")
    head, rest = page.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    page = PAGE.read_text(encoding="utf-8")
    wanted = with_table(page)
    if argv == ["--check"]:
        if page != wanted:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run scripts/settings_table.py",
                  file=sys.stderr)
            return 1
        return 0
    if argv:
        print("usage: scripts/settings_table.py [--check]", file=sys.stderr)
        return 2
    PAGE.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
