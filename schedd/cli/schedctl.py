"""``schedctl``: the command line for a schedd cluster.

``schedctl [--server URL]... [--token T | --token-file PATH] [-o table|json] [--timeout S] COMMAND``

Exit codes: 0 ok · 1 error from the server · 2 usage · 3 not found · 4 cluster unavailable.
``-o json`` prints exactly the bytes the API answered, followed by a newline.
"""

from __future__ import annotations

import argparse
import os
import sys
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
        return ApiRequest("GET", job_path(args.id, "/runs"))
    if cmd == "cancel":
        return ApiRequest("DELETE", job_path(args.id))
    if cmd == "cluster":
        return ApiRequest("GET", "/api/v1/cluster")
    if cmd == "workers":
        return ApiRequest("GET", "/api/v1/workers")
    raise UsageError(f"unknown command {cmd!r}")  # pragma: no cover - argparse refuses first


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
    common = _Parser(add_help=False)
    _connection_options(common, "_after")
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_Parser
    )

    s = sub.add_parser("submit", parents=[common], help="submit a job")
    s.add_argument("task", metavar="TASK")
    s.add_argument("--payload", metavar="JSON|@FILE", help="JSON payload, or @FILE / @- (stdin)")
    when = s.add_mutually_exclusive_group()
    when.add_argument("--at", metavar="TIME", help="run once at an RFC 3339 time")
    when.add_argument("--in", dest="in_", metavar="DUR", help="run once after a delay, e.g. 5m")
    when.add_argument("--every", metavar="DUR", help="run every DUR, e.g. 1h30m")
    when.add_argument("--cron", metavar="EXPR", help="run on a cron schedule, e.g. '0 2 * * *'")
    s.add_argument("--tz", metavar="ZONE", help="IANA time zone for --cron (default UTC)")
    s.add_argument("--priority", choices=("high", "normal", "low"))
    s.add_argument("--queue", metavar="Q")
    s.add_argument("--namespace", metavar="N")
    s.add_argument("--max-attempts", type=_positive_int, metavar="N")
    s.add_argument("--timeout", dest="job_timeout", metavar="DUR", help="per-attempt timeout")
    s.add_argument("--heartbeat-timeout", metavar="DUR")
    s.add_argument("--depends-on", action="append", metavar="ID", help="repeatable")
    s.add_argument("--idempotency-key", metavar="K")
    s.add_argument("--name", metavar="NAME")

    for name, text in (
        ("get", "show one job"),
        ("runs", "show a job's runs, newest first"),
        ("cancel", "cancel a job and its unfinished runs"),
    ):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("id", metavar="ID")

    ls = sub.add_parser("list", parents=[common], help="list jobs")
    ls.add_argument("--status", metavar="S", help="active, paused, done or cancelled")
    ls.add_argument("--queue", metavar="Q")
    ls.add_argument("--namespace", metavar="N")
    ls.add_argument("--task", metavar="T")
    ls.add_argument("--limit", type=_positive_int, metavar="N", help="page size")
    ls.add_argument(
        "--all",
        action="store_true",
        help="follow every page (with -o json: one page body per line)",
    )

    sub.add_parser("cluster", parents=[common], help="show nodes, leader, term and indexes")
    sub.add_parser("workers", parents=[common], help="show connected workers")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


# ---- settings: servers and token -------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    servers: tuple[Server, ...]
    token: str | None
    output: str
    timeout: float


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
    return Settings(servers, token, output, args.http_timeout)


# ---- running a command -----------------------------------------------------------------------


def _error_exit(status: int) -> int:
    return EXIT_NOT_FOUND if status == 404 else EXIT_SERVER


_HINTS = {
    401: "pass --token or --token-file, or set SCHEDD_TOKEN (a local `schedd` keeps its admin "
    "token in ./.schedd/tokens.toml)",
    403: "this token's role does not allow it; use a token with the submit, read or admin role",
    413: "the payload is over the server's limit (64 KiB by default); pass a reference instead",
}


def server_error(resp: Response) -> CliError:
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
    hint = _HINTS.get(resp.status)
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
    "runs": lambda d: (
        render.runs_table(_as_list(d, "runs")) if _as_list(d, "runs") else "no runs yet"
    ),
    "cluster": lambda d: render.cluster_view(_as_mapping(d)),
    "workers": lambda d: (
        render.workers_table(_as_list(d, "workers"))
        if _as_list(d, "workers")
        else "no workers connected"
    ),
}


def _call(
    client: Client, req: ApiRequest, query: tuple[tuple[str, str], ...] | None = None
) -> Response:
    resp = client.request(
        req.method,
        req.path,
        query=req.query if query is None else query,
        body=req.encoded_body(),
        idempotent=req.idempotent,
    )
    if resp.status >= 400:
        raise server_error(resp)
    return resp


def _run_list(
    client: Client, req: ApiRequest, follow: bool, settings: Settings, out: IO[bytes], err: IO[str]
) -> None:
    jobs: list[Mapping[str, Any]] = []
    seen: set[str] = set()
    query = req.query
    more = False
    for _ in range(MAX_PAGES):
        resp = _call(client, req, query)
        data = resp.json()
        if settings.output == "json":
            out.write(resp.body + b"\n")
        else:
            jobs.extend(_as_list(data, "jobs"))
        cursor = data.get("next_cursor") if isinstance(data, Mapping) else None
        more = isinstance(cursor, str) and bool(cursor)
        if not follow or not isinstance(cursor, str) or not cursor or cursor in seen:
            break
        seen.add(cursor)
        query = tuple((k, v) for k, v in req.query if k != "cursor") + (("cursor", cursor),)
    if settings.output != "json":
        _write(out, render.jobs_table(jobs) if jobs else "no jobs")
        if more and not follow:
            err.write("schedctl: there are more jobs; pass --all to list every page\n")


def run_command(args: argparse.Namespace, settings: Settings, out: IO[bytes], err: IO[str]) -> int:
    req = build_request(args)
    client = Client(settings.servers, settings.token, settings.timeout)
    if args.command == "list":
        _run_list(client, req, args.all, settings, out, err)
        return EXIT_OK
    resp = _call(client, req)
    if args.command == "cancel":
        if settings.output != "json":
            _write(out, f"cancelled job {render.clean(args.id)}")
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
    _write(out, _TABLES[args.command](data))
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
    except Exception as exc:  # a CLI never prints a traceback
        err.write(
            f"schedctl: unexpected error: {type(exc).__name__}: {exc}; please report it "
            f"with the command you ran\n"
        )
        return EXIT_SERVER


if __name__ == "__main__":
    sys.exit(main())
