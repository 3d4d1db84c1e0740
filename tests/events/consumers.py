"""What event tests receive: consumers of the queue's exchanges and their messages."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

from azqueue.api import validation

AMQP_URL = os.environ.get("AZQUEUE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
PREFIX = "exchange/taskcluster-queue/v1/"


@dataclass
class Received:
    exchange: str
    routing_key: str
    body: dict[str, Any]
    cc: list[str] = field(default_factory=list)


@dataclass
class Consumer:
    """An exclusive queue bound to the queue's exchanges; collects what it receives."""

    messages: list[Received] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

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


def assert_valid(message: Received) -> None:
    """The payload matches our schema for its exchange."""
    schema = {"$ref": f"#/$defs/{message.exchange}", "$defs": _SCHEMA["$defs"]}
    errors = list(Draft202012Validator(schema).iter_errors(message.body))
    assert not errors, f"{message.exchange}: {[e.message for e in errors]}"
