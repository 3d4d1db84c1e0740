"""Logging for the command line: text lines for a terminal, or JSON lines for a log
collector (``--log-format json`` or ``AZQUEUE_LOG_FORMAT=json``)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

FORMATS = ("text", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonLines(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the record's ``fields``
    (a dict passed as ``extra={"fields": ...}``), and the exception's traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update((k, v) for k, v in fields.items() if k not in out)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str, fmt: str = "text") -> None:
    """Log ``level`` and above to stderr in ``fmt`` (one of ``FORMATS``); the Azure SDK's
    own request logging only from WARNING."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if fmt == "json" else logging.Formatter(TEXT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("azure").setLevel(logging.WARNING)
