"""The route table: what each endpoint declares where it is registered."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from azqueue.api.app import ROUTES
from azqueue.api.routing import MATCH_KEY, Router, Routes


def test_every_endpoint_but_health_and_schemas_declares_its_scopes() -> None:
    """'Scopes per endpoint, as in Taskcluster's Queue reference' (docs/api/auth.md): a route
    registered without them would be open to anyone."""
    assert {r.name for r in ROUTES if r.scopes is None} == {
        "ping", "lbheartbeat", "heartbeat", "version", "metrics", "schema"}


def test_a_path_parameter_needs_a_convertor() -> None:
    with pytest.raises(ValueError) as info:
        Routes("Things").declare("GET", "/task/<taskId>/things/<thing>", "listThings",
                                 title="List things")
    assert "<thing>" in str(info.value)


def test_no_route_is_declared_twice() -> None:
    """Each endpoint once by name, and each method and path once: a second declaration
    would never be reached, or would shadow the first."""
    names = [r.name for r in ROUTES]
    assert sorted({n for n in names if names.count(n) > 1}) == []
    targets = [(r.method, r.path) for r in ROUTES]
    assert sorted({t for t in targets if targets.count(t) > 1}) == []


def test_a_table_that_declares_a_route_twice_is_refused() -> None:
    routes = Routes("Service")

    async def handler() -> None:
        pass

    routes.declare("GET", "/ping", "ping", title="Ping")(handler)
    routes.declare("GET", "/ping", "ping", title="Ping")(handler)
    with pytest.raises(ValueError) as info:
        Router(routes.table)
    assert "ping" in str(info.value)


def test_only_claim_work_and_poll_task_urls_long_poll() -> None:
    """Their storage calls get the long poll's time on top of a request's budget
    (pollTaskUrls waits with ``wait``)."""
    assert sorted(r.name for r in ROUTES if r.long_poll) == ["claimWork", "pollTaskUrls"]


def test_listings_declare_the_query_parameters_they_read() -> None:
    paged = {r.name for r in ROUTES if {"continuationToken", "limit"} <= r.query}
    assert paged == {"listTaskGroup", "listDependentTasks", "tasks", "statuses",
                     "listProvisioners", "listWorkerTypes", "listTaskQueues", "listWorkers",
                     "listPendingTasks", "listClaimedTasks", "listArtifacts",
                     "listLatestArtifacts"}
    by_name = {r.name: r for r in ROUTES}
    assert "pending" in by_name["pollTaskUrls"].query
    assert "quarantined" in by_name["listWorkers"].query
    assert by_name["claimWork"].query == frozenset()


def _router() -> Router:
    routes = Routes("Things")

    async def handler(call: object) -> None:
        pass

    routes.declare("GET", "/ping", "ping", title="Ping")(handler)
    routes.declare("POST", "/claim-work/<taskQueueId>", "claimWork", title="Claim work",
                   long_poll=True)(handler)
    return Router(routes.table)


def test_a_request_is_matched_once_for_its_budget_and_its_handler() -> None:
    """The storage budget asks whether the request long-polls before the handler runs;
    the handler serves that same match (the table is not read again)."""
    router = _router()
    request = make_mocked_request("POST", "/api/queue/v1/claim-work/prov%2Ftype")
    assert router.long_polls(request)
    found = request[MATCH_KEY]
    assert found.route is not None and found.route.name == "claimWork"
    assert found.params == {"taskQueueId": "prov/type"}
    router.table = []  # a second reading of the table would find nothing
    assert router.match(request) is found
    assert not router.long_polls(make_mocked_request("GET", "/api/queue/v1/ping"))


def test_a_clone_with_another_path_is_matched_for_its_own_path() -> None:
    """The root's Dockerflow paths are served as under the API by a clone of the request,
    which carries its original's state: it is matched for its own path."""
    router = _router()
    request = make_mocked_request("GET", "/__heartbeat__")
    assert not router.long_polls(request)
    assert request[MATCH_KEY].route is None
    clone = request.clone(rel_url="/api/queue/v1/ping")
    found = router.match(clone)
    assert found.route is not None and found.route.name == "ping"
