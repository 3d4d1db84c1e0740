"""Taskcluster's own JSON schemas for the Queue's answers and messages, and a check
against them.

``schemas/`` holds them as Taskcluster renders them (``generated/references.json`` of
the taskcluster/taskcluster repository), unedited: ``$ref`` between them resolves by
their ``$id`` (``/schemas/queue/v1/<name>.json``).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

SCHEMAS = Path(__file__).parent / "schemas"


@cache
def _registry() -> Registry:
    resources = []
    for path in sorted(SCHEMAS.glob("*.json")):
        contents = json.loads(path.read_text())
        resources.append((str(contents["$id"]).rstrip("#"),
                          Resource(contents=contents, specification=DRAFT7)))
    return Registry().with_resources(resources)


@cache
def _validator(name: str) -> Draft7Validator:
    schema = json.loads((SCHEMAS / f"{name}.json").read_text())
    return Draft7Validator(schema, registry=_registry(),
                           format_checker=Draft7Validator.FORMAT_CHECKER)


def problems(name: str, body: Any) -> list[str]:
    """Where ``body`` departs from Taskcluster's schema ``name`` (e.g.
    ``task-status-response``), each as ``<field path>: <what is wrong>``; [] if nowhere."""
    errors = sorted(_validator(name).iter_errors(body), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or 'body'}: {e.message}" for e in errors]


def assert_matches(name: str, body: Any) -> None:
    """``body`` is valid against Taskcluster's schema ``name`` (e.g.
    ``task-status-response``), with every key it requires."""
    found = problems(name, body)
    assert not found, f"not a valid {name}: " + "; ".join(found[:5])
