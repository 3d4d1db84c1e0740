"""The arguments of ``azqueue``: ``parser()`` turns a command line into a Namespace.

This module imports nothing but the standard library, ``azqueue.config``,
``azqueue.logs`` and the pure model's names and priorities (``azqueue.model``), so
``--help``, ``--version`` and a mistake in the arguments answer at once; what a command
runs is imported when it runs (``azqueue.cli.main``).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import re
import socket
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

from azqueue import __version__, logs
from azqueue.config import ConfigError, variables_help
from azqueue.model.identifiers import SLUGID, TASK_QUEUE_ID
from azqueue.model.priority import IN_DEFINITION, Priority

__all__ = ["Parser", "parser"]

# The background resolvers `azqueue resolve` runs (azqueue.background.resolvers.NAMES).
RESOLVERS = ("claims", "deadlines", "dependencies", "expiry", "events", "groups")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_MAX_RUN_TIME = 3600
DEFAULT_DEADLINE = "1h"
# The states `task list --task-queue` lists (azqueue.cli.client lists each).
LISTED_STATES = ("pending", "running", "unscheduled", "resolved")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

CLIENT_VARIABLES = """\
environment: TASKCLUSTER_ROOT_URL (required), TASKCLUSTER_CLIENT_ID and
TASKCLUSTER_ACCESS_TOKEN (anonymous without them), TASKCLUSTER_CERTIFICATE
(temporary credentials), as `azqueue dev` prints them; TASKCLUSTER_ACCESS_TOKEN_FILE
instead of TASKCLUSTER_ACCESS_TOKEN: a file holding the token (first line)."""

SERVE_VARIABLES = variables_help()


CREATE_EPILOG = f"""\
WHEN: a duration after creation (90s, 30m, 1h, 2d; a bare number is seconds), or an ISO
time such as 2030-01-31T12:00:00Z.

{CLIENT_VARIABLES}"""


def _log_level(value: str) -> str:
    if value.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown log level {value!r} (from --log-level, else AZQUEUE_LOG_LEVEL); use "
            f"one of {', '.join(LOG_LEVELS)}")
    return value.upper()


def _number(kind: type[int], low: int, high: int, what: str) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a {what}") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range: use {low} to {high}")
        return number
    return parse


def _seconds(zero: bool = False) -> Callable[[str], float]:
    """A number of seconds over 0 (or 0 too, with ``zero``)."""
    def parse(value: str) -> float:
        seconds = float(value) if re.fullmatch(r"\d+(\.\d*)?|\.\d+", value.strip()) else -1.0
        if seconds < 0 or (seconds == 0 and not zero):
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a number of seconds {'(0 or more)' if zero else 'over 0'}")
        return seconds
    return parse


def _task_queue(value: str) -> str:
    if not TASK_QUEUE_ID.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a task queue: write provisionerId/workerType, each 1-38 "
            "letters, digits, - or _")
    return value


def _task_id(value: str) -> str:
    if SLUGID.fullmatch(value):
        return value
    if re.fullmatch(r"[A-Za-z0-9_-]{22}", value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a taskId: it has 22 characters of A-Z a-z 0-9 _ -, but it is "
            "not a v4 slugid (a random UUID, as `azqueue task create` and `azqueue task "
            "list` print them)")
    raise argparse.ArgumentTypeError(
        f"{value!r} is not a taskId: a taskId is 22 characters of A-Z a-z 0-9 _ - (a v4 "
        "slugid), as `azqueue task create` and `azqueue task list` print them")


def _when(value: str) -> datetime.timedelta | datetime.datetime:
    """A time after the task's creation (30m, 1h, 2d; a bare number is seconds), or an ISO
    8601 time (without a timezone: UTC)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", value)
    if m:
        seconds = float(m[1]) * _UNITS[m[2] or "s"]
        if seconds > 0:
            return datetime.timedelta(seconds=seconds)
    try:
        moment = datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or m:
        raise argparse.ArgumentTypeError(
            f"{value!r} is neither a duration (30m, 1h, 2d; over 0) nor an ISO time "
            "(2030-01-31T12:00:00Z)")
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def _default_worker_id() -> str:
    name = re.sub(r"[^a-zA-Z0-9_-]", "-", socket.gethostname())[:24] or "worker"
    return f"{name}-{os.getpid()}"[:38]


class Parser(argparse.ArgumentParser):
    """Argument mistakes in one line (not argparse's usage block), pointing to --help.

    What it offers is kept as it is added: ``arguments`` holds its arguments in order
    (``-h`` first), whether added by ``add_argument``, ``add_commands`` (the one that
    names the command under it) or an ``add_exclusive`` group; ``commands`` holds the
    commands under it by name. ``add_commands`` and ``add_exclusive`` stand for argparse's
    ``add_subparsers`` and ``add_mutually_exclusive_group``, which would keep nothing (and
    are refused); an ``add_argument_group``'s options would not be kept either."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.arguments: list[argparse.Action] = []
        self.commands: dict[str, Parser] = {}
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.arguments.append(action)
        return action

    def add_commands(self, **kwargs: Any) -> _Commands:
        """The commands under this one (``add_subparsers``' keywords)."""
        under = super().add_subparsers(**kwargs)
        self.arguments.append(under)
        return _Commands(self, under)

    def add_exclusive(self, required: bool = False) -> _Exclusive:
        """Options of which one at most is given (``required``: exactly one)."""
        return _Exclusive(self, super().add_mutually_exclusive_group(required=required))

    def add_subparsers(self, **kwargs: Any) -> NoReturn:
        raise TypeError("Parser.add_commands adds commands (and keeps them in commands)")

    def add_mutually_exclusive_group(self, **kwargs: Any) -> NoReturn:
        raise TypeError("Parser.add_exclusive adds such a group (and keeps its options in "
                        "arguments)")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (`{self.prog} --help` explains)\n")


class _AddsParsers(Protocol):
    """What ``add_subparsers`` returns, as ``_Commands`` uses it."""

    def add_parser(self, name: str, **kwargs: Any) -> Parser: ...


class _AddsArguments(Protocol):
    """What ``add_mutually_exclusive_group`` returns, as ``_Exclusive`` uses it."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action: ...


class _Commands:
    """The commands under a command: each that ``add_parser`` adds is kept in the
    command's ``commands`` too (under its aliases as well)."""

    def __init__(self, command: Parser, under: _AddsParsers) -> None:
        self._command, self._under = command, under

    def add_parser(self, name: str, **kwargs: Any) -> Parser:
        added = self._under.add_parser(name, **kwargs)
        for each in (name, *kwargs.get("aliases", ())):
            self._command.commands[each] = added
        return added


class _Exclusive:
    """A group of options of which one at most is given: each that ``add_argument`` adds
    is kept in its command's ``arguments`` too."""

    def __init__(self, command: Parser, group: _AddsArguments) -> None:
        self._command, self._group = command, group

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = self._group.add_argument(*args, **kwargs)
        self._command.arguments.append(action)
        return action


def _formatter(prog: str) -> argparse.HelpFormatter:
    """Help as written (line breaks kept), options aligned."""
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=30)


def parser() -> Parser:
    top = Parser(
        prog="azqueue", formatter_class=_formatter,
        description="A Taskcluster-compatible task queue whose state lives in Azure Storage.",
        epilog="`azqueue COMMAND --help` explains each command.")
    top.add_argument("--version", action="version", version=f"azqueue {__version__}")
    top.add_argument("--log-level", type=_log_level, metavar="LEVEL",
                     default=os.environ.get("AZQUEUE_LOG_LEVEL") or "INFO",
                     help="DEBUG, INFO, WARNING, ERROR or CRITICAL (default: "
                          "AZQUEUE_LOG_LEVEL, else INFO)")
    top.add_argument("--log-format", choices=logs.FORMATS,
                     default=os.environ.get("AZQUEUE_LOG_FORMAT") or "text",
                     help="text, or json: one JSON object per line (default: "
                          "AZQUEUE_LOG_FORMAT, else text)")
    sub = top.add_commands(dest="command", required=True, metavar="COMMAND",
                             help="what to do (each command has its own --help)")

    sub.add_parser("serve", formatter_class=_formatter, epilog=SERVE_VARIABLES,
                   help="serve the API and run the background resolvers",
                   description="Serve the queue's API and run its background resolvers.")

    dev = sub.add_parser(
        "dev", formatter_class=_formatter,
        help="serve on a private Azurite started and stopped with it",
        description="Serve on a private Azurite that starts and stops with it; prints the "
                    "rootUrl, the dashboard's URL and root credentials. Ctrl-C, SIGTERM or "
                    "SIGHUP stops both. AZQUEUE_* variables apply as for `serve` (storage "
                    "excepted). One `dev` at a time uses a --data directory.")
    dev.add_argument("--data", metavar="DIR",
                     help="keep Azurite's data, the tip secrets and the root credentials in "
                          "DIR (created if missing), so a restart keeps tasks and pending tips "
                          "valid (default: a temporary directory removed on exit, fresh "
                          "credentials each start)")
    dev.add_argument("--port", type=_number(int, 0, 65535, "port number"),
                     help="HTTP port, or 0 for any free one, which the rootUrl printed "
                          "names (one replica only) (default: AZQUEUE_PORT, else 8080)")
    dev.add_argument("--replicas", type=_number(int, 1, 16, "number of replicas"), default=1,
                     help="serve N replicas of one deployment on the one Azurite, on "
                          "consecutive ports from --port (the first in this process, the "
                          "others as `azqueue serve` processes) (default: 1)")
    dev.add_argument("--access-log", action="store_true",
                     help="log a line per request (default: only with --log-level DEBUG)")

    resolve = sub.add_parser(
        "resolve", formatter_class=_formatter, epilog=SERVE_VARIABLES,
        help="run background resolvers alone, for scaling out",
        description="Run background resolvers without serving the API (configured as "
                    "`serve`); `all` runs every one the settings allow.")
    resolve.add_argument("which", choices=[*RESOLVERS, "all"], help="the resolver to run")

    _worker_parser(sub)
    _task_parsers(sub)
    _queue_parsers(sub)
    return top


def _worker_parser(sub: _Commands) -> None:
    worker = sub.add_parser(
        "worker", formatter_class=_formatter, epilog=CLIENT_VARIABLES,
        help="run tasks whose payload is {command, env, maxRunTime}",
        description="Claim tasks of one task queue and run each payload's command in a "
                    "fresh scratch directory; its output becomes public/logs/live.log.")
    worker.add_argument("action", nargs="?", choices=["list"],
                        help="list: print the task queue's workers instead of running one "
                             "(needs a queue that offers listWorkers)")
    worker.add_argument("--task-queue", required=True, metavar="PROV/TYPE", type=_task_queue,
                        help="the task queue to take tasks from (provisionerId/workerType)")
    worker.add_argument("--json", action="store_true",
                        help="with list: print JSON lines, one per worker")
    worker.add_argument("--capacity", type=_number(int, 1, 32, "whole number"), default=1,
                        metavar="N", help="tasks run at once, 1-32 (default: 1)")
    worker.add_argument("--mode", choices=["sas", "claim-work"], default="claim-work",
                        help="claim-work: long-poll claimWork; sas: poll the Azure queues of "
                             "pollTaskUrls directly (default: claim-work)")
    worker.add_argument("--worker-group", default="azqueue",
                        help="the workerGroup it claims as (default: azqueue)")
    worker.add_argument("--worker-id", default=_default_worker_id(),
                        help="the workerId it claims as, unique in its group (default: "
                             "HOSTNAME-PID)")
    worker.add_argument("--reclaim-margin", type=_seconds(zero=True), default=60.0, metavar="SECONDS",
                        help="reclaim a task this many seconds before its claim expires "
                             "(default: 60)")
    worker.add_argument("--status-interval", type=_seconds(), default=10.0, metavar="SECONDS",
                        help="check each running task's status this often, to stop its "
                             "command when it was canceled or resolved by someone else "
                             "(default: 10; one status call per task per interval)")
    worker.add_argument("--log-interval", type=_seconds(), default=2.0, metavar="SECONDS",
                        help="append a running command's new output to its live log this "
                             "often (default: 2; one request per interval with new output, "
                             "none when it prints nothing)")
    worker.add_argument("--idle-sleep", type=_seconds(), default=1.0, metavar="SECONDS",
                        help="sas mode: sleep after an empty polling pass, doubled after each "
                             "further one (default: 1)")
    worker.add_argument("--max-idle-sleep", type=_seconds(), default=5.0, metavar="SECONDS",
                        help="sas mode: the longest sleep between empty polling passes "
                             "(default: 5)")
    worker.add_argument("--priority-recheck", type=_seconds(), default=5.0, metavar="SECONDS",
                        help="sas mode: a worker that keeps finding work in one queue polls "
                             "the higher-priority queues again after this long (default: 5)")


def _task_parsers(sub: _Commands) -> None:
    task = sub.add_parser("task", formatter_class=_formatter, epilog=CLIENT_VARIABLES,
                          help="create, follow, list, cancel and rerun tasks",
                          description="Create, follow, list, cancel and rerun tasks.")
    tsub = task.add_commands(dest="task_command", required=True, metavar="TASK_COMMAND",
                               help="what to do with tasks")
    _task_create_parser(tsub)
    _one_task_parsers(tsub)
    _task_list_parser(tsub)


def _task_create_parser(tsub: _Commands) -> None:
    create = tsub.add_parser(
        "create", formatter_class=_formatter, epilog=CREATE_EPILOG,
        help="create a task (CMD, --payload or --definition); prints its taskId",
        description="Create a task and print its taskId: one running CMD on `azqueue worker` "
                    "(put `--` before CMD), one with the payload of --payload, or the task "
                    "definition of --definition.")
    create.add_argument("--definition", metavar="FILE",
                        help="a whole task definition (JSON; - reads stdin); a missing created "
                             "is now, a missing deadline --deadline's (default: none, build "
                             "one from the options)")
    create.add_argument("--task-queue", metavar="PROV/TYPE", type=_task_queue,
                        help="the task queue whose workers run it (provisionerId/workerType; "
                             "required without --definition)")
    create.add_argument("--payload", metavar="FILE",
                        help="the payload, a JSON object (- reads stdin), instead of CMD "
                             "(default: {command: CMD, maxRunTime})")
    create.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable of the command, payload.env "
                             "(repeatable; default: none)")
    create.add_argument("--group", metavar="TASK_GROUP_ID", type=_task_id,
                        help="its taskGroupId (default: its own taskId, a group of its own)")
    create.add_argument("--dependency", action="append", default=[], metavar="TASK_ID",
                        type=_task_id, help="a task that must complete before it runs "
                                            "(repeatable; default: none)")
    create.add_argument("--priority", choices=IN_DEFINITION, default=Priority.LOWEST.value,
                        help="(default: lowest)")
    create.add_argument("--max-run-time", type=_number(int, 1, 86400, "whole number"),
                        default=DEFAULT_MAX_RUN_TIME, metavar="SECONDS",
                        help="with CMD: the command is killed and the run failed after this "
                             f"long (default: {DEFAULT_MAX_RUN_TIME})")
    create.add_argument("--deadline", type=_when, default=_when(DEFAULT_DEADLINE),
                        metavar="WHEN", help="resolve it deadline-exceeded if not done by "
                                             "then: a duration after creation (30m, 1h, 2d) "
                                             "or an ISO time, at most 5 days ahead "
                                             f"(default: {DEFAULT_DEADLINE})")
    create.add_argument("--expires", type=_when, metavar="WHEN",
                        help="when the queue forgets it and its artifacts: a duration or an "
                             "ISO time, after the deadline (default: the queue's, a year "
                             "after the deadline)")
    create.add_argument("--route", action="append", default=[], metavar="ROUTE",
                        help="a route its events are also published on (repeatable; "
                             "default: none)")
    create.add_argument("--retries", type=_number(int, 0, 49, "whole number"), default=5,
                        metavar="N", help="runs retried after worker-shutdown or an expired "
                                          "claim (default: 5)")
    create.add_argument("--scope", action="append", default=[], metavar="SCOPE",
                        help="a scope its worker may use for it (repeatable; you must hold "
                             "it; default: none)")
    create.add_argument("--name", default="", help="metadata.name (default: CMD)")
    create.add_argument("--owner", default="",
                        help="metadata.owner, who to ask about it (default: USER@HOSTNAME)")
    create.add_argument("--source", default="",
                        help="metadata.source, where it was defined: a URL starting https://, "
                             "http://, ssh:// or git@ (default: "
                             "ssh://HOSTNAME/CURRENT/DIRECTORY, where it was run)")
    create.add_argument("cmd", nargs="*", metavar="CMD",
                        help="the command and its arguments (default: none; give CMD, "
                             "--payload or --definition)")
    create.set_defaults(check=functools.partial(_check_create, create))


def _one_task_parsers(tsub: _Commands) -> None:
    """The commands about one task, named by its taskId."""

    def one_task(name: str, text: str, json_too: bool = True) -> Parser:
        p = tsub.add_parser(name, formatter_class=_formatter, epilog=CLIENT_VARIABLES,
                            help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument("task_id", metavar="TASK_ID", type=_task_id, help="the task's taskId")
        if json_too:
            p.add_argument("--json", action="store_true",
                           help="print the status as the API answers it (JSON)")
        return p

    one_task("status", "print the task's state and runs")
    wait = one_task("wait", "wait until the task is resolved, printing its progress")
    wait.add_argument("--timeout", type=_seconds(), metavar="SECONDS",
                      help="give up after this long (exit code 5; default: wait as long as "
                           "it takes)")
    wait.epilog = (f"exit codes: 0 completed, 3 failed, 4 exception, 5 --timeout reached, "
                   f"1 an error, 130 Ctrl-C\n\n{CLIENT_VARIABLES}")
    task_log = one_task("log", "print the latest run's public/logs/live.log", json_too=False)
    task_log.add_argument("--follow", action="store_true",
                          help="keep printing what the run prints until the task is resolved "
                               "(waiting while it is pending); exit codes as `task wait`")
    task_log.epilog = (f"exit codes: 0 printed (with --follow: completed), 3 failed, "
                       f"4 exception, 1 an error, 130 Ctrl-C\n\n{CLIENT_VARIABLES}")
    one_task("cancel", "cancel the task: its current run is resolved exception canceled "
                       "and its worker stops it")
    one_task("rerun", "rerun a resolved task: it gets a new pending run (before its "
                      "deadline); prints its status")


def _task_list_parser(tsub: _Commands) -> None:
    listing = tsub.add_parser(
        "list", formatter_class=_formatter, epilog=CLIENT_VARIABLES,
        help="list the tasks of a task group, or a task queue's tasks by state",
        description="List the tasks of a task group (--group), or a task queue's tasks "
                    "(--task-queue) in a state (--state): pending (listPendingTasks), running "
                    "(listClaimedTasks), or "
                    "unscheduled or resolved lately (the server's recent changes, "
                    "as the dashboard lists them).")
    which = listing.add_exclusive(required=True)
    which.add_argument("--group", metavar="TASK_GROUP_ID", type=_task_id, help="a taskGroupId")
    which.add_argument("--task-queue", metavar="PROV/TYPE", type=_task_queue,
                       help="a task queue (provisionerId/workerType)")
    listing.add_argument("--state", choices=LISTED_STATES,
                         help="with --task-queue: the tasks to list (default: pending)")
    listing.set_defaults(check=functools.partial(_check_list, listing))
    listing.add_argument("--json", action="store_true", help="print JSON lines, one per task")


# What `task create --definition` still takes from the options: a missing deadline or expires.
_WITH_DEFINITION = {"help", "definition", "deadline", "expires"}


def _check_create(create: Parser, args: argparse.Namespace) -> None:
    """What `task create` needs beyond each option's own check: CMD, --payload or
    --definition, and NAME=VALUE in each --env."""
    if args.definition is not None:
        given = [action.option_strings[0] for action in create.arguments
                 if action.option_strings and action.dest not in _WITH_DEFINITION
                 and getattr(args, action.dest) != action.default]
        if args.cmd:
            given.append("CMD")
        if given:
            create.error(f"--definition {args.definition} is the whole task: write what "
                         f"{', '.join(given)} would set in it instead")
        return
    if args.task_queue is None:
        create.error("--task-queue PROV/TYPE is required (without --definition)")
    if args.cmd and args.payload is not None:
        create.error("give a CMD or --payload, not both (a payload's command goes in its "
                     "\"command\")")
    if not args.cmd and args.payload is None:
        create.error("give a CMD (after --), --payload FILE or --definition FILE")
    for pair in args.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", pair, re.DOTALL):
            create.error(f"--env {pair} is not NAME=VALUE; write e.g. --env DEBUG=1")


def _check_list(listing: Parser, args: argparse.Namespace) -> None:
    if args.group is not None and args.state is not None:
        listing.error("--state lists a task queue's tasks: give it with --task-queue, not "
                      "--group (which lists every task of the group, whatever its state)")


def _queue_parsers(sub: _Commands) -> None:
    queue = sub.add_parser("queue", formatter_class=_formatter, epilog=CLIENT_VARIABLES,
                           help="list task queues",
                           description="List task queues (needs a queue that offers "
                                       "listTaskQueues).")
    qsub = queue.add_commands(dest="queue_command", required=True, metavar="QUEUE_COMMAND",
                                help="what to do with task queues")
    qlist = qsub.add_parser("list", formatter_class=_formatter, epilog=CLIENT_VARIABLES,
                            help="list the task queues", description="List the task queues.")
    qlist.add_argument("--json", action="store_true", help="print JSON lines, one per queue")

