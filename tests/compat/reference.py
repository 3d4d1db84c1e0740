"""Taskcluster's own JSON schemas for the Queue's answers and messages, and a check
against them.

``schemas/`` holds them as Taskcluster renders them (``generated/references.json`` of
the taskcluster/taskcluster repository), unedited: ``$ref`` between them resolves by
their ``$id`` (``/schemas/queue/v1/<name>.json``). They are those of ``RELEASE`` (at
``COMMIT``), but for task-queue-counts-list-response, of the later release that added
taskQueueCountsBatch; the official client the tests run is ``CLIENT`` (pinned by the
``test`` extra), which names no other schema.
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
RELEASE = "106.0.0"
COMMIT = "9d59eb59f6fd0912075c194100d8910f2da40f52"
CLIENT = "113.2.0"


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
