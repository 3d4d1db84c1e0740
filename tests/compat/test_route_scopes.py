"""Every route's scope expression is the one Taskcluster's Queue declares for the method.

``taskcluster-queue-scopes.json`` beside this file is a snapshot of the scopes each
method of Taskcluster's ``services/queue/src/api.js`` declares (its ``taskcluster``
release and ``commit`` say which), in the template form both use: ``<name>``
placeholders, ``{"for", "in", "each"}`` lists and ``AnyOf``/``AllOf``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from azqueue.api.app import ROUTES
from azqueue.api.routing import Route

SNAPSHOT = json.loads((Path(__file__).parent / "taskcluster-queue-scopes.json").read_text())

# Routes Taskcluster's Queue (at the snapshot's release) does not have, and why.
OURS_ALONE = {
    "pollTaskUrls": "the SAS URLs of a task queue's Azure queues",
    "metrics": "Prometheus metrics, unauthenticated as Taskcluster's are",
    "schema": "the JSON schemas the queue validates against",
    "taskQueueCountsBatch": "a method of the official clients newer than the snapshot",
}


def _routes() -> dict[str, Route]:
    return {route.name: route for route in ROUTES}


def _normal(template: Any) -> Any:
    """A template with ``<provisionerId>/<workerType>`` spelt ``<taskQueueId>`` (the same
    value; Taskcluster spells it both ways) and its keys in order."""
    text = json.dumps(template, sort_keys=True)
    return json.loads(text.replace("<provisionerId>/<workerType>", "<taskQueueId>"))


def test_the_snapshot_says_which_taskcluster_it_is_from() -> None:
    assert SNAPSHOT["taskcluster"] == "106.0.0"
    assert len(SNAPSHOT["commit"]) == 40
    assert len(SNAPSHOT["scopes"]) + len(SNAPSHOT["unscoped"]) == 49  # the Queue's methods


def test_every_route_declares_the_scopes_taskcluster_declares() -> None:
    routes = _routes()
    theirs: dict[str, Any] = SNAPSHOT["scopes"]
    differ = {name: {"azqueue": routes[name].scopes, "taskcluster": theirs[name]}
              for name in theirs
              if name in routes and _normal(routes[name].scopes) != _normal(theirs[name])}
    assert not differ, json.dumps(differ, indent=1)
    assert not [n for n in SNAPSHOT["unscoped"] if routes[n].scopes is not None]
    missing = set(theirs) | set(SNAPSHOT["unscoped"])
    assert not missing - set(routes), "methods of Taskcluster's Queue without a route"
    assert set(routes) - missing == set(OURS_ALONE)
