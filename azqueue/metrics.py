"""What a process reports to Prometheus (``GET /metrics``), and the hooks that count it.

The metrics are the process's own, in prometheus-client's default registry, as an
exporter's are: scrape every replica (and every ``azqueue resolve`` process, which has
no HTTP server and reports nothing). Counters and histograms count what *this process*
did; the sampled gauges (pending tips and running runs per task queue, events waiting in
the outbox) describe the storage account, so every replica reports the same figure and a
dashboard should take ``max``. No ``*_created`` series are exported.

Sampling costs storage requests, so it happens in the background, and only while
``/metrics`` is scraped (``api.observe``): every task queue at most once per
``SAMPLE_INTERVAL`` (a sample in between looks only at task queues not sampled yet), for
at most ``MAX_SAMPLED_QUEUES`` task queues (those this process most recently created,
claimed or resolved a task of): seven requests (one per priority) per task queue, one
scan of the claim index for the running runs of all of them (shared with
taskQueueCounts), and one for the outbox per sample. A scrape itself makes no storage
request.

What the metrics hold per task queue is bounded: the series of
``azqueue_task_pending_seconds`` are kept for the ``MAX_SAMPLED_QUEUES`` task queues
claimed from most recently, and both they and the sampled task queues are dropped once
the task queue was not seen for the idle expiry (``forget_idle``), so that a caller who
names many task queues cannot grow what every scrape writes.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import Counter as Tally
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from azqueue import release

if TYPE_CHECKING:
    from azqueue.model.task import Task

SAMPLE_INTERVAL = 30.0
MAX_SAMPLED_QUEUES = 50

# A `_created` series per counter and histogram child is a timestamp nobody graphs.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Minutes to hours: tasks wait and run from seconds to a day.
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)

API_REQUESTS = Counter(
    "azqueue_api_requests", "API requests answered, by endpoint (the Taskcluster method "
    "name; `unknown` for paths that are none) and HTTP status", ["endpoint", "status"])
API_LATENCY = Histogram(
    "azqueue_api_request_duration_seconds", "Time to answer an API request, by endpoint "
    "(claimWork's includes its wait for work, up to 20 s)", ["endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60))
RUNS = Counter(
    "azqueue_runs", "Run state changes stored by this process: `pending` by reasonCreated, "
    "`running` (claims), and `completed`/`failed`/`exception` by reasonResolved",
    ["state", "reason"])
EVENTS = Counter("azqueue_events_published", "Task events confirmed by the broker, by exchange",
                 ["exchange"])
PENDING_SECONDS = Histogram(
    "azqueue_task_pending_seconds", "Time a run waited, from pending (scheduled) until a "
    "worker claimed it, observed at the claim, by task queue", ["task_queue"],
    buckets=DURATION_BUCKETS)
RUN_SECONDS = Histogram(
    "azqueue_run_seconds", "Time a run took from its claim until it was resolved, by "
    "resolution (reasonResolved: completed, failed, canceled, claim-expired, ...)",
    ["resolution"], buckets=DURATION_BUCKETS)
RESOLVER_PASSES = Counter("azqueue_resolver_passes", "Passes of a background resolver, by outcome "
                          "(`ok`, or `failed`: retried at its next interval)",
                          ["resolver", "outcome"])
RESOLVER_ITEMS = Counter("azqueue_resolver_items", "Items a background resolver handled (claims "
                         "expired, deadlines resolved, events recovered, ...)", ["resolver"])

# The loops name themselves as in their logs ("claim resolver"); metrics name them as
# `azqueue resolve` does (azqueue.background.resolvers.NAMES).
RESOLVER_NAMES = {"claim": "claims", "deadline": "deadlines", "dependency": "dependencies",
                  "group-passes": "groups"}

# resolver name -> time.time() of the end of its last successful pass
_last_ok: dict[str, float] = {}
_started = time.time()


def count_request(endpoint: str, status: int, seconds: float) -> None:
    API_REQUESTS.labels(endpoint, str(status)).inc()
    API_LATENCY.labels(endpoint).observe(seconds)


def count_change(before: Task | None, after: Task) -> None:
    """Count the run transitions between ``before`` (None: a new task) and ``after``, time
    the runs claimed or resolved and remember the task queue for sampling."""
    old = before.runs if before is not None else ()
    for index, run in enumerate(after.runs):
        previous = old[index] if index < len(old) else None
        if previous is not None and previous.state is run.state:
            continue
        state = run.state.value
        if state == "pending":
            reason = run.reason_created.value
        elif state == "running":
            reason = ""
            if run.started is not None:
                observe_pending(after.task_queue_id,
                                max(0.0, (run.started - run.scheduled).total_seconds()))
        else:
            reason = run.reason_resolved.value if run.reason_resolved is not None else ""
            if run.started is not None and run.resolved is not None:
                RUN_SECONDS.labels(reason or state).observe(
                    max(0.0, (run.resolved - run.started).total_seconds()))
        RUNS.labels(state, reason).inc()
    PENDING.seen(after.task_queue_id)


# task queue -> time.monotonic() of its last observation in PENDING_SECONDS, oldest first
_pending_series: OrderedDict[str, float] = OrderedDict()


def observe_pending(task_queue_id: str, seconds: float) -> None:
    """A run of ``task_queue_id`` was claimed after ``seconds`` pending: observed in
    ``PENDING_SECONDS``, whose series of the task queue claimed from longest ago are
    dropped beyond ``MAX_SAMPLED_QUEUES`` task queues."""
    _pending_series[task_queue_id] = time.monotonic()
    _pending_series.move_to_end(task_queue_id)
    while len(_pending_series) > MAX_SAMPLED_QUEUES:
        PENDING_SECONDS.remove(_pending_series.popitem(last=False)[0])
    PENDING_SECONDS.labels(task_queue_id).observe(seconds)


def forget_idle(idle: float) -> None:
    """Drop what the metrics keep of task queues not seen for ``idle`` seconds: their
    series of ``azqueue_task_pending_seconds`` and their sampled gauges."""
    old = time.monotonic() - idle
    while _pending_series and next(iter(_pending_series.values())) < old:
        PENDING_SECONDS.remove(_pending_series.popitem(last=False)[0])
    PENDING.forget(old)


def count_event(exchange: str) -> None:
    EVENTS.labels(exchange).inc()


def resolver_name(name: str) -> str:
    """The name ``azqueue resolve`` knows a resolver loop by: "claim resolver" is
    ``claims``."""
    name = name.removesuffix(" resolver")
    return RESOLVER_NAMES.get(name, name)


def resolver_pass(name: str, ok: bool, items: object = None) -> None:
    """Count a pass of the resolver loop ``name`` (e.g. "claim resolver": labelled
    ``claims``, as ``azqueue resolve`` names it) and the items it handled, if it says
    (an int)."""
    name = resolver_name(name)
    RESOLVER_PASSES.labels(name, "ok" if ok else "failed").inc()
    if ok:
        _last_ok[name] = time.time()
        if isinstance(items, int) and not isinstance(items, bool) and items > 0:
            RESOLVER_ITEMS.labels(name).inc(items)


class _ResolverLag(Collector):
    """``azqueue_resolver_lag_seconds``: how long ago each resolver last finished a pass
    without failing (since the process started, if never): it grows while a resolver is
    stuck or failing, and stays below its interval (jittered up to 1.2 times) plus a
    pass's time while it keeps up; ``azqueue_resolver_interval_seconds``: that interval,
    so that an alert can compare each resolver's lag with its own."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "azqueue_resolver_lag_seconds", "Seconds since the resolver's last successful pass "
            "(since the process started, if none yet)", labels=["resolver"])
        now = time.time()
        for name in sorted(set(_last_ok) | set(_intervals)):
            family.add_metric([name], now - _last_ok.get(name, _started))
        yield family
        intervals = GaugeMetricFamily(
            "azqueue_resolver_interval_seconds", "Seconds between a resolver's passes, as "
            "configured (each wait is jittered between 0.8 and 1.2 times it)",
            labels=["resolver"])
        for name, interval in sorted(_intervals.items()):
            intervals.add_metric([name], interval)
        yield intervals


# resolver name -> its interval in seconds
_intervals: dict[str, float] = {}


def resolver_started(name: str, interval: float) -> None:
    _intervals[resolver_name(name)] = interval


class _StorageRequests(Collector):
    """``azqueue_storage_requests_total``: every request this process sent to Azure
    Storage (retries included), by service and HTTP method, summed over the process's
    storage accounts (one per server; tests run several). The counts of an account that
    is gone are kept, so the counter never goes down."""

    def __init__(self) -> None:
        # by id(): accounts are dataclasses, compared by value and not hashable
        self._accounts: weakref.WeakValueDictionary[int, Counted] = weakref.WeakValueDictionary()
        self._retired: Tally[str] = Tally()

    def watch(self, account: Counted) -> None:
        self._accounts[id(account)] = account
        weakref.finalize(account, self._retired.update, account.requests)

    def collect(self) -> Iterator[CounterMetricFamily]:
        total: Tally[str] = Tally(self._retired)
        for account in list(self._accounts.values()):
            total.update(account.requests)
        family = CounterMetricFamily(
            "azqueue_storage_requests", "Requests sent to Azure Storage (retries included), "
            "by service (table, queue, blob) and operation (HTTP method)",
            labels=["service", "operation"])
        for key, value in sorted(total.items()):
            service, _, operation = key.partition(" ")
            family.add_metric([service, operation], value)
        yield family


class Counted(Protocol):
    """A storage account, as far as metrics are concerned: its tally of requests, keyed
    ``"<service> <method>"``."""

    requests: Tally[str]


Sampler = Callable[[str], Awaitable[dict[str, int]]]


class _Pending(Collector):
    """``azqueue_pending_tips``: Azure's approximate message count of each priority queue
    of recently active task queues; ``azqueue_runs_running``: their runs in the claim
    index; and ``azqueue_outbox_pending``: event triggers not yet published. All sampled
    in the background while scraped, at most every ``SAMPLE_INTERVAL`` seconds.

    A queue's approximate count includes tips that became stale (their run was claimed
    or resolved through another tip) and tips held invisible by a claim: it is an upper
    bound of the pending runs, good for trends and alerts, not an exact count. The running
    runs are those taskQueueCounts counts (the claim index and every replica's notes of
    its younger claims, ``service.runs.claimindex``)."""

    def __init__(self) -> None:
        self._queues: OrderedDict[str, float] = OrderedDict()  # -> when last seen
        self._counts: dict[tuple[str, str], int] = {}
        self._running: dict[str, int] = {}
        self._outbox: int | None = None
        self._sampled_at = 0.0
        self._lock = asyncio.Lock()

    def seen(self, task_queue_id: str) -> None:
        self._queues[task_queue_id] = time.monotonic()
        self._queues.move_to_end(task_queue_id)
        while len(self._queues) > MAX_SAMPLED_QUEUES:
            self._queues.popitem(last=False)

    def forget(self, before: float) -> None:
        """Stop sampling the task queues last seen before ``before`` (``time.monotonic()``)
        and drop their figures."""
        while self._queues and next(iter(self._queues.values())) < before:
            self._queues.popitem(last=False)
        self._counts = {k: n for k, n in self._counts.items() if k[0] in self._queues}
        self._running = {k: n for k, n in self._running.items() if k in self._queues}

    async def sample(self, pending: Sampler, outbox: Callable[[], Awaitable[int]] | None,
                     running: Callable[[str], Awaitable[int]] | None = None) -> None:
        """Sample every task queue if the last sample is ``SAMPLE_INTERVAL`` old, else only
        those seen since."""
        async with self._lock:
            full = time.monotonic() - self._sampled_at >= SAMPLE_INTERVAL
            sampled = {name for name, _ in self._counts}
            names = [name for name in self._queues if full or name not in sampled]
            if not names and not full and (outbox is None or self._outbox is not None):
                return
            results = await asyncio.gather(*(pending(name) for name in names),
                                           return_exceptions=True)
            counts = {} if full else {k: n for k, n in self._counts.items() if k[0] in self._queues}
            for name, result in zip(names, results):
                if isinstance(result, dict):
                    counts.update({(name, priority): n for priority, n in result.items()})
            self._counts = counts
            if running is not None:
                found = await asyncio.gather(*(running(name) for name in names),
                                             return_exceptions=True)
                runs = {} if full else {k: n for k, n in self._running.items()
                                        if k in self._queues}
                runs.update({name: n for name, n in zip(names, found) if isinstance(n, int)})
                self._running = runs
            if full:
                self._sampled_at = time.monotonic()
            # The outbox with every full sample, and until it was sampled once (a server
            # whose events came on after a sample of task queues alone).
            if outbox is not None and (full or self._outbox is None):
                try:
                    self._outbox = await outbox()
                except Exception:  # noqa: BLE001 - a sample is skipped, never fatal
                    self._outbox = None

    def collect(self) -> Iterable[GaugeMetricFamily]:
        tips = GaugeMetricFamily(
            "azqueue_pending_tips", "Approximate messages in each priority queue of a task "
            "queue (stale tips included: an upper bound of pending runs), sampled",
            labels=["task_queue", "priority"])
        for (name, priority), n in sorted(self._counts.items()):
            tips.add_metric([name, priority], n)
        yield tips
        running = GaugeMetricFamily(
            "azqueue_runs_running", "Runs of a task queue claimed and running, as "
            "taskQueueCounts' claimedTasks counts them (a claim counts within about 2 s on "
            "whichever replica made it), sampled",
            labels=["task_queue"])
        for name, n in sorted(self._running.items()):
            running.add_metric([name], n)
        yield running
        if self._outbox is not None:
            yield GaugeMetricFamily("azqueue_outbox_pending", "Approximate event triggers "
                                    "waiting to be published (sampled)", value=self._outbox)


class _Build(Collector):
    """``azqueue_build_info{version, commit} 1``: the release this process runs, so that
    replicas of two releases show side by side during a rollout."""

    def collect(self) -> Iterator[InfoMetricFamily]:
        running = release.current()
        yield InfoMetricFamily("azqueue_build", "The release this process runs",
                               value={"version": running.version, "commit": running.commit})


STORAGE = _StorageRequests()
PENDING = _Pending()
for _collector in (STORAGE, PENDING, _ResolverLag(), _Build()):
    REGISTRY.register(_collector)
