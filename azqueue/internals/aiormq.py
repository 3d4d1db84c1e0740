"""What azqueue relies on of aiormq (under aio-pika) beyond its documented API.

Read against aiormq 7.2.4, as aio-pika 10.2.1 requires it (``pyproject.toml`` allows
aio-pika ``>=9.4,<11``). ``tests/events/test_internals.py`` fails when a release changes
it:

* **The confirms a channel awaits** (``events.publisher``, its bound on unconfirmed
  events): a channel opened with publisher confirms keeps one entry in its
  ``confirmations`` for each message sent on it until the broker answers it, also when
  the publish gave up waiting for the answer. aiormq documents neither the attribute nor
  when it is emptied, and offers no public count.
"""

from __future__ import annotations

import aiormq


def unconfirmed(channel: aiormq.Channel) -> int:
    """How many messages sent on ``channel`` still await the broker's confirm."""
    return len(channel.confirmations)
