#!/usr/bin/env python3
"""Storage requests per call of the task and task-group methods, printed as a table.

Starts an Azurite (data in a throwaway directory) and the server in this process (events
off, resolvers off), drives each method with the official client and prints how many
Azure Storage requests the server made for it (the server's own count, as
``__metrics__`` reports it).

Usage: .venv/bin/python scripts/measure_task_methods.py [--members 250]
(needs the test dependencies, for the official client: scripts/bootstrap --test)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import slugid
import taskcluster

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from measuring import ROOT, in_process  # noqa: E402

from azqueue.service.tasks import groups  # noqa: E402


def _definition(group: str | None = None) -> dict[str, Any]:
    now = datetime.now(UTC)
    body: dict[str, Any] = {
        "taskQueueId": "measure/methods", "created": taskcluster.stringDate(now),
        "deadline": taskcluster.stringDate(now + timedelta(hours=1)), "payload": {},
        "metadata": {"name": "m", "description": "", "owner": "m@example.com",
                     "source": "https://example.com"}}
    if group:
        body["taskGroupId"] = group
    return body


def _measure(root_url: str, count: Callable[[], int], members: int) -> list[tuple[str, float]]:
    queue = taskcluster.Queue({"rootUrl": root_url, "maxRetries": 0,
                               "credentials": {"clientId": ROOT.client_id,
                                               "accessToken": ROOT.access_token}})
    rows: list[tuple[str, float]] = []

    def step(name: str, call: Callable[[], object], per: int = 1) -> None:
        before = count()
        call()
        rows.append((name, (count() - before) / per))

    # The task queue's Azure queues exist before anything is measured.
    for priority in ("lowest", "high", "low"):
        queue.createTask(slugid.nice(), {**_definition(), "priority": priority})
    own = slugid.nice()
    step("createTask, a group's own task", lambda: queue.createTask(own, _definition()))
    group = own
    member = slugid.nice()
    step("createTask into another task's group", lambda: queue.createTask(
        member, _definition(group)))
    queue.cancelTask(member)
    step("rerunTask (resolved task)", lambda: queue.rerunTask(member))
    step("rerunTask (pending task: its tip again)", lambda: queue.rerunTask(member))
    step("changeTaskPriority (pending task)", lambda: queue.changeTaskPriority(
        member, {"newPriority": "high"}))
    ids = [own, member]
    step("statuses, 2 tasks", lambda: queue.statuses({"taskIds": ids}))

    big = slugid.nice()
    for _ in range(members):
        queue.createTask(slugid.nice(), _definition(big))
    step(f"getTaskGroup, {members} members, unsealed", lambda: queue.getTaskGroup(big))
    step(f"listTaskGroup, {members} members, first page of 100",
         lambda: queue.listTaskGroup(big, query={"limit": 100}))
    step(f"changeTaskGroupPriority, first batch of {groups.GROUP_BATCH}, per member",
         lambda: queue.changeTaskGroupPriority(big, {"newPriority": "low"}),
         per=groups.GROUP_BATCH)
    step(f"sealTaskGroup, {members} members", lambda: queue.sealTaskGroup(big))
    step("getTaskGroup, sealed", lambda: queue.getTaskGroup(big))
    step("createTask into a sealed group (409)", lambda: _refused(
        lambda: queue.createTask(slugid.nice(), _definition(big))))
    step(f"cancelTaskGroup, first batch of {groups.GROUP_BATCH}, per member",
         lambda: queue.cancelTaskGroup(big), per=groups.GROUP_BATCH)
    return rows


def _refused(call: Callable[[], object]) -> None:
    try:
        call()
    except taskcluster.exceptions.TaskclusterRestFailure as e:
        assert e.status_code == 409, e
    else:
        raise AssertionError("expected a 409")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=250)
    args = parser.parse_args()
    async with in_process(run_resolvers=False) as (_, server):
        health = server.services.health

        def count() -> int:
            return sum(health.storage_requests().values())

        rows = await asyncio.to_thread(_measure, server.root_url, count, args.members)
    print("| call | server storage requests |\n| --- | ---: |")
    for name, value in rows:
        print(f"| {name} | {value:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
