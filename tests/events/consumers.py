"""What event tests receive: consumers of the queue's exchanges and their messages.

Every message a consumer receives is checked, as it arrives, against our schema for its
exchange (``azqueue/api/schemas/task-messages.json``) and against Taskcluster's own
(``MESSAGE_SCHEMAS``, vendored in ``tests/compat/schemas/``): a test that reads what a
consumer received fails, naming the exchange and the field, once any message departs."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

from azqueue.api import validation
from azqueue.model.events import EXCHANGES
from tests.compat import reference

AMQP_URL = os.environ.get("AZQUEUE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
PREFIX = "exchange/taskcluster-queue/v1/"


@dataclass
class Received:
    exchange: str
    routing_key: str
    body: dict[str, Any]
    cc: list[str] = field(default_factory=list)


# Taskcluster's schema of each exchange's messages, as its Queue exchanges reference
# declares them (references/queue/v1/exchanges.json).
MESSAGE_SCHEMAS = {
    "task-defined": "task-defined-message",
    "task-pending": "task-pending-message",
    "task-running": "task-running-message",
    "artifact-created": "artifact-created-message",
    "task-completed": "task-completed-message",
    "task-failed": "task-failed-message",
    "task-exception": "task-exception-message",
    "task-group-resolved": "task-group-changed-message",
    "task-group-sealed": "task-group-changed-message",
    "task-priority-changed": "task-priority-changed-message",
    "task-group-priority-changed": "task-group-priority-changed-message",
}
assert sorted(MESSAGE_SCHEMAS) == sorted(EXCHANGES), "an exchange without its message schema"


@dataclass
class Consumer:
    """An exclusive queue bound to the queue's exchanges; collects what it receives
    (``messages``), each checked against the schemas of its exchange."""

    received: list[Received] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def receive(self, message: Received) -> None:
        """Keep ``message``, and where it departs from the schemas of its exchange."""
        self.invalid.extend(f"{message.exchange} ({message.routing_key}) {problem}"
                            for problem in departures(message))
        self.received.append(message)
        self.arrived.set()

    def check(self) -> None:
        """AssertionError, naming the exchange and the field, if any message received so
        far is not valid against the schemas of its exchange."""
        assert not self.invalid, "messages not valid against their exchange's schema: " + \
            "; ".join(self.invalid[:5])

    @property
    def messages(self) -> list[Received]:
        """What arrived so far, once ``check()`` passes."""
        self.check()
        return self.received

    def about(self, task_id: str) -> list[Received]:
        return [m for m in self.messages if m.body.get("status", {}).get("taskId") == task_id]

    async def wait_for(self, predicate: Callable[[list[Received]], bool],
                       timeout: float = 30.0) -> list[Received]:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not predicate(self.messages):
            remaining = end - loop.time()
            if remaining <= 0:
                raise AssertionError("expected messages never arrived; got: "
                                     + ", ".join(f"{m.exchange} {m.routing_key}"
                                                 for m in self.messages))
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), remaining)
            except TimeoutError:
                pass
        return self.messages


ConsumerFactory = Callable[..., Awaitable[Consumer]]


_SCHEMA = validation.schema("task-messages.json")


def departures(message: Received) -> list[str]:
    """Where ``message`` departs from our schema for its exchange and from Taskcluster's,
    each as ``<schema>: <field>: <what is wrong>``; [] if nowhere."""
    if message.exchange not in MESSAGE_SCHEMAS:
        return [f"came from {message.exchange}, which is not one of the Queue's exchanges"]
    ours = {"$ref": f"#/$defs/{message.exchange}", "$defs": _SCHEMA["$defs"]}
    return [*(f"task-messages.json: {'/'.join(map(str, e.absolute_path)) or 'body'}: "
              f"{e.message}" for e in Draft202012Validator(ours).iter_errors(message.body)),
            *(f"Taskcluster's {MESSAGE_SCHEMAS[message.exchange]}: {problem}"
              for problem in reference.problems(MESSAGE_SCHEMAS[message.exchange],
                                                message.body))]
