"""azqueue's scope satisfaction against Taskcluster's own library (the npm package
taskcluster-lib-scopes, pinned in libscopes/ and installed by scripts/bootstrap --test):
random held scopes against random expressions, and against every expression the Queue's
routes declare (``taskcluster-queue-scopes.json``), filled with random values."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import taskcluster
import taskcluster.aio
from taskcluster.exceptions import TaskclusterRestFailure

from azqueue.model import scopes
from azqueue.testing.tasks import definition, slugid
from tests.servers import ROOT, ServerFactory

CHECKOUT = Path(__file__).parents[2]
ORACLE = Path(__file__).parent / "scope_oracle.js"
MODULES = CHECKOUT / "libscopes" / "node_modules"
SNAPSHOT = json.loads((Path(__file__).parent / "taskcluster-queue-scopes.json").read_text())
# Few letters, so that random scopes share prefixes, and the characters that matter.
ALPHABET = ["a", "b", ":", "/", "*", "-", " ", "é", "\n"]


def _oracle(cases: list[tuple[list[str], Any]]) -> list[tuple[bool, bool | None]]:
    if shutil.which("node") is None or not MODULES.is_dir():
        if os.environ.get("CI") == "true":
            raise AssertionError("node and libscopes/node_modules are needed: run "
                                 "scripts/bootstrap --test")
        pytest.skip("needs node and libscopes/node_modules (scripts/bootstrap --test)")
    given = "".join(json.dumps(case) + "\n" for case in cases)
    done = subprocess.run(["node", str(ORACLE)], input=given, capture_output=True, text=True,
                          check=True, timeout=300, env={**os.environ, "NODE_PATH": str(MODULES)})
    return [tuple(json.loads(line)) for line in done.stdout.splitlines()]  # type: ignore[misc]


def _scope(rng: random.Random, valid: bool) -> str:
    letters = ALPHABET if not valid else ALPHABET[:-2]
    return "".join(rng.choice(letters) for _ in range(rng.randint(0, 5)))


def _expression(rng: random.Random, depth: int = 0) -> Any:
    if depth >= 3 or rng.random() < 0.5:
        return _scope(rng, valid=rng.random() < 0.95)
    kind = rng.choice(["AllOf", "AnyOf"])
    return {kind: [_expression(rng, depth + 1) for _ in range(rng.randint(0, 3))]}


def _agree(cases: list[tuple[list[str], Any]]) -> None:
    theirs = _oracle(cases)
    assert len(theirs) == len(cases)
    differ = []
    for (held, expression), (valid, satisfied) in zip(cases, theirs):
        ours_valid = all(scopes.invalid(s) is None for s in held) and _valid(expression)
        if ours_valid != valid or (valid and scopes.satisfies(held, expression) != satisfied):
            differ.append({"held": held, "expression": expression, "valid": valid,
                           "satisfied": satisfied})
    assert not differ, json.dumps(differ[:5], indent=1)


def _valid(expression: Any) -> bool:
    if isinstance(expression, str):
        return scopes.invalid(expression) is None
    (kind, items), = expression.items()
    return kind in ("AllOf", "AnyOf") and all(_valid(e) for e in items)


def test_random_scopes_and_expressions_agree_with_taskclusters_library() -> None:
    rng = random.Random(44)
    cases = [([_scope(rng, valid=rng.random() < 0.95) for _ in range(rng.randint(0, 4))],
              _expression(rng)) for _ in range(20_000)]
    _agree(cases)


def _values(rng: random.Random) -> dict[str, Any]:
    """Random values for every placeholder the Queue's declarations use."""
    def word() -> str:
        return "".join(rng.choice("ab*") for _ in range(rng.randint(1, 3)))
    values: dict[str, Any] = {name: word() for name in (
        "taskId", "runId", "taskGroupId", "schedulerId", "projectId", "provisionerId",
        "workerType", "taskQueueId", "workerGroup", "workerId", "name")}
    values["priorities"] = rng.sample(["highest", "high", "lowest"], rng.randint(1, 3))
    for many in ("scopes", "routes", "names", "taskIds", "taskQueueIds", "properties"):
        values[many] = [word() for _ in range(rng.randint(0, 3))]
    return values


def test_every_expression_the_queue_declares_is_satisfied_as_taskclusters_library_says(
        ) -> None:
    rng = random.Random(43)
    cases = []
    for template in SNAPSHOT["scopes"].values():
        for _ in range(200):
            expression = scopes.render(template, _values(rng))
            assert expression is not None
            prefixes = [s.split(":", 2) for s in json.dumps(expression).split('"') if ":" in s]
            pool = [":".join(p[:n]) + "*" for p in prefixes for n in (1, 2)] + ["*", "queue:*"]
            held = rng.sample(pool, min(len(pool), rng.randint(0, 4)))
            held += [s for s in json.dumps(expression).split('"') if s.startswith("queue:")
                     and rng.random() < 0.3]
            cases.append((held, expression))
    _agree(cases)


# Routes called end to end: how to call each on the task made for it, and the values its
# declaration is filled with.
def _calls(task_id: str, group: str) -> dict[str, tuple[str, tuple[Any, ...], dict[str, Any]]]:
    values = {"taskId": task_id, "taskGroupId": group, "schedulerId": "sched",
              "projectId": "proj-a", "taskQueueId": "prov/oracle", "runId": 0,
              "name": "public/a", "names": ["public/a"]}
    return {
        "task": ("task", (task_id,), values),
        "status": ("status", (task_id,), values),
        "scheduleTask": ("scheduleTask", (task_id,), values),
        "cancelTask": ("cancelTask", (task_id,), values),
        "rerunTask": ("rerunTask", (task_id,), values),
        "changeTaskPriority": ("changeTaskPriority", (task_id, {"newPriority": "lowest"}),
                               values),
        "listLatestArtifacts": ("listLatestArtifacts", (task_id,), values),
        "artifactInfo": ("artifactInfo", (task_id, 0, "public/a"), values),
        "getLatestArtifact": ("latestArtifact", (task_id, "public/a"), values),
        "listTaskGroup": ("listTaskGroup", (group,), values),
    }


@pytest.mark.timeout(600)
async def test_end_to_end_a_request_is_refused_exactly_when_taskclusters_library_says(
        make_server: ServerFactory) -> None:
    """Callers narrowed by authorizedScopes or holding temporary credentials, with random
    scopes near the ones a route asks for: a 403 exactly when taskcluster-lib-scopes says
    their scopes, with the anonymous ones every caller holds, do not satisfy the route's
    declared expression."""
    anonymous = ("queue:get-task:*", "queue:list-task-group:*")
    server = await make_server(anonymous_scopes=anonymous)
    root = {"clientId": ROOT.client_id, "accessToken": ROOT.access_token}
    admin = taskcluster.aio.Queue({"rootUrl": server.root_url, "credentials": root})
    rng = random.Random(82)
    cases: list[tuple[str, list[str], Any, bool, int]] = []
    for n in range(90):
        task_id, group = slugid(), slugid()
        await admin.createTask(task_id, definition(
            "prov/oracle", schedulerId="sched", taskGroupId=group, projectId="proj-a"))
        await admin.claimTask(task_id, 0, {"workerGroup": "wg", "workerId": "w"})
        await admin.createArtifact(task_id, 0, "public/a", {
            "storageType": "reference", "url": "https://example.com/",
            "expires": (await admin.task(task_id))["expires"]})
        name, (method, args, values) = rng.choice(sorted(_calls(task_id, group).items()))
        expression = scopes.render(SNAPSHOT["scopes"][name], values)
        words = [w for w in json.dumps(expression).split('"') if ":" in w]
        pool = words + [w.rsplit(":", 1)[0] + ":*" for w in words] + [
            w[:-3] + "*" for w in words] + ["queue:*", "queue:status:*", "assume:*",
                                            f"queue:cancel-task:sched/{group}/*"]
        held = sorted(set(rng.sample(pool, min(len(pool), rng.randint(0, 3)))))
        options: dict[str, Any] = {"rootUrl": server.root_url, "maxRetries": 0}
        if n % 2:
            options |= {"credentials": root, "authorizedScopes": held}
        else:
            now = datetime.now(UTC)
            options["credentials"] = taskcluster.createTemporaryCredentials(
                ROOT.client_id, ROOT.access_token, now - timedelta(minutes=1),
                now + timedelta(hours=1), held)
        try:
            await getattr(taskcluster.aio.Queue(options), method)(*args)
            status = 200
        except TaskclusterRestFailure as e:
            status = int(e.status_code)
        cases.append((name, [*held, *anonymous], expression, status != 403, status))
    verdicts = _oracle([(held, expression) for _, held, expression, _, _ in cases])
    differ = [{"route": name, "held": held, "status": status, "taskcluster": satisfied}
              for (name, held, _, allowed, status), (_, satisfied) in zip(cases, verdicts)
              if allowed != satisfied]
    assert not differ, json.dumps(differ, indent=1)
    assert {allowed for *_, allowed, _ in cases} == {True, False}
