"""The one error tree: what reaches a client, what loops retry quietly, what is a bug."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from azqueue import errors
from azqueue.api.middleware import error_middleware
from azqueue.background import every
from azqueue.config import ConfigError
from azqueue.events.publisher import Publisher
from azqueue.model import events
from azqueue.service import wiring
from azqueue.storage import errors as storage_errors
from azqueue.storage.rest import RequestFailed


def test_storage_errors_are_one_branch_of_the_tree_and_never_rendered() -> None:
    for name in ("EntityNotFound", "EntityExists", "ETagMismatch", "TransactionConflict",
                 "MessageGone"):
        cls = getattr(storage_errors, name)
        assert cls is getattr(errors, name)
        assert issubclass(cls, errors.StorageCondition) and not issubclass(cls, errors.QueueError)
    assert storage_errors.StorageError is errors.StorageError


@pytest.mark.parametrize(("status", "code", "expected"), [
    (404, "ResourceNotFound", errors.EntityNotFound),
    (404, "QueueNotFound", errors.EntityNotFound),
    (409, "EntityAlreadyExists", errors.EntityExists),
    (409, "QueueBeingDeleted", errors.QueueBeingDeleted),
    (409, "TableBeingDeleted", errors.StorageError),
    (412, "UpdateConditionNotSatisfied", errors.ETagMismatch),
    (503, "ServerBusy", errors.StorageUnavailable),
    (500, "InternalError", errors.StorageUnavailable),
    (403, "AuthenticationFailed", errors.StorageError),
])
def test_an_error_answer_to_a_hand_written_request_is_one_of_azqueues_errors(
        status: int, code: str, expected: type[Exception]) -> None:
    with pytest.raises(expected) as info, storage_errors.translate("reading tasks"):
        raise RequestFailed("reading tasks", status, code)
    assert type(info.value) is expected and "reading tasks" in str(info.value)


@pytest.mark.parametrize(("status", "code", "lost", "expected"), [
    (404, "MessageNotFound", False, errors.MessageGone),
    (400, "PopReceiptMismatch", False, errors.MessageGone),
    (400, "PopReceiptMismatch", True, errors.ReceiptLost),
    (404, "MessageNotFound", True, errors.ReceiptLost),
    (400, "InvalidQueryParameterValue", False, errors.StorageError),
    (503, "ServerBusy", True, errors.StorageUnavailable),
])
def test_a_message_refused_by_its_receipt_is_gone_or_its_receipt_lost(
        status: int, code: str, lost: bool, expected: type[Exception]) -> None:
    with pytest.raises(expected) as info, storage_errors.translate_message("deleting a tip"):
        raise RequestFailed("deleting a tip", status, code, after_lost_answer=lost)
    assert type(info.value) is expected


def test_a_storage_failure_is_its_own_branch_and_no_answer_to_a_client() -> None:
    for cls in (errors.StorageError, errors.StorageUnavailable):
        assert issubclass(cls, errors.AzqueueError) and not issubclass(cls, errors.QueueError)
        assert not issubclass(cls, errors.StorageCondition)
        assert not hasattr(cls("Azure Storage failed"), "status")


async def _answer(failure: Exception) -> web.Response:
    async def handler(request: web.Request) -> web.StreamResponse:
        raise failure

    response = await error_middleware(make_mocked_request("GET", "/api/queue/v1/ping"), handler)
    assert isinstance(response, web.Response)
    return response


async def test_the_api_answers_storage_that_stays_unavailable_503_with_retry_after() -> None:
    response = await _answer(errors.StorageUnavailable("Azure Storage is busy"))
    assert (response.status, response.headers["Retry-After"]) == (503, "2")
    assert isinstance(response.body, bytes)
    body = json.loads(response.body)
    assert body["code"] == "StorageUnavailable"
    assert body["message"] == "Azure Storage is busy; retry after 2s"


async def test_the_api_answers_an_unexpected_storage_failure_500_with_an_incident(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="azqueue.api.middleware"):
        response = await _answer(errors.StorageError("Azure Storage failed during a read: 400 X"))
    assert response.status == 500
    assert isinstance(response.body, bytes)
    body = json.loads(response.body)
    assert body["code"] == "InternalServerError"
    [record] = caplog.records
    incident = record.getMessage().split()[1].rstrip(":")
    assert body["message"] == f"Azure Storage failed during a read: 400 X (incident {incident})"


def test_a_configuration_mistake_is_not_an_http_error() -> None:
    assert issubclass(ConfigError, errors.AzqueueError)
    assert not issubclass(ConfigError, errors.QueueError)
    assert not hasattr(ConfigError("AZQUEUE_PORT"), "status")


def test_a_body_that_is_not_json_keeps_taskclusters_code() -> None:
    assert (errors.InvalidJson.code, errors.InvalidJson.status) == ("MalformedPayload", 400)


async def test_an_unreachable_broker_is_a_broker_error(refused_port: int) -> None:
    publisher = Publisher(f"amqp://guest:guest@127.0.0.1:{refused_port}/", "test/")
    try:
        with pytest.raises(errors.BrokerError) as info:
            await publisher.publish(events.task_group_resolved("g", "s", "2030-01-01T00:00:00.000Z"))
        assert isinstance(info.value, errors.TRANSIENT)
        assert "task-group-resolved primary.g.s._ not confirmed" in info.value.message
    finally:
        await publisher.close()


@pytest.mark.parametrize(("failure", "traceback"), [
    (errors.StorageError("Azure Storage failed during a read: 503 ServerBusy"), False),
    (errors.BrokerError("task-pending not confirmed"), False),
    (KeyError("taskId"), True),
])
async def test_a_resolver_logs_an_outage_in_one_line_and_a_bug_with_its_traceback(
        caplog: pytest.LogCaptureFixture, failure: Exception, traceback: bool) -> None:
    stop = asyncio.Event()

    async def step() -> None:
        stop.set()
        raise failure

    # A resolver's real name: the metrics it counts stay among those /metrics may show.
    with caplog.at_level(logging.WARNING, logger="azqueue.background"):
        await every(0.01, step, stop, "expiry")
    [record] = caplog.records
    assert record.getMessage().startswith("expiry: ")
    assert (record.exc_info is not None) is traceback


async def test_a_blob_service_that_refuses_the_cors_rule_stops_the_start_in_one_line() -> None:
    """AZQUEUE_BLOB_CORS_ORIGINS is set as a server starts: a refusal is a StartupError
    naming the setting (serve exits 1 with it), a rule too many the ConfigError it is."""
    asked: list[tuple[str, ...]] = []

    def services(failure: Exception | None) -> Any:
        async def allow_browsers(origins: tuple[str, ...]) -> bool:
            asked.append(origins)
            if failure is not None:
                raise failure
            return True
        return SimpleNamespace(artifacts=SimpleNamespace(blobs=SimpleNamespace(
            allow_browsers=allow_browsers)))

    origins = ("https://queue.example.com",)
    none: Any = SimpleNamespace(blob_cors_origins=())
    await wiring.allow_browsers(none, services(None))
    assert asked == []
    settings: Any = SimpleNamespace(blob_cors_origins=origins)
    with pytest.raises(errors.StartupError) as refused:
        await wiring.allow_browsers(settings, services(RuntimeError("This request is not "
                                                                    "authorized\nRequestId:1")))
    assert refused.value.message == (
        "could not set the Blob service's CORS rules for AZQUEUE_BLOB_CORS_ORIGINS: "
        "RuntimeError: This request is not authorized; leave it empty to keep the account's "
        "rules")
    with pytest.raises(ConfigError):
        await wiring.allow_browsers(settings, services(ConfigError("five rules already")))
    await wiring.allow_browsers(settings, services(None))
    assert asked == [origins] * 3
