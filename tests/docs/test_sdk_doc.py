"""docs/workers/sdk.md's first example, saved as worker.py and run as written against a
server: it runs a task of my-prov/my-type, whose log holds what the handler wrote and
whose artifact holds the script's output, and it fails one whose script fails, with the
reason at the end of its log."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import aiohttp

from azqueue.testing.tasks import create, definition
from tests.servers import Server
from tests.worker.helpers import CHECKOUT, cli_env, finish, log_of, wait_status

PAGE = Path(CHECKOUT) / "docs" / "workers" / "sdk.md"


def first_example() -> str:
    found = re.search(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    assert found, f"no Python block in {PAGE}"
    return found[1]


async def test_the_first_example_uploads_an_artifact_and_writes_the_log(
        server: Server, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(first_example())
    ok = await create(http, server.api, definition("my-prov/my-type",
                                                   payload={"script": "echo hi"}))
    bad = await create(http, server.api, definition("my-prov/my-type",
                                                    payload={"script": "echo oops; exit 3"}))
    worker = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path,
                              env=cli_env(server), stderr=subprocess.PIPE)
    try:
        await wait_status(http, server, ok, lambda s: s["state"] == "completed")
        await wait_status(http, server, bad, lambda s: s["state"] == "failed")
    finally:
        errors = finish(worker)
    assert await log_of(http, server, ok, 0) == "running 'echo hi'\nhi\n", errors
    async with http.get(f"{server.api}/task/{ok}/runs/0/artifacts/public/output.txt") as r:
        assert await r.read() == b"hi\n"
    assert await log_of(http, server, bad, 0) == (
        "running 'echo oops; exit 3'\noops\n\n"
        "[azqueue] the run ended failed: the script exited with 3\n"), errors
