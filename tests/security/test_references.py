"""``reference`` artifacts whose URL would break the redirect to it: a URL holding CR or
LF (header injection into the Location of getArtifact) or another control character is
refused at creation, and one stored before that rule is answered cleanly, never with a
dropped connection and a traceback."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest

from azqueue.model.artifact import from_request
from azqueue.testing import sas
from azqueue.testing.storage import StorageInspector
from azqueue.testing.tasks import iso
from tests.integration.test_artifacts import _running_task
from tests.servers import Server

INJECTED = "https://example.com/x\r\nSet-Cookie: session=stolen"


def _reference(url: str) -> dict[str, str]:
    return {"storageType": "reference", "url": url,
            "expires": iso(datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=50))}


@pytest.mark.parametrize("url", [INJECTED, "https://example.com/a\nb", "https://example.com/\x1b[2J",
                                 "https://example.com/a b", "https://example.com/\x85"])
async def test_a_reference_url_with_control_characters_is_refused_at_creation(
        server: Server, http: aiohttp.ClientSession, url: str) -> None:
    task_id = await _running_task(http, server)
    code, answer = await sas.post(
        http, f"{server.api}/task/{task_id}/runs/0/artifacts/public/ref", _reference(url))
    assert code == 400, answer
    assert answer["code"] == "InputValidationError"
    assert "`url`" in answer["message"] and "percent-encode" in answer["message"]


async def test_a_stored_reference_url_with_cr_lf_is_answered_cleanly(
        server: Server, http: aiohttp.ClientSession, anonymous: aiohttp.ClientSession,
        storage: StorageInspector, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    task_id = await _running_task(http, server)
    name = "public/old-ref"
    code, answer = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/artifacts/{name}",
                                  _reference("https://example.com/fine"))
    assert code == 200, answer
    # As an earlier release stored it: the same artifact with the URL it did not refuse.
    artifacts = server.services.artifacts
    task = await storage.task(task_id)
    stored = from_request(task, 0, name, _reference("https://example.com/fine"))
    await artifacts.records.delete(stored)
    assert await artifacts.records.insert(replace(stored, url=INJECTED), [])

    async with anonymous.get(f"{server.api}/task/{task_id}/runs/0/artifacts/{name}",
                             allow_redirects=False) as r:
        assert r.status == 409, await r.text()
        assert "Set-Cookie" not in r.headers
        answer = await r.json()
    assert answer["code"] == "RequestConflict"
    assert "cannot be served" in answer["message"]
    assert not [rec for rec in caplog.records if rec.exc_info], caplog.text
