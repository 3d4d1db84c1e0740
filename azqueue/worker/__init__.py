"""The worker SDK: a client of the queue's HTTP API and of SAS URLs only."""

from __future__ import annotations

from azqueue.worker.client import Credentials
from azqueue.worker.config import WorkerConfig
from azqueue.worker.errors import (
    IntermittentTask,
    MalformedPayload,
    QueueRefused,
    RequestFailed,
    ResourceUnavailable,
    TaskFailed,
    WorkerError,
)
from azqueue.worker.livelog import LiveLog
from azqueue.worker.run import RunLog, TaskRun
from azqueue.worker.worker import Worker, WorkerState

__all__ = ["Credentials", "IntermittentTask", "LiveLog", "MalformedPayload", "QueueRefused",
           "RequestFailed", "ResourceUnavailable", "RunLog", "TaskFailed", "TaskRun", "Worker",
           "WorkerConfig", "WorkerError", "WorkerState"]
