"""``schedctl``'s command line: the argument parser (its subcommands, options and help), from
which the shell completion is generated too (``schedd.cli.completion``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from schedd.cli.client import (
    DEFAULT_SERVER,
    UsageError,
)

# ---- argument parsing ------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors as :class:`UsageError`, so :func:`main` returns 2 instead of exiting."""

    def error(self, message: str) -> Any:
        raise UsageError(f"{message}\n{self.format_usage().rstrip()}\ntry '{self.prog} --help'")


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
        choices=("table", "json"),
        default=default,
        help="table (default) or the API's exact JSON",
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


def _retry_and_timeout_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-attempts", type=_positive_int, metavar="N")
    p.add_argument("--timeout", dest="job_timeout", metavar="DUR", help="per-attempt timeout")


SHELLS = ("bash", "zsh")
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
        epilog="exit codes: 0 ok, 1 error from the server, 2 usage, 3 not found, "
        "4 cluster unavailable",
    )
    _connection_options(parser, "")
    parser.add_argument(
        "--timeout",
        dest="http_timeout",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="per-request HTTP timeout (default 10)",
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

    def paging(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--limit", type=_positive_int, metavar="N", help="page size")
        parser.add_argument(
            "--all",
            action="store_true",
            help="follow every page (with -o json: one page body per line)",
        )

    for name, text in (
        ("get", "show one job"),
        ("runs", "show a job's runs, newest first"),
        ("cancel", "cancel a job and its unfinished runs"),
        ("pause", "pause a job: no new runs until it is resumed"),
        ("resume", "resume a paused job"),
    ):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("id", metavar="ID")
        if name == "runs":
            paging(p)

    ls = sub.add_parser("list", parents=[common], help="list jobs")
    ls.add_argument("--status", metavar="S", help="active, paused, done or cancelled")
    ls.add_argument("--queue", metavar="Q")
    ls.add_argument("--namespace", metavar="N")
    ls.add_argument("--task", metavar="T")
    paging(ls)

    t = sub.add_parser("trigger", parents=[common], help="run a job now")
    t.add_argument("id", metavar="ID")
    t.add_argument(
        "--override",
        action="store_true",
        help="run even if the job's overlap policy would skip or queue it",
    )

    u = sub.add_parser(
        "update",
        parents=[common],
        help="change a job's schedule, payload, priority, retries or timeout",
        description="Change a job; only the options given are changed, and only runs not yet "
        "started see the change.",
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
        usage="schedctl explain (ID | --cron EXPR [--tz ZONE]) [--count N]",
    )
    e.add_argument("id", metavar="ID", nargs="?", help="a job with an every or cron schedule")
    e.add_argument("--cron", metavar="EXPR", help="a cron expression instead of a job")
    e.add_argument("--tz", metavar="ZONE", help="IANA time zone for --cron (default UTC)")
    e.add_argument("--count", type=_positive_int, metavar="N", help="how many fire times")

    d = sub.add_parser("dlq", help="the dead-letter queue: runs that failed every attempt")
    dlq = d.add_subparsers(
        dest="dlq_command", metavar="DLQ_COMMAND", required=True, parser_class=_Parser
    )
    paging(dlq.add_parser("list", parents=[common], help="list dead-lettered runs, newest first"))
    for name, text in (
        ("replay", "run a dead-lettered run again, with fresh attempts"),
        ("drop", "remove a run from the dead-letter queue"),
    ):
        p = dlq.add_parser(name, parents=[common], help=text)
        p.add_argument("run_id", metavar="RUN_ID")

    sub.add_parser("cluster", parents=[common], help="show nodes, leader, term and indexes")
    sub.add_parser("workers", parents=[common], help="show connected workers")

    w = sub.add_parser(
        "watch",
        parents=[common],
        help="follow a job's runs live until it is done (Ctrl-C stops)",
        description="Print a line each time one of the job's runs changes state, attempt or "
        "fence; with -o json, each changed run as one JSON line. Exits when the job is done or "
        "cancelled and every run has finished.",
    )
    w.add_argument("id", metavar="ID")
    w.add_argument(
        "--interval",
        type=_seconds,
        default=1.0,
        metavar="SECONDS",
        help="how often to poll (default 1)",
    )

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
