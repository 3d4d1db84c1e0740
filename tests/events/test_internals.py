"""What azqueue relies on of aiormq beyond its documented API (``azqueue.internals.aiormq``)
still holds for the version installed, against a real RabbitMQ: the test fails when a
release changes it, before the publisher's bound on unconfirmed events silently stops
bounding anything."""

from __future__ import annotations

import aio_pika
import aiormq
import pytest

from azqueue.internals.aiormq import unconfirmed
from tests.events.test_durability import Proxy
from tests.waiting import eventually


async def test_a_channel_counts_the_confirms_it_awaits_also_those_given_up_on(
        amqp_url: str) -> None:
    """Each message sent on a channel with publisher confirms counts until the broker
    answers it, also once its publish gave up waiting; the broker's late answers bring
    the count back to nothing."""
    proxy = Proxy()
    await proxy.start()
    user = amqp_url.split("//", 1)[1].split("@", 1)[0]
    connection = await aio_pika.connect(f"amqp://{user}@127.0.0.1:{proxy.port}/")
    try:
        channel = await (await connection.channel(publisher_confirms=True)
                         ).get_underlay_channel()
        assert isinstance(channel, aiormq.Channel)
        # The default exchange confirms a message no queue takes (it is not mandatory).
        await channel.basic_publish(b"before", routing_key="nowhere", timeout=10)
        assert unconfirmed(channel) == 0

        proxy.freeze()
        for body in (b"first", b"second"):
            with pytest.raises(TimeoutError):
                await channel.basic_publish(body, routing_key="nowhere", timeout=0.5,
                                            wait=False)
        assert unconfirmed(channel) == 2

        proxy.thaw()
        await eventually(lambda: unconfirmed(channel) == 0, what="the broker's late confirms")
    finally:
        proxy.thaw()
        await connection.close()
        await proxy.close()
