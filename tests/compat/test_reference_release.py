"""Which Taskcluster the vendored schemas and scope declarations are of, and which
official client the tests run; what follows from them for reportException."""

from __future__ import annotations

import json
from importlib.metadata import version

import pytest
import taskcluster.aio
from taskcluster.exceptions import TaskclusterRestFailure

from azqueue.api.validation import SCHEMA_DIR
from azqueue.testing.tasks import definition, slugid
from tests.compat import reference
from tests.compat.test_route_scopes import SNAPSHOT
from tests.servers import ROOT, Server


def test_the_tests_run_the_client_and_the_release_they_name() -> None:
    assert version("taskcluster") == reference.CLIENT == "113.2.0"
    assert (reference.RELEASE, reference.COMMIT) == (SNAPSHOT["taskcluster"], SNAPSHOT["commit"])
    assert reference.RELEASE == "106.0.0"


def _reasons(text: str) -> list[str]:
    return list(json.loads(text)["properties"]["reason"]["enum"])


async def test_report_exception_takes_the_reasons_taskcluster_takes(server: Server) -> None:
    """Taskcluster's Queue refuses `superseded` since its release 40 (the reason stays
    in the task status schema for runs resolved before): so does azqueue, with a 400."""
    ours = _reasons((SCHEMA_DIR / "task-exception-request.json").read_text())
    assert ours == _reasons((reference.SCHEMAS / "task-exception-request.json").read_text())
    assert "superseded" not in ours
    queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "maxRetries": 0, "credentials": {
        "clientId": ROOT.client_id, "accessToken": ROOT.access_token}})
    task_id = slugid()
    await queue.createTask(task_id, definition())
    await queue.claimTask(task_id, 0, {"workerGroup": "wg", "workerId": "w"})
    with pytest.raises(TaskclusterRestFailure) as info:
        await queue.reportException(task_id, 0, {"reason": "superseded"})
    assert info.value.status_code == 400
    assert (await queue.status(task_id))["status"]["runs"][0]["state"] == "running"
