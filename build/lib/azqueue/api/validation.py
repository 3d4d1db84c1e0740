"""Our JSON schemas (``schemas/*.json``), and request bodies checked against them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

from azqueue.errors import InputError

SCHEMA_DIR = resources.files("azqueue.api") / "schemas"
# Characters of one rule's message; longer ones (quoting a long value) are shortened.
MAX_MESSAGE = 400


@cache
def schema(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SCHEMA_DIR / name).read_text())
    return data


@cache
def _regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` as JSON Schema means it (ECMA-262): a final ``$`` is the end of the
    string, where Python's also matches before a final newline."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def _pattern(validator: Any, pattern: str, instance: Any, _: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, {"pattern": _pattern})


@cache
def _validator(name: str) -> Any:
    return _Validator(schema(name), format_checker=Draft202012Validator.FORMAT_CHECKER)


def _describe(error: ValidationError) -> str:
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    field = f"`{where.lstrip('.')}`" if where else "the body"
    rule = error.schema.get("description") if isinstance(error.schema, dict) else None
    message = error.message
    if error.validator == "pattern":
        message = f"{error.instance!r} does not match {error.validator_value!r}"
    elif error.validator == "additionalProperties":
        message = f"{message} (remove them; see the schema for the allowed fields)"
    if len(message) > MAX_MESSAGE:  # it quotes the value: a long array, a long string
        message = f"{message[:MAX_MESSAGE // 2]} ... {message[-MAX_MESSAGE // 4:]}"
    return f"{field}: {message}" + (f" ({rule})" if rule else "")


def validate(name: str, body: Any, what: str) -> None:
    """InputError listing every rule ``body`` breaks, or nothing."""
    errors = sorted(_validator(name).iter_errors(body), key=lambda e: list(e.absolute_path))
    if errors:
        details = "; ".join(_describe(e) for e in errors[:10])
        more = f" (and {len(errors) - 10} more)" if len(errors) > 10 else ""
        raise InputError(f"{what} does not match schema {name}: {details}{more}")


def schema_names() -> list[str]:
    return sorted(p.name for p in SCHEMA_DIR.iterdir() if p.name.endswith(".json"))
