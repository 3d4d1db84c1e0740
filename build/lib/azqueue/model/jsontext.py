"""JSON from clients: strict, bounded, and with every way to fail a ValueError.

What is accepted here is stored and later read back by every reader of a task, in any
language: so nothing that is not JSON (``NaN``, ``Infinity``) or that a reader would take
for infinity (``1e999``, or an integer of more than 308 digits, which JavaScript reads as
a double), no string with a lone surrogate (``"\\udc00"``, which strict readers refuse),
and nothing nested deeper than ``MAX_DEPTH`` levels, far below the recursion limits of
common parsers (Python's stops near 1,000).
"""

from __future__ import annotations

import json
import math
from typing import Any

# Levels of arrays and objects, the outermost one included.
MAX_DEPTH = 100
# The largest integer that is still a finite double has 309 digits.
_MAX_INT_CHARS = 310


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON; send numbers only")


def _out_of_range(text: str) -> ValueError:
    shown = text if len(text) <= 30 else f"{text[:30]}..."
    return ValueError(f"the number {shown} is out of the range of a double (readers would take "
                      "it for Infinity, which is not JSON); send a finite number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _out_of_range(text)
    return value


def _integer(text: str) -> int:
    if len(text) > _MAX_INT_CHARS or not math.isfinite(float(text)):
        raise _out_of_range(text)
    return int(text)


def checked_depth(value: Any) -> int:
    """How many levels of arrays and objects ``value`` has (0 for a scalar); ValueError
    if a string in it (a key or a value) holds a lone UTF-16 surrogate (``"\\udc00"``),
    which is no character: strict readers refuse the whole document."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, str):
            _text(node)
        elif isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            if isinstance(node, dict):
                stack.extend((key, level) for key in node)
            stack.extend((child, level + 1) for child in (
                node.values() if isinstance(node, dict) else node))
    return deepest


def _text(text: str) -> None:
    try:
        text.encode()
    except UnicodeEncodeError as e:
        raise ValueError(
            f"a string holds a lone UTF-16 surrogate ({text[e.start]!r} at {e.start} in "
            f"{text[:30]!r}), which is no character: escape characters outside the Basic "
            "Multilingual Plane as a pair, or send them as UTF-8") from None


def _too_deep(levels: str) -> ValueError:
    return ValueError(f"it is nested {levels} levels deep; at most {MAX_DEPTH} levels of arrays "
                      "and objects are accepted (flatten the data, or keep it in an artifact)")


def loads(text: str | bytes) -> Any:
    """``json.loads`` that refuses NaN, Infinity, numbers out of a double's range, lone
    surrogates and nesting deeper than MAX_DEPTH, and raises ValueError (never
    RecursionError) for anything it cannot take."""
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite,
                           parse_int=_integer)
    except RecursionError:
        raise _too_deep("about 1,000") from None
    levels = checked_depth(value)
    if levels > MAX_DEPTH:
        raise _too_deep(str(levels))
    return value
