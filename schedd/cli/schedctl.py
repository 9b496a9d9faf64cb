"""``schedctl``: the command line for a schedd cluster.

``schedctl [--server URL]... [--token T | --token-file PATH] [-o table|json] [--timeout S]
[--cacert FILE] COMMAND``

Exit codes: 0 ok · 1 error from the server · 2 usage · 3 not found · 4 cluster unavailable.
``-o json`` prints exactly the bytes the API answered, followed by a newline.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

import orjson

from schedd.cli import render
from schedd.cli.args import build_parser, parse_args
from schedd.cli.client import (
    Client,
    CliError,
    Response,
    job_path,
)
from schedd.cli.completion import completion_script
from schedd.cli.requests import ApiRequest, build_request, command_name
from schedd.cli.settings import Settings, resolve_settings

EXIT_OK = 0
EXIT_SERVER = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNAVAILABLE = 4

MAX_PAGES = 10_000

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
