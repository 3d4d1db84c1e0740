"""Timestamps as Taskcluster writes them: ISO 8601, UTC, millisecond ``Z`` form."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_ISO_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?(Z|[+-]\d{2}:\d{2})$"
)


def utcnow() -> datetime:
    return datetime.now(UTC)


def parse(value: str) -> datetime:
    """Parse ISO 8601 with 0-6 fractional digits and ``Z`` (or an offset); ValueError otherwise."""
    m = _ISO_RE.match(value)
    if not m:
        raise ValueError(f"{value!r} is not an ISO 8601 date-time such as 2026-01-31T12:00:00.000Z")
    frac = (m.group(7) or "").ljust(6, "0")
    tz = m.group(8)
    text = f"{value[:19]}.{frac}{'+00:00' if tz == 'Z' else tz}"
    try:
        return datetime.fromisoformat(text).astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{value!r} is out of range (years 1-9999 in UTC)") from None


def fmt(moment: datetime) -> str:
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    if moment.year < 1000:  # strftime writes such a year without leading zeros
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    # "…T12:00:00.123+00:00": the milliseconds cut, not rounded, as above
    return moment.isoformat(timespec="milliseconds")[:-6] + "Z"


def normalize(value: str) -> str:
    return fmt(parse(value))
