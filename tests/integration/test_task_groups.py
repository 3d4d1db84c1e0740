"""listTaskGroup through the official client: "List tasks sharing the same taskGroupId",
paginated with continuationToken and limit (Taskcluster Queue reference)."""

from __future__ import annotations

import pytest
import taskcluster.aio
from taskcluster.exceptions import TaskclusterRestFailure

from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import definition, slugid
from tests.servers import ROOT, Server


async def test_list_task_group_pages_through_its_tasks_and_only_its_tasks(server: Server) -> None:
    queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "maxRetries": 0, "credentials": {
        "clientId": ROOT.client_id, "accessToken": ROOT.access_token}})
    group, other = slugid(), slugid()
    members = sorted([slugid() for _ in range(5)])
    for task_id in members:
        await queue.createTask(task_id, definition("prov/groups", taskGroupId=group))
    await queue.createTask(slugid(), definition("prov/groups", taskGroupId=other))
    # A refused redefinition naming the other group does not join it.
    refused = definition("prov/groups", taskGroupId=other, priority="high")
    with pytest.raises(TaskclusterRestFailure) as info:
        await queue.createTask(members[0], refused)
    assert info.value.status_code == 409

    seen: list[str] = []
    page = await queue.listTaskGroup(group, query={"limit": "2"})
    while True:
        assert page["taskGroupId"] == group and len(page["tasks"]) <= 2
        for entry in page["tasks"]:
            assert entry["task"]["taskGroupId"] == group
            assert entry["status"]["state"] == "pending"
            seen.append(entry["status"]["taskId"])
        if "continuationToken" not in page:
            break
        page = await queue.listTaskGroup(group, query={
            "limit": "2", "continuationToken": page["continuationToken"]})
    assert seen == members
    anonymous = taskcluster.aio.Queue({"rootUrl": server.root_url, "maxRetries": 0})
    others = (await anonymous.listTaskGroup(other))["tasks"]
    assert len(others) == 1 and others[0]["status"]["taskId"] not in members


async def test_an_unknown_task_group_is_404(server: Server) -> None:
    """'No task-group with taskGroupId' (Taskcluster's listTaskGroup)."""
    anonymous = taskcluster.aio.Queue({"rootUrl": server.root_url, "maxRetries": 0})
    with pytest.raises(TaskclusterRestFailure) as info:
        await anonymous.listTaskGroup(slugid())
    assert info.value.status_code == 404


async def test_the_group_named_after_a_task_lists_that_task_in_its_place(server: Server) -> None:
    """A task created without taskGroupId is its own group (Taskcluster's default), and a
    decision task's children join it: the group's own task, which has no member row, is
    listed in taskId order, once, on whichever page it falls."""
    queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "maxRetries": 0, "credentials": {
        "clientId": ROOT.client_id, "accessToken": ROOT.access_token}})
    decision = slugid()
    await queue.createTask(decision, definition("prov/own"))
    assert [t["status"]["taskId"] for t in (await queue.listTaskGroup(decision))["tasks"]] == [
        decision]
    children = [slugid() for _ in range(4)]
    for task_id in children:
        await queue.createTask(task_id, definition("prov/own", taskGroupId=decision))
    for limit in ("1", "2", "5", "10"):
        seen: list[str] = []
        page = await queue.listTaskGroup(decision, query={"limit": limit})
        while True:
            assert len(page["tasks"]) <= int(limit)
            seen += [t["status"]["taskId"] for t in page["tasks"]]
            if "continuationToken" not in page:
                break
            page = await queue.listTaskGroup(decision, query={
                "limit": limit, "continuationToken": page["continuationToken"]})
        assert seen == sorted([decision, *children]), limit


async def test_a_task_a_sealed_group_refuses_leaves_no_member_row_and_no_tip(
        server: Server, storage: StorageInspector) -> None:
    """A member of a sealed group, refused, writes neither its member row nor its tip
    (the group's records are read first), even once the server knows the group."""
    queue = taskcluster.aio.Queue({"rootUrl": server.root_url, "maxRetries": 0, "credentials": {
        "clientId": ROOT.client_id, "accessToken": ROOT.access_token}})
    group, member, late = slugid(), slugid(), slugid()
    await queue.createTask(group, definition("prov/sealed-before"))
    await queue.createTask(member, definition("prov/sealed-before", taskGroupId=group))
    await queue.sealTaskGroup(group)
    with pytest.raises(TaskclusterRestFailure) as info:
        await queue.createTask(late, definition("prov/sealed-late", taskGroupId=group))
    assert info.value.status_code == 409 and "sealed" in info.value.body["message"]
    assert await storage.message_count(storage.pending_queue("prov/sealed-late")) == 0
    assert late not in await storage.row_keys("groups", group)
    assert member in await storage.row_keys("groups", group)
    listed = await queue.listTaskGroup(group)
    assert sorted(t["status"]["taskId"] for t in listed["tasks"]) == sorted([group, member])
