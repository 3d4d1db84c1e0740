"""A table written into a documentation page between two marker comments, by a script
that also checks it (`--check`): scripts/settings_table.py and scripts/api_table.py."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Generated:
    """The text ``table()`` makes, kept in ``page`` between ``begin`` and ``end``."""

    page: Path
    begin: str
    end: str
    table: Callable[[], str]
    script: str  # how to run the script that writes it

    def with_table(self, text: str) -> str:
        """``text`` (the page) with what is between its markers replaced by the table."""
        if text.count(self.begin) != 1 or text.count(self.end) != 1:
            raise SystemExit(f"{self.page}: needs the lines {self.begin} and {self.end} once each")
        head, rest = text.split(self.begin)
        _, tail = rest.split(self.end)
        return f"{head}{self.begin}\n{self.table()}\n{self.end}{tail}"

    def main(self, argv: list[str]) -> int:
        """Write the page; with ``--check``, write nothing and return 1 if it is out of date."""
        text = self.page.read_text(encoding="utf-8")
        wanted = self.with_table(text)
        if argv == ["--check"]:
            if text != wanted:
                print(f"{self.page} is out of date: run {self.script}", file=sys.stderr)
                return 1
            return 0
        if argv:
            print(f"usage: {self.script} [--check]", file=sys.stderr)
            return 2
        self.page.write_text(wanted, encoding="utf-8")
        return 0
