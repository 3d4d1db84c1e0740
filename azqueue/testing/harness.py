"""A throwaway azqueue for tests of other projects: a server on its own storage prefix
(``azqueue.testing.server``), a worker of the SDK that runs until its task queue is
drained (``azqueue.testing.queueworker``), and Azure's failures on demand
(``StorageFaults``). Each runs on a ``BackgroundLoop``, so plain synchronous tests can use
them while they block; ``azqueue.testing.pytest_plugin`` makes fixtures of them."""

from __future__ import annotations

from azqueue.devstorage import Azurite
from azqueue.testing.background import BackgroundLoop
from azqueue.testing.faultproxy import FaultProxy, Faults
from azqueue.testing.queueworker import WORKER_GROUP, DrainTimeout, QueueWorker
from azqueue.testing.server import AzqueueServer, new_prefix, server_settings

__all__ = ["WORKER_GROUP", "AzqueueServer", "DrainTimeout", "QueueWorker", "StorageFaults",
           "new_prefix", "server_settings"]


class StorageFaults:
    """Azure's own failures in front of a server's storage (``FaultProxy``): ``set(busy,
    lost)`` injects them at those rates, ``once(method, path_contains, fault)`` into the
    next matching request, ``clear()`` stops; ``counts`` says what was done."""

    def __init__(self, loop: BackgroundLoop, proxy: FaultProxy) -> None:
        self._loop = loop
        self.proxy = proxy

    @classmethod
    def start(cls, loop: BackgroundLoop, azurite: Azurite) -> StorageFaults:
        proxy = FaultProxy(azurite.ports)
        loop.run(proxy.start())
        return cls(loop, proxy)

    @property
    def connection_string(self) -> str:
        """The storage account as seen through the proxy."""
        return self.proxy.connection_string()

    def set(self, busy: float = 0.0, lost: float = 0.0, drop_share: float = 0.5) -> None:
        """``busy``: the share of requests answered 503 ServerBusy (nothing applied);
        ``lost``: the share of writes applied whose answer is lost (500
        OperationTimedOut, or ``drop_share`` of them a dropped connection)."""
        faults = Faults(busy=busy, lost=lost, drop_share=drop_share)
        self._loop.call(setattr, self.proxy, "faults", faults)

    def clear(self) -> None:
        self.set()

    def once(self, method: str, path_contains: str, fault: str) -> None:
        """Inject ``fault`` ("busy", "timed out", "dropped", "refused" or "stalled") into
        the next request with ``method`` ("*": any) whose path contains ``path_contains``."""
        self._loop.call(self.proxy.once, method, path_contains, fault)

    @property
    def counts(self) -> dict[str, int]:
        """What was done to how many requests, e.g. ``{"queue busy": 3, ...}``."""
        return dict(self.proxy.counts)

    def stop(self) -> None:
        self._loop.run(self.proxy.stop())
