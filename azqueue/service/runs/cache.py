"""The tasks this process wrote last, to decide the next change without reading first.

A worker's claim and report usually reach the replica that wrote the task a moment
before (created it, claimed it). Deciding on the copy kept here saves the read, and is
safe because every write is conditional on the ETag the copy was written at
(``TaskStore.modify(..., speculative=True)``): a copy that someone else changed since
loses its write (412), and only then is the task read. A copy is never used to answer
without writing: a refusal or a "nothing to do" found on it is decided again on a fresh
read. Bounded in entries and age; reads for clients (status, definition) never use it.

It also knows the new tasks this process is inserting (``inserting``), so that a claim of
a tip handed over the moment its put was answered can rewrite the tip while the insert
is under way, and write the claim once the insert says what it stored.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

from azqueue.model.task import Task
from azqueue.storage.taskrows import Stored

MAX_ENTRIES = 10_000
MAX_AGE = 60.0


class TaskCache:
    """The last tasks this process wrote, with their ETags: a bounded, aging map by taskId."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_age: float = MAX_AGE) -> None:
        self._entries: OrderedDict[str, tuple[float, Stored]] = OrderedDict()
        self._max_entries = max_entries
        self._max_age = max_age
        self._inserting: dict[str, _Inserting] = {}

    def get(self, task_id: str) -> Stored | None:
        entry = self._entries.get(task_id)
        if entry is None:
            return None
        if time.monotonic() - entry[0] > self._max_age:
            del self._entries[task_id]
            return None
        return entry[1]

    def put(self, stored: Stored) -> None:
        task_id = stored.task.task_id
        self._entries.pop(task_id, None)
        self._entries[task_id] = (time.monotonic(), stored)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def drop(self, task_id: str) -> None:
        self._entries.pop(task_id, None)

    def recorded(self, stored: Stored, was: str) -> None:
        """``stored`` is the task as a write that found it at ETag ``was`` left it (a
        record of its tip): kept if the copy here is still the one at ``was``; a copy
        another change put meanwhile is newer."""
        entry = self._entries.get(stored.task.task_id)
        if entry is not None and entry[1].etag == was:
            self.put(stored)

    def insert_begins(self, task: Task) -> asyncio.Future[Stored | None]:
        """``task`` is about to be inserted by this process: its tip, once ``tip_put`` names
        it, is what ``inserting`` gives until ``insert_ends`` is called with the future
        returned."""
        inserted: asyncio.Future[Stored | None] = asyncio.get_running_loop().create_future()
        self._inserting[task.task_id] = _Inserting(task, inserted)
        return inserted

    def tip_put(self, task_id: str, inserted: asyncio.Future[Stored | None],
                message_id: str) -> None:
        """The tip of the insert that ``inserted`` stands for was put as ``message_id``."""
        entry = self._inserting.get(task_id)
        if entry is not None and entry.inserted is inserted:
            entry.message_id = message_id

    def insert_ends(self, task_id: str, inserted: asyncio.Future[Stored | None],
                    stored: Stored | None) -> None:
        """The insert of ``insert_begins`` is over: ``stored`` is the task it stored, None
        if it stored none (a task of that id existed, or it failed)."""
        if not inserted.done():
            inserted.set_result(stored)
        entry = self._inserting.get(task_id)
        if entry is not None and entry.inserted is inserted:
            del self._inserting[task_id]

    def inserting(self, task_id: str, message_id: str
                  ) -> tuple[Task, asyncio.Future[Stored | None]] | None:
        """The task this process is inserting with that id whose tip is the message
        ``message_id``, and what will say what the insert stored; None if it is inserting
        none, or the message is another tip (an earlier task's of that id, whose claim is
        decided on what is stored, not on a definition that may be refused)."""
        entry = self._inserting.get(task_id)
        if entry is None or entry.message_id != message_id:
            return None
        return entry.task, entry.inserted


@dataclass(slots=True)
class _Inserting:
    """A task this process is inserting, and the message id of its tip once put."""

    task: Task
    inserted: asyncio.Future[Stored | None]
    message_id: str | None = None
