"""What tenants wrote, printed on an operator's terminal without taking it over.

Task names, logs, error messages and other text the queue hands back were written by
whoever created the task or ran it. A terminal obeys the control characters in what it
prints: ESC starts sequences that set the window title, write the clipboard (OSC 52),
move the cursor and erase lines; CR returns to the start of a line to overwrite it. So
every C0 control character, DEL and every C1 control character is printed as a visible
escape (``\\x1b``): all of them in a line of a listing or a status (``line``), all but
newline and tab in multi-line text and logs (``text``, ``LogText``). So are Unicode's
bidirectional controls (U+202E, the right-to-left override, and the others), which make
a terminal that lays out right-to-left text show a line's characters in another order
than they come, and its line and paragraph separators (U+2028, U+2029), which some
terminals break a line at (``\\u202e``). JSON output (``--json``) needs none of this:
``json.dumps`` escapes them already.
"""

from __future__ import annotations

import codecs

_CONTROLS = [*range(0x20), 0x7F, *range(0x80, 0xA0)]
# The bidirectional controls (ALM, LRM, RLM, the embeddings and overrides, the isolates)
# and the line and paragraph separators.
_LAYOUT = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028,
           0x2029]
_IN_LINE = {c: f"\\x{c:02x}" for c in _CONTROLS} | {c: f"\\u{c:04x}" for c in _LAYOUT}
_IN_TEXT = {c: escape for c, escape in _IN_LINE.items() if c not in (0x09, 0x0A)}


def line(value: str) -> str:
    """``value`` for one line of output: every control character escaped."""
    return value.translate(_IN_LINE)


def text(value: str) -> str:
    """``value`` for lines of output: control characters escaped but newlines and tabs."""
    return value.translate(_IN_TEXT)


class LogText:
    """A log's bytes, as they arrive in chunks, for a terminal: decoded as UTF-8 (a
    character split between two chunks is kept for the next; bytes that are not UTF-8
    become U+FFFD) and escaped as ``text`` does."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, chunk: bytes, final: bool = False) -> bytes:
        return text(self._decoder.decode(chunk, final)).encode()
