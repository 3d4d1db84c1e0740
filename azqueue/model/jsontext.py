"""JSON from clients: strict, and with every way to fail a ValueError."""

from __future__ import annotations

import json
from typing import Any


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON; send numbers only")


def loads(text: str | bytes) -> Any:
    """``json.loads`` that refuses NaN and Infinity and raises ValueError (never
    RecursionError) for anything it cannot take."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None
