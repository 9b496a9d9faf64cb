"""What a ``schedctl`` command line asks of the API: the method, path, query and body of the
request it means (validated here first, so a typo is a usage error, not a round trip)."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson

from schedd.cli.client import (
    UsageError,
)
from schedd.client.servers import job_path, run_path
from schedd.core.durations import format_time, parse_duration, parse_time
from schedd.core.validate import RECURRING_FIELDS
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


def is_run_id(text: str) -> bool:
    """A run id, ``<job>@<scheduled ms>``, rather than a job's."""
    job, at, ms = text.rpartition("@")
    return bool(at and job and ms.isascii() and ms.isdigit())


def _time(option: str, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        parse_time(value, option)
    except InvalidArgument as exc:
        raise UsageError(exc.message) from None
    return value


def _from_time(value: str, zone: str | None) -> str:
    """``explain --from``: an RFC 3339 time, or a plain date (``2027-03-26``): its midnight in
    ``--tz`` (UTC without one, and for a job: give a time with its offset for another zone)."""
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value.strip()):
        return str(_time("--from", value))
    try:
        day = date.fromisoformat(value.strip())
    except ValueError as exc:
        raise UsageError(
            f"--from: expected a date like 2027-03-26, got {value!r} ({exc})"
        ) from None
    try:
        tz = ZoneInfo(zone) if zone else UTC
    except (ValueError, ZoneInfoNotFoundError):
        raise UsageError(f"--tz: expected an IANA time zone, got {zone!r}") from None
    return datetime(day.year, day.month, day.day, tzinfo=tz).isoformat()


#: the policy options of a recurring schedule: (option, the schedule's key)
POLICY_OPTIONS = (
    ("--overlap", "overlap"),
    ("--misfire", "misfire"),
    ("--catchup-window", "catchup_window"),
    ("--jitter", "jitter"),
    ("--start-at", "start_at"),
    ("--end-at", "end_at"),
    ("--dst-gap", "gap"),
    ("--dst-repeat", "repeat"),
)


def _policies(args: argparse.Namespace) -> dict[str, Any]:
    """The policy options given, as schedule fields (``dst`` as one object)."""
    given = {key: getattr(args, option[2:].replace("-", "_")) for option, key in POLICY_OPTIONS}
    out: dict[str, Any] = {}
    for option, key in POLICY_OPTIONS:
        value = given[key]
        if value is None:
            continue
        if key in ("catchup_window", "jitter"):
            value = _duration(option, value, allow_zero=key == "jitter")
        elif key in ("start_at", "end_at"):
            value = _time(option, value)
        if key in ("gap", "repeat"):
            out.setdefault("dst", {})[key] = value
        else:
            out[key] = value
    return out


def _given_policies(args: argparse.Namespace) -> list[str]:
    return [o for o, _ in POLICY_OPTIONS if getattr(args, o[2:].replace("-", "_")) is not None]


def _schedule(
    args: argparse.Namespace, current: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The schedule the options ask for; None when they do not touch it.  ``current`` (update):
    the job's schedule as the API shows it, whose policies and kind are kept unless given."""
    policies = _policies(args)
    if args.at is not None or args.in_ is not None:
        if policies or args.tz is not None:
            what = _given_policies(args) + (["--tz"] if args.tz is not None else [])
            raise UsageError(
                f"{', '.join(what)}: only apply to an --every or --cron schedule, not a one-off "
                "(--at, --in)"
            )
        if args.at is not None:
            return {"at": _time("--at", args.at)}
        return {"in": _duration("--in", args.in_, allow_zero=True)}
    cron = args.cron is not None or (
        args.every is None and current is not None and current.get("cron") is not None
    )
    if args.tz is not None and not cron:
        raise UsageError(
            "--tz: only applies to --cron (e.g. --cron '0 2 * * *' --tz Europe/Berlin)"
            + ("" if current is None else " or to a job with a cron schedule")
        )
    schedule: dict[str, Any] = {}
    if _recurring(current):
        assert current is not None
        schedule = {k: current[k] for k in ("cron", "every", *RECURRING_FIELDS) if k in current}
        schedule = {k: v for k, v in schedule.items() if v is not None}
    if args.every is not None:
        schedule.pop("cron", None)
        schedule["every"] = _duration("--every", args.every)
    elif args.cron is not None:
        if not args.cron.strip():
            raise UsageError("--cron: expected a cron expression like '0 2 * * *'")
        schedule.pop("every", None)
        schedule["cron"] = args.cron
    elif not policies and args.tz is None:
        return None
    elif not schedule:
        named = ", ".join(_given_policies(args)) or "--tz"
        raise UsageError(
            f"{named}: only apply to an --every or --cron schedule; give one"
            + ("" if current is None else " (this job's schedule is not recurring)")
        )
    if args.tz is not None:
        schedule["timezone"] = args.tz
    dst = policies.pop("dst", None)
    schedule.update(policies)
    if dst:
        schedule["dst"] = {**(schedule.get("dst") or {}), **dst}
    return schedule


def _recurring(schedule: Mapping[str, Any] | None) -> bool:
    return schedule is not None and (
        schedule.get("cron") is not None or schedule.get("every") is not None
    )


_RETRY_OPTIONS = (
    ("max_attempts", "max_attempts"),
    ("retry_initial", "initial"),
    ("retry_max", "max"),
    ("retry_multiplier", "multiplier"),
    ("retry_jitter", "jitter"),
)


def _retry(
    args: argparse.Namespace, current: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The retry policy the options ask for (None: untouched); on update, the job's current
    policy with the options given changed (the API replaces the whole policy)."""
    given = {key: getattr(args, dest) for dest, key in _RETRY_OPTIONS}
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return None
    for key, option in (("initial", "--retry-initial"), ("max", "--retry-max")):
        if key in given:
            given[key] = _duration(option, given[key])
    base = {k: v for k, v in (current or {}).items() if k in dict(_RETRY_OPTIONS).values()}
    return {**base, **given}


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
        ("retry", _retry(args)),
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


UPDATE_OPTIONS = (
    "--payload, --at, --in, --every, --cron, --tz, a policy option (--overlap, --misfire, "
    "--catchup-window, --jitter, --start-at, --end-at, --dst-gap, --dst-repeat), --priority, a "
    "retry option (--max-attempts, --retry-initial, --retry-max, --retry-multiplier, "
    "--retry-jitter) or --timeout"
)


def update_needs_job(args: argparse.Namespace) -> bool:
    """Whether ``update`` must read the job first: options that change part of its schedule
    or of its retry policy, which the API replaces whole."""
    partial_schedule = bool(_given_policies(args)) or args.tz is not None or args.every or args.cron
    return bool(partial_schedule) or any(
        getattr(args, dest) is not None for dest, _ in _RETRY_OPTIONS
    )


def build_update_body(
    args: argparse.Namespace,
    stdin: IO[bytes] | None = None,
    current: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``PATCH /jobs/{id}`` body for ``schedctl update``: only the fields given (``current``:
    the job as the API shows it, when :func:`update_needs_job`)."""
    body: dict[str, Any] = {}
    schedule = None if current is None else current.get("schedule")
    retry = None if current is None else current.get("retry")
    optional: list[tuple[str, Any]] = [
        ("schedule", _schedule(args, schedule if isinstance(schedule, Mapping) else None)),
        ("payload", None if args.payload is None else _payload(args.payload, stdin)),
        ("priority", args.priority),
        ("retry", _retry(args, retry if isinstance(retry, Mapping) else None)),
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


def check_request(args: argparse.Namespace, stdin: IO[bytes] | None = None) -> None:
    """Usage errors of a command line, before anything is asked of the cluster (an ``update``
    that must read the job first is checked as if the job were recurring)."""
    wait_seconds(args)
    if command_name(args) == "update" and update_needs_job(args):
        build_update_body(args, stdin, {"schedule": {"cron": "* * * * *"}, "retry": {}})
    elif command_name(args) not in ("apply", "__jobs", "completion"):
        build_request(args, stdin)


def wait_seconds(args: argparse.Namespace) -> float | None:
    """``wait --timeout`` / ``submit --wait-timeout`` in seconds; None: no limit."""
    value = getattr(args, "wait_timeout", None)
    if value is None:
        return None
    option = "--timeout" if args.command in ("wait", "ready") else "--wait-timeout"
    return parse_duration(_duration(option, value), option) / 1000


def since_time(value: str, now_ms: int) -> str:
    """``--since``: an RFC 3339 time as it is, or a duration (``1h``) as the time that long
    before ``now_ms``."""
    try:
        parse_time(value, "--since")
        return value
    except InvalidArgument:
        pass
    try:
        ago = parse_duration(value, "--since", allow_zero=True)
    except InvalidArgument:
        raise UsageError(
            f"--since: expected an RFC 3339 time (2026-11-27T09:00:00Z) or a duration ago "
            f"(30m, 1h, 7d), got {value!r}"
        ) from None
    return str(format_time(now_ms - ago))


def _list_request(args: argparse.Namespace) -> ApiRequest:
    query = _query(args, "status", "queue", "namespace", "task", "name", "sort", "order")
    state = args.state
    if args.status == "failed":  # as the STATUS column shows it: done, its latest run failed
        if state not in (None, "failed"):
            raise UsageError(f"--status failed means --state failed, not --state {state}")
        query = (("status", "done"), *(q for q in query if q[0] != "status"))
        state = "failed"
    if state is not None:
        query = (("last_run", state), *query)
    return ApiRequest("GET", "/api/v1/jobs", query=query)


DLQ_FILTERS = ("namespace", "queue", "task", "error")


def is_bulk(args: argparse.Namespace) -> bool:
    """Whether ``dlq replay|drop`` goes through the bulk endpoint: anything but one run by
    its id without ``--dry-run`` (what filters or ``--all`` pick, several ids)."""
    return len(args.run_ids) != 1 or bool(args.dry_run)


def _dlq_request(args: argparse.Namespace, action: str) -> ApiRequest:
    """``dlq replay|drop``: one run by its own endpoint; else a dry run of the bulk endpoint
    (the command confirms, then sends the run ids it counted: ``schedd.cli.dlq``)."""
    filters: dict[str, Any] = dict(_query(args, *DLQ_FILTERS))
    ids = list(args.run_ids)
    if ids and (filters or args.all):
        raise UsageError(
            f"dlq {action}: give run ids, or filters (--task, --queue, --namespace, --error, "
            "--since) or --all, not both"
        )
    if not ids and not filters and not args.all:
        raise UsageError(
            f"dlq {action}: name the runs (RUN_ID ...), or pick them with --task, --queue, "
            "--namespace, --error or --since, or take every one with --all"
        )
    if not is_bulk(args):
        if action == "replay":
            return ApiRequest("POST", run_path(ids[0], "/replay", under="dlq"))
        return ApiRequest("DELETE", run_path(ids[0], under="dlq"))
    body: dict[str, Any] = {"dry_run": True, **filters}
    if ids:
        body["run_ids"] = ids
    return ApiRequest("POST", f"/api/v1/dlq/{action}", body=body)


def _explain_request(args: argparse.Namespace) -> ApiRequest:
    given = [
        what
        for what, v in (("a job ID", args.id), ("--cron", args.cron), ("--every", args.every))
        if v is not None
    ]
    if len(given) > 1:
        raise UsageError(
            f"explain: give one of a job ID, --cron EXPR or --every DUR, not {' and '.join(given)}"
        )
    if not given:
        raise UsageError(
            "explain: expected a job ID, --cron EXPR [--tz ZONE] or --every DUR "
            "(e.g. schedctl explain --cron '0 2 * * *' --tz Europe/Berlin)"
        )
    if args.tz is not None and args.cron is None:
        raise UsageError("--tz: only applies to --cron (explain ID uses the job's own time zone)")
    extra = [] if args.count is None else [("count", str(args.count))]
    if args.from_ is not None:
        extra.insert(0, ("from", _from_time(args.from_, args.tz)))
    if args.id is not None:
        return ApiRequest("GET", job_path(args.id, "/explain"), query=tuple(extra))
    if args.every is not None:
        query = [("every", str(_duration("--every", args.every)))]
    else:
        if not args.cron.strip():
            raise UsageError("--cron: expected a cron expression like '0 2 * * *'")
        query = [("cron", args.cron)]
        if args.tz is not None:
            query.append(("timezone", args.tz))
    return ApiRequest("GET", "/api/v1/explain", query=tuple(query + extra))


def command_name(args: argparse.Namespace) -> str:
    """``get``, ``dlq replay``, ...: the command a parsed command line runs."""
    if args.command == "dlq":
        return f"dlq {args.dlq_command}"
    if args.command == "snapshot":
        return f"snapshot {args.snapshot_command}"
    if args.command == "node":
        return f"node {args.node_command}"
    return str(args.command)


def _node_request(args: argparse.Namespace) -> ApiRequest:
    """``node list``, ``node add`` and ``node remove``: the membership."""
    if args.node_command == "add":
        body = {"raft": args.raft}
        body.update({k: v for k, v in (("id", args.id), ("http", args.http)) if v})
        return ApiRequest("POST", "/api/v1/cluster/nodes", body=body)
    if args.node_command == "remove":
        path = f"/api/v1/cluster/nodes/{quote(args.node, safe='')}"
        return ApiRequest("DELETE", path, idempotent=False)
    return ApiRequest("GET", "/api/v1/cluster/nodes")


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
        return ApiRequest("GET", "/api/v1/dlq", query=_query(args, *DLQ_FILTERS))
    if cmd in ("dlq replay", "dlq drop"):
        return _dlq_request(args, cmd.split()[1])
    raise UsageError(f"unknown command {cmd!r}")  # pragma: no cover - argparse refuses first


def _query(args: argparse.Namespace, *names: str) -> tuple[tuple[str, str], ...]:
    """The query of a listing: the filters ``names`` that were given, ``since`` (as a time)
    and ``limit``."""
    query = [(name, str(getattr(args, name))) for name in names if getattr(args, name, None)]
    since = getattr(args, "since", None)
    if since is not None:
        query.append(("since", since_time(since, int(time.time() * 1000))))
    if getattr(args, "limit", None) is not None:
        query.append(("limit", str(args.limit)))
    return tuple(query)


def build_request(args: argparse.Namespace, stdin: IO[bytes] | None = None) -> ApiRequest:
    """The first (or only) HTTP request for a parsed command line."""
    cmd = args.command
    if cmd == "submit":
        body = build_submit_body(args, stdin)
        return ApiRequest("POST", "/api/v1/jobs", body=body)  # X-Request-Id makes retries safe
    if cmd == "get":
        return ApiRequest("GET", job_path(args.id))
    if cmd == "list":
        return _list_request(args)
    if cmd == "runs":
        return ApiRequest("GET", job_path(args.id, "/runs"), query=_query(args, "state"))
    if cmd == "run":
        return ApiRequest("GET", run_path(args.run_id))
    if cmd == "wait":
        return ApiRequest("GET", run_path(args.id) if is_run_id(args.id) else job_path(args.id))
    if cmd == "cancel" and is_run_id(args.id):
        return ApiRequest("POST", run_path(args.id, "/cancel"))
    if cmd == "cancel":
        return ApiRequest("DELETE", job_path(args.id))
    if cmd == "cluster":
        return ApiRequest("GET", "/api/v1/cluster")
    if args.command == "node":
        return _node_request(args)
    if cmd == "workers":
        return ApiRequest("GET", "/api/v1/workers")
    if cmd == "ui":
        return ApiRequest("POST", "/api/v1/login/codes", body={"read_only": args.read_only})
    return _job_action_request(args, stdin)
