"""``schedctl``: the command line for a schedd cluster.

``schedctl [--server URL]... [--token T | --token-file PATH] [-o table|json] [--timeout S]
[--cacert FILE] COMMAND``

Exit codes: 0 ok · 1 error from the server · 2 usage · 3 not found · 4 cluster unavailable.
``-o json`` prints exactly the bytes the API answered, followed by a newline.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from schedd.cli import render
from schedd.cli.client import (
    DEFAULT_SERVER,
    Client,
    CliError,
    Response,
    Server,
    UsageError,
    job_path,
    parse_server,
    run_path,
    tls_context,
)
from schedd.core.durations import parse_duration, parse_time
from schedd.errors import InvalidArgument

EXIT_OK = 0
EXIT_SERVER = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNAVAILABLE = 4

DEFAULT_TOKENS_FILE = Path(".schedd") / "tokens.toml"
MAX_PAGES = 10_000

# ---- the request a command line means ----------------------------------------------------------


@dataclass(frozen=True)
class ApiRequest:
    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()
    body: dict[str, Any] | None = None
    idempotent: bool = True

    def encoded_body(self) -> bytes | None:
        return None if self.body is None else orjson.dumps(self.body)


def _duration(option: str, value: str | None, *, allow_zero: bool = False) -> str | None:
    """Checks a duration locally (exit 2 on a bad one) and passes it on as the user wrote it."""
    if value is None:
        return None
    try:
        parse_duration(value, option, allow_zero=allow_zero)
    except InvalidArgument as exc:
        raise UsageError(exc.message) from None
    return value


def _payload(text: str, stdin: IO[bytes] | None = None) -> Any:
    if text.startswith("@"):
        name = text[1:]
        try:
            if name == "-":
                data = (stdin or sys.stdin.buffer).read()
            else:
                data = Path(name).read_bytes()
        except OSError as exc:
            raise UsageError(f"--payload: cannot read {name!r}: {exc.strerror or exc}") from None
        source = f"the JSON in {'stdin' if name == '-' else repr(name)}"
    else:
        data = text.encode()
        source = "JSON"
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise UsageError(
            f'--payload: expected JSON like \'{{"report": "sales"}}\' or @FILE (@- for stdin); '
            f"{source} is not valid: {exc}"
        ) from None


def _schedule(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.tz is not None and args.cron is None:
        raise UsageError(
            "--tz: only applies to --cron (e.g. --cron '0 2 * * *' --tz Europe/Berlin)"
        )
    if args.at is not None:
        try:
            parse_time(args.at, "--at")
        except InvalidArgument as exc:
            raise UsageError(exc.message) from None
        return {"at": args.at}
    if args.in_ is not None:
        return {"in": _duration("--in", args.in_, allow_zero=True)}
    if args.every is not None:
        return {"every": _duration("--every", args.every)}
    if args.cron is not None:
        if not args.cron.strip():
            raise UsageError("--cron: expected a cron expression like '0 2 * * *'")
        schedule: dict[str, Any] = {"cron": args.cron}
        if args.tz is not None:
            schedule["timezone"] = args.tz
        return schedule
    return None


def build_submit_body(args: argparse.Namespace, stdin: IO[bytes] | None = None) -> dict[str, Any]:
    """The ``POST /jobs`` body for ``schedctl submit``; only what was given is sent."""
    body: dict[str, Any] = {"task": args.task}
    optional: list[tuple[str, Any]] = [
        ("name", args.name),
        ("namespace", args.namespace),
        ("queue", args.queue),
        ("payload", None if args.payload is None else _payload(args.payload, stdin)),
        ("schedule", _schedule(args)),
        ("priority", args.priority),
        ("retry", None if args.max_attempts is None else {"max_attempts": args.max_attempts}),
        ("timeout", _duration("--timeout", args.job_timeout)),
        ("heartbeat_timeout", _duration("--heartbeat-timeout", args.heartbeat_timeout)),
        ("depends_on", args.depends_on or None),
        ("idempotency_key", args.idempotency_key),
    ]
    for key, value in optional:
        if value is not None:
            body[key] = value
    if args.payload is not None and "payload" not in body:
        body["payload"] = None  # --payload null
    return body


UPDATE_OPTIONS = "--payload, --at, --in, --every, --cron, --priority, --max-attempts or --timeout"


def build_update_body(args: argparse.Namespace, stdin: IO[bytes] | None = None) -> dict[str, Any]:
    """The ``PATCH /jobs/{id}`` body for ``schedctl update``: only the fields given."""
    body: dict[str, Any] = {}
    optional: list[tuple[str, Any]] = [
        ("schedule", _schedule(args)),
        ("payload", None if args.payload is None else _payload(args.payload, stdin)),
        ("priority", args.priority),
        ("retry", None if args.max_attempts is None else {"max_attempts": args.max_attempts}),
        ("timeout", _duration("--timeout", args.job_timeout)),
    ]
    for key, value in optional:
        if value is not None:
            body[key] = value
    if args.payload is not None and "payload" not in body:
        body["payload"] = None  # --payload null
    if not body:
        raise UsageError(f"update: nothing to change; pass at least one of {UPDATE_OPTIONS}")
    return body


def _explain_request(args: argparse.Namespace) -> ApiRequest:
    if args.id is not None and args.cron is not None:
        raise UsageError("explain: give a job ID or --cron EXPR, not both")
    if args.id is None and args.cron is None:
        raise UsageError(
            "explain: expected a job ID, or --cron EXPR [--tz ZONE] "
            "(e.g. schedctl explain --cron '0 2 * * *' --tz Europe/Berlin)"
        )
    if args.tz is not None and args.cron is None:
        raise UsageError("--tz: only applies to --cron (explain ID uses the job's own time zone)")
    count = [] if args.count is None else [("count", str(args.count))]
    if args.id is not None:
        return ApiRequest("GET", job_path(args.id, "/explain"), query=tuple(count))
    if not args.cron.strip():
        raise UsageError("--cron: expected a cron expression like '0 2 * * *'")
    query = [("cron", args.cron)]
    if args.tz is not None:
        query.append(("timezone", args.tz))
    return ApiRequest("GET", "/api/v1/explain", query=tuple(query + count))


def command_name(args: argparse.Namespace) -> str:
    """``get``, ``dlq replay``, ...: the command a parsed command line runs."""
    if args.command == "dlq":
        return f"dlq {args.dlq_command}"
    return str(args.command)


def _job_action_request(args: argparse.Namespace, stdin: IO[bytes] | None) -> ApiRequest:
    """The commands that change or inspect one job, and the dead-letter queue."""
    cmd = command_name(args)
    if cmd in ("pause", "resume"):
        return ApiRequest("PATCH", job_path(args.id), body={"paused": cmd == "pause"})
    if cmd == "update":
        return ApiRequest("PATCH", job_path(args.id), body=build_update_body(args, stdin))
    if cmd == "trigger":
        overlap = "override" if args.override else "respect"
        return ApiRequest("POST", job_path(args.id, "/trigger"), body={"overlap": overlap})
    if cmd == "explain":
        return _explain_request(args)
    if cmd == "watch":
        return ApiRequest("GET", job_path(args.id, "/runs"))
    if cmd == "dlq list":
        return ApiRequest("GET", "/api/v1/dlq", query=_limit(args))
    if cmd == "dlq replay":
        return ApiRequest("POST", run_path(args.run_id, "/replay", under="dlq"))
    if cmd == "dlq drop":
        return ApiRequest("DELETE", run_path(args.run_id, under="dlq"))
    raise UsageError(f"unknown command {cmd!r}")  # pragma: no cover - argparse refuses first


def _limit(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    return () if args.limit is None else (("limit", str(args.limit)),)


def build_request(args: argparse.Namespace, stdin: IO[bytes] | None = None) -> ApiRequest:
    """The first (or only) HTTP request for a parsed command line."""
    cmd = args.command
    if cmd == "submit":
        body = build_submit_body(args, stdin)
        return ApiRequest("POST", "/api/v1/jobs", body=body)  # X-Request-Id makes retries safe
    if cmd == "get":
        return ApiRequest("GET", job_path(args.id))
    if cmd == "list":
        query = [
            (key, str(value))
            for key, value in (
                ("status", args.status),
                ("queue", args.queue),
                ("namespace", args.namespace),
                ("task", args.task),
                ("limit", args.limit),
            )
            if value is not None
        ]
        return ApiRequest("GET", "/api/v1/jobs", query=tuple(query))
    if cmd == "runs":
        return ApiRequest("GET", job_path(args.id, "/runs"), query=_limit(args))
    if cmd == "cancel":
        return ApiRequest("DELETE", job_path(args.id))
    if cmd == "cluster":
        return ApiRequest("GET", "/api/v1/cluster")
    if cmd == "workers":
        return ApiRequest("GET", "/api/v1/workers")
    return _job_action_request(args, stdin)


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


# ---- shell completion, generated from the parser ---------------------------------------------


@dataclass
class _Level:
    """What can follow at one command path (``""``, ``"dlq"``, ``"dlq replay"``)."""

    words: list[tuple[str, str]]  # subcommands, or a positional's choices: (word, help)
    options: list[str]
    valued: list[str]  # options that take a value
    choices: dict[str, list[str]]  # option -> the values it accepts


def _help(text: str | None) -> str:
    return " ".join((text or "").replace("%%", "%").split())


def completion_levels(parser: argparse.ArgumentParser) -> dict[str, _Level]:
    """Every command path of ``parser`` and what can be typed there."""
    levels: dict[str, _Level] = {}

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        level = _Level([], [], [], {})
        levels[path] = level
        for action in p._actions:
            if action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: _help(a.help) for a in action._choices_actions}
                for name, child in action.choices.items():
                    level.words.append((name, helps.get(name, "")))
                    walk(child, f"{path} {name}".strip())
            elif action.option_strings:
                level.options += action.option_strings
                if action.nargs != 0:
                    level.valued += action.option_strings
                    if action.choices is not None:
                        for option in action.option_strings:
                            level.choices[option] = [str(c) for c in action.choices]
            elif action.choices is not None:
                level.words += [(str(c), "") for c in action.choices]

    walk(parser, "")
    return levels


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _spec_function(levels: Mapping[str, _Level], zsh: bool) -> list[str]:
    lines = [
        "_schedctl_spec() {",
        "    # $1: the command path so far; sets cmdwords (the subcommands or values that can",
        "    # follow), options, valued (the options that take a value), described (zsh)",
        '    case "$1" in',
    ]
    for path, level in levels.items():
        words = " ".join(w for w, _ in level.words)
        sets = [
            f"cmdwords={_sh_quote(words)}",
            f"options={_sh_quote(' '.join(level.options))}",
            f"valued={_sh_quote(' '.join(level.valued))}",
        ]
        if zsh:
            described = " ".join(
                _sh_quote(w.replace(":", "\\:") + (f":{h}" if h else "")) for w, h in level.words
            )
            sets.append(f"described=({described})")
        lines.append(f"        {_sh_quote(path)})")
        lines += [f"            {line}" for line in sets]
        lines.append("            ;;")
    default = "cmdwords='' options='' valued=''" + (" described=()" if zsh else "")
    lines += [f"        *) {default} ;;", "    esac", "}", ""]
    lines += [
        "_schedctl_choices() {",
        "    # $1: the command path, $2: an option; prints the values it accepts",
        '    case "$1|$2" in',
    ]
    # an option that accepts the same values wherever it appears (-o) gets one pattern
    seen: dict[str, list[tuple[str, list[str]]]] = {}
    for path, level in levels.items():
        for option, values in level.choices.items():
            seen.setdefault(option, []).append((path, values))
    for option, uses in seen.items():
        if all(values == uses[0][1] for _, values in uses):
            uses = [("*", uses[0][1])]
        for path, values in uses:
            pattern = (
                "*" + _sh_quote(f"|{option}") if path == "*" else _sh_quote(f"{path}|{option}")
            )
            lines.append(f"        {pattern}) echo {_sh_quote(' '.join(values))} ;;")
    lines += ["    esac", "}", "", ""]
    return lines


_BASH_MAIN = """\
_schedctl() {
    local cur="${COMP_WORDS[COMP_CWORD]}" cmdpath="" w i skip=0 cmdwords options valued
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        if ((skip)); then skip=0; continue; fi
        _schedctl_spec "$cmdpath"
        case "$w" in
            -*=*) ;;
            -*) [[ " $valued " == *" $w "* ]] && skip=1 ;;
            *) [[ " $cmdwords " == *" $w "* ]] && cmdpath="${cmdpath:+$cmdpath }$w" ;;
        esac
    done
    _schedctl_spec "$cmdpath"
    COMPREPLY=()
    if ((skip)); then
        local choices
        choices="$(_schedctl_choices "$cmdpath" "${COMP_WORDS[COMP_CWORD-1]}")"
        [[ -n "$choices" ]] && COMPREPLY=($(compgen -W "$choices" -- "$cur"))
    elif [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$options" -- "$cur"))
    elif [[ -n "$cmdwords" ]]; then
        COMPREPLY=($(compgen -W "$cmdwords" -- "$cur"))
    fi
    return 0
}

complete -o default -F _schedctl schedctl
"""

_ZSH_MAIN = """\
_schedctl() {
    local cmdpath="" w i skip=0 cmdwords options valued
    local -a described
    for ((i = 2; i < CURRENT; i++)); do
        w="${words[i]}"
        if ((skip)); then skip=0; continue; fi
        _schedctl_spec "$cmdpath"
        case "$w" in
            -*=*) ;;
            -*) [[ " $valued " == *" $w "* ]] && skip=1 ;;
            *) [[ " $cmdwords " == *" $w "* ]] && cmdpath="${cmdpath:+$cmdpath }$w" ;;
        esac
    done
    _schedctl_spec "$cmdpath"
    if ((skip)); then
        local choices
        choices="$(_schedctl_choices "$cmdpath" "${words[CURRENT-1]}")"
        if [[ -n "$choices" ]]; then compadd -- ${=choices}; else _files; fi
    elif [[ "${words[CURRENT]}" == -* ]]; then
        compadd -- ${=options}
    elif ((${#described})); then
        _describe -t commands 'schedctl command' described
    else
        _files
    fi
}

if [[ "${zsh_eval_context[-1]}" == loadautofunc ]]; then
    _schedctl "$@"
else
    compdef _schedctl schedctl
fi
"""


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """A completion script for ``shell`` (bash or zsh) listing the parser's commands, options
    and option values; ``-o default``/``_files`` complete file names where nothing else fits."""
    levels = completion_levels(parser)
    if shell == "zsh":
        head = [
            "#compdef schedctl",
            "# zsh completion for schedctl, generated by `schedctl completion zsh`.",
            "# Load it with: source <(schedctl completion zsh)",
            "# or save it as _schedctl in a directory on $fpath.",
            "",
        ]
        return "\n".join(head + _spec_function(levels, True)) + _ZSH_MAIN
    head = [
        "# bash completion for schedctl, generated by `schedctl completion bash`.",
        "# Load it with: source <(schedctl completion bash)",
        "# or save it as ~/.local/share/bash-completion/completions/schedctl.",
        "",
    ]
    return "\n".join(head + _spec_function(levels, False)) + _BASH_MAIN


# ---- settings: servers and token -------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    servers: tuple[Server, ...]
    token: str | None
    output: str
    timeout: float
    #: the CAs of --cacert / SCHEDD_CACERT for https servers; None: the system's trusted CAs
    ssl_context: ssl.SSLContext | None = None


def _split(values: Sequence[str]) -> list[str]:
    return [part for value in values for part in value.split(",") if part.strip()]


def read_token_file(path: Path) -> str | None:
    """A plain token file (the whole file, stripped), or a tokens.toml: its first admin token."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".toml" or "[[token]]" in text:
        import tomllib

        try:
            tokens = tomllib.loads(text).get("token")
        except tomllib.TOMLDecodeError:
            return None
        if not isinstance(tokens, list):
            return None
        for entry in tokens:
            if isinstance(entry, dict) and entry.get("role") == "admin":
                secret = entry.get("secret")
                if isinstance(secret, str) and secret:
                    return secret
        return None
    return text.strip() or None


def resolve_settings(
    args: argparse.Namespace, env: Mapping[str, str], cwd: Path | None = None
) -> Settings:
    """Flags (before or after the command) over environment over defaults."""
    flags = list(args.server or []) + list(getattr(args, "server_after", []))
    raw = _split(flags) or _split([env.get("SCHEDD_SERVER", "")]) or [DEFAULT_SERVER]
    servers = tuple(parse_server(s) for s in raw)
    output = getattr(args, "output_after", None) or args.output or "table"
    token = getattr(args, "token_after", None) or args.token
    token_file = getattr(args, "token_file_after", None) or args.token_file
    if token is None and token_file is not None:
        try:
            token = read_token_file(Path(token_file))
        except OSError as exc:
            raise UsageError(
                f"--token-file: cannot read {token_file!r}: {exc.strerror or exc}"
            ) from None
        if token is None:
            raise UsageError(
                f"--token-file: no token in {token_file!r} (expected the token "
                f"itself, or a tokens.toml with an admin [[token]])"
            )
    if token is None:
        token = env.get("SCHEDD_TOKEN") or None
    if token is None and all(s.is_loopback for s in servers):
        # the embedded default (`schedd` with no config) keeps its admin token here; only ever
        # sent to a server on this machine
        default = (cwd or Path.cwd()) / DEFAULT_TOKENS_FILE
        try:
            token = read_token_file(default)
        except (OSError, UnicodeDecodeError):
            token = None
    ssl_context = None
    if getattr(args, "cacert", None):
        ssl_context = tls_context(args.cacert, "--cacert")
    elif env.get("SCHEDD_CACERT"):
        ssl_context = tls_context(env["SCHEDD_CACERT"], "SCHEDD_CACERT")
    return Settings(servers, token, output, args.http_timeout, ssl_context)


# ---- running a command -----------------------------------------------------------------------


def _error_exit(status: int) -> int:
    return EXIT_NOT_FOUND if status == 404 else EXIT_SERVER


_HINTS = {
    401: "pass --token or --token-file, or set SCHEDD_TOKEN (a local `schedd` keeps its admin "
    "token in ./.schedd/tokens.toml)",
    403: "this token's role does not allow it; use a token with the submit, read or admin role",
    413: "the payload is over the server's limit (64 KiB by default); pass a reference instead",
}


def server_error(resp: Response, hints: Mapping[int, str] = _HINTS) -> CliError:
    """``<server>: <code>: <message>`` plus what to try, for a 4xx/5xx answer."""
    code, message, where = "", "", ""
    try:
        err = orjson.loads(resp.body)["error"]
        code, message = str(err["code"]), str(err["message"])
        where = str(err.get("field") or "")
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    if not code:
        message = f"HTTP {resp.status} {resp.reason}".strip()
        snippet = resp.body[:200].decode("utf-8", "replace").strip()
        text = f"{resp.server.url}: {message}" + (f": {snippet}" if snippet else "")
        text += " (not a schedd error; is this a schedd server and the right URL?)"
    else:
        if where and not message.startswith(where):
            message = f"{where}: {message}"
        text = f"{resp.server.url}: {code}: {message}"
    hint = hints.get(resp.status)
    if resp.status == 429:
        wait = resp.retry_after
        hint = f"retry after {wait:g}s" if wait is not None else "retry later"
    if hint:
        text += f" ({hint})"
    return CliError(render.clean(text), _error_exit(resp.status))


def _write(out: IO[bytes], text: str) -> None:
    if text:
        out.write(text.encode("utf-8", "replace") + b"\n")


def _as_list(data: Any, key: str) -> list[Mapping[str, Any]]:
    items = data.get(key) if isinstance(data, Mapping) else None
    return [i for i in items if isinstance(i, Mapping)] if isinstance(items, list) else []


def _as_mapping(data: Any) -> Mapping[str, Any]:
    return data if isinstance(data, Mapping) else {}


_TABLES: dict[str, Callable[[Any], str]] = {
    "submit": lambda d: render.submitted_table(_as_mapping(d)),
    "get": lambda d: render.job_details(_as_mapping(d)),
    "pause": lambda d: render.submitted_table(_as_mapping(d)),
    "resume": lambda d: render.submitted_table(_as_mapping(d)),
    "update": lambda d: render.job_details(_as_mapping(d)),
    "trigger": lambda d: render.runs_table([_as_mapping(d)]),
    "explain": lambda d: (
        render.fires_table(_as_list(d, "fires")) if _as_list(d, "fires") else "no fire times ahead"
    ),
    "dlq replay": lambda d: render.runs_table([_as_mapping(d)]),
    "cluster": lambda d: render.cluster_view(_as_mapping(d)),
    "workers": lambda d: (
        render.workers_table(_as_list(d, "workers"))
        if _as_list(d, "workers")
        else "no workers connected"
    ),
}


def _call(
    client: Client,
    req: ApiRequest,
    query: tuple[tuple[str, str], ...] | None = None,
    hints: Mapping[int, str] = _HINTS,
) -> Response:
    resp = client.request(
        req.method,
        req.path,
        query=req.query if query is None else query,
        body=req.encoded_body(),
        idempotent=req.idempotent,
    )
    if resp.status >= 400:
        raise server_error(resp, hints)
    return resp


_TRIGGER_HINTS = {
    **_HINTS,
    409: "the job's overlap policy keeps it from running now; pass --override to run it anyway",
}
_JOB_DONE = ("done", "cancelled")


def watch(
    client: Client,
    job_id: str,
    interval: float,
    output: str,
    out: IO[bytes],
    err: IO[str],
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """``schedctl watch``: poll the job and its runs, print what changed, until the job is done
    or cancelled and every run has finished; Ctrl-C stops it (exit 0)."""
    job_req = ApiRequest("GET", job_path(job_id))
    runs_req = ApiRequest("GET", job_path(job_id, "/runs"))
    previous: list[Mapping[str, Any]] | None = None
    shown = render.clean(job_id)
    if output != "json":
        err.write(f"schedctl: watching job {shown} (times UTC); Ctrl-C to stop\n")
        err.flush()
    try:
        while True:
            # the job first: once it is done no run is added, so the runs read after it are all
            status = _as_mapping(_call(client, job_req).json()).get("status")
            runs = _as_list(_call(client, runs_req).json(), "runs")
            for line in render.watch_lines(previous, runs, output):
                _write(out, line)
            out.flush()
            previous = runs
            if status in _JOB_DONE and all(render.run_finished(r) for r in runs):
                if output != "json":
                    err.write(f"schedctl: job {shown} is {status}; every run has finished\n")
                return EXIT_OK
            sleep(interval)
    except KeyboardInterrupt:
        return EXIT_OK


#: the listings that page: the key of their items, how to show them, and what they list
_PAGED: dict[str, tuple[str, Callable[[list[Mapping[str, Any]]], str], str, str]] = {
    "list": ("jobs", render.jobs_table, "no jobs", "jobs"),
    "runs": ("runs", render.runs_table, "no runs yet", "runs"),
    "dlq list": ("runs", render.dlq_table, "the dead-letter queue is empty", "dead-lettered runs"),
}


def _run_pages(
    client: Client,
    req: ApiRequest,
    command: str,
    follow: bool,
    settings: Settings,
    out: IO[bytes],
    err: IO[str],
) -> None:
    key, table, empty, noun = _PAGED[command]
    items: list[Mapping[str, Any]] = []
    seen: set[str] = set()
    query = req.query
    more = False
    for _ in range(MAX_PAGES):
        resp = _call(client, req, query)
        data = resp.json()
        if settings.output == "json":
            out.write(resp.body + b"\n")
        else:
            items.extend(_as_list(data, key))
        cursor = data.get("next_cursor") if isinstance(data, Mapping) else None
        more = isinstance(cursor, str) and bool(cursor)
        if not follow or not isinstance(cursor, str) or not cursor or cursor in seen:
            break
        seen.add(cursor)
        query = (*tuple((k, v) for k, v in req.query if k != "cursor"), ("cursor", cursor))
    if settings.output != "json":
        _write(out, table(items) if items else empty)
        if more and not follow:
            err.write(f"schedctl: there are more {noun}; pass --all to list every page\n")


def run_command(args: argparse.Namespace, settings: Settings, out: IO[bytes], err: IO[str]) -> int:
    command = command_name(args)
    if command == "completion":
        _write(out, completion_script(build_parser(), args.shell))
        return EXIT_OK
    req = build_request(args)
    client = Client(
        settings.servers, settings.token, settings.timeout, ssl_context=settings.ssl_context
    )
    if command in _PAGED:
        _run_pages(client, req, command, args.all, settings, out, err)
        return EXIT_OK
    if command == "watch":
        return watch(client, args.id, args.interval, settings.output, out, err)
    hints = _TRIGGER_HINTS if command == "trigger" and not args.override else _HINTS
    resp = _call(client, req, hints=hints)
    if command in ("cancel", "dlq drop"):
        if settings.output != "json":
            what = (
                f"cancelled job {render.clean(args.id)}"
                if command == "cancel"
                else f"dropped run {render.clean(args.run_id)} from the dead-letter queue"
            )
            _write(out, what)
        elif resp.body:
            out.write(resp.body + b"\n")
        return EXIT_OK
    if settings.output == "json":
        out.write(resp.body + b"\n")
        return EXIT_OK
    data = resp.json()
    if args.command == "submit" and resp.status == 200:
        err.write(
            "schedctl: a job with this idempotency key already exists; nothing new was submitted\n"
        )
    _write(out, _TABLES[command](data))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``schedctl`` console script; returns the exit code."""
    out = sys.stdout.buffer
    err = sys.stderr
    try:
        try:
            args = parse_args(sys.argv[1:] if argv is None else argv)
        except SystemExit as exc:  # --help, --version
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        settings = resolve_settings(args, os.environ)
        code = run_command(args, settings, out, err)
        out.flush()
        return code
    except CliError as exc:
        err.write(f"schedctl: {exc.message}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        err.write("schedctl: interrupted\n")
        return 130
    except BrokenPipeError:  # `schedctl list | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - a CLI never prints a traceback
        err.write(
            f"schedctl: unexpected error: {type(exc).__name__}: {exc}; please report it "
            f"with the command you ran\n"
        )
        return EXIT_SERVER


if __name__ == "__main__":
    sys.exit(main())
