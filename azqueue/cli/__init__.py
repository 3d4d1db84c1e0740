"""The command line, ``azqueue``: arguments -> Settings -> run.

The top layer: it may import any package of azqueue, and no package imports it (the
worker SDK in ``azqueue/worker/`` among them). ``main`` parses the arguments
(``parser``, which loads next to nothing, so ``--help``, ``--version`` and a mistake in
the arguments answer at once), then imports what the command runs: the server stack
(``server``) for ``serve``, ``dev`` and ``resolve``; the official client and the worker
SDK (``client``, with ``follow`` for ``task log --follow``) for ``worker``, ``task`` and
``queue``.

Exit codes (``exitcodes``): 0 done, 1 an error (one line on stderr saying what and how
to fix it), 2 a mistake in the arguments or the settings, 130 interrupted (Ctrl-C);
``task wait`` and ``task log --follow`` add their own (``WAIT_EXIT_CODES``).
"""

from __future__ import annotations

import sys

from azqueue import logs
from azqueue.cli import parser
from azqueue.cli.exitcodes import INTERRUPTED, USAGE
from azqueue.config import ConfigError

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before a command had its own handler in place
        return INTERRUPTED


def _main(argv: list[str] | None) -> int:
    args = parser.parser().parse_args(argv)
    if getattr(args, "check", None):
        args.check(args)
    logs.configure(args.log_level, args.log_format)
    try:
        if args.command in ("serve", "dev", "resolve"):
            from azqueue.cli import server
            return server.run(args)
        from azqueue.cli import client
        return client.run(args)
    except ConfigError as e:  # every wrong setting, a line each
        for line in e.message.splitlines():
            print(f"azqueue: {line}", file=sys.stderr)
        return USAGE
