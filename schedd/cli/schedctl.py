"""``schedctl``: the command line for a schedd cluster.

``schedctl [--server URL]... [--token T | --token-file PATH] [-o table|wide|json] [-q]
[--timeout S] [--cacert FILE] COMMAND``

Exit codes: 0 ok · 1 error from the server · 2 usage · 3 not found · 4 cluster unavailable;
``wait``, ``watch`` and ``submit --wait``: 5 the run failed · 6 it was cancelled or skipped ·
7 the wait timed out.  ``-o json`` prints exactly the bytes the API answered, followed by a
newline.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import webbrowser
from collections.abc import Callable, Mapping
from typing import IO, Any

import orjson

from schedd.cli import dlq, render
from schedd.cli.args import build_parser, parse_args
from schedd.cli.client import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_SERVER,
    EXIT_USAGE,
    EXIT_WAIT_TIMEOUT,
    Client,
    CliError,
    Response,
    UsageError,
)
from schedd.cli.client import (
    EXIT_UNAVAILABLE as EXIT_UNAVAILABLE,  # (re-exported: the exit codes are schedctl's)
)
from schedd.cli.client import write_text as _write
from schedd.cli.completion import completion_script
from schedd.cli.requests import (
    ApiRequest,
    build_request,
    build_update_body,
    check_request,
    command_name,
    is_bulk,
    is_run_id,
    update_needs_job,
    wait_seconds,
)
from schedd.cli.settings import Settings, resolve_settings
from schedd.client.servers import job_path, run_path
from schedd.ids import JOB_ID_LENGTH, could_be_job_id_prefix

#: a finished run's state -> the exit code of wait, watch and submit --wait
OUTCOME_EXIT = {
    "succeeded": EXIT_OK,
    "failed": EXIT_FAILED,
    "cancelled": EXIT_CANCELLED,
    "skipped": EXIT_CANCELLED,
}

MAX_PAGES = 10_000

# ---- running a command -----------------------------------------------------------------------


def _error_exit(status: int) -> int:
    """404: not found (3); 400 and 413: the input is wrong, as a usage error found here is
    (2); any other error answer: 1."""
    if status == 404:
        return EXIT_NOT_FOUND
    return EXIT_USAGE if status in (400, 413) else EXIT_SERVER


_HINTS = {
    401: "pass --token or --token-file, or set SCHEDD_TOKEN (a local `schedd` keeps its admin "
    "token in ./.schedd/tokens.toml)",
    403: "use a token with one of the roles allowed",
    413: "pass a reference to the data (a path, a URL, a key) instead of the data itself",
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


def _as_list(data: Any, key: str) -> list[Mapping[str, Any]]:
    items = data.get(key) if isinstance(data, Mapping) else None
    return [i for i in items if isinstance(i, Mapping)] if isinstance(items, list) else []


def _as_mapping(data: Any) -> Mapping[str, Any]:
    return data if isinstance(data, Mapping) else {}


_TABLES: dict[str, Callable[[Any, render.Style], str]] = {
    "submit": lambda d, st: render.submitted_table(_as_mapping(d), st),
    "get": lambda d, st: render.job_details(_as_mapping(d), st),
    "pause": lambda d, st: render.submitted_table(_as_mapping(d), st),
    "resume": lambda d, st: render.submitted_table(_as_mapping(d), st),
    "update": lambda d, st: render.job_details(_as_mapping(d), st),
    "trigger": lambda d, st: render.runs_table([_as_mapping(d)], st),
    "run": lambda d, st: render.run_details(_as_mapping(d), st),
    "cancel": lambda d, st: render.runs_table([_as_mapping(d)], st),  # a run's cancel
    "explain": lambda d, st: (
        render.fires_table(_as_list(d, "fires"), st)
        if _as_list(d, "fires")
        else "no fire times ahead"
    ),
    "dlq replay": lambda d, st: render.runs_table([_as_mapping(d)], st),
    "cluster": lambda d, st: render.cluster_view(_as_mapping(d), st),
    "node list": lambda d, st: render.members_table(_as_mapping(d), st),
    "node add": lambda d, st: render.members_table(_as_mapping(d), st),
    "node remove": lambda d, st: render.members_table(_as_mapping(d), st),
    "workers": lambda d, st: (
        render.workers_table(_as_list(d, "workers"), st)
        if _as_list(d, "workers")
        else "no workers connected"
    ),
}

#: with -q: the ids an answer names
_IDS: dict[str, Callable[[Any], list[str]]] = {
    "workers": lambda d: [str(w.get("worker_id")) for w in _as_list(d, "workers")],
    "cluster": lambda d: [str(n.get("id")) for n in _as_list(d, "nodes")],
    "node list": lambda d: [str(n.get("id") or n.get("raft")) for n in _as_list(d, "nodes")],
    "explain": lambda d: [str(f.get("scheduled_at")) for f in _as_list(d, "fires")],
}


def _ids(command: str, data: Any) -> list[str]:
    if command in _IDS:
        return _IDS[command](data)
    value = _as_mapping(data).get("id")
    return [str(value)] if value is not None else []


def terminal_style(
    output: str, out_is_tty: bool, env: Mapping[str, str], now_ms: int | None = None
) -> render.Style:
    """Fit the terminal (``COLUMNS`` or its real width) when the output is one; cut nothing
    when it is a pipe or a file (unless ``COLUMNS`` says a width); ``-o wide``: more columns
    and nothing cut."""
    clock = _wall_ms if now_ms is None else None  # ages as of when each is printed
    # colours on a terminal only, unless NO_COLOR is set (no-color.org) or it cannot show them
    color = out_is_tty and not env.get("NO_COLOR") and env.get("TERM") != "dumb"
    if output == "wide":
        return render.Style(render.UNLIMITED, now_ms, wide=True, clock=clock, color=color)
    columns = env.get("COLUMNS", "")
    if columns.isdigit() and int(columns) >= 20:
        return render.Style(int(columns), now_ms, clock=clock, color=color)
    if out_is_tty:
        width = max(shutil.get_terminal_size((render.WIDTH, 24)).columns, 20)
        return render.Style(width, now_ms, clock=clock, color=color)
    return render.Style(render.UNLIMITED, now_ms, clock=clock, color=color)


def _wall_ms() -> int:
    return int(time.time() * 1000)


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
_SNAPSHOT_HINTS = {**_HINTS, 403: "a snapshot needs a token with the admin role"}


def watch(
    client: Client,
    job_id: str,
    interval: float,
    settings: Settings,
    style: render.Style,
    out: IO[bytes],
    err: IO[str],
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """``schedctl watch``: poll the job and its runs, print what changed, until the job is done
    or cancelled and every run has finished, then exit with its latest run's outcome; Ctrl-C
    stops it (exit 0)."""
    output = settings.output
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
            for line in render.watch_lines(previous, runs, output, style):
                _write(out, line)
            out.flush()
            previous = runs
            if status in _JOB_DONE and all(render.run_finished(r) for r in runs):
                latest = str(runs[0].get("state")) if runs else "cancelled"
                if output != "json":
                    err.write(
                        f"schedctl: job {shown} is {status}; every run has finished "
                        f"(the latest {latest})\n"
                    )
                return OUTCOME_EXIT.get(latest, EXIT_CANCELLED)
            sleep(interval)
    except KeyboardInterrupt:
        return EXIT_OK


def wait(
    client: Client,
    target: str,
    timeout: float | None,
    settings: Settings,
    style: render.Style,
    out: IO[bytes],
    err: IO[str],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """``schedctl wait``: poll a run (a run id) or a job's latest run until it has finished,
    print it, and exit with its outcome (:data:`OUTCOME_EXIT`); 7 when ``timeout`` seconds pass
    first.  A job whose latest run has already finished answers at once."""
    deadline = None if timeout is None else clock() + timeout
    delay = 0.1
    run: Mapping[str, Any] | None = None
    while True:
        if is_run_id(target):
            resp = _call(client, ApiRequest("GET", run_path(target)))
            run = _as_mapping(resp.json())
            body = resp.body
        else:
            job = _as_mapping(_call(client, ApiRequest("GET", job_path(target))).json())
            latest = job.get("latest_run")
            run = latest if isinstance(latest, Mapping) else None
            body = b"null" if run is None else orjson.dumps(run)
            if run is None and job.get("status") in _JOB_DONE:
                err.write(
                    f"schedctl: job {render.clean(target)} is {job.get('status')} and has no run\n"
                )
                return EXIT_CANCELLED
        if run is not None and render.run_finished(run):
            _show_runs([run], body, settings, style, out)
            return OUTCOME_EXIT.get(str(run.get("state")), EXIT_CANCELLED)
        now = clock()
        if deadline is not None and now >= deadline:
            state = "not yet created" if run is None else f"{run.get('state')}"
            err.write(
                f"schedctl: gave up waiting after {timeout:g}s: "
                f"{render.clean(str(run.get('id') if run else target))} is {state}\n"
            )
            return EXIT_WAIT_TIMEOUT
        sleep(delay if deadline is None else max(0.0, min(delay, deadline - now)))
        delay = min(delay * 1.5, 2.0)


def _show_runs(
    runs: list[Mapping[str, Any]],
    body: bytes,
    settings: Settings,
    style: render.Style,
    out: IO[bytes],
) -> None:
    if settings.output == "json":
        out.write(body + b"\n")
    elif settings.quiet:
        _write(out, "\n".join(str(r.get("id")) for r in runs))
    else:
        _write(out, render.runs_table(runs, style))


#: the listings that page: the key of their items, how to show them, and what they list
_PAGED: dict[str, tuple[str, Callable[[list[Mapping[str, Any]], render.Style], str], str, str]] = {
    "list": ("jobs", render.jobs_table, "no jobs", "jobs"),
    "runs": ("runs", render.runs_table, "no runs yet", "runs"),
    "dlq list": ("runs", render.dlq_table, "the dead-letter queue is empty", "dead-lettered runs"),
}


def _run_pages(
    client: Client,
    req: ApiRequest,
    command: str,
    args: argparse.Namespace,
    settings: Settings,
    style: render.Style,
    out: IO[bytes],
    err: IO[str],
) -> None:
    """Print a listing's first page, or every page with ``--all``.  A filter the server reads
    in windows (``list --state``, a filter with ``--sort next_fire``, ``dlq list --task``) can
    answer short pages: they are followed until a page's worth of items has come (any other
    page is full unless it is the last)."""
    key, table, empty, noun = _PAGED[command]
    follow = bool(args.all)
    want = args.limit or 100
    items: list[Mapping[str, Any]] = []
    seen: set[str] = set()
    query = req.query
    more = False
    for _ in range(MAX_PAGES):
        resp = _call(client, req, query)
        data = resp.json()
        page = _as_list(data, key)
        if settings.output == "json":
            out.write(resp.body + b"\n")
        elif settings.quiet:
            _write(out, "\n".join(str(i.get("id")) for i in page))
        items.extend(page)
        cursor = data.get("next_cursor") if isinstance(data, Mapping) else None
        more = isinstance(cursor, str) and bool(cursor)
        if not isinstance(cursor, str) or not cursor or cursor in seen:
            break
        if not follow and len(items) >= want:
            break
        seen.add(cursor)
        query = (*tuple((k, v) for k, v in req.query if k != "cursor"), ("cursor", cursor))
    if settings.output != "json" and not settings.quiet:
        _write(out, table(items, style) if items else empty)
    if more and not follow and settings.output != "json":
        err.write(f"schedctl: there are more {noun}; pass --all to list every page\n")


def _list_jobs(client: Client, query: tuple[tuple[str, str], ...]) -> list[Mapping[str, Any]]:
    """The jobs a query lists; none when it cannot be asked (the command's own request then
    says why)."""
    try:
        resp = _call(client, ApiRequest("GET", "/api/v1/jobs", query=query))
    except CliError:
        return []
    return _as_list(resp.json(), "jobs")


def resolve_job(client: Client, ref: str) -> str:
    """The id of the job ``ref`` names: a whole id as it is; else the one live job (or the one
    job) with that name; else the one job whose id starts so.  Ambiguous: a usage error listing
    the candidates; nothing found: ``ref`` itself (the server then says it is not found)."""
    if len(ref) == JOB_ID_LENGTH and ref == ref.upper() and could_be_job_id_prefix(ref):
        return ref
    named = _list_jobs(client, (("name", ref), ("limit", "20")))
    live = [j for j in named if j.get("status") in ("active", "paused")]
    if not live and len(named) == 20:  # a full page of finished ones: a live one may be older
        for status in ("active", "paused"):
            live += _list_jobs(client, (("name", ref), ("status", status), ("limit", "10")))
    candidates = live or named
    kind = "name"
    if not candidates and could_be_job_id_prefix(ref):
        candidates = _list_jobs(client, (("id_prefix", ref), ("limit", "10")))
        kind = "id prefix"
    if len(candidates) == 1:
        return str(candidates[0].get("id"))
    if len(candidates) > 1:
        ids = ", ".join(str(j.get("id")) for j in candidates[:10])
        raise UsageError(
            f"{render.clean(ref)!r} is ambiguous: the {kind} of {len(candidates)}"
            f"{'+' if len(candidates) >= 10 else ''} {'live ' if live else ''}jobs ({ids}); "
            "give a longer prefix or the whole id"
        )
    return ref


def _latest_run_of(client: Client, job_id: str) -> str:
    """``schedctl run JOB``: the id of the job's latest run."""
    job = _as_mapping(_call(client, ApiRequest("GET", job_path(job_id))).json())
    latest = job.get("latest_run")
    if not isinstance(latest, Mapping) or not latest.get("id"):
        raise CliError(f"job {render.clean(job_id)} has no run yet", EXIT_NOT_FOUND)
    return str(latest["id"])


def resolve_run(client: Client, ref: str) -> str:
    """A run id whose job part may be a name or an id prefix."""
    job, _, ms = ref.rpartition("@")
    return f"{resolve_job(client, job)}@{ms}" if is_run_id(ref) else ref


def _resolve(client: Client, args: argparse.Namespace) -> None:
    """Replace the job or run the command line names by its id."""
    if getattr(args, "run_id", None):
        if args.command == "run" and not is_run_id(args.run_id):  # a job: its latest run
            args.run_id = _latest_run_of(client, resolve_job(client, args.run_id))
        else:
            args.run_id = resolve_run(client, args.run_id)
    if getattr(args, "run_ids", None):
        args.run_ids = [resolve_run(client, ref) for ref in args.run_ids]
    if getattr(args, "id", None):
        args.id = (
            resolve_run(client, args.id) if is_run_id(args.id) else resolve_job(client, args.id)
        )


def complete_jobs(client: Client, prefix: str, out: IO[bytes]) -> int:
    """``schedctl __jobs PREFIX``: the names and ids of live jobs starting so, for the shell
    completion; quietly nothing when the cluster cannot be asked."""
    words: list[str] = []
    for status in ("active", "paused"):
        for job in _list_jobs(client, (("status", status), ("limit", "1000"))):
            words.append(str(job.get("id")))
            name = job.get("name")
            if isinstance(name, str) and name and not any(c.isspace() for c in name):
                words.append(name)
    low = prefix.lower()
    _write(out, "\n".join(dict.fromkeys(w for w in words if w.lower().startswith(low))))
    return EXIT_OK


def run_command(
    args: argparse.Namespace,
    settings: Settings,
    out: IO[bytes],
    err: IO[str],
    style: render.Style = render.PLAIN,
) -> int:
    command = command_name(args)
    if command == "completion":
        _write(out, completion_script(build_parser(), args.shell))
        return EXIT_OK
    if command.startswith("snapshot "):
        return _snapshot(command, args, settings, style, out)
    client = Client(
        settings.servers, settings.token, settings.timeout, ssl_context=settings.ssl_context
    )
    if command == "ready":
        from schedd.cli.ready import wait_ready

        timeout = wait_seconds(args)
        assert timeout is not None  # (its default is 30s)
        return wait_ready(client, timeout, out)
    if command == "__jobs":
        return complete_jobs(client, args.prefix, out)
    if command == "apply":
        from schedd.cli.apply import apply_file

        return apply_file(
            client,
            args.file,
            dry_run=args.dry_run,
            replace=args.replace,
            output=settings.output,
            out=out,
            err=err,
            server_error=server_error,
        )
    check_request(args)  # usage errors first: nothing is asked of a cluster for them
    _resolve(client, args)
    if command == "update" and update_needs_job(args):
        current = _as_mapping(_call(client, ApiRequest("GET", job_path(args.id))).json())
        req = ApiRequest("PATCH", job_path(args.id), body=build_update_body(args, current=current))
    else:
        req = build_request(args)
    return _run_request(client, req, command, args, settings, style, out, err)


def _run_request(
    client: Client,
    req: ApiRequest,
    command: str,
    args: argparse.Namespace,
    settings: Settings,
    style: render.Style,
    out: IO[bytes],
    err: IO[str],
) -> int:
    """Send the command's request (or run the commands that make several) and print."""
    if command in _PAGED:
        _run_pages(client, req, command, args, settings, style, out, err)
        return EXIT_OK
    if command == "watch":
        return watch(client, args.id, args.interval, settings, style, out, err)
    if command == "wait":
        return wait(client, args.id, wait_seconds(args), settings, style, out, err)
    if command in ("dlq replay", "dlq drop") and is_bulk(args):
        return dlq.bulk(
            lambda r: _call(client, r),
            req,
            command.split()[1],
            dry_run=args.dry_run,
            yes=args.yes,
            settings=settings,
            out=out,
            err=err,
        )
    hints = _TRIGGER_HINTS if command == "trigger" and not args.override else _HINTS
    resp = _call(client, req, hints=hints)
    if command == "ui":
        return open_dashboard(resp, args.no_open, settings, out, err)
    if command == "dlq drop" or (command == "cancel" and not is_run_id(args.id)):
        _removed(command, args, resp, settings, out)
        return EXIT_OK
    data = resp.json()
    if command == "submit":
        _submit_notes(resp, data, err)
    if settings.output == "json":
        out.write(resp.body + b"\n")
    elif settings.quiet:
        _write(out, "\n".join(render.clean(i) for i in _ids(command, data)))
    else:
        _write(out, _TABLES[command](data, style))
    if command == "submit" and args.wait:
        out.flush()
        job_id = str(_as_mapping(data).get("id"))
        return wait(client, job_id, wait_seconds(args), settings, style, out, err)
    return EXIT_OK


def _snapshot(
    command: str,
    args: argparse.Namespace,
    settings: Settings,
    style: render.Style,
    out: IO[bytes],
) -> int:
    """``snapshot save`` (from a node) and ``snapshot inspect`` (a file, no server needed)."""
    from schedd.cli.snapshot import inspect_image, save_image

    if command == "snapshot inspect":
        return inspect_image(args.file, settings, style, out)
    client = Client(
        settings.servers, settings.token, settings.timeout, ssl_context=settings.ssl_context
    )
    return save_image(
        client, args.file, args.force, settings, out, lambda r: server_error(r, _SNAPSHOT_HINTS)
    )


def open_dashboard(
    resp: Response, no_open: bool, settings: Settings, out: IO[bytes], err: IO[str]
) -> int:
    """``schedctl ui``: the dashboard's address with the one-time code, on the node that made
    it; printed, and opened in a browser unless ``no_open``."""
    data = _as_mapping(resp.json())
    url = resp.server.url + str(data.get("path", "/ui/"))
    if settings.output == "json":
        out.write(orjson.dumps({**data, "url": url}) + b"\n")
    else:
        _write(out, url)
    if no_open:
        return EXIT_OK
    out.flush()
    if not webbrowser.open(url):
        err.write(
            "schedctl: no browser to start here: open the address above (good once, for 60 s)\n"
        )
    return EXIT_OK


def _removed(
    command: str, args: argparse.Namespace, resp: Response, settings: Settings, out: IO[bytes]
) -> None:
    """What ``cancel`` (a job) and ``dlq drop`` print: they answer no body."""
    if settings.output == "json":
        if resp.body:
            out.write(resp.body + b"\n")
    elif settings.quiet:
        _write(out, render.clean(args.id if command == "cancel" else args.run_ids[0]))
    else:
        what = (
            f"cancelled job {render.clean(args.id)}"
            if command == "cancel"
            else f"dropped run {render.clean(args.run_ids[0])} from the dead-letter queue"
        )
        _write(out, what)


def _submit_notes(resp: Response, data: Any, err: IO[str]) -> None:
    if resp.status == 200:
        err.write(
            "schedctl: a job with this idempotency key already exists; nothing new was submitted\n"
        )
    for warning in _as_mapping(data).get("warnings") or ():
        err.write(f"schedctl: warning: {render.clean(str(warning))}\n")


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
        style = terminal_style(settings.output, sys.stdout.isatty(), os.environ)
        code = run_command(args, settings, out, err, style)
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
