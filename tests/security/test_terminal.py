"""A tenant's text on an operator's terminal: task names in listings and statuses, and
task logs, printed by `azqueue task …` with their control characters escaped, so that
none can set the window title, write the clipboard (OSC 52) or overwrite a line."""

from __future__ import annotations

import aiohttp

from azqueue.testing.tasks import create, definition
from tests.cli.helpers import as_root
from tests.servers import Server
from tests.worker.helpers import running, shell_worker, wait_status

# What a hostile name or log holds: an OSC 52 clipboard write, a window title, an erased
# line overwritten after a carriage return, a C1 control (CSI), a right-to-left override
# that shows "txt.exe" as "exe.txt", and a line separator.
HOSTILE = ("\x1b]52;c;ZXZpbA==\x07\x1b]0;owned\x07\x1b[2K\rall good\u009b2J"
           "\u202etxt.exe\u2028")
CONTROLS = ("\x1b", "\x07", "\r", "\u009b", "\u202e", "\u2028")


def _metadata(name: str) -> dict[str, str]:
    return {"name": name, "description": "", "owner": "me@example.com",
            "source": "https://example.com"}


def _assert_tame(printed: str) -> None:
    assert not any(c in printed for c in CONTROLS), repr(printed)
    assert "\\x1b]52;c;ZXZpbA==\\x07" in printed, repr(printed)  # shown, not obeyed
    assert "\\u202etxt.exe\\u2028" in printed, repr(printed)


async def test_task_names_are_printed_with_their_control_characters_escaped(
        server: Server, http: aiohttp.ClientSession) -> None:
    group = await create(http, server.api, definition("prov/hostile-names",
                                                      metadata=_metadata(HOSTILE)))
    listed = await as_root(server, "task", "list", "--group", group)
    assert listed.returncode == 0, listed.stderr
    _assert_tame(listed.stdout)
    pending = await as_root(server, "task", "list", "--task-queue", "prov/hostile-names")
    assert pending.returncode == 0, pending.stderr
    _assert_tame(pending.stdout)


async def test_a_task_log_is_printed_with_its_control_characters_escaped_but_lines_and_tabs(
        server: Server, http: aiohttp.ClientSession) -> None:
    script = "printf 'one\\ttwo\\n'; printf '%s\\n' \"$HOSTILE\""
    task_id = await create(http, server.api, definition("prov/hostile-log", payload={
        "command": ["sh", "-c", script], "env": {"HOSTILE": HOSTILE}}))
    async with running(shell_worker(server, "prov/hostile-log", "hostile")):
        await wait_status(http, server, task_id, lambda s: s["state"] == "completed")
    for follow in ((), ("--follow",)):
        printed = await as_root(server, "task", "log", *follow, task_id)
        assert printed.returncode == 0, printed.stderr
        _assert_tame(printed.stdout)
        assert "one\ttwo\n" in printed.stdout
