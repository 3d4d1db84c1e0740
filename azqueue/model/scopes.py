"""Scopes as Taskcluster defines them.

A scope is a string of printable ASCII (space to ``~``); one that a client or a task is
given may not end in ``**``. A scope ``s`` is satisfied by a held scope equal to it, or
by a held scope ending in ``*`` whose prefix starts ``s``. An expression is a scope
string, ``{"AllOf": [...]}`` or ``{"AnyOf": [...]}`` of expressions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Union

Expression = Union[str, Mapping[str, Sequence["Expression"]]]


def invalid(scope: object) -> str | None:
    """What makes ``scope`` no scope (None: it is one): not a string, or a character
    outside printable ASCII."""
    if not isinstance(scope, str):
        return f"{scope!r} is not a string"
    bad = next((c for c in scope if not " " <= c <= "~"), None)
    if bad is not None:
        return (f"{scope!r} holds {bad!r}: a scope is printable ASCII (space to `~`) "
                "alone")
    return None


def ungrantable(scope: object) -> str | None:
    """What makes ``scope`` no scope to give a client or a task (None: it may be given):
    ``invalid``, or it ends in ``**``."""
    if (problem := invalid(scope)) is not None:
        return problem
    assert isinstance(scope, str)
    if scope.endswith("**"):
        return (f"{scope!r} ends in `**`, which Taskcluster forbids: a `*` at the end "
                "matches every scope starting with what comes before it")
    return None


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


# A scope expression as a route declares it, before the request's values are known:
# strings may hold ``<name>`` placeholders; ``{"if": name, "then": template}`` asks for
# ``then`` only when the value ``name`` is true; inside an AllOf or AnyOf list,
# ``{"for": name, "in": list, "each": template}`` stands for one template per element.
# These are the scope templates of Taskcluster's API declarations.
Template = Union[str, Mapping[str, object]]
_PLACEHOLDER = re.compile(r"<([A-Za-z]+)>")


class Unresolved(KeyError):
    """A template needs a value that is not known yet (the request has to load it)."""


def _value(values: Mapping[str, object], name: str) -> object:
    if name not in values:
        raise Unresolved(name)
    return values[name]


def render(template: Template, values: Mapping[str, object]) -> Expression | None:
    """The expression ``template`` asks for with ``values`` filled in (None: nothing is
    asked); ``Unresolved`` naming a placeholder that ``values`` lacks."""
    if isinstance(template, str):
        return _PLACEHOLDER.sub(lambda m: str(_value(values, m[1])), template)
    if "if" in template:
        then = template["then"]
        assert isinstance(then, (str, Mapping))
        return render(then, values) if _value(values, str(template["if"])) else None
    kind = "AllOf" if "AllOf" in template else "AnyOf"
    items = template[kind]
    assert isinstance(items, Sequence)
    out: list[Expression] = []
    for item in items:
        if isinstance(item, Mapping) and "for" in item:
            elements = _value(values, str(item["in"]))
            assert isinstance(elements, Sequence)
            out += [e for element in elements
                    if (e := render(item["each"], {**values, str(item["for"]): element}))
                    is not None]
        elif (e := render(item, values)) is not None:
            out.append(e)
    return {kind: out}
