"""How the command line ends: the exit codes of every ``azqueue`` command.

0 done; 1 an error (one line on stderr saying what and how to fix it); 2 a mistake in
the arguments or the settings; 130 interrupted (Ctrl-C). ``task wait`` and
``task log --follow`` end by the task's resolution (``WAIT_EXIT_CODES``). A
``CommandError`` is the failure a user can fix, said in one line, that ends with 1.
"""

from __future__ import annotations

OK = 0
ERROR = 1
USAGE = 2
INTERRUPTED = 130
# `azqueue task wait`: how it ends, by the task's state (or by running out of time).
WAIT_EXIT_CODES = {"completed": 0, "failed": 3, "exception": 4, "timeout": 5}


class CommandError(Exception):
    """A failure the user can fix, in one line (exit status 1)."""


def unreachable(root_url: str, error: Exception) -> CommandError:
    """Nothing answered at ``root_url`` (``error`` says how)."""
    return CommandError(f"cannot reach the queue at {root_url} ({error or type(error).__name__}); "
                        "check TASKCLUSTER_ROOT_URL and that the server runs")
