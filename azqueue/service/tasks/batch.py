"""tasks and statuses: many tasks read in one call (POST /tasks, POST /tasks/status).

As in Taskcluster, taskIds that name no task are left out (the caller compares), a
taskId asked for twice is answered once, and the answer is paged: at most ``limit``
of the given taskIds are read per call, in the order given (fewer once the page holds
``paging.MAX_PAGE_BYTES``), and ``continuationToken``
(sent again with the same body) says where the next call starts. Each taskId read is one
storage request, made a few at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from azqueue import errors
from azqueue.model.task import Task
from azqueue.service.common import paging
from azqueue.storage.tasks import TaskStore


def _start(continuation: str | None) -> int:
    after = paging.after(continuation)
    if after is None:
        return 0
    if not (after.isascii() and after.isdigit()):
        raise errors.InputError("`continuationToken` is not one this API returned")
    return int(after)


@dataclass(frozen=True, slots=True)
class BatchReads:
    """The tasks and statuses methods."""

    tasks: TaskStore

    async def read_many(self, task_ids: list[str], continuation: str | None, limit: int,
                        valid: Callable[[str], bool], answer: Callable[[Task], dict[str, Any]]
                        ) -> tuple[list[dict[str, Any]], str | None]:
        """``answer(task)`` for each task of a page of ``task_ids`` that exists (ids that are
        not ``valid`` name no task), and the token of the next page, if any."""
        unique = list(dict.fromkeys(task_ids))
        start = _start(continuation)
        page = unique[start:start + limit]
        async def read(task_id: str) -> dict[str, Any] | None:
            task = await self.tasks.find(task_id) if valid(task_id) else None
            return None if task is None else answer(task)

        found, read_ids = await paging.read_fitting(page, read)
        end = start + read_ids
        token = paging.token(str(end)) if end < len(unique) else None
        return found, token
