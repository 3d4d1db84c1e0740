"""A task group belongs to one schedulerId: createTask refuses (409) a task whose
schedulerId differs from its group's, so a client holding the scopes of another
schedulerId can neither join a group nor, by joining it, seal or cancel it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from azqueue.config import Client
from azqueue.testing.hawk import hawk_signer
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import definition, slugid
from tests.servers import Server, ServerFactory

VICTIM = Client("victim", "victim-access-token-0123456789", (
    "queue:create-task:lowest:victim/q", "queue:create-task:project:none",
    "queue:scheduler-id:victim-scheduler", "queue:seal-task-group:victim-scheduler/*",
    "queue:cancel-task-group:victim-scheduler/*", "queue:status:*",
    "queue:list-task-group:*"))
ATTACKER = Client("attacker", "attacker-access-token-0123456789", (
    "queue:create-task:lowest:attacker/q", "queue:create-task:project:none",
    "queue:scheduler-id:attacker-scheduler", "queue:seal-task-group:attacker-scheduler/*",
    "queue:cancel-task-group:attacker-scheduler/*", "queue:status:*",
    "queue:list-task-group:*"))


@pytest.fixture
async def groups_server(make_server: ServerFactory) -> Server:
    return await make_server(clients=(VICTIM, ATTACKER))


@pytest.fixture
async def victim() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(
            middlewares=(hawk_signer(VICTIM.client_id, VICTIM.access_token),)) as session:
        yield session


@pytest.fixture
async def attacker() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(
            middlewares=(hawk_signer(ATTACKER.client_id, ATTACKER.access_token),)) as session:
        yield session


def first_sorting_task_id() -> str:
    """A taskId that sorts before any slugid ("-" comes before letters and digits)."""
    return "-" + slugid()[1:]


async def create(http: aiohttp.ClientSession, server: Server, task_id: str, group: str,
                 who: str) -> tuple[int, dict[str, Any]]:
    body = definition(f"{who}/q", taskGroupId=group, schedulerId=f"{who}-scheduler")
    async with http.put(f"{server.api}/task/{task_id}", json=body) as r:
        return r.status, await r.json()


async def post(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with http.post(url, json={}) as r:
        return r.status, await r.json()


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with http.get(url) as r:
        return r.status, await r.json()


async def victim_group(victim: aiohttp.ClientSession, server: Server,
                       with_own_task: bool) -> tuple[str, list[str]]:
    """A group of the victim's tasks: with its own task (taskId = taskGroupId) or only
    members."""
    group = slugid()
    tasks = [slugid(), slugid()] + ([group] if with_own_task else [])
    for task_id in tasks:
        code, answer = await create(victim, server, task_id, group, "victim")
        assert code == 200, answer
    return group, tasks


def assert_refused_for_scheduler(code: int, answer: dict[str, Any]) -> None:
    assert code == 409, answer
    assert answer["code"] == "RequestConflict"
    assert "victim-scheduler" in answer["message"] and "schedulerId" in answer["message"]


@pytest.mark.parametrize("with_own_task", [False, True], ids=["members-only", "own-task"])
async def test_a_task_with_another_schedulerId_cannot_join_a_group(
        groups_server: Server, victim: aiohttp.ClientSession,
        attacker: aiohttp.ClientSession, with_own_task: bool) -> None:
    server = groups_server
    group, tasks = await victim_group(victim, server, with_own_task)
    intruder = first_sorting_task_id()
    assert_refused_for_scheduler(*await create(attacker, server, intruder, group, "attacker"))
    # Nothing of it was written: no task, no member of the group.
    code, _ = await get(attacker, f"{server.api}/task/{intruder}/status")
    assert code == 404
    code, listing = await get(victim, f"{server.api}/task-group/{group}/list")
    assert code == 200, listing
    assert sorted(t["status"]["taskId"] for t in listing["tasks"]) == sorted(tasks)
    assert listing["schedulerId"] == "victim-scheduler"


async def test_another_scheduler_cannot_seal_or_cancel_a_group_it_tried_to_join(
        groups_server: Server, victim: aiohttp.ClientSession,
        attacker: aiohttp.ClientSession) -> None:
    server = groups_server
    group, tasks = await victim_group(victim, server, with_own_task=False)
    await create(attacker, server, first_sorting_task_id(), group, "attacker")
    code, meta = await get(victim, f"{server.api}/task-group/{group}")
    assert code == 200 and meta["schedulerId"] == "victim-scheduler", meta
    code, answer = await post(attacker, f"{server.api}/task-group/{group}/seal")
    assert code == 403, answer
    assert "queue:seal-task-group:victim-scheduler/" in answer["message"]
    code, answer = await post(attacker, f"{server.api}/task-group/{group}/cancel")
    assert code in (403, 409), answer  # not its group, and not sealed either
    for task_id in tasks:
        code, status = await get(victim, f"{server.api}/task/{task_id}/status")
        assert status["status"]["state"] == "pending", status


async def test_a_group_without_its_own_task_cannot_be_taken_by_creating_that_task(
        groups_server: Server, victim: aiohttp.ClientSession,
        attacker: aiohttp.ClientSession, storage: StorageInspector) -> None:
    """The taskId that names the group is free while the group has only members: a task
    of another schedulerId created under it is refused like any other, and what its
    createTask put before the group's record refused it (the deadline trigger, the tip)
    is gone, so nothing of it works later."""
    server = groups_server
    group, tasks = await victim_group(victim, server, with_own_task=False)
    assert_refused_for_scheduler(*await create(attacker, server, group, group, "attacker"))
    assert await storage.pending_count("attacker/q") == 0
    assert await storage.message_count(storage.queue_name("deadline-batches")) == len(tasks)
    code, meta = await get(victim, f"{server.api}/task-group/{group}")
    assert code == 200 and meta["schedulerId"] == "victim-scheduler", meta
    code, answer = await post(attacker, f"{server.api}/task-group/{group}/seal")
    assert code == 403, answer


async def test_a_groups_own_task_makes_it_its_schedulers_group(
        groups_server: Server, victim: aiohttp.ClientSession,
        attacker: aiohttp.ClientSession) -> None:
    server = groups_server
    group = slugid()
    code, answer = await create(victim, server, group, group, "victim")
    assert code == 200, answer
    assert_refused_for_scheduler(
        *await create(attacker, server, first_sorting_task_id(), group, "attacker"))
    code, answer = await create(victim, server, slugid(), group, "victim")
    assert code == 200, answer


@pytest.mark.parametrize("with_own_task", [False, True], ids=["members-only", "own-task"])
async def test_concurrent_first_tasks_of_two_schedulers_cannot_both_join_a_new_group(
        groups_server: Server, victim: aiohttp.ClientSession,
        attacker: aiohttp.ClientSession, with_own_task: bool) -> None:
    server = groups_server
    group = slugid()
    victims = [slugid() for _ in range(3)] + ([group] if with_own_task else [])
    attackers = [first_sorting_task_id() for _ in range(4)]
    answers = await asyncio.gather(
        *(create(victim, server, t, group, "victim") for t in victims),
        *(create(attacker, server, t, group, "attacker") for t in attackers))
    accepted = {who for (code, _), who in zip(
        answers, ["victim"] * len(victims) + ["attacker"] * len(attackers)) if code == 200}
    assert len(accepted) == 1, answers
    assert all(code in (200, 409) for code, _ in answers), answers
    owner = accepted.pop()
    winners = victims if owner == "victim" else attackers
    assert all(code == 200 for (code, _), t in zip(answers, victims + attackers)
               if t in winners), answers
    code, meta = await get(victim, f"{server.api}/task-group/{group}")
    assert code == 200 and meta["schedulerId"] == f"{owner}-scheduler", meta
