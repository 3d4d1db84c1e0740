"""The check every consumer makes of what it receives (``consumers.departures``): a
message that departs from Taskcluster's schema for its exchange is named, with the
field."""

from __future__ import annotations

import pytest

from tests.events.consumers import Consumer, Received
from azqueue.testing.tasks import slugid


def test_a_group_message_without_expires_fails_whoever_reads_it() -> None:
    """task-group-resolved carries ``expires``: Taskcluster's task-group-changed-message
    requires it, and our schema as well."""
    consumer = Consumer()
    group = slugid()
    consumer.receive(Received("task-group-resolved", f"primary.{group}.-._",
                              {"version": 1, "taskGroupId": group, "schedulerId": "-"}))
    with pytest.raises(AssertionError) as failure:
        consumer.messages
    message = str(failure.value)
    assert "task-group-resolved" in message
    assert "Taskcluster's task-group-changed-message: body: 'expires' is a required" in message


def test_a_valid_message_passes() -> None:
    consumer = Consumer()
    group = slugid()
    body = {"version": 1, "taskGroupId": group, "schedulerId": "-",
            "expires": "2030-01-01T00:00:00.000Z"}
    consumer.receive(Received("task-group-resolved", f"primary.{group}.-._", body))
    assert [m.body for m in consumer.messages] == [body]


def test_a_message_from_an_exchange_the_queue_does_not_have_is_refused() -> None:
    consumer = Consumer()
    consumer.receive(Received("task-rerun", "primary.x", {}))
    with pytest.raises(AssertionError, match="not one of the Queue's exchanges"):
        consumer.check()
