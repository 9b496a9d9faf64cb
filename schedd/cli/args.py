"""``schedctl``'s command line: the argument parser (its subcommands, options and help), from
which the shell completion is generated too (``schedd.cli.completion``)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from schedd import __version__
from schedd.cli.client import (
    UsageError,
)
from schedd.client.servers import DEFAULT_SERVER
from schedd.core.model import Direction, DstGap, DstRepeat, JobSort, Misfire, Overlap, RunState

# ---- argument parsing ------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors as :class:`UsageError`, so :func:`main` returns 2 instead of exiting.  A
    value that starts with a minus and a digit (``--in -5m``) is a value, not an option (no
    option here looks like that), so its own check can say what is wrong with it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\d")

    def error(self, message: str) -> Any:
        raise UsageError(f"{message}\n{self.format_usage().rstrip()}\ntry '{self.prog} --help'")


def _values(members: type[StrEnum]) -> tuple[str, ...]:
    """An enum's values as an option's choices (a usage error lists them as written, not as
    the enum's members)."""
    return tuple(m.value for m in members)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _connection_options(parser: argparse.ArgumentParser, suffix: str) -> None:
    """Options accepted before and after the command (``schedctl get X -o json`` works)."""
    default = argparse.SUPPRESS if suffix else None
    parser.add_argument(
        "--server",
        action="append",
        dest="server" + suffix,
        metavar="URL",
        default=default,
        help=f"schedd HTTP URL; repeat (or comma-separate) to fail over "
        f"[env SCHEDD_SERVER, default {DEFAULT_SERVER}]",
    )
    tokens = parser.add_mutually_exclusive_group()
    tokens.add_argument(
        "--token",
        dest="token" + suffix,
        metavar="TOKEN",
        default=default,
        help="bearer token [env SCHEDD_TOKEN]",
    )
    tokens.add_argument(
        "--token-file",
        dest="token_file" + suffix,
        metavar="PATH",
        default=default,
        help="file holding the token (or a tokens.toml: its first admin token)",
    )
    parser.add_argument(
        "-o",
        "--output",
        dest="output" + suffix,
        choices=OUTPUTS,
        default=default,
        help="table (default: fits the terminal, cuts nothing when piped), wide (more "
        "columns, nothing cut) or json (the API's exact JSON)",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        dest="quiet" + suffix,
        action="store_true",
        default=default if suffix else False,
        help="print only ids (of the jobs or runs listed, submitted or changed)",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"schedctl {__version__}",
        help=argparse.SUPPRESS if suffix else "print schedctl's version and exit",
    )


class _FixedOnUpdate(argparse.Action):
    """A submit option that ``update`` cannot change: a usage error that says so."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        raise UsageError(
            f"update: {option_string} cannot be changed on an existing job (only its schedule, "
            f"payload, priority, retries and timeout can); cancel it and submit a new one"
        )


def _payload_and_schedule_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``submit`` and ``update``."""
    p.add_argument("--payload", metavar="JSON|@FILE", help="JSON payload, or @FILE / @- (stdin)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--at", metavar="TIME", help="run once at an RFC 3339 time")
    when.add_argument("--in", dest="in_", metavar="DUR", help="run once after a delay, e.g. 5m")
    when.add_argument("--every", metavar="DUR", help="run every DUR, e.g. 1h30m")
    when.add_argument("--cron", metavar="EXPR", help="run on a cron schedule, e.g. '0 2 * * *'")
    p.add_argument("--tz", metavar="ZONE", help="IANA time zone for --cron (default UTC)")
    p.add_argument("--priority", choices=("high", "normal", "low"))
    policy = p.add_argument_group(
        "policies of an --every or --cron job (update: changed on the job's schedule)"
    )
    policy.add_argument(
        "--overlap",
        choices=_values(Overlap),
        help="a fire time that comes while the previous run is still going (default skip)",
    )
    policy.add_argument(
        "--misfire",
        choices=_values(Misfire),
        help="fire times missed while no leader was scheduling (default run_once)",
    )
    policy.add_argument(
        "--catchup-window", metavar="DUR", help="how far back --misfire run_all catches up"
    )
    policy.add_argument(
        "--jitter", metavar="DUR", help="a random delay added to each fire time (default 0)"
    )
    policy.add_argument("--start-at", metavar="TIME", help="no fire before this RFC 3339 time")
    policy.add_argument("--end-at", metavar="TIME", help="no fire after this RFC 3339 time")
    policy.add_argument(
        "--dst-gap",
        choices=_values(DstGap),
        help="a local time skipped by a DST change: run just after it (shift, default) or skip",
    )
    policy.add_argument(
        "--dst-repeat",
        choices=_values(DstRepeat),
        help="a local time that happens twice: run the first time (default) or both",
    )


def _retry_and_timeout_options(p: argparse.ArgumentParser) -> None:
    retry = p.add_argument_group("retries and timeout")
    retry.add_argument("--max-attempts", type=_positive_int, metavar="N")
    retry.add_argument(
        "--retry-initial", metavar="DUR", help="backoff before the second attempt (default 1s)"
    )
    retry.add_argument("--retry-max", metavar="DUR", help="the longest backoff (default 10m)")
    retry.add_argument(
        "--retry-multiplier",
        type=_multiplier,
        metavar="X",
        help="each backoff is the last times X (1 to 10, default 2)",
    )
    retry.add_argument(
        "--retry-jitter",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="randomize each backoff (default yes)",
    )
    retry.add_argument("--timeout", dest="job_timeout", metavar="DUR", help="per-attempt timeout")


def _multiplier(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 1 <= value <= 10:
        raise argparse.ArgumentTypeError(f"expected a number from 1 to 10, got {text!r}")
    return value


def _wait_options(p: argparse.ArgumentParser, flag: bool) -> None:
    if flag:
        p.add_argument(
            "--wait",
            action="store_true",
            help="wait for the job's run to finish; exit with its outcome (see exit codes)",
        )
    p.add_argument(
        "--wait-timeout" if flag else "--timeout",
        dest="wait_timeout",
        metavar="DUR",
        help="give up waiting after DUR (exit 7; default: wait as long as it takes)",
    )


SHELLS = ("bash", "zsh")
OUTPUTS = ("table", "wide", "json")
JOB_REF = (
    "A job is named by its id, a unique prefix of it (either case), or its name when one live "
    "job has it."
)
OUTCOME_CODES = (
    "Exit codes: 0 succeeded, 5 failed, 6 cancelled or skipped, 7 still running when the wait "
    "timed out."
)
FIXED_ON_UPDATE = (
    "--queue",
    "--namespace",
    "--name",
    "--heartbeat-timeout",
    "--depends-on",
    "--idempotency-key",
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="schedctl",
        description="Talk to a schedd cluster.",
        epilog="exit codes: 0 ok, 1 error from the server, 2 usage (found here or by the server), 3 not found, "
        "4 cluster unavailable; wait, watch and submit --wait: 5 the run failed, 6 it was "
        "cancelled or skipped, 7 the wait timed out",
    )
    _connection_options(parser, "")
    parser.add_argument(
        "--http-timeout",
        "--timeout",  # its older name, before the command (after it, --timeout is the job's)
        dest="http_timeout",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="per-request HTTP timeout (default 10); not a job's timeout (submit --timeout)",
    )
    parser.add_argument(
        "--cacert",
        metavar="FILE",
        help="PEM file with the CA certificate(s) to trust for https servers instead of the "
        "system's [env SCHEDD_CACERT]",
    )
    common = _Parser(add_help=False)
    _connection_options(common, "_after")
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_Parser
    )

    s = sub.add_parser("submit", parents=[common], help="submit a job")
    s.add_argument("task", metavar="TASK")
    _payload_and_schedule_options(s)
    s.add_argument("--queue", metavar="Q")
    s.add_argument("--namespace", metavar="N")
    _retry_and_timeout_options(s)
    s.add_argument("--heartbeat-timeout", metavar="DUR")
    s.add_argument("--depends-on", action="append", metavar="ID", help="repeatable")
    s.add_argument("--idempotency-key", metavar="K")
    s.add_argument("--name", metavar="NAME")
    _wait_options(s, flag=True)

    def paging(parser: argparse.ArgumentParser, since: str = "") -> None:
        parser.add_argument("--limit", type=_positive_int, metavar="N", help="page size")
        if since:
            parser.add_argument(
                "--since",
                metavar="TIME|DUR",
                help=f"only runs {since} at or after TIME (RFC 3339) or DUR ago (e.g. 1h)",
            )
        parser.add_argument(
            "--all",
            action="store_true",
            help="follow every page (with -o json: one page body per line)",
        )

    for name, text in (
        ("get", "show one job"),
        ("runs", "show a job's runs, newest first"),
        ("cancel", "cancel a job and its unfinished runs, or one run (a RUN_ID)"),
        ("pause", "pause a job: no new runs until it is resumed"),
        ("resume", "resume a paused job"),
    ):
        p = sub.add_parser(name, parents=[common], help=text, epilog=JOB_REF)
        p.add_argument("id", metavar="RUN_ID|ID" if name == "cancel" else "ID")
        if name == "runs":
            paging(p, since="scheduled")
            p.add_argument("--state", choices=_values(RunState), help="only runs in this state")

    r = sub.add_parser(
        "run",
        parents=[common],
        help="show one run: every attempt with its worker, times, outcome, progress and error",
    )
    r.add_argument(
        "run_id",
        metavar="RUN_ID|JOB",
        help="a run id (JOB@MS; the job part may be a name or an id prefix), or a job: its "
        "latest run",
    )

    wt = sub.add_parser(
        "wait",
        parents=[common],
        help="wait for a run (or a job's latest run) to finish; exit with its outcome",
        epilog=JOB_REF + " " + OUTCOME_CODES,
    )
    wt.add_argument("id", metavar="ID|RUN_ID")
    _wait_options(wt, flag=False)

    ls = sub.add_parser("list", parents=[common], help="list jobs")
    ls.add_argument(
        "--status",
        metavar="S",
        help="active, paused, done, cancelled, or failed (done, its latest run failed: as the "
        "STATUS column shows it)",
    )
    ls.add_argument(
        "--state",
        choices=_values(RunState),
        help="only jobs whose latest run is in this state (e.g. failed)",
    )
    ls.add_argument("--queue", metavar="Q")
    ls.add_argument("--namespace", metavar="N")
    ls.add_argument("--task", metavar="T")
    ls.add_argument("--name", metavar="NAME")
    ls.add_argument(
        "--sort",
        choices=_values(JobSort),
        help="created (newest first; the default), next_fire (soonest first) or latest_run "
        "(the latest run newest first)",
    )
    ls.add_argument(
        "--order", choices=_values(Direction), help="asc or desc: turn the sort the other way"
    )
    paging(ls)

    t = sub.add_parser("trigger", parents=[common], help="run a job now", epilog=JOB_REF)
    t.add_argument("id", metavar="ID")
    t.add_argument(
        "--override",
        action="store_true",
        help="run even if the job's overlap policy would skip or queue it",
    )

    u = sub.add_parser(
        "update",
        parents=[common],
        help="change a job's schedule, policies, payload, priority, retries or timeout",
        description="Change a job; only the options given are changed (a policy option alone "
        "keeps the job's schedule; a retry option alone keeps the rest of its retry policy), "
        "and only runs not yet started see the change.",
        epilog=JOB_REF,
    )
    u.add_argument("id", metavar="ID")
    _payload_and_schedule_options(u)
    _retry_and_timeout_options(u)
    for option in FIXED_ON_UPDATE:  # accepted only to say why they cannot be changed
        u.add_argument(option, action=_FixedOnUpdate, nargs="?", help=argparse.SUPPRESS)

    e = sub.add_parser(
        "explain",
        parents=[common],
        help="show the next fire times of a job or a cron expression, with DST notes",
        usage="schedctl explain (ID | --cron EXPR [--tz ZONE] | --every DUR) [--from TIME] "
        "[--count N]",
        epilog=JOB_REF,
    )
    e.add_argument("id", metavar="ID", nargs="?", help="a job with an every or cron schedule")
    e.add_argument("--cron", metavar="EXPR", help="a cron expression instead of a job")
    e.add_argument("--every", metavar="DUR", help="an interval instead of a job")
    e.add_argument("--tz", metavar="ZONE", help="IANA time zone for --cron (default UTC)")
    e.add_argument(
        "--from",
        dest="from_",
        metavar="TIME",
        help="the fire times after TIME (RFC 3339, or a date: its midnight in --tz or UTC) "
        "instead of after now",
    )
    e.add_argument("--count", type=_positive_int, metavar="N", help="how many fire times")

    d = sub.add_parser("dlq", help="the dead-letter queue: runs that failed every attempt")
    dlq = d.add_subparsers(
        dest="dlq_command", metavar="DLQ_COMMAND", required=True, parser_class=_Parser
    )

    def dlq_filters(parser: argparse.ArgumentParser) -> None:
        """The filters of the dead-letter queue (``GET /dlq``, ``POST /dlq/replay|drop``)."""
        parser.add_argument("--task", metavar="T", help="the runs of this task")
        parser.add_argument("--queue", metavar="Q", help="the runs of this queue")
        parser.add_argument("--namespace", metavar="N", help="the runs of this namespace")
        parser.add_argument(
            "--error", metavar="TEXT", help="the runs whose error contains TEXT (either case)"
        )

    dl = dlq.add_parser("list", parents=[common], help="list dead-lettered runs, newest first")
    paging(dl, since="that failed")
    dlq_filters(dl)
    for name, text in (
        ("replay", "run dead-lettered runs again, with fresh attempts"),
        ("drop", "remove runs from the dead-letter queue"),
    ):
        p = dlq.add_parser(
            name,
            parents=[common],
            help=text,
            description=f"{text.capitalize()}: the runs named, or those the filters pick, or "
            "--all. Anything but one run named is counted first (a dry run): the count and "
            "the tasks are printed and, on a terminal, confirmed before anything is done; "
            "--yes does it without asking, --dry-run only prints.",
        )
        p.add_argument("run_ids", metavar="RUN_ID", nargs="*", help="the runs to " + name)
        dlq_filters(p)
        p.add_argument(
            "--since", metavar="TIME|DUR", help="the runs that failed at or after TIME or DUR ago"
        )
        p.add_argument("--all", action="store_true", help="every run of the queue")
        p.add_argument("--dry-run", action="store_true", help="count them; do nothing")
        p.add_argument("-y", "--yes", action="store_true", help="do it without asking")

    sub.add_parser("cluster", parents=[common], help="show nodes, leader, term and indexes")
    rd = sub.add_parser(
        "ready",
        parents=[common],
        help="wait until the cluster has a leader and knows the token (e.g. after starting it)",
    )
    rd.add_argument(
        "--timeout",
        dest="wait_timeout",
        default="30s",
        metavar="DUR",
        help="give up (exit 4, saying why) after DUR (default 30s)",
    )
    nd = sub.add_parser(
        "node",
        help="the cluster's members: list, add and remove nodes (admin)",
        description="Membership changes go one at a time through the Raft log. A node added "
        "joins as a learner: it loads the state without voting, and becomes a voter once it "
        "has caught up (node list shows it). Removing the leader hands its leadership over "
        "first. See docs/operations.md, Membership.",
    )
    nodes = nd.add_subparsers(
        dest="node_command", metavar="NODE_COMMAND", required=True, parser_class=_Parser
    )
    nodes.add_parser(
        "list", parents=[common], help="the members: voters, and the learner being added"
    )
    na = nodes.add_parser(
        "add",
        parents=[common],
        help="add a node by its Raft address; start it empty with raft.peers naming the cluster "
        "(or use raft.join on the new node instead of this command)",
    )
    na.add_argument("raft", metavar="ADDR", help="the new node's raft.listen (host:port)")
    na.add_argument("--id", metavar="ID", help="its node.id (else it says so when it connects)")
    na.add_argument("--http", metavar="URL", help="its API URL (else it says so itself)")
    nr = nodes.add_parser(
        "remove",
        parents=[common],
        help="remove a node (by id or Raft address); it stops, and is refused if it comes back",
    )
    nr.add_argument("node", metavar="ID", help="a node id or Raft address (node list)")
    sub.add_parser("workers", parents=[common], help="show connected workers")
    ui = sub.add_parser(
        "ui",
        parents=[common],
        help="open the web dashboard, logged in with this token",
        description="Ask a node for a one-time login code and open its dashboard with it in "
        "the address (/ui/#code=...): the page exchanges it for a session token of this "
        "token's role, good for auth.ui_session_ttl (default 8 h). The code is good once, "
        "for 60 s, on that node. Prints the address; without a browser here, open it "
        "elsewhere within the minute.",
    )
    ui.add_argument(
        "--no-open", action="store_true", help="print the address, do not start a browser"
    )
    ui.add_argument(
        "--read-only", action="store_true", help="open a session with the read role only"
    )

    w = sub.add_parser(
        "watch",
        parents=[common],
        help="follow a job's runs live until it is done (Ctrl-C stops)",
        description="Print a line each time one of the job's runs changes state, attempt, "
        "fence or progress; with -o json, each changed run as one JSON line. Exits when the job "
        "is done or cancelled and every run has finished, with its latest run's outcome.",
        epilog=JOB_REF + " " + OUTCOME_CODES,
    )
    w.add_argument("id", metavar="ID")
    w.add_argument(
        "--interval",
        type=_seconds,
        default=1.0,
        metavar="SECONDS",
        help="how often to poll (default 1)",
    )

    ap = sub.add_parser(
        "apply",
        parents=[common],
        help="create or update named jobs from a TOML or JSON file",
        description="Make the cluster's named jobs match a file: jobs are matched by namespace "
        "and name; a new name is created, a changed job updated in place, an unchanged one left "
        "alone (docs/cli.md describes the file).",
    )
    ap.add_argument("-f", "--file", required=True, metavar="FILE", help="the file; - for stdin")
    ap.add_argument("--dry-run", action="store_true", help="show what would change; change nothing")
    ap.add_argument(
        "--replace",
        action="store_true",
        help="cancel and submit again a job whose task, queue or other fixed field changed",
    )

    sn = sub.add_parser("snapshot", help="back up a node's state to a file, or check such a file")
    snap = sn.add_subparsers(
        dest="snapshot_command", metavar="SNAPSHOT_COMMAND", required=True, parser_class=_Parser
    )
    sv = snap.add_parser(
        "save",
        parents=[common],
        help="save a consistent image of a node's state to FILE (an admin token)",
        description="Stream a consistent image of the state of the first node of --server "
        "that answers into FILE.part, checking every frame and the SHA-256 of the whole as it "
        "comes; only a whole, checked image is synced and renamed to FILE. Otherwise the "
        "partial file is removed, FILE is left as it was, and the exit status is 1. "
        "schedd restore seeds a new cluster from FILE (docs/operations.md, Backups).",
    )
    sv.add_argument("file", metavar="FILE", help="the file to write (mode 0600)")
    sv.add_argument(
        "--force",
        action="store_true",
        help="replace FILE if it exists (only once the new image is whole and checked)",
    )
    si = snap.add_parser(
        "inspect",
        parents=[common],
        help="check a saved image whole and show what it holds (no server needed)",
    )
    si.add_argument("file", metavar="FILE")

    jobs_words = sub.add_parser("__jobs", parents=[common])
    jobs_words.add_argument("prefix", nargs="?", default="")

    c = sub.add_parser(
        "completion",
        help="print a shell completion script",
        epilog="bash: source <(schedctl completion bash), or save it as "
        "~/.local/share/bash-completion/completions/schedctl; zsh: source <(schedctl "
        "completion zsh), or save it as _schedctl in a directory on $fpath",
    )
    c.add_argument("shell", choices=SHELLS, metavar="bash|zsh")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))
