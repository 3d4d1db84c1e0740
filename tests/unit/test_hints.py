"""A pollTaskUrls caller waiting for a visible tip (``PendingHints.wait_visible``) is woken
by a tip marked visible whenever the mark comes, even on the tick its wait times out."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from azqueue.model.priority import ORDER
from azqueue.service.dispatch.hints import PendingHints


async def test_a_tip_marked_visible_as_the_wait_runs_out_wakes_its_waiter() -> None:
    # Neither storage client is used by a wait or a mark.
    hints = PendingHints(cast(Any, None), cast(Any, None), fallback=3600.0)
    waiting = asyncio.create_task(hints.wait_visible("prov/tick", 0.01))
    await asyncio.sleep(0)  # waiting: its time-out is due in 0.01 s
    asyncio.get_running_loop().call_later(0.05, hints.tip_visible, "prov/tick", ORDER[-1])
    # The loop is busy past both: on its next look the time-out runs, then the mark, before
    # the waiter has seen its event set. The mark took the event away, so the waiter must
    # count it, or it sleeps through the only wake-up it gets.
    time.sleep(0.1)
    assert await waiting
