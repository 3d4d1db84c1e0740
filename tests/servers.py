"""What tests know about the servers the fixtures of ``tests/conftest.py`` start."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

from azqueue.config import Client
from azqueue.model.tip import TipSigner
from azqueue.testing.inprocess import InProcessServer

# Under CI a missing service (RabbitMQ) fails the tests that need it instead of skipping them.
IN_CI = os.environ.get("CI", "").lower() == "true"
# The root client of every test server.
ROOT = Client("root", "root-access-token-for-tests-0123456789", ("*",))


# The servers make_server starts: the kit's, on the test's event loop.
Server = InProcessServer

# make_server(**settings overrides) -> a started Server.
ServerFactory = Callable[..., Awaitable[Server]]


def tip_signer(server: Server) -> TipSigner:
    """A signer of tips as ``server`` signs them: with its tip secrets, in its tip form
    (the same signatures, so a test can check or forge the tips it puts)."""
    return TipSigner(secrets=server.settings.tip_secrets, form=server.settings.tip_form)
