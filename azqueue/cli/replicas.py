"""``azqueue dev --replicas N``: the replicas after the first, each an ``azqueue serve``
process (started as the test kit starts one, ``azqueue.testing.processes``) on the dev's
Azurite with the dev's settings and a port of its own, as the replicas of one deployment
share one storage account; each is stopped with the dev."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

from azqueue.config import Settings
from azqueue.errors import StartupError


def replicas(settings: Settings, count: int) -> list[Settings]:
    """The settings of ``count`` replicas: ``settings`` on consecutive ports."""
    return [settings.with_(port=settings.port + i) for i in range(count)]


@asynccontextmanager
async def serving(env: Mapping[str, str], others: list[Settings]) -> AsyncIterator[None]:
    """An ``azqueue serve`` process for each of ``others``, configured by the
    ``AZQUEUE_*`` variables of ``env`` and its port, once each answers; stopped on exit."""
    from azqueue.testing.processes import NotServing, ServeProcess
    variables = {k: v for k, v in env.items() if k.startswith("AZQUEUE_")}
    async with AsyncExitStack() as stack:
        for replica in others:
            try:
                server = await ServeProcess.start(variables, port=replica.port)
            except NotServing as e:
                raise StartupError(f"the replica on port {replica.port} did not start: "
                                   f"{e}") from None
            stack.push_async_callback(server.stop)
        yield
