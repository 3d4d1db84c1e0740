"""Task definitions: the rules a schema cannot express, defaults, and normal form.

The input has already passed ``task-definition-request.json``. What is stored, compared
for idempotency and answered by ``task`` is the normal form built here: every default
filled in, both ``taskQueueId`` and ``provisionerId``/``workerType``, and timestamps in
millisecond ``Z`` form.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from azqueue.errors import InputError
from azqueue.model import scopes as scopeset, timeutil
from azqueue.model.priority import Priority

CREATED_SKEW = timedelta(minutes=15)
MAX_DEADLINE = timedelta(days=5)
DEFAULT_EXPIRES_AFTER_DEADLINE = timedelta(days=365)
DEFAULT_RETRIES = 5
# The task's scopes, as JSON, at most: they travel in the certificate of the claim's
# temporary credentials, base64-encoded in every Authorization header the worker sends,
# and a header line must stay under 8,190 bytes (aiohttp's limit, and common proxies').
MAX_SCOPES_JSON = 4000


def _time(body: Mapping[str, Any], name: str) -> datetime:
    try:
        return timeutil.parse(body[name])
    except ValueError as e:
        raise InputError(f"task definition: `{name}`: {e}") from None


def normalize(task_id: str, body: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The stored form of a schema-valid createTask body, or InputError naming the rule."""
    if "taskQueueId" in body:
        provisioner_id, worker_type = str(body["taskQueueId"]).split("/", 1)
        for name, value in (("provisionerId", provisioner_id), ("workerType", worker_type)):
            if name in body and body[name] != value:
                raise InputError(
                    f"task definition: `{name}` is {body[name]!r} but `taskQueueId` "
                    f"{body['taskQueueId']!r} says {value!r}; give one of them, or make them agree"
                )
    elif "provisionerId" in body and "workerType" in body:
        provisioner_id, worker_type = body["provisionerId"], body["workerType"]
    else:
        raise InputError("task definition: give `taskQueueId` (`<provisionerId>/<workerType>`) "
                         "or both `provisionerId` and `workerType`")

    created = _time(body, "created")
    deadline = _time(body, "deadline")
    if abs(created - now) > CREATED_SKEW:
        raise InputError(
            f"task definition: `created` ({body['created']}) must be within 15 minutes of the "
            f"server's time ({timeutil.fmt(now)}); set it to the current time"
        )
    if deadline <= now:
        raise InputError(f"task definition: `deadline` ({body['deadline']}) must be in the "
                         f"future (now is {timeutil.fmt(now)})")
    if deadline > now + MAX_DEADLINE:
        raise InputError(f"task definition: `deadline` ({body['deadline']}) must be at most "
                         "5 days from now")
    if "expires" in body:
        expires = _time(body, "expires")
        if expires < deadline:
            raise InputError(f"task definition: `expires` ({body['expires']}) must not be before "
                             f"`deadline` ({body['deadline']})")
    else:
        expires = deadline + DEFAULT_EXPIRES_AFTER_DEADLINE
    scopes = list(body.get("scopes", []))
    for scope in scopes:  # printable ASCII: the schema's pattern
        if scope.endswith("**"):
            raise InputError(f"task definition: `scopes`: {scopeset.ungrantable(scope)}")
    if len(json.dumps(scopes)) > MAX_SCOPES_JSON:
        raise InputError(
            f"task definition: `scopes` take {len(json.dumps(scopes))} characters as JSON, more "
            f"than {MAX_SCOPES_JSON}: a claim's credentials carry them in every request "
            "header the worker sends, which must stay under 8 KB; use fewer or shorter scopes "
            "(a role, `assume:<role>`, or a `*` pattern)")

    return {
        "provisionerId": provisioner_id,
        "workerType": worker_type,
        "taskQueueId": f"{provisioner_id}/{worker_type}",
        "schedulerId": body.get("schedulerId", "-"),
        "projectId": body.get("projectId", "none"),
        "taskGroupId": body.get("taskGroupId", task_id),
        "dependencies": list(body.get("dependencies", [])),
        "requires": body.get("requires", "all-completed"),
        "routes": list(body.get("routes", [])),
        # `normal` is stored as what it means, `lowest`, as Taskcluster stored it until it
        # refused the word (release 102).
        "priority": str(Priority.from_definition(body.get("priority", "lowest"))),
        "retries": body.get("retries", DEFAULT_RETRIES),
        "created": timeutil.fmt(created),
        "deadline": timeutil.fmt(deadline),
        "expires": timeutil.fmt(expires),
        "scopes": scopes,
        "payload": body["payload"],
        "metadata": body["metadata"],
        "tags": body.get("tags", {}),
        "extra": body.get("extra", {}),
    }
