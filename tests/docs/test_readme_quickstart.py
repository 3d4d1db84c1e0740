"""README's quickstart, run as a newcomer runs it: the blocks marked ``<!-- quickstart… -->``
in README.md, in order, against a real `azqueue dev`.

The marks say what a block is:

- ``<!-- quickstart: server -->``: the command of terminal 1 (``scripts/dev``); the test
  starts what it runs, ``azqueue dev`` (on a free port and a data directory of its own),
  and reads the ``export`` lines of its banner as the reader copies them;
- ``<!-- quickstart: background -->``: a shell block left running (the worker) while the
  rest runs, stopped at the end;
- ``<!-- quickstart: file NAME -->``: a file the reader saves as NAME;
- ``<!-- quickstart -->``: a shell block run to its end, which must succeed.

Shell blocks run with ``bash -e`` in a directory holding the files and a ``.venv`` that is
this test's virtualenv, with the banner's ``TASKCLUSTER_*`` variables, and import this
checkout's azqueue.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.worker.helpers import AZQUEUE, CHECKOUT, checkout_env, ctrl_c_reaches_it

README = Path(CHECKOUT) / "README.md"
BANNER_TIMEOUT = 120.0
BLOCK_TIMEOUT = 180.0

_BLOCK = re.compile(r"<!-- quickstart(?::\s*(?P<kind>[^>]*?))?\s*-->\s*\n"
                    r"```(?P<lang>\w*)[^\n]*\n(?P<body>.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Block:
    kind: str  # "run", "server", "background" or "file NAME"
    lang: str
    body: str


def quickstart_blocks(text: str) -> list[Block]:
    return [Block(m["kind"] or "run", m["lang"], m["body"]) for m in _BLOCK.finditer(text)]


def test_readme_marks_a_server_a_worker_a_python_file_and_commands_to_run() -> None:
    """The quickstart starts the service with the set-up command `scripts/dev`, runs a
    worker, creates tasks with the CLI and with a Python file, and only marks shell and
    Python blocks."""
    blocks = quickstart_blocks(README.read_text())
    kinds = [b.kind.split()[0] for b in blocks]
    assert kinds[0] == "server" and blocks[0].body.strip() == "scripts/dev", blocks[:1]
    assert "exec .venv/bin/azqueue dev" in (Path(CHECKOUT) / "scripts" / "dev").read_text()
    assert "background" in kinds and "file" in kinds and kinds.count("run") >= 2, kinds
    for b in blocks:
        assert b.lang == ("python" if b.kind.endswith(".py") else "sh"), b


class Dev:
    """`azqueue dev` as terminal 1 runs it (scripts/dev passes its arguments on), but on
    any free port (its banner names it)."""

    def __init__(self, data: Path) -> None:
        # As on a newcomer's machine: no AZQUEUE_* settings, but the tests' Azurite.
        env = {k: v for k, v in checkout_env().items()
               if not k.startswith("AZQUEUE_") or k == "AZQUEUE_AZURITE_BIN"}
        self.process = subprocess.Popen(
            [AZQUEUE, "dev", "--data", str(data), "--port", "0"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=ctrl_c_reaches_it)
        self.exports: dict[str, str] = {}
        self.banner: list[str] = []

    async def started(self) -> Dev:
        def read_banner() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self.banner.append(line)
                if m := re.match(r"\s*export (TASKCLUSTER_\w+)=(\S+)", line):
                    self.exports[m[1]] = m[2]
                    if len(self.exports) == 3:
                        return

        await asyncio.wait_for(asyncio.to_thread(read_banner), BANNER_TIMEOUT)
        assert len(self.exports) == 3, f"no banner: {self.banner}; {self.stop()}"
        return self

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        _, err = self.process.communicate(timeout=60)
        return err


@pytest.mark.slow
async def test_readme_quickstart_completes_its_tasks_and_shows_their_logs(
        tmp_path: Path) -> None:
    """Every block of README's quickstart works as written: the worker runs, the CLI's task
    and the Python client's task complete, and their logs print what the commands said
    (after the worker's own lines); `task create` does not warn that no worker asks for
    work once the worker said it runs; the dashboard answers at the rootUrl."""
    blocks = quickstart_blocks(README.read_text())
    work = tmp_path / "checkout"
    work.mkdir()
    # The reader's checkout: its .venv is the one running these tests.
    (work / ".venv").symlink_to(Path(sys.executable).parent.parent)
    dev = await Dev(tmp_path / "data").started()
    env = {**checkout_env(), **dev.exports}
    background: list[subprocess.Popen[str]] = []
    outputs: list[str] = []
    try:
        for block in blocks:
            if block.kind == "server":
                continue  # started above
            if block.kind.startswith("file"):
                (work / block.kind.split(maxsplit=1)[1]).write_text(block.body)
            elif block.kind == "background":
                background.append(subprocess.Popen(
                    ["bash", "-e", "-c", block.body], cwd=work, env=env, text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True))
                # The reader goes on once the worker says it runs (its first line).
                said = await asyncio.wait_for(asyncio.to_thread(
                    background[-1].stdout.readline), BANNER_TIMEOUT)  # type: ignore[union-attr]
                assert said.startswith("azqueue worker "), said
            else:
                assert block.kind == "run", f"unknown quickstart mark {block.kind!r}"
                done = await asyncio.to_thread(
                    subprocess.run, ["bash", "-e", "-c", block.body], cwd=work, env=env,
                    capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
                assert done.returncode == 0, (
                    f"README quickstart block failed (exit {done.returncode}):\n{block.body}\n"
                    f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}")
                outputs.append(done.stdout)
                # The worker asks for work: no warning that none does.
                assert "no worker has asked" not in done.stderr, done.stderr
            for process in background:
                assert process.poll() is None, (
                    f"a background block of README's quickstart ended (exit "
                    f"{process.returncode}): {process.communicate()[0]}")
        cli, python = outputs[0], outputs[1]
        assert "hello from the CLI" in cli, cli
        assert re.search(r"^\[azqueue\] running \['echo', 'hello', 'from', 'the', 'CLI'\]",
                         cli, re.M), cli  # README: the worker's [azqueue] lines too
        assert re.search(r"^\S+ completed$", python, re.M), python
        assert "hello from Python" in python, python
        async with aiohttp.ClientSession() as http:
            async with http.get(dev.exports["TASKCLUSTER_ROOT_URL"] + "/") as r:
                assert r.status == 200 and "html" in r.content_type, r.status
    finally:
        for process in background:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
            process.communicate(timeout=60)
        dev.stop()
