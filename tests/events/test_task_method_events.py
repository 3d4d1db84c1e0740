"""The messages of rerunTask, changeTaskPriority, sealTaskGroup and
changeTaskGroupPriority, as a consumer bound to the queue's exchanges receives them:
each valid against our schema and Taskcluster's own (the consumer checks every
message)."""

from __future__ import annotations

import aiohttp

from azqueue.testing import sas
from azqueue.testing.tasks import create, definition, slugid
from tests.events.consumers import ConsumerFactory, Received
from tests.servers import ServerFactory


def _kinds(messages: list[Received]) -> list[str]:
    return [m.exchange for m in messages]


async def test_rerun_and_priority_change_publish_pending_and_priority_changed(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory) -> None:
    """rerunTask publishes task-pending for the new run; changeTaskPriority 'Emits
    `taskPriorityChanged` events', routed like task-defined (no run)."""
    group = slugid()
    consumer = await consume("primary.#")
    server = await make_server(amqp_url=amqp_url)
    task_id = await create(http, server.api, definition("prov/ev-rerun", taskGroupId=group))
    await sas.post(http, f"{server.api}/task/{task_id}/cancel")
    assert (await sas.post(http, f"{server.api}/task/{task_id}/rerun"))[0] == 200
    assert (await sas.post(http, f"{server.api}/task/{task_id}/priority",
                           {"newPriority": "high"}))[0] == 200
    await consumer.wait_for(lambda _: "task-priority-changed" in _kinds(consumer.about(task_id)))
    mine = consumer.about(task_id)
    assert _kinds(mine) == ["task-defined", "task-pending", "task-exception", "task-pending",
                            "task-priority-changed"]
    pending, changed = mine[3], mine[4]
    assert pending.body["runId"] == 1
    assert pending.routing_key == f"primary.{task_id}.1._._.prov.ev-rerun.-.{group}._"
    assert changed.routing_key == f"primary.{task_id}._._._.prov.ev-rerun.-.{group}._"
    assert (changed.body["oldPriority"], changed.body["newPriority"]) == ("lowest", "high")
    assert changed.body["status"]["state"] == "pending"


async def test_sealing_and_reprioritizing_a_group_publish_group_messages(
        make_server: ServerFactory, http: aiohttp.ClientSession, amqp_url: str,
        consume: ConsumerFactory) -> None:
    """'A message is published on task-group-sealed whenever task group is sealed';
    changeTaskGroupPriority 'Emits `taskGroupPriorityChanged` summary event at the end'."""
    group = slugid()
    consumer = await consume(f"primary.{group}.#", exchanges=(
        "task-group-sealed", "task-group-priority-changed"))
    server = await make_server(amqp_url=amqp_url)
    for _ in range(2):
        await create(http, server.api, definition("prov/ev-group", taskGroupId=group))
    code, changed = await sas.post(http, f"{server.api}/task-group/{group}/priority",
                                   {"newPriority": "medium"})
    assert code == 200 and changed["tasksAffected"] == 2
    code, sealed = await sas.post(http, f"{server.api}/task-group/{group}/seal")
    assert code == 200
    await consumer.wait_for(lambda m: len(m) >= 2)
    summary, seal = consumer.messages
    assert summary.exchange == "task-group-priority-changed"
    assert summary.routing_key == f"primary.{group}.-._"
    assert summary.body == {"version": 1, "taskGroupId": group, "schedulerId": "-",
                            "newPriority": "medium", "tasksAffected": 2}
    assert seal.exchange == "task-group-sealed" and seal.routing_key == f"primary.{group}.-._"
    assert seal.body == {"version": 1, **sealed}
