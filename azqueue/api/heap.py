"""The server process's heap, and the answers that pass through it.

An answer of hundreds of kilobytes (a listing page; the answers a client that does not
read leaves waiting until the send timeout cuts it) is one block of ``malloc``. glibc
serves a block above its mmap threshold with ``mmap`` and gives it back to the system
when it is freed, but each time it frees one it raises the threshold to that block's
size (up to 32 MiB): from then on such blocks come from the heap, whose freed space
the process keeps. So a burst of large answers left a replica's memory that much
higher for good. With the threshold fixed at glibc's own starting value, they keep
going back: 120 clients that left 780 KB answers unread until they were cut left the
process 97 MiB above where it was with the moving threshold, 17 MiB with it fixed
(``docs/benchmarks.md``, "Clients that do not read").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

# mallopt's parameter of the mmap threshold (<malloc.h>), and glibc's starting value of it.
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 * 1024
# Where an operator sets the threshold themselves, their value stands.
VARIABLE = "MALLOC_MMAP_THRESHOLD_"


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD`` for this process; whether it was
    (not where the C library is not glibc, or ``MALLOC_MMAP_THRESHOLD_`` is set)."""
    if os.environ.get(VARIABLE) or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
