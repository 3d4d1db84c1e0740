"""The worker SDK: a client of the queue's HTTP API and of SAS URLs only.

Its names are imported on first use, so that the command line can import
``azqueue.worker.exitcodes`` without loading the HTTP clients."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from azqueue.worker.client import Credentials
    from azqueue.worker.errors import (
        IntermittentTask,
        MalformedPayload,
        QueueRefused,
        RequestFailed,
        ResourceUnavailable,
        TaskFailed,
        WorkerError,
    )
    from azqueue.worker.config import WorkerConfig
    from azqueue.worker.run import TaskRun
    from azqueue.worker.worker import Worker, WorkerState

_WHERE = {"Credentials": "client", "IntermittentTask": "errors", "MalformedPayload": "errors",
          "QueueRefused": "errors", "RequestFailed": "errors", "ResourceUnavailable": "errors", "TaskFailed": "errors",
          "TaskRun": "run", "Worker": "worker", "WorkerConfig": "config",
          "WorkerError": "errors", "WorkerState": "worker"}

__all__ = ["Credentials", "IntermittentTask", "MalformedPayload", "QueueRefused", "RequestFailed",
           "ResourceUnavailable", "TaskFailed", "TaskRun", "Worker", "WorkerConfig",
           "WorkerError", "WorkerState"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'azqueue.worker' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"azqueue.worker.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
