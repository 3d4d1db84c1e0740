"""The doorbell's transport with events on (``doorbell``): a ring is a transient message
on the broker's doorbell exchange (``events.bells``), which every replica hears within
milliseconds, at no storage request.

Every task queue is worth a ring (a replica does not know who waits where), and every
one is covered while the broker is reachable. While it is away, nothing is covered and
the pollers look at their queues as they did before there was a doorbell; once it is
back, rings sent meanwhile were lost, so every waiter of this replica looks again.
"""

from __future__ import annotations

from collections.abc import Callable

from azqueue.events.bells import BrokerBells
from azqueue.service.dispatch.doorbell import Heard


class BrokerTransport:
    """Rings and hears the other replicas through ``bells``, the broker's doorbell."""

    def __init__(self, bells: BrokerBells) -> None:
        self.bells = bells

    async def start(self, heard: Heard, lost: Callable[[], None]) -> None:
        await self.bells.start(heard)
        self.bells.on_reconnect(lost)

    def covers(self, task_queue_id: str) -> bool:
        return self.bells.listening

    def worth_ringing(self, task_queue_id: str) -> bool:
        return True

    async def ring(self, rings: dict[str, set[int]]) -> None:
        await self.bells.ring(rings)

    async def sweep(self) -> None:
        pass  # nothing is kept per task queue

    async def close(self) -> None:
        await self.bells.close()
