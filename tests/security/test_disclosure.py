"""What a caller, a log or a traceback learns that it should not: secrets in reprs,
which clientIds exist, and /metrics where the operator did not ask for it."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import aiohttp
import mohawk
import pytest
import taskcluster
from taskcluster.exceptions import TaskclusterAuthFailure

from azqueue.config import Client, Settings, StorageSettings
from azqueue.devstorage import KEY, free_port
from azqueue.testing.tasks import definition, slugid
from azqueue.worker import Credentials
from tests.servers import ROOT, Server, ServerFactory

AMQP_PASSWORD = "broker-password-0123456789"


def test_the_repr_of_settings_and_credentials_holds_no_secret() -> None:
    settings = Settings(
        storage=StorageSettings(f"AccountName=devstoreaccount1;AccountKey={KEY};"
                                "QueueEndpoint=http://127.0.0.1:1/devstoreaccount1"),
        tip_secrets=("tip-secret-0123456789abcdef",), root=ROOT,
        clients=(Client("builder", "builder-token-0123456789abcdef", ("queue:*",)),),
        amqp_url=f"amqp://azqueue:{AMQP_PASSWORD}@broker:5672/")
    shown = repr(settings) + repr(Credentials("c", "credentials-token-0123456789", '{"cert"}'))
    for secret in (KEY, "tip-secret-0123456789abcdef", ROOT.access_token,
                   "builder-token-0123456789abcdef", AMQP_PASSWORD, "credentials-token", "cert"):
        assert secret not in shown, secret
    assert "builder" in shown and "root" in shown  # what is no secret stays readable


async def _hawk(http: aiohttp.ClientSession, url: str, client_id: str, token: str
                ) -> tuple[int, str]:
    sender = mohawk.Sender({"id": client_id, "key": token, "algorithm": "sha256"}, url, "PUT",
                           content=b"{}", content_type="application/json")
    async with http.put(url, data=b"{}", headers={"Authorization": sender.request_header,
                                                  "Content-Type": "application/json"}) as r:
        return r.status, (await r.json())["message"]


async def test_an_unknown_client_id_is_answered_as_a_wrong_access_token(
        server: Server, anonymous: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture) -> None:
    """The caller cannot tell whether a clientId exists; the operator's log can."""
    caplog.set_level(logging.INFO, logger="azqueue.api.auth")
    url = f"{server.api}/task/{slugid()}"
    wrong_token = await _hawk(anonymous, url, "root", "not-the-root-token-0123456789")
    unknown = await _hawk(anonymous, url, "nobody-here", "not-the-root-token-0123456789")
    assert wrong_token[0] == unknown[0] == 401
    assert wrong_token[1].replace("'root'", "ID") == unknown[1].replace("'nobody-here'", "ID")
    logged = " | ".join(r.getMessage() for r in caplog.records)
    assert "clientId 'nobody-here' is not a known client" in logged, logged
    assert "the Hawk signature of clientId 'root' does not match" in logged, logged


async def test_an_unknown_certificate_issuer_is_answered_as_a_wrong_signature(
        server: Server) -> None:
    now = datetime.now(UTC)
    answers = []
    for issuer, token in (("root", "not-the-root-token-0123456789"),
                          ("nobody-here", "not-the-root-token-0123456789")):
        temp = taskcluster.createTemporaryCredentials(
            issuer, token, now - timedelta(minutes=1), now + timedelta(hours=1), ["queue:*"])
        queue = taskcluster.Queue({"rootUrl": server.root_url, "maxRetries": 0,
                                   "credentials": temp})
        with pytest.raises(TaskclusterAuthFailure) as refused:
            await asyncio.to_thread(queue.createTask, slugid(), definition())
        answers.append(refused.value.body["message"].replace(f"'{issuer}'", "ID"))
    assert answers[0] == answers[1], answers


async def test_metrics_can_be_served_on_a_listener_of_their_own(
        make_server: ServerFactory, anonymous: aiohttp.ClientSession) -> None:
    """AZQUEUE_METRICS_PORT: /metrics answers there (on 127.0.0.1), and the API's port
    no longer answers it to whoever asks."""
    port = free_port()
    server = await make_server(metrics_port=port)
    async with anonymous.get(f"http://127.0.0.1:{port}/metrics") as r:
        assert r.status == 200
        assert "azqueue_api_requests_total" in await r.text()
    async with anonymous.get(f"{server.root_url}/metrics") as r:
        assert r.status == 404


def test_the_metrics_listener_is_read_from_the_environment() -> None:
    settings = Settings.from_env({
        "AZQUEUE_STORAGE_CONNECTION_STRING": "AccountName=a", "AZQUEUE_TIP_SECRETS": "s" * 32,
        "AZQUEUE_ROOT_CLIENT_ID": "root", "AZQUEUE_ROOT_ACCESS_TOKEN": ROOT.access_token,
        "AZQUEUE_METRICS_PORT": "9464"})
    assert (settings.metrics_host, settings.metrics_port) == ("127.0.0.1", 9464)
