"""A createTask refused with 409 leaves nothing that works later.

taskIds are not secret, so a tenant may try createTask with another tenant's taskId as
often as it likes (each answered 409), choosing its own ``deadline``. What such an attempt
writes before it learns that the taskId is taken (its deadline trigger, its group row, its
tip) must be gone when it is refused: a deadline trigger left behind would surface at the
deadline the attacker chose and make the server read and resolve the victim's task over and
over, for as long as the victim's deadline (up to five days).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import taskcluster.aio
from taskcluster.exceptions import TaskclusterRestFailure

from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import definition, slugid
from tests.security.test_tenant_isolation import ATTACKER, _client
from tests.servers import ROOT, ServerFactory

ATTEMPTS = 20


async def test_refused_createTasks_on_another_tenants_taskId_leave_no_deadline_message(
        make_server: ServerFactory, storage: StorageInspector) -> None:
    # Resolvers off: the messages counted are those createTask left, none consumed.
    server = await make_server(clients=(ATTACKER,), run_resolvers=False)
    root, attacker = _client(server, ROOT), _client(server, ATTACKER)
    task_id = slugid()
    await root.createTask(task_id, definition("vic/pool", deadline=timedelta(days=4)))
    deadlines = storage.queue_name("deadline-batches")
    assert await storage.message_count(deadlines) == 1

    for _ in range(ATTEMPTS):
        with pytest.raises(TaskclusterRestFailure) as refused:
            await attacker.createTask(task_id, definition(
                "att/pool", deadline=timedelta(minutes=1), taskGroupId=slugid()))
        assert refused.value.status_code == 409

    assert await storage.message_count(deadlines) == 1  # the victim's own
    assert await storage.pending_count("att/pool") == 0
    assert (await root.status(task_id))["status"]["state"] == "pending"


async def test_a_repeated_identical_createTask_still_answers_its_status(
        make_server: ServerFactory) -> None:
    server = await make_server(run_resolvers=False)
    root: taskcluster.aio.Queue = _client(server, ROOT)
    task_id, body = slugid(), definition("vic/pool")
    first = await root.createTask(task_id, body)
    assert await root.createTask(task_id, body) == first
