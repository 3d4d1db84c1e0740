"""The fault proxy's count of the storage round trips a call waited for one after another
(the benchmark's latency figures)."""

from __future__ import annotations

from azqueue.testing.faultproxy import Trip, round_trips
from azqueue.testing.requestkinds import Hit


def trip(kind: str, sent: float, answered: float, client: str = "server") -> Trip:
    return Trip(Hit(client, "queue", kind), sent, answered)


def test_requests_sent_together_are_one_round_trip_and_a_request_after_them_another() -> None:
    trips = [trip("tip", 0.0, 1.0), trip("trigger", 0.1, 1.2), trip("insert", 1.3, 2.0)]
    chain = round_trips(trips, 0.0, 2.5)
    assert len(chain) == 2 and chain[0].hit.kind in ("tip", "trigger")
    assert chain[1].hit.kind == "insert"


def test_requests_outside_the_call_or_of_other_clients_are_left_out() -> None:
    trips = [trip("before", -1.0, 0.5), trip("tip", 0.0, 1.0), trip("other", 1.1, 1.5, "celery"),
             trip("after", 1.2, 3.0)]
    assert [t.hit.kind for t in round_trips(trips, 0.0, 2.5)] == ["tip"]
    assert round_trips([], 0.0, 1.0) == []
