"""How every storage request is retried, and how long a storage call may take in all.

One policy and one loop (``send``) for the hand-written requests of the hot path
(``storage.rest``) and for the Azure SDK clients (``storage.account``'s transport; the
clients' own retry policies are switched off: their defaults wait 15 s and more between
attempts). A request is sent again when it cannot have failed for good:

* it could not connect, the connection dropped, or no answer came within
  ``attempt_timeout`` seconds;
* Azure answered ``408``, ``500``, ``502``, ``503`` (``ServerBusy``: throttled) or ``504``.

Between attempts it waits an exponential backoff with full jitter (a random time up to
``first_backoff * 2 ** attempt``, at most ``max_backoff``), or longer if the answer said
``Retry-After``. It gives up after ``attempts`` tries, or sooner when the time left runs
out: inside a client's request that is the request's budget (``budget``, set by the API
middleware), so that no storage call outlives the client's patience; outside one (the
background resolvers) each call has ``call_budget`` seconds. What gives up is translated
into ``StorageUnavailable`` (``storage.errors``): the API answers 503 with ``Retry-After``.

A retried write may have been applied by the attempt whose answer was lost; the callers
recognise their own effect (see ``storage.rest`` and ``storage.tasks``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

from azure.core.exceptions import ServiceRequestError, ServiceResponseError

A = TypeVar("A")

RETRIED_STATUS = frozenset({408, 500, 502, 503, 504})

# The loop time by which the storage calls of the current client request must end, and
# the task that serves the request. Tasks it starts inherit this context: those that work
# for the request (a gather) keep to its budget, those that outlive it (a poller) do not.
_deadline: ContextVar[tuple[float, asyncio.Task[Any] | None] | None] = ContextVar(
    "azqueue_storage_deadline", default=None)


@contextmanager
def budget(seconds: float) -> Iterator[None]:
    """Storage calls made inside this block (and by tasks it starts, while it lasts) end
    within ``seconds``, or by an enclosing budget's end, if that comes sooner."""
    end = asyncio.get_running_loop().time() + seconds
    outer = _budget_end()
    token = _deadline.set((end if outer is None else min(outer, end), asyncio.current_task()))
    try:
        yield
    finally:
        _deadline.reset(token)


def time_left() -> float | None:
    """The seconds left of the budget of the request being served (None outside one)."""
    end = _budget_end()
    return None if end is None else end - asyncio.get_running_loop().time()


def _budget_end() -> float | None:
    """The end of the budget of the request being served, if it still is."""
    current = _deadline.get()
    if current is None or (current[1] is not None and current[1].done()):
        return None
    return current[0]


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The seconds an answer's ``Retry-After`` (seconds or an HTTP date) asks to wait."""
    value = headers.get("Retry-After", "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (moment - datetime.now(UTC)).total_seconds())


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts, backoff and time limits of one storage call (see the module docstring).

    ``attempts``: tries of one request at most. ``first_backoff``, ``max_backoff``: the
    exponential backoff's first and largest ceiling (seconds). ``attempt_timeout``: an
    attempt with no answer after this long was lost. ``call_budget``: how long a call
    made outside a client request may take in all, retries included.
    """

    attempts: int = 8
    first_backoff: float = 0.05
    max_backoff: float = 1.0
    attempt_timeout: float = 5.0
    call_budget: float = 30.0

    def deadline(self) -> float:
        """The loop time by which a call starting now must end."""
        own = asyncio.get_running_loop().time() + self.call_budget
        request = _budget_end()
        return own if request is None else min(own, request)

    def timeout(self, deadline: float) -> float:
        """How long the next attempt may wait for its answer; 0 when no time is left."""
        left = deadline - asyncio.get_running_loop().time()
        return max(0.0, min(self.attempt_timeout, left))

    def pause(self, attempt: int, deadline: float, asked: float | None = None) -> float | None:
        """How long to wait before attempt ``attempt + 1`` (``attempt`` counts from 0), or
        None to give up: attempts used up, or no time left to wait and try again."""
        if attempt + 1 >= self.attempts:
            return None
        ceiling = min(self.max_backoff, self.first_backoff * 2 ** attempt)
        wait = random.uniform(0, ceiling)
        if asked is not None:
            wait = max(wait, asked)
        left = deadline - asyncio.get_running_loop().time()
        # Worth it only with time for the attempt after the wait (a tenth of a second at least).
        if wait + 0.1 > left:
            return None
        return wait


DEFAULT = RetryPolicy()


# One attempt at a request: given the seconds it may wait for its answer and its number
# (from 0), the answer's status, headers and the rest of it; or ServiceRequestError /
# ServiceResponseError when it got no answer (no connection, a dropped one, a timeout).
Attempt = Callable[[float, int], Awaitable[tuple[int, Mapping[str, str], A]]]


async def send(attempt: Attempt[A], policy: RetryPolicy = DEFAULT, what: str = "",
               discard: Callable[[A], None] | None = None) -> tuple[int, Mapping[str, str], A]:
    """Make ``attempt`` until it is answered with a status not in ``RETRIED_STATUS``, or
    ``policy`` gives up (attempts used up, or no time left): then the last answer, or the
    last failure raised. ``discard`` is given each answer left unread for a retry.
    ServiceRequestError (``what``: no time left) when no time is left for a first attempt
    or the next one."""
    deadline = policy.deadline()
    number = 0
    while True:
        timeout = policy.timeout(deadline)
        if timeout <= 0:
            raise ServiceRequestError(f"{what}: no time left to ask Azure Storage" if what
                                      else "no time left to ask Azure Storage")
        answer: tuple[int, Mapping[str, str], A] | None = None
        failure: ServiceRequestError | ServiceResponseError | None = None
        try:
            answer = await attempt(timeout, number)
        except (ServiceRequestError, ServiceResponseError) as e:
            failure = e
        else:
            if answer[0] not in RETRIED_STATUS:
                return answer
        wait = policy.pause(number, deadline, retry_after(answer[1]) if answer is not None else None)
        if wait is None:
            if answer is not None:
                return answer
            assert failure is not None
            raise failure
        if answer is not None and discard is not None:
            discard(answer[2])
        await asyncio.sleep(wait)
        number += 1
