"""What a ``schedctl`` command line asks of the API: the method, path, query and body of the
request it means (validated here first, so a typo is a usage error, not a round trip)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from schedd.cli.client import (
    UsageError,
    job_path,
    run_path,
)
from schedd.core.durations import parse_duration, parse_time
from schedd.errors import InvalidArgument

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
