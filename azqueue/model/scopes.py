"""Scopes as Taskcluster defines them.

A scope ``s`` is satisfied by a held scope equal to it, or by a held scope ending in
``*`` whose prefix starts ``s``. An expression is a scope string, ``{"AllOf": [...]}``
or ``{"AnyOf": [...]}`` of expressions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Union

Expression = Union[str, Mapping[str, Sequence["Expression"]]]


def satisfies_scope(held: Iterable[str], scope: str) -> bool:
    return any(h == scope or (h.endswith("*") and scope.startswith(h[:-1])) for h in held)


def satisfies(held: Sequence[str], expr: Expression) -> bool:
    if isinstance(expr, str):
        return satisfies_scope(held, expr)
    if "AllOf" in expr:
        return all(satisfies(held, e) for e in expr["AllOf"])
    return any(satisfies(held, e) for e in expr["AnyOf"])


def unsatisfied(held: Sequence[str], expr: Expression) -> Expression | None:
    """The part of ``expr`` that ``held`` does not satisfy (None when satisfied)."""
    if isinstance(expr, str):
        return None if satisfies_scope(held, expr) else expr
    if "AllOf" in expr:
        missing = [m for e in expr["AllOf"] if (m := unsatisfied(held, e)) is not None]
        if not missing:
            return None
        return missing[0] if len(missing) == 1 else {"AllOf": missing}
    if any(satisfies(held, e) for e in expr["AnyOf"]):
        return None
    return expr


def describe(expr: Expression) -> str:
    if isinstance(expr, str):
        return f"`{expr}`"
    if "AllOf" in expr:
        return "all of (" + ", ".join(describe(e) for e in expr["AllOf"]) + ")"
    return "any of (" + ", ".join(describe(e) for e in expr["AnyOf"]) + ")"


def missing_scopes(held: Sequence[str], wanted: Iterable[str]) -> list[str]:
    """The scopes of ``wanted`` that ``held`` does not satisfy (empty: ``held`` covers all)."""
    return [s for s in wanted if not satisfies_scope(held, s)]
