"""createTask requires `queue:create-task:project:<projectId>`, as Taskcluster's does, so
a creator cannot label its tasks with a project it was not given (the
`queue:<verb>-task-in-project:<projectId>` scopes trust that label)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from azqueue.config import Client
from azqueue.testing.hawk import hawk_signer
from azqueue.testing.tasks import definition, slugid
from tests.servers import Server, ServerFactory

CREATOR = Client("creator", "creator-access-token-0123456789", (
    "queue:create-task:lowest:creator/q", "queue:scheduler-id:-",
    "queue:create-task:project:mine", "queue:status:*"))


@pytest.fixture
async def projects_server(make_server: ServerFactory) -> Server:
    return await make_server(clients=(CREATOR,))


@pytest.fixture
async def creator() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(
            middlewares=(hawk_signer(CREATOR.client_id, CREATOR.access_token),)) as session:
        yield session


async def create(http: aiohttp.ClientSession, server: Server, task_id: str,
                 **extra: Any) -> tuple[int, dict[str, Any]]:
    async with http.put(f"{server.api}/task/{task_id}",
                        json=definition("creator/q", **extra)) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("project", ["theirs", None], ids=["named", "default-none"])
async def test_creating_a_task_in_a_project_needs_that_projects_scope(
        projects_server: Server, creator: aiohttp.ClientSession, project: str | None) -> None:
    """Without `projectId` a task is in project `none`, which needs its scope too."""
    task_id = slugid()
    code, answer = await create(creator, projects_server, task_id,
                                **({"projectId": project} if project else {}))
    assert code == 403, answer
    assert answer["code"] == "InsufficientScopes"
    assert f"queue:create-task:project:{project or 'none'}" in answer["message"]
    async with creator.get(f"{projects_server.api}/task/{task_id}/status") as r:
        assert r.status == 404  # nothing written


async def test_a_task_in_a_project_the_creator_holds_is_created(
        projects_server: Server, creator: aiohttp.ClientSession) -> None:
    code, answer = await create(creator, projects_server, slugid(), projectId="mine")
    assert code == 200, answer
