"""The rows of the tasks table: one entity per task, and how a task and its records
become entities and back (``azqueue.storage.tasks`` reads and writes them).

Entity: PartitionKey = taskId, RowKey = ``task``. The normalized definition and the
runs are JSON, split into properties of at most ``CHUNK`` characters (Azure's limit on
one string property is 32K characters, on an entity 1 MiB). ``state``, ``taskQueueId``,
``deadline`` and ``retriesLeft`` are plain properties so they can be read and queried;
``hasDependents`` is set (merged in) by the first task defined depending on this one;
``groupMembers``, on the task a group is named after, says whether another task has joined
its group: written false by its insert when no task had, merged in true by the first
other task to join (``TaskStore.note_group_member``);
``held`` is the message the running run's claim holds (``HeldMessage``), written with
the claim that took it and cleared by the write that ends the run; each property
``tip_<hash of messageId>`` (value: the messageId) records a message that was put carrying
one of the task's tips, the first in the task's own insert; ``liveTip`` (a ``LiveTip``)
is the pending run's last tip with its pop receipt, for the tip repair; ``tipRepair`` (``<runId>
<epoch seconds>``) notes the last tip a claim queued to repair a pending run's (kept
until the next write of the task, which changes the run anyway).

Other rows in a task's partition: ``wait:<tag>:<taskId>`` (dependencies it still waits
for), ``outbox:…`` (unpublished events), ``artifact:…``, ``members`` (written with
``groupMembers`` false by the insert of a group's own task, in the same transaction; or
first, by another task that joins the group while its own task is not stored yet: that
insert then fails on it and stores ``groupMembers`` true); ``tip:<messageId>`` rows are
tip records of earlier versions, still honoured.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from azure.data.tables import EdmType, EntityProperty

from azqueue.model.events import Event
from azqueue.model.task import Run, Task

CHUNK = 30_000
OUTBOX = "outbox:"  # Azure refuses "/" in keys; ";" follows ":"
_sequence = itertools.count()
# Names this process in the outbox rows it writes (``azqueue.events``: its lease).
WRITER = secrets.token_hex(6)

MAX_DEFINITION_CHARS = 400_000
ROW = "task"
# Rows "tip:<messageId>": tip records as earlier versions wrote them.
TIP = "tip:"
# Properties "tip_<hash>" on the task entity: the messages put carrying its tips.
TIP_PROPERTY = "tip_"
# Property "liveTip" on the task entity: the ``LiveTip`` of a pending run.
LIVE_TIP = "liveTip"
# More tip records than this are not kept (a createTask repeated without end).
MAX_TIPS = 64
# Rows "wait:<tag>:<taskId>": a dependency this task still waits for, as written by a
# createTask of the definition that ``tag`` names.
WAIT = "wait:"
# Row "members": written with this task's ``groupMembers`` false, or before it by a task
# that joined the group named after this task while it was not stored.
MEMBERS = "members"


def _put_chunks(entity: dict[str, Any], name: str, text: str) -> None:
    parts = [text[i:i + CHUNK] for i in range(0, len(text), CHUNK)] or [""]
    entity[f"{name}Chunks"] = len(parts)
    for i, part in enumerate(parts):
        entity[f"{name}{i}"] = part


def _get_chunks(entity: Mapping[str, Any], name: str) -> str:
    return "".join(entity[f"{name}{i}"] for i in range(int(entity[f"{name}Chunks"])))


def definition_size(definition: Mapping[str, Any]) -> int:
    return len(json.dumps(definition, separators=(",", ":")))


@dataclass(frozen=True, slots=True)
class HeldMessage:
    """The Azure message a running run's claim holds: rewritten to carry the tip of
    ``run_id + 1`` and invisible until ``takenUntil``; ``pop_receipt`` is its current one,
    or "" when the answer that had it was lost (the claim cannot move the message then,
    which reappears at ``takenUntil``, but knows which message it took)."""

    run_id: int
    queue_name: str
    message_id: str
    pop_receipt: str

    def to_json(self) -> str:
        return json.dumps({"runId": self.run_id, "queue": self.queue_name,
                           "messageId": self.message_id, "receipt": self.pop_receipt},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Self:
        data = json.loads(text)
        return cls(int(data["runId"]), str(data["queue"]), str(data["messageId"]),
                   str(data["receipt"]))


@dataclass(frozen=True, slots=True)
class LiveTip(HeldMessage):
    """The tip last put for a pending run, with the pop receipt its put (or the last
    look at it) returned: updating the message with that receipt succeeds only while
    nobody has received it since, so the tip repair can tell a tip that waits untouched
    from one a worker took (and may have lost) without putting a duplicate."""

    @classmethod
    def parse(cls, text: str) -> LiveTip | None:
        try:
            return cls.from_json(text)
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True, slots=True)
class MessageRecords:
    """What a task's entity records of its messages: the message its running run holds,
    the messageIds put carrying its tips, and its pending run's live tip. Which of them a
    change keeps is decided by the owner of tips (``azqueue.service.dispatch.tips``);
    the store writes what it is given."""

    held: HeldMessage | None
    tips: frozenset[str]
    live_tip: LiveTip | None


@dataclass(frozen=True, slots=True)
class Stored:
    """A task as read (or just written): with the ETag to write it conditionally, the
    message its running run holds, and the recorded tip messages that were read with it
    (not necessarily all of them)."""

    task: Task
    etag: str
    held: HeldMessage | None = None
    tips: frozenset[str] = field(default=frozenset())
    write_id: str = ""  # names the write that stored it (see ``modify``)
    tip_repair: str = ""  # ``<runId> <epoch seconds>``: see ``note_tip_repair``
    live_tip: LiveTip | None = None


def tip_property(message_id: str) -> str:
    return TIP_PROPERTY + hashlib.sha256(message_id.encode()).hexdigest()[:32]


def to_entity(task: Task, held: HeldMessage | None = None,
              tips: frozenset[str] = frozenset(), write_id: str = "",
              live_tip: LiveTip | None = None) -> dict[str, Any]:
    entity: dict[str, Any] = {
        "PartitionKey": task.task_id,
        "RowKey": ROW,
        "state": str(task.state),
        "taskQueueId": task.task_queue_id,
        "deadline": task.deadline,
        "expires": task.expires,
        "retriesLeft": EntityProperty(task.retries_left, EdmType.INT32),
        "hasDependents": task.has_dependents,
        **({"groupMembers": task.group_members} if task.group_members is not None else {}),
        "held": held.to_json() if held is not None else "",
        "writeId": write_id,
        **{tip_property(t): t for t in tips},
        **({LIVE_TIP: live_tip.to_json()} if live_tip is not None else {}),
    }
    _put_chunks(entity, "definition", json.dumps(task.definition, separators=(",", ":")))
    _put_chunks(entity, "runs", json.dumps([r.to_json() for r in task.runs], separators=(",", ":")))
    return entity


def stored_from_entity(entity: Mapping[str, Any]) -> Stored:
    held = entity.get("held")
    recorded = frozenset(str(v) for k, v in entity.items() if k.startswith(TIP_PROPERTY))
    return Stored(from_entity(entity), str(entity.metadata["etag"]),  # type: ignore[attr-defined]
                  HeldMessage.from_json(held) if held else None, recorded,
                  str(entity.get("writeId", "")), str(entity.get("tipRepair", "")),
                  LiveTip.parse(str(entity[LIVE_TIP])) if entity.get(LIVE_TIP) else None)


def from_entity(entity: Mapping[str, Any]) -> Task:
    return Task(
        task_id=str(entity["PartitionKey"]),
        definition=json.loads(_get_chunks(entity, "definition")),
        runs=tuple(Run.from_json(r) for r in json.loads(_get_chunks(entity, "runs"))),
        retries_left=int(entity["retriesLeft"]),
        has_dependents=bool(entity.get("hasDependents", False)),
        group_members=(bool(entity["groupMembers"]) if entity.get("groupMembers") is not None
                       else None),
    )


def outbox_row(task_id: str, event: Event) -> dict[str, Any]:
    """An outbox entity in the task's partition; RowKeys sort in the order of writing
    within this process (nanoseconds, then a counter) and end with the ``WRITER``."""
    entity: dict[str, Any] = {
        "PartitionKey": task_id,
        "RowKey": f"{OUTBOX}{time.time_ns():020d}-{next(_sequence):09d}-{WRITER}"}
    _put_chunks(entity, "event", json.dumps(event.to_json(), separators=(",", ":")))
    return entity


def event_from_row(entity: Mapping[str, Any]) -> Event:
    return Event.from_json(json.loads(_get_chunks(entity, "event")))
