"""The Celery peer of ``scripts/bench.py``: a no-op task on kombu's Azure Storage Queues
transport (broker URL in BENCH_CELERY_BROKER).

In the worker (``celery -A bench_celery worker``), the moment it is ready, its first task
and its BENCH_CELERY_TARGET-th finished task are written as JSON to BENCH_CELERY_DONE
(wall-clock times, for the benchmark in another process to read).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_ready

app = Celery("bench_celery", broker=os.environ.get("BENCH_CELERY_BROKER", "memory://"))
app.conf.update(task_ignore_result=True, broker_pool_limit=64, worker_hijack_root_logger=False,
                broker_connection_retry_on_startup=True)

_lock = threading.Lock()
_seen: dict[str, Any] = {"finished": 0}


@app.task(name="bench.noop")
def noop() -> None:
    return None


def _note(key: str) -> None:
    with _lock:
        _seen.setdefault(key, time.time())


@worker_ready.connect
def _ready(**_: Any) -> None:
    _note("ready")


@task_prerun.connect
def _first(**_: Any) -> None:
    _note("first")


@task_postrun.connect
def _finished(**_: Any) -> None:
    with _lock:
        _seen["finished"] += 1
        if _seen["finished"] != int(os.environ.get("BENCH_CELERY_TARGET", "0")):
            return
        _seen["done"] = time.time()
        path = os.environ["BENCH_CELERY_DONE"]
        with open(path + ".tmp", "w") as out:
            json.dump(_seen, out)
        os.replace(path + ".tmp", path)
