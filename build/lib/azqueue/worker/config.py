"""What a worker is and how it gets work: ``WorkerConfig``, checked when it is made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from azqueue.model.identifiers import TASK_QUEUE_ID
from azqueue.worker.client import Credentials

Mode = Literal["sas", "claim-work"]


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What a ``Worker`` is and how it gets work.

    :param root_url: the queue's rootUrl, e.g. ``http://127.0.0.1:8080``.
    :param credentials: the worker's own credentials (scopes: claim-task or claim-work
        on the task queue, ``queue:worker-id:<workerGroup>/<workerId>``, and
        ``queue:poll-task-urls:<taskQueueId>`` in ``sas`` mode); None for anonymous.
    :param task_queue_id: ``<provisionerId>/<workerType>``.
    :param worker_group: the ``workerGroup`` the worker claims as.
    :param worker_id: the ``workerId`` the worker claims as, unique in its group.
    :param capacity: how many tasks run at once, 1–32 (the most one Azure poll returns),
        default 1. The worker asks for exactly its free capacity.
    :param mode: ``"claim-work"`` (default): long-poll claimWork; ``"sas"``: poll the
        Azure queues of pollTaskUrls directly.
    :param reclaim_margin: seconds before ``takenUntil`` at which a task is reclaimed,
        default 60 (docs/workers/sdk.md: "a few minutes prior to expiration" for the default
        20-minute claims).
    :param idle_sleep: ``sas`` mode: seconds slept after an empty pass over the queues,
        default 1 ("sleep a second or so", docs/workers/sas.md), with ±25% jitter; doubled
        after each further empty pass in a row, up to ``max_idle_sleep``.
    :param max_idle_sleep: ``sas`` mode: the longest sleep between empty passes (on
        average; ±25% jitter), default 5. An idle worker asks the queue which queues
        hold tips once per pass (no Azure request when none does; seven per pass without
        ``hints``); a task created while it sleeps waits up to 1.25 × ``max_idle_sleep``
        seconds for it.
    :param priority_recheck: ``sas`` mode: a worker that keeps finding work in one queue
        keeps polling that queue, and goes back to the top of the list (highest priority
        first) when that queue is empty or when its last pass from the top is this many
        seconds old, default 5. So a higher-priority task waits at most this much longer
        for this worker than if every poll started at the top; with W workers sticky on
        a lower queue, about ``priority_recheck / (W + 1)`` seconds on average. The
        default equals ``max_idle_sleep``: a higher-priority task waits about as long
        for busy workers as any task may wait for idle ones.
    :param hints: ``sas`` mode: every pass from the top first asks the queue which of
        the seven queues hold visible tips (pollTaskUrls with ``?pending=true``, answered
        from a sample at most 2 s old that all the queue's workers share) and polls only
        those, default True. False: every pass polls the queues in order until one has
        work (six empty polls per recheck at a ``lowest`` backlog).
    :param status_interval: seconds between two reads of each running task's status,
        default 10 (with ±10% jitter): a run canceled or resolved by someone else stops
        its handler that much later at most (plus the time of one status call). It
        costs one ``status`` call per running task per interval; the call is made
        without credentials (anonymous ``queue:status:*``, as in Taskcluster), with the
        worker's own when that is refused.
    :param log_interval: seconds between two appends of a running command's new output
        to its live log (``azqueue.worker.shell``), default 2: readers see output that
        much later at most. Only an interval with new output costs a request (one Append
        Block per 4 MiB).
    """

    root_url: str
    credentials: Credentials | None
    task_queue_id: str
    worker_group: str
    worker_id: str
    capacity: int = 1
    mode: Mode = "claim-work"
    reclaim_margin: float = 60.0
    idle_sleep: float = 1.0
    max_idle_sleep: float = 5.0
    priority_recheck: float = 5.0
    hints: bool = True
    status_interval: float = 10.0
    log_interval: float = 2.0

    def __post_init__(self) -> None:
        if not TASK_QUEUE_ID.fullmatch(self.task_queue_id):
            raise ValueError(f"task_queue_id must be <provisionerId>/<workerType>, each 1-38 "
                             f"letters, digits, - or _; not {self.task_queue_id!r}")
        if self.mode not in ("sas", "claim-work"):
            raise ValueError(f"mode must be 'sas' or 'claim-work', not {self.mode!r}")
        if not 1 <= self.capacity <= 32:
            raise ValueError(f"capacity must be 1-32, not {self.capacity}")
        if self.reclaim_margin < 0:
            raise ValueError(f"reclaim_margin must be 0 or more seconds, not {self.reclaim_margin}")
        if not 0 < self.idle_sleep <= self.max_idle_sleep:
            raise ValueError(f"idle_sleep ({self.idle_sleep}) must be over 0 and at most "
                             f"max_idle_sleep ({self.max_idle_sleep})")
        if self.status_interval <= 0:
            raise ValueError(f"status_interval must be over 0 seconds, not "
                             f"{self.status_interval}")
        if self.log_interval <= 0:
            raise ValueError(f"log_interval must be over 0 seconds, not {self.log_interval}")
        if self.priority_recheck <= 0:
            raise ValueError(f"priority_recheck must be over 0 seconds, not "
                             f"{self.priority_recheck}")
