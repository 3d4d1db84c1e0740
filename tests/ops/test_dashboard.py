"""The dashboard in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by Selenium): pages load, show what the test created, follow its state changes,
escape what they show, lead to tasks without their IDs, draw their charts, act for an
operator signed in with the scopes for it (and only then), and log no console errors.

Skipped when Chromium is missing, except under CI (``tests/browser.py``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from azure.storage.blob.aio import BlobServiceClient

from azqueue import __version__, release
from azqueue.config import Client
from azqueue.devstorage import Azurite
from azqueue.model.priority import ORDER
from azqueue.testing import sas
from azqueue.testing.tasks import create, definition, slugid, status
from tests.browser import browser  # noqa: F401 - the fixture
from tests.servers import Server
from tests.waiting import eventually
from tests.worker.helpers import running, shell_worker

HOSTILE = '<img src=x onerror="window.__injected = true">'

pytestmark = pytest.mark.browser


async def until(driver: Any, check: Callable[[Any], Any], what: str, timeout: float = 30) -> Any:
    """Wait (without blocking the server on this loop) until ``check(driver)`` is truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            found = await asyncio.to_thread(check, driver)
        except Exception:  # noqa: BLE001 - the page is still changing: look again
            found = None
        if found:
            return found
        if asyncio.get_running_loop().time() > deadline:
            source = await asyncio.to_thread(lambda: driver.find_element("id", "view").text)
            raise AssertionError(f"the dashboard never showed {what}; it shows:\n{source}")
        await asyncio.sleep(0.2)


def text_of(selector: str) -> Callable[[Any], str]:
    return lambda driver: driver.find_element("css selector", selector).text


async def console_errors(driver: Any) -> list[str]:
    entries = await asyncio.to_thread(driver.get_log, "browser")
    return [e["message"] for e in entries if e["level"] == "SEVERE"]


async def test_a_task_page_shows_the_task_and_follows_it_to_completed(
        server: Server, http: aiohttp.ClientSession, browser: Any) -> None:
    body = definition("prov/dash")
    body["metadata"]["name"] = HOSTILE
    task_id = await create(http, server.api, body)
    await asyncio.to_thread(browser.get, f"{server.root_url}/#/task/{task_id}")
    await until(browser, lambda d: text_of("h1")(d) == HOSTILE, "the task's name as text")
    await until(browser, lambda d: d.find_element("css selector", 'dd [data-state="pending"]'),
                "the pending state")
    assert await asyncio.to_thread(browser.execute_script,
                                   "return document.querySelectorAll('main img').length") == 0
    assert await asyncio.to_thread(browser.execute_script, "return window.__injected") is None

    urls = await sas.poll_task_urls(http, server.api, "prov", "dash")
    [message] = await sas.poll_once(http, urls)
    code, _ = await sas.claim(http, server.api, message)
    assert code == 200
    await until(browser, lambda d: d.find_element("css selector", 'dd [data-state="running"]'),
                "the running state, without a reload")
    code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/completed", {})
    assert code == 200
    await until(browser, lambda d: d.find_element("css selector", 'dd [data-state="completed"]'),
                "the completed state, without a reload")
    runs = await asyncio.to_thread(text_of("main table"), browser)
    assert "completed" in runs and "wg/w1" in runs
    assert await console_errors(browser) == []


@pytest.fixture
async def readable_blobs(server: Server, azurite: Azurite) -> AsyncIterator[None]:
    """Blob storage lets the dashboard's origin read artifacts (CORS), as `azqueue dev`
    and AZQUEUE_BLOB_CORS_ORIGINS arrange; the rule is removed afterwards."""
    assert await server.services.artifacts.blobs.allow_browsers((server.root_url,))
    yield
    async with BlobServiceClient.from_connection_string(azurite.connection_string) as blobs:
        await blobs.set_service_properties(cors=[])


async def test_a_running_tasks_log_grows_on_its_page_without_a_reload(
        server: Server, http: aiohttp.ClientSession, browser: Any, readable_blobs: None,
        tmp_path: Path) -> None:
    more, end = tmp_path / "more", tmp_path / "end"
    wait = "while [ ! -e {} ]; do sleep 0.05; done"
    task_id = await create(http, server.api, definition("prov/dash-log", payload={"command": [
        "sh", "-c", f"printf 'first %s\\n' line; {wait.format(more)}; printf '%s\\n' \"$HOSTILE\"; "
                    f"printf 'later %s\\n' line; {wait.format(end)}"],
        "env": {"HOSTILE": HOSTILE}}))
    log = text_of("pre.log")
    async with running(shell_worker(server, "prov/dash-log", "dash", log_interval=0.2)):
        try:
            # The page is opened once the log is there: a page that reads it in the moment
            # between the worker's createArtifact and its first append sees a 404, which
            # the page shrugs off but the browser logs as a console error.
            await eventually(lambda: log_text(http, server.api, task_id),
                             lambda text: "first line" in text, what="the log's first line")
            await asyncio.to_thread(browser.get, f"{server.root_url}/#/task/{task_id}")
            await until(browser, lambda d: "first line" in log(d), "the log's first line")
            await asyncio.to_thread(browser.execute_script, "window.__same_page = true")
            more.touch()
            await until(browser, lambda d: "later line" in log(d), "a later line, without a reload")
            assert await asyncio.to_thread(browser.execute_script,
                                           "return window.__same_page") is True
            assert "running" in await asyncio.to_thread(text_of("main table"), browser)
            end.touch()
            await until(browser, lambda d: d.find_element(
                "css selector", 'dd [data-state="completed"]'), "the completed state")
            await until(browser, lambda d: "[azqueue] exit code 0" in log(d),
                        "the end of the log")
        finally:
            more.touch()
            end.touch()
    shown = await asyncio.to_thread(log, browser)
    assert shown.count("first line\n") == shown.count("later line\n") == 1, shown
    assert HOSTILE in shown  # shown as text, not markup
    assert await asyncio.to_thread(browser.execute_script,
                                   "return document.querySelectorAll('main img').length") == 0
    assert await asyncio.to_thread(browser.execute_script, "return window.__injected") is None
    assert await console_errors(browser) == []


async def log_text(http: aiohttp.ClientSession, api: str, task_id: str) -> str:
    """The live log of run 0 as read through the API, or "" while it is not there yet."""
    async with http.get(f"{api}/task/{task_id}/runs/0/artifacts/public/logs/live.log") as got:
        return await got.text() if got.status == 200 else ""


async def test_a_group_page_lists_its_members_and_their_states(
        server: Server, http: aiohttp.ClientSession, browser: Any) -> None:
    group = slugid()
    names = []
    for i in range(3):
        body = definition("prov/dash-group")
        body["taskGroupId"] = group
        body["metadata"]["name"] = names.append(f"member {i}") or f"member {i}"
        await create(http, server.api, body)
    await asyncio.to_thread(browser.get, f"{server.root_url}/#/group/{group}")
    table = await until(browser, lambda d: "member 2" in text_of("main table")(d)
                        and text_of("main table")(d), "the group's members")
    assert all(name in table for name in names) and table.count("pending") == 3
    bar = await asyncio.to_thread(browser.find_element, "css selector",
                                  'svg.bar rect[data-state="pending"]')
    assert await asyncio.to_thread(bar.get_attribute, "width") == "100.00"
    assert "0 of 3" in await asyncio.to_thread(text_of("main dl"), browser)
    assert await console_errors(browser) == []


async def test_the_opening_form_leads_to_a_task(
        server: Server, http: aiohttp.ClientSession, browser: Any) -> None:
    task_id = await create(http, server.api, definition("prov/dash-form"))
    await asyncio.to_thread(browser.get, f"{server.root_url}/")
    field = await until(browser, lambda d: d.find_element("id", "open-id"), "the form")
    await asyncio.to_thread(field.send_keys, task_id)
    button = await asyncio.to_thread(browser.find_element, "css selector",
                                     'header button[value="task"]')
    await asyncio.to_thread(button.click)
    await until(browser, lambda d: task_id in text_of("main dl")(d), "the task opened")


async def test_task_queues_show_their_counts_pending_tasks_and_workers(
        server: Server, http: aiohttp.ClientSession, browser: Any) -> None:
    """Anonymous, with the default anonymous scopes: the overview lists the task queue
    with its counts, and its page lists pending tasks and the worker that claimed one."""
    pending = [await create(http, server.api, definition("prov/dash-q")) for _ in range(2)]
    claimed = await create(http, server.api, definition("prov/dash-q", priority="highest"))
    code, body = await sas.post(http, f"{server.api}/claim-work/prov%2Fdash-q",
                                {"workerGroup": "wg", "workerId": "dash-worker", "tasks": 1})
    assert code == 200 and body["tasks"][0]["status"]["taskId"] == claimed
    await asyncio.to_thread(browser.get, f"{server.root_url}/")
    await until(browser, lambda d: "prov/dash-q" in text_of("main table")(d), "the task queue")
    await asyncio.to_thread(browser.get, f"{server.root_url}/#/queue/prov%2Fdash-q")
    await until(browser, lambda d: all(t in text_of("main")(d) for t in pending),
                "the pending tasks")
    await until(browser, lambda d: "wg/dash-worker" in text_of("main")(d)
                and claimed in text_of("main")(d), "the worker and its recent task")
    assert await console_errors(browser) == []


async def resolve(http: aiohttp.ClientSession, server: Server, task_queue_id: str,
                  outcomes: list[str]) -> list[str]:
    """Tasks of ``task_queue_id`` claimed and resolved, one per outcome (completed,
    failed, ...); their IDs in that order."""
    ids = [await create(http, server.api, definition(task_queue_id)) for _ in outcomes]
    code, body = await sas.post(http, f"{server.api}/claim-work/{task_queue_id.replace('/', '%2F')}",
                                {"workerGroup": "wg", "workerId": "w1", "tasks": len(ids)})
    assert code == 200 and len(body["tasks"]) == len(ids)
    for task_id, outcome in zip(ids, outcomes):
        code, _ = await sas.post(http, f"{server.api}/task/{task_id}/runs/0/{outcome}", {})
        assert code == 200
    return ids


async def test_a_failed_task_is_found_from_the_front_page_without_its_id(
        server: Server, http: aiohttp.ClientSession, browser: Any) -> None:
    _, failed = await resolve(http, server, "prov/dash-fail", ["completed", "failed"])
    await asyncio.to_thread(browser.get, f"{server.root_url}/")
    link = await until(browser, lambda d: d.find_element(
        "css selector", f'table.failures a[href="#/task/{failed}"]'), "the failed task listed")
    assert "recent on this replica" in await asyncio.to_thread(text_of("main"), browser)
    # The header names the release of the replica that answered.
    assert await asyncio.to_thread(text_of("#releases"), browser) == (
        f"azqueue {__version__} ({release.current().commit[:7]})")
    await asyncio.to_thread(link.click)
    await until(browser, lambda d: d.find_element("css selector", 'dd [data-state="failed"]'),
                "the failed task's page")
    runs = await asyncio.to_thread(text_of("table.runs"), browser)
    assert "wg/w1" in runs and "failed" in runs
    assert await console_errors(browser) == []


async def test_the_front_page_charts_resolutions_per_minute_and_the_backlog(
        server: Server, http: aiohttp.ClientSession, browser: Any) -> None:
    await resolve(http, server, "prov/dash-chart", ["completed", "completed", "failed"])
    await create(http, server.api, definition("prov/dash-chart"))
    await asyncio.to_thread(browser.get, f"{server.root_url}/")
    counted = "return [...document.querySelectorAll('figure.throughput rect[data-state=\"%s\"]')]" \
              ".reduce((n, r) => n + Number(r.dataset.count), 0)"
    await until(browser, lambda d: d.execute_script(counted % "completed") >= 2
                and d.execute_script(counted % "failed") >= 1, "the resolutions charted")
    # Two samples of the backlog, a refresh apart: a line with two points or more.
    await until(browser, lambda d: len(d.find_element(
        "css selector", 'figure.backlog polyline[data-queue="prov/dash-chart"]')
        .get_attribute("points").split()) >= 2, "the backlog charted")
    assert await console_errors(browser) == []


VIEWER = Client("viewer", "viewer-access-token-0123456789abcdef", (
    "queue:get-task:*", "queue:status:*", "queue:list-artifacts:*"))
OPERATOR = Client("operator", "operator-access-token-0123456789abcd", (
    *VIEWER.scopes, "queue:cancel-task:*"))


async def _submit_sign_in(driver: Any, client_id: str, access_token: str) -> None:
    for field, text in (("signin-client", client_id), ("signin-token", access_token)):
        element = await asyncio.to_thread(driver.find_element, "id", field)
        await asyncio.to_thread(element.clear)
        await asyncio.to_thread(element.send_keys, text)
    button = await asyncio.to_thread(driver.find_element, "css selector", "#signin button")
    await asyncio.to_thread(button.click)


async def sign_in(driver: Any, client: Client) -> None:
    await _submit_sign_in(driver, client.client_id, client.access_token)
    await until(driver, lambda d: text_of("#signed-as")(d) == f"signed in as {client.client_id}",
                "signed in")


async def test_signing_in_with_a_wrong_token_says_so_and_stays_signed_out(
        make_server: Any, browser: Any) -> None:
    server = await make_server(clients=(VIEWER,))
    await asyncio.to_thread(browser.get, f"{server.root_url}/")
    await _submit_sign_in(browser, VIEWER.client_id, "not-the-viewer-access-token-at-all")
    error = await until(browser, lambda d: d.find_element("id", "signin-error").is_displayed()
                        and text_of("#signin-error")(d), "the sign-in error")
    assert error.startswith("The queue refused these credentials (401"), error
    assert await asyncio.to_thread(text_of("#signed-as"), browser) == ""
    await sign_in(browser, VIEWER)


async def test_a_signed_in_operator_cancels_a_running_task_and_others_cannot(
        make_server: Any, http: aiohttp.ClientSession, browser: Any) -> None:
    server = await make_server(clients=(VIEWER, OPERATOR))
    task_id = await create(http, server.api, definition("prov/dash-cancel"))
    code, _ = await sas.post(http, f"{server.api}/claim-work/prov%2Fdash-cancel",
                             {"workerGroup": "wg", "workerId": "w1", "tasks": 1})
    assert code == 200
    await asyncio.to_thread(browser.get, f"{server.root_url}/#/task/{task_id}")
    await until(browser, lambda d: d.find_element("css selector", 'dd [data-state="running"]'),
                "the running task")
    assert "Sign in to cancel" in await asyncio.to_thread(text_of("main"), browser)
    assert not await asyncio.to_thread(browser.find_elements, "css selector",
                                       'button[name="cancel"]')

    async def cancel(confirm: bool = True) -> str:
        button = await until(browser, lambda d: d.find_element(
            "css selector", 'button[name="cancel"]'), "the cancel button")
        await asyncio.to_thread(button.click)
        question = await until(browser, lambda d: d.switch_to.alert, "the confirmation")
        assert f"Cancel task {task_id}?" in question.text
        await asyncio.to_thread(question.accept if confirm else question.dismiss)
        if not confirm:
            return ""
        return await until(browser, lambda d: (t := text_of(".actions .result")(d)) != "…" and t,
                           "the answer to cancel")

    await sign_in(browser, VIEWER)
    # The priorities offered are the model's, highest first, the task's own chosen.
    offered = await until(browser, lambda d: d.execute_script(
        "return [...document.querySelectorAll('.actions select option')].map(o => o.value)"),
        "the priorities")
    assert offered == [p.value for p in ORDER]
    chosen = await asyncio.to_thread(browser.execute_script,
                                     "return document.querySelector('.actions select').value")
    assert chosen == "lowest"
    refused = await cancel()
    assert "403" in refused and "queue:cancel-task:" in refused, refused
    assert (await status(http, server.api, task_id))["state"] == "running"

    signout = await asyncio.to_thread(browser.find_element, "id", "signout")
    await asyncio.to_thread(signout.click)
    await sign_in(browser, OPERATOR)
    await cancel(confirm=False)
    assert (await status(http, server.api, task_id))["state"] == "running"
    await cancel()
    await until(browser, lambda d: d.find_element("css selector", 'dd [data-state="exception"]'),
                "the canceled task")
    assert "canceled" in await asyncio.to_thread(text_of("table.runs"), browser)
    assert (await status(http, server.api, task_id))["state"] == "exception"
    # The browser itself logs the refused request; the page logs nothing.
    assert [e for e in await console_errors(browser)
            if f"/task/{task_id}/cancel - Failed to load resource" not in e
            or "status of 403" not in e] == []
