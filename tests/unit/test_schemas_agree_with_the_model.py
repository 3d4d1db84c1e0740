"""The JSON schemas served to clients state the taskId, task queue and worker name
patterns and the priorities in their own words; azqueue's code reads them from
``azqueue.model`` only. Each statement in a schema is the model's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from azqueue.api.validation import schema, schema_names
from azqueue.model.identifiers import (IDENTIFIER, SLUGID, TASK_QUEUE_ID, TASK_QUEUE_ID_OF_TASK,
                                       WORKER_TYPE_OF_TASK)
from azqueue.model.priority import IN_DEFINITION, NORMAL, ORDER, Priority

def _nodes(node: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object of a schema, with the key it is under ('' at the top and in lists)."""
    stack: list[tuple[str, Any]] = [("", node)]
    while stack:
        key, node = stack.pop()
        if isinstance(node, dict):
            yield key, node
            stack += list(node.items())
        elif isinstance(node, list):
            stack += [("", item) for item in node]


def test_each_task_queue_and_worker_name_pattern_of_the_schemas_is_the_models() -> None:
    found = 0
    for name in schema_names():
        for key, node in _nodes(schema(name)):
            pattern = node.get("pattern")
            if not isinstance(pattern, str) or not ("{1,38}" in pattern or "{0,36}" in pattern):
                continue
            found += 1
            if name == "task-definition-request.json" and key in ("taskQueueId", "workerType"):
                expected = TASK_QUEUE_ID_OF_TASK if key == "taskQueueId" else WORKER_TYPE_OF_TASK
            elif name == "task-queue-counts-request.json":  # answers name them as tasks do
                expected = TASK_QUEUE_ID_OF_TASK
            else:
                expected = TASK_QUEUE_ID if "/" in pattern else IDENTIFIER
            assert pattern == expected.pattern, (name, key)
    assert found >= 9


def test_each_slugid_pattern_of_the_schemas_is_the_models() -> None:
    found = []
    for name in schema_names():
        for key, node in _nodes(schema(name)):
            pattern = node.get("pattern")
            if isinstance(pattern, str) and "[Q-T]" in pattern:
                assert pattern == SLUGID.pattern, (name, key)
                found.append(name)
    assert sorted(found) == ["task-definition-request.json", "task-messages.json"]


def test_each_priority_list_of_the_schemas_is_the_models() -> None:
    values = [p.value for p in ORDER]
    assert values == [p.value for p in Priority]
    assert IN_DEFINITION == (*values, NORMAL)
    found = []
    for name in schema_names():
        for _, node in _nodes(schema(name)):
            enum = node.get("enum")
            if isinstance(enum, list) and "lowest" in enum:
                assert enum in (values, list(IN_DEFINITION)), name
                found.append(name)
    assert sorted(set(found)) == ["change-task-priority-request.json",
                                  "task-definition-request.json", "task-messages.json"]
