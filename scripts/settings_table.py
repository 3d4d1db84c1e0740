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
sys.path.insert(0, str(ROOT / "scripts"))

from azqueue.config import SETTINGS, shown_default  # noqa: E402
from doctable import Generated  # noqa: E402

PAGE = ROOT / "docs" / "operating" / "settings.md"
BEGIN = "<!-- settings table: written by scripts/settings_table.py from azqueue/config/variables.py -->"
END = "<!-- end of settings table -->"


def table() -> str:
    """The markdown table of every setting a deployment may set (not the tests' own)."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{s.variable}` | {shown_default(s)} | {s.meaning} |"
             for s in SETTINGS if not s.test_only]
    return "\n".join(rows)


GENERATED = Generated(PAGE, BEGIN, END, table, "scripts/settings_table.py")
with_table = GENERATED.with_table


if __name__ == "__main__":
    sys.exit(GENERATED.main(sys.argv[1:]))
