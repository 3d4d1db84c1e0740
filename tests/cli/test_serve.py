"""`azqueue serve` on a port it is not given: AZQUEUE_PORT=0 serves on any free port,
which its start-up line and its rootUrl name."""

from __future__ import annotations

import asyncio
import secrets
import re
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from azqueue.devstorage import Azurite
from azqueue.model import upload
from azqueue.testing.hawk import signed_session
from azqueue.testing.processes import stop_process
from azqueue.testing.tasks import call, create, definition
from tests.servers import ROOT
from tests.worker.helpers import AZQUEUE, checkout_env

START_TIMEOUT = 60.0
SERVING = re.compile(r"serving (\S+) on 127\.0\.0\.1:(\d+)")


@asynccontextmanager
async def serving_anywhere(azurite: Azurite, prefix: str,
                           **extra: str) -> AsyncIterator[tuple[str, str]]:
    """`azqueue serve` with AZQUEUE_PORT=0 (and the variables of ``extra``); the rootUrl
    and the port its start-up line names (the rest of its log read meanwhile, so that it
    never waits on a full pipe)."""
    env = {k: v for k, v in checkout_env().items() if not k.startswith("AZQUEUE_")}
    process = subprocess.Popen(
        [AZQUEUE, "serve"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True, env={
            **env, "AZQUEUE_STORAGE_CONNECTION_STRING": azurite.connection_string,
            "AZQUEUE_STORAGE_PREFIX": prefix, "AZQUEUE_TIP_SECRETS": "s" * 32,
            "AZQUEUE_ROOT_CLIENT_ID": ROOT.client_id,
            "AZQUEUE_ROOT_ACCESS_TOKEN": ROOT.access_token, "AZQUEUE_PORT": "0",
            "AZQUEUE_LOG_LEVEL": "INFO", **extra})
    assert process.stderr is not None
    stderr = process.stderr
    lines: list[str] = []

    def started() -> re.Match[str] | None:
        for line in stderr:
            lines.append(line)
            if m := SERVING.search(line):
                return m
        return None

    draining: asyncio.Future[str] | None = None
    try:
        found = await asyncio.wait_for(asyncio.to_thread(started), START_TIMEOUT)
        assert found, f"no start-up line; it exited with {process.poll()}: {''.join(lines)}"
        assert found[2] != "0", found[0]
        draining = asyncio.ensure_future(asyncio.to_thread(stderr.read))
        yield found[1], found[2]
    finally:
        await stop_process(process)
        if draining is not None:
            await draining
        stderr.close()


async def test_serve_on_port_0_names_the_port_it_listens_on(
        azurite: Azurite, storage_prefix: str) -> None:
    """The rootUrl of the start-up line answers, and the putUrl of an `s3` artifact (the
    server's own rootUrl) takes the upload."""
    async with serving_anywhere(azurite, storage_prefix) as (root_url, port), \
            signed_session(ROOT.client_id, ROOT.access_token) as http:
        assert root_url == f"http://127.0.0.1:{port}"
        api = f"{root_url}/api/queue/v1"
        async with http.get(f"{root_url}/__heartbeat__") as r:
            assert r.status == 200, await r.text()
        task_queue_id = f"prov/serve-{secrets.token_hex(4)}"
        task_id = await create(http, api, definition(task_queue_id))
        claim = await call(http, "POST", f"{api}/task/{task_id}/runs/0/claim",
                           {"workerGroup": "g", "workerId": "w"})
        made = await call(http, "POST", f"{api}/task/{task_id}/runs/0/artifacts/public%2Fa.txt",
                          {"storageType": "s3", "contentType": "text/plain",
                           "expires": claim["task"]["expires"]})
        assert made["putUrl"].startswith(f"{root_url}{upload.PATH}/"), made["putUrl"]
        async with aiohttp.ClientSession() as anonymous, anonymous.put(
                made["putUrl"], data=b"uploaded\n", headers={"Content-Type": "text/plain"}) as r:
            assert r.status == 200, await r.text()


async def test_a_root_url_set_stays_as_set_on_port_0(azurite: Azurite, storage_prefix: str) -> None:
    """AZQUEUE_ROOT_URL names the public address (a proxy's, say): the start-up line says
    it, and the port it gives is the one the server listens on."""
    public = "https://queue.example.com"
    async with serving_anywhere(azurite, storage_prefix, AZQUEUE_ROOT_URL=public) as (
            root_url, port), aiohttp.ClientSession() as http:
        assert root_url == public
        async with http.get(f"http://127.0.0.1:{port}/__heartbeat__") as r:
            assert r.status == 200, await r.text()
