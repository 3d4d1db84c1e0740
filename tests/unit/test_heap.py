"""The server fixes glibc's mmap threshold, so that the large blocks its answers take go
back to the system when freed (``azqueue.api.heap``), unless the operator set it."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from azqueue.api import heap

# In a process of its own: a freed block of 4 MiB moves a threshold left to glibc up to
# 4 MiB, after which blocks of 900 KB come from the heap, and the half of them freed
# between the others stays in the process; with the threshold fixed, each is mapped on
# its own and goes back once freed. What the process grew by, in MiB, is printed.
_PROBE = """
import sys
from azqueue.api import heap
if sys.argv[1] == "fixed":
    assert heap.fix_mmap_threshold()
def rss():
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith("VmRSS:")).split()[1]) // 1024
large = b"x" * (4 << 20)
del large
before = rss()
blocks = [b"x" * 900_000 for _ in range(200)]
del blocks[::2]
print(rss() - before)
"""


def _grown(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True,
                          text=True, check=True)
    return int(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_freed_large_blocks_go_back_with_the_threshold_fixed() -> None:
    assert _grown("fixed") < _grown("moving") - 40


def test_an_operators_threshold_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(heap.VARIABLE, "65536")
    assert heap.fix_mmap_threshold() is False
