"""Hypothesis strategies for the JSON our schemas (``azqueue/api/schemas``) describe.

Only what our schemas use: ``$ref`` into ``$defs``, ``enum``/``const``, objects with
``properties``/``required``/``additionalProperties``, strings with ``pattern``,
lengths and ``format: date-time``, bounded integers, and arrays. Conditional parts
(``allOf``/``if``/``then``, ``dependentRequired``) are left out: a value that breaks
them is one more request the server must refuse cleanly. (hypothesis-jsonschema would
do this, but its last release does not run with current Hypothesis.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

# Arrays are kept short: the point is the shape of requests, not their bulk.
MAX_ITEMS = 4

JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10)


def from_schema(schema: dict[str, Any], root: dict[str, Any] | None = None,
                times: Sequence[str] = ()) -> st.SearchStrategy[Any]:
    """Values of ``schema`` (a part of ``root``); ``times`` are the date-times to use."""
    root = root if root is not None else schema
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        return from_schema(root["$defs"][name], root, times)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "object":
        return _object(schema, root, times)
    if kind == "array":
        items = from_schema(schema.get("items", {}), root, times)
        return st.lists(items, max_size=min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS),
                        unique_by=(lambda v: repr(v)) if schema.get("uniqueItems") else None)
    if kind == "string":
        return _string(schema, times)
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    return JSON_VALUES


def _string(schema: dict[str, Any], times: Sequence[str]) -> st.SearchStrategy[str]:
    if schema.get("format") == "date-time" and times:
        return st.sampled_from(list(times))
    low, high = schema.get("minLength", 0), schema.get("maxLength", 60)
    if "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True).filter(
            lambda s: low <= len(s) <= high)
    return st.text(min_size=low, max_size=min(high, 60))


def _object(schema: dict[str, Any], root: dict[str, Any],
            times: Sequence[str]) -> st.SearchStrategy[dict[str, Any]]:
    properties = schema.get("properties", {})
    required = [name for name in schema.get("required", []) if name in properties]
    optional = [name for name in properties if name not in required]
    extra = schema.get("additionalProperties", True)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        names = required + [n for n in optional if draw(st.booleans())]
        value = {name: draw(from_schema(properties[name], root, times)) for name in names}
        if isinstance(extra, dict):
            value.update(draw(st.dictionaries(st.text(min_size=1, max_size=10),
                                              from_schema(extra, root, times), max_size=2)))
        return value

    return build()
