"""The route table: what each endpoint declares where it is registered."""

from __future__ import annotations

import pytest

from azqueue.api.routes import ROUTES, route


def test_every_endpoint_but_health_and_schemas_declares_its_scopes() -> None:
    """'Scopes per endpoint, as in Taskcluster's Queue reference' (README): a route
    registered without them would be open to anyone."""
    assert {r.name for r in ROUTES if r.scopes is None} == {
        "ping", "lbheartbeat", "heartbeat", "version", "metrics", "schema"}


def test_a_path_parameter_needs_a_convertor() -> None:
    with pytest.raises(ValueError) as info:
        route("GET", "/task/<taskId>/things/<thing>", "listThings")
    assert "<thing>" in str(info.value)

