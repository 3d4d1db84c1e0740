"""`azqueue dev --data DIR` keeps DIR to its user: Azurite's files there hold every
payload and artifact, and the directory's mode is all that keeps others out."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import stat
import subprocess
from pathlib import Path

from tests.cli.helpers import azqueue, one_line_error
from tests.worker.helpers import AZQUEUE

REPO = Path(__file__).resolve().parents[2]
BANNER_TIMEOUT = 120.0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZQUEUE_")}
    if "AZQUEUE_AZURITE_BIN" in os.environ:
        env["AZQUEUE_AZURITE_BIN"] = os.environ["AZQUEUE_AZURITE_BIN"]
    return {**env, "PYTHONPATH": str(REPO)}


async def test_dev_makes_an_open_data_dir_private_and_says_so(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    process = subprocess.Popen([AZQUEUE, "dev", "--data", str(data), "--port", "0"],
                               env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)

    def read_banner() -> bool:
        assert process.stdout is not None
        return any(re.search(r"export TASKCLUSTER_ACCESS_TOKEN=", line)
                   for line in process.stdout)

    try:
        assert await asyncio.wait_for(asyncio.to_thread(read_banner), BANNER_TIMEOUT)
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        assert any(data.iterdir())  # Azurite's files are there, behind the directory
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(process.communicate, timeout=60)
    assert f"--data {data} was open to other users (mode 0755); made it 0700" in err, err


async def test_dev_refuses_a_shared_directory_as_its_data_dir(tmp_path: Path) -> None:
    """A directory others write into (sticky, as /tmp) is not made private: it is
    refused, before anything is written into it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    done = await azqueue("dev", "--data", str(shared), env=_env(), timeout=30)
    assert done.returncode == 1
    assert one_line_error(done) == (
        f"azqueue: --data {shared}: a directory shared with other users (sticky, as /tmp); "
        f"give a directory of its own, such as {shared}/azqueue")
    assert not any(shared.iterdir())
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
