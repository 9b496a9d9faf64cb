"""schedctl: command lines to requests, rendering, exit codes, and a tiny real HTTP server."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson
import pytest

from schedd.cli import render
from schedd.cli.args import build_parser, parse_args
from schedd.cli.client import (
    MAX_RETRIES,
    Client,
    CliError,
    Unreachable,
    parse_server,
)
from schedd.cli.completion import completion_levels, completion_script
from schedd.cli.render import PLAIN
from schedd.cli.requests import ApiRequest, build_request
from schedd.cli.schedctl import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_SERVER,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    main,
    terminal_style,
    wait,
    watch,
)
from schedd.cli.settings import Settings, resolve_settings
from schedd.client.servers import parse_retry_after, run_path

DEAD = "http://127.0.0.1:1"  # nothing listens on port 1


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SCHEDD_SERVER", raising=False)
    monkeypatch.delenv("SCHEDD_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./.schedd/tokens.toml unless a test writes one


def run(argv: list[str], capsysbinary: pytest.CaptureFixture[bytes]) -> tuple[int, bytes, str]:
    code = main(argv)
    captured = capsysbinary.readouterr()
    return code, captured.out, captured.err.decode()


# ---- command line → request ------------------------------------------------------------------

POST = "POST"
PATCH = "PATCH"
JOBS = "/api/v1/jobs"

REQUESTS: list[tuple[list[str], ApiRequest]] = [
    (["submit", "t"], ApiRequest(POST, JOBS, body={"task": "t"})),
    (
        ["submit", "reports.generate", "--payload", '{"report": "sales"}', "--every", "5m"],
        ApiRequest(
            POST,
            JOBS,
            body={
                "task": "reports.generate",
                "payload": {"report": "sales"},
                "schedule": {"every": "5m"},
            },
        ),
    ),
    (
        ["submit", "t", "--cron", "0 2 * * *", "--tz", "Europe/Berlin", "--priority", "high"],
        ApiRequest(
            POST,
            JOBS,
            body={
                "task": "t",
                "schedule": {"cron": "0 2 * * *", "timezone": "Europe/Berlin"},
                "priority": "high",
            },
        ),
    ),
    (
        ["submit", "t", "--at", "2026-11-25T02:00:00Z", "--queue", "q", "--namespace", "n"],
        ApiRequest(
            POST,
            JOBS,
            body={
                "task": "t",
                "namespace": "n",
                "queue": "q",
                "schedule": {"at": "2026-11-25T02:00:00Z"},
            },
        ),
    ),
    (
        ["submit", "t", "--in", "90s", "--max-attempts", "5", "--timeout", "30m"],
        ApiRequest(
            POST,
            JOBS,
            body={
                "task": "t",
                "schedule": {"in": "90s"},
                "retry": {"max_attempts": 5},
                "timeout": "30m",
            },
        ),
    ),
    (
        [
            "submit",
            "t",
            "--heartbeat-timeout",
            "60s",
            "--depends-on",
            "a",
            "--depends-on",
            "b",
            "--idempotency-key",
            "k-1",
            "--name",
            "nightly",
            "--payload",
            "null",
        ],
        ApiRequest(
            POST,
            JOBS,
            body={
                "task": "t",
                "name": "nightly",
                "payload": None,
                "heartbeat_timeout": "60s",
                "depends_on": ["a", "b"],
                "idempotency_key": "k-1",
            },
        ),
    ),
    (["get", "j/1@2"], ApiRequest("GET", "/api/v1/jobs/j%2F1%402")),
    (["runs", "j1"], ApiRequest("GET", "/api/v1/jobs/j1/runs")),
    (["cancel", "j1"], ApiRequest("DELETE", "/api/v1/jobs/j1")),
    (["list"], ApiRequest("GET", JOBS)),
    (
        ["explain", "--cron", "0 2 * * *", "--tz", "Europe/Berlin", "--from", "2027-03-26"],
        ApiRequest(
            "GET",
            "/api/v1/explain",
            query=(
                ("cron", "0 2 * * *"),
                ("timezone", "Europe/Berlin"),
                ("from", "2027-03-26T00:00:00+01:00"),
            ),
        ),
    ),
    (
        ["list", "--status", "failed"],
        ApiRequest("GET", JOBS, query=(("last_run", "failed"), ("status", "done"))),
    ),
    (
        ["list", "--sort", "next_fire", "--order", "desc", "--task", "t"],
        ApiRequest("GET", JOBS, query=(("task", "t"), ("sort", "next_fire"), ("order", "desc"))),
    ),
    (
        [
            "list",
            "--status",
            "active",
            "--queue",
            "q",
            "--namespace",
            "n",
            "--task",
            "t",
            "--limit",
            "5",
            "--all",
        ],
        ApiRequest(
            "GET",
            JOBS,
            query=(
                ("status", "active"),
                ("queue", "q"),
                ("namespace", "n"),
                ("task", "t"),
                ("limit", "5"),
            ),
        ),
    ),
    (["cluster"], ApiRequest("GET", "/api/v1/cluster")),
    (["workers"], ApiRequest("GET", "/api/v1/workers")),
    (["ui"], ApiRequest("POST", "/api/v1/login/codes", body={"read_only": False})),
    (
        ["ui", "--read-only", "--no-open"],
        ApiRequest("POST", "/api/v1/login/codes", body={"read_only": True}),
    ),
    (
        ["dlq", "list", "--error", "disk full"],
        ApiRequest("GET", "/api/v1/dlq", query=(("error", "disk full"),)),
    ),
    # connection options are accepted after the command too
    (["get", "x", "-o", "json", "--server", DEAD], ApiRequest("GET", "/api/v1/jobs/x")),
    # changing a job
    (["pause", "j/1"], ApiRequest(PATCH, "/api/v1/jobs/j%2F1", body={"paused": True})),
    (["resume", "j1"], ApiRequest(PATCH, "/api/v1/jobs/j1", body={"paused": False})),
    (
        ["trigger", "j1"],
        ApiRequest(POST, "/api/v1/jobs/j1/trigger", body={"overlap": "respect"}),
    ),
    (
        ["trigger", "j1", "--override", "-o", "json"],
        ApiRequest(POST, "/api/v1/jobs/j1/trigger", body={"overlap": "override"}),
    ),
    (
        ["update", "j1", "--cron", "0 3 * * *", "--tz", "Europe/Berlin"],
        ApiRequest(
            PATCH,
            "/api/v1/jobs/j1",
            body={"schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"}},
        ),
    ),
    (
        ["update", "j1", "--every", "10m", "--payload", '{"a": 1}', "--priority", "low"],
        ApiRequest(
            PATCH,
            "/api/v1/jobs/j1",
            body={"schedule": {"every": "10m"}, "payload": {"a": 1}, "priority": "low"},
        ),
    ),
    (
        ["update", "j1", "--max-attempts", "3", "--timeout", "30m"],
        ApiRequest(PATCH, "/api/v1/jobs/j1", body={"retry": {"max_attempts": 3}, "timeout": "30m"}),
    ),
    (
        ["update", "j1", "--at", "2026-11-25T02:00:00Z"],
        ApiRequest(PATCH, "/api/v1/jobs/j1", body={"schedule": {"at": "2026-11-25T02:00:00Z"}}),
    ),
    (
        ["update", "j1", "--in", "0s"],
        ApiRequest(PATCH, "/api/v1/jobs/j1", body={"schedule": {"in": "0s"}}),
    ),
    (
        ["update", "j1", "--payload", "null"],
        ApiRequest(PATCH, "/api/v1/jobs/j1", body={"payload": None}),
    ),
    # explain: a job, or a cron expression
    (["explain", "j1"], ApiRequest("GET", "/api/v1/jobs/j1/explain")),
    (
        ["explain", "j1", "--count", "5"],
        ApiRequest("GET", "/api/v1/jobs/j1/explain", query=(("count", "5"),)),
    ),
    (
        ["explain", "--cron", "30 2 * * *", "--tz", "Europe/Berlin", "--count", "3"],
        ApiRequest(
            "GET",
            "/api/v1/explain",
            query=(("cron", "30 2 * * *"), ("timezone", "Europe/Berlin"), ("count", "3")),
        ),
    ),
    (
        ["explain", "--cron", "*/5 * * * *"],
        ApiRequest("GET", "/api/v1/explain", query=(("cron", "*/5 * * * *"),)),
    ),
    # the dead-letter queue: run ids hold an '@'
    (["dlq", "list"], ApiRequest("GET", "/api/v1/dlq")),
    (["dlq", "list", "-o", "json"], ApiRequest("GET", "/api/v1/dlq")),
    (
        ["dlq", "replay", "J1@1795645921727"],
        ApiRequest(POST, "/api/v1/dlq/J1%401795645921727/replay"),
    ),
    (["dlq", "drop", "J1@1795645921727"], ApiRequest("DELETE", "/api/v1/dlq/J1%401795645921727")),
    # watch's first request (it then polls the job and its runs)
    (["watch", "j1", "--interval", "0.5"], ApiRequest("GET", "/api/v1/jobs/j1/runs")),
]


@pytest.mark.parametrize(("argv", "expected"), REQUESTS, ids=[" ".join(a) for a, _ in REQUESTS])
def test_command_line_builds_request(argv: list[str], expected: ApiRequest) -> None:
    assert build_request(parse_args(argv)) == expected


def test_payload_from_file_and_stdin(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_bytes(b'{"rows": [1, 2]}')
    req = build_request(parse_args(["submit", "t", "--payload", "@p.json"]))
    assert req.body == {"task": "t", "payload": {"rows": [1, 2]}}
    req = build_request(parse_args(["submit", "t", "--payload", "@-"]), stdin=io.BytesIO(b"[3]"))
    assert req.body == {"task": "t", "payload": [3]}


USAGE_ERRORS: list[tuple[list[str], str]] = [
    (["submit", "t", "--every", "5x"], '--every: expected a duration like "90s"'),
    (["submit", "t", "--timeout", "soon"], "--timeout: expected a duration"),
    (["submit", "t", "--heartbeat-timeout", "0"], "--heartbeat-timeout: expected a positive"),
    (["submit", "t", "--payload", "{nope"], "--payload: expected JSON"),
    (["submit", "t", "--payload", "@missing.json"], "--payload: cannot read 'missing.json'"),
    (["submit", "t", "--at", "tomorrow"], "--at: expected an RFC 3339 time"),
    (["submit", "t", "--tz", "UTC"], "--tz: only applies to --cron"),
    (["submit", "t", "--at", "2026-01-01T00:00:00Z", "--every", "1m"], "not allowed with"),
    (["submit", "t", "--max-attempts", "0"], "expected a number of at least 1"),
    (["submit", "t", "--priority", "urgent"], "invalid choice"),
    (["submit"], "required: TASK"),
    (["frobnicate"], "invalid choice"),
    ([], "required: COMMAND"),
    (["--timeout", "0", "cluster"], "expected a positive number of seconds"),
    (["--server", "ftp://x", "cluster"], "--server: expected a URL like http://"),
    (["--token", "a", "--token-file", "b", "cluster"], "not allowed with"),
    (["--token-file", "nope.txt", "cluster"], "--token-file: cannot read 'nope.txt'"),
    (["update", "j1"], "update: nothing to change; pass at least one of --payload"),
    (["update", "j1", "-o", "json"], "update: nothing to change"),
    (["update", "j1", "--tz", "UTC", "--in", "5m"], "--tz: only apply to an --every or --cron"),
    (["update", "j1", "--overlap", "allow", "--at", "2030-01-01T00:00:00Z"], "--overlap: only"),
    (["submit", "t", "--overlap", "allow"], "--overlap: only apply to an --every or --cron"),
    (["submit", "t", "--every", "5m", "--tz", "UTC"], "--tz: only applies to --cron"),
    (["submit", "t", "--every", "5m", "--jitter", "soon"], "--jitter: expected a duration"),
    (["submit", "t", "--cron", "* * * * *", "--start-at", "monday"], "--start-at: expected"),
    (["submit", "t", "--retry-multiplier", "11"], "expected a number from 1 to 10"),
    (["submit", "t", "--wait", "--wait-timeout", "x"], "--wait-timeout: expected a duration"),
    (["wait", "j1", "--timeout", "-1s"], "--timeout: expected"),
    (["runs", "j1", "--since", "yesterday"], "--since: expected an RFC 3339 time"),
    (["list", "--state", "exploded"], "argument --state: invalid choice"),
    (["list", "--status", "failed", "--state", "running"], "--status failed means --state"),
    (["submit", "t", "--in", "-5m"], "--in: expected a positive duration"),
    (["explain", "--every", "5m", "--cron", "* * * * *"], "give one of a job ID, --cron EXPR"),
    (["explain", "--every", "5m", "--from", "noon"], "--from: expected"),
    (["update", "j1", "--every", "5x"], '--every: expected a duration like "90s"'),
    (["update", "j1", "--timeout", "soon"], "--timeout: expected a duration"),
    (["update", "j1", "--max-attempts", "0"], "expected a number of at least 1"),
    (["update", "j1", "--queue", "q"], "update: --queue cannot be changed on an existing job"),
    (["update", "j1", "--heartbeat-timeout", "5s"], "--heartbeat-timeout cannot be changed"),
    (["update"], "required: ID"),
    (["pause"], "required: ID"),
    (["trigger", "j1", "--overlap", "skip"], "unrecognized arguments"),
    (["explain"], "explain: expected a job ID, --cron EXPR [--tz ZONE] or --every DUR"),
    (["explain", "--count", "3"], "explain: expected a job ID, --cron EXPR"),
    (
        ["explain", "j1", "--cron", "* * * * *"],
        "explain: give one of a job ID, --cron EXPR or --every DUR, not a job ID and --cron",
    ),
    (["explain", "j1", "--tz", "UTC"], "--tz: only applies to --cron"),
    (["explain", "--cron", " "], "--cron: expected a cron expression"),
    (["explain", "j1", "--count", "0"], "--count: expected a number of at least 1, got 0"),
    (["explain", "j1", "--count", "-2"], "--count: expected a number of at least 1"),
    (["explain", "j1", "--count", "many"], "--count: expected a whole number, got 'many'"),
    (["dlq"], "required: DLQ_COMMAND"),
    (["dlq", "replay"], "dlq replay: name the runs (RUN_ID ...), or pick them"),
    (["dlq", "purge"], "invalid choice"),
    (["watch", "j1", "--interval", "0"], "expected a positive number of seconds"),
    (["watch"], "required: ID"),
    (["completion", "fish"], "invalid choice: 'fish'"),
]


@pytest.mark.parametrize(
    ("argv", "message"), USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS]
)
def test_usage_errors_exit_2_and_say_what_is_expected(
    argv: list[str], message: str, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    code, out, err = run(["--server", DEAD, *argv], capsysbinary)
    assert code == EXIT_USAGE
    assert out == b""
    assert err.startswith("schedctl: ")
    assert message in err
    assert "Traceback" not in err


def test_help_exits_0(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    code, out, _ = run(["--help"], capsysbinary)
    assert code == EXIT_OK
    assert b"submit" in out and b"exit codes" in out


# ---- settings --------------------------------------------------------------------------------


def test_servers_from_flags_override_environment() -> None:
    env = {"SCHEDD_SERVER": "http://10.0.0.1:7700,10.0.0.2:7710"}
    settings = resolve_settings(parse_args(["cluster"]), env)
    assert [s.url for s in settings.servers] == ["http://10.0.0.1:7700", "http://10.0.0.2:7710"]
    args = parse_args(["--server", "https://a.example", "cluster", "--server", "b:1,c:2"])
    settings = resolve_settings(args, env)
    assert [s.url for s in settings.servers] == [
        "https://a.example:443",
        "http://b:1",
        "http://c:2",
    ]
    assert [s.url for s in resolve_settings(parse_args(["cluster"]), {}).servers] == [
        "http://127.0.0.1:7700"
    ]
    assert parse_server("[::1]:7700").url == "http://[::1]:7700"


TOKENS_TOML = """
[[token]]
name = "w"
secret = "worker-secret"
role = "worker"

[[token]]
name = "admin"
secret = "admin-secret"
role = "admin"
"""


def test_token_precedence_and_embedded_default(tmp_path: Path) -> None:
    (tmp_path / ".schedd").mkdir()
    (tmp_path / ".schedd" / "tokens.toml").write_text(TOKENS_TOML)
    (tmp_path / "plain").write_text("  plain-secret\n")
    # the embedded default's admin token, only for servers on this machine
    assert resolve_settings(parse_args(["cluster"]), {}).token == "admin-secret"
    remote = parse_args(["--server", "http://10.0.0.1:7700", "cluster"])
    assert resolve_settings(remote, {}).token is None
    assert resolve_settings(parse_args(["cluster"]), {"SCHEDD_TOKEN": "env"}).token == "env"
    args = parse_args(["--token-file", "plain", "cluster"])
    assert resolve_settings(args, {"SCHEDD_TOKEN": "env"}).token == "plain-secret"
    args = parse_args(["--token-file", ".schedd/tokens.toml", "cluster"])
    assert resolve_settings(args, {}).token == "admin-secret"
    args = parse_args(["--token", "flag", "cluster", "--token", "after"])
    assert resolve_settings(args, {"SCHEDD_TOKEN": "env"}).token == "after"


def test_retry_after_parsing() -> None:
    assert parse_retry_after("0") == 0.0
    assert parse_retry_after(" 2 ") == 2.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    at = parse_retry_after("Wed, 25 Nov 2026 02:00:10 GMT", now=1795572000.0)
    assert at == pytest.approx(10.0)


# ---- rendering -------------------------------------------------------------------------------

LONG = "x" * 300
JOB: dict[str, Any] = {
    "id": "job-" + LONG,
    "task": "reports." + LONG,
    "name": None,
    "namespace": "default",
    "queue": "default",
    "payload": {"blob": LONG},
    "schedule": {"cron": "0 2 * * *", "timezone": "Europe/Berlin"},
    "priority": "high",
    "retry": {"max_attempts": 5},
    "timeout": "30m",
    "heartbeat_timeout": "60s",
    "depends_on": ["a" * 100, "b"],
    "idempotency_key": None,
    "status": "active",
    "created_at": "2026-11-25T01:00:00.000Z",
    "updated_at": "2026-11-25T01:00:00.000+01:00",
    "next_run_at": "2026-11-25T02:00:00.000Z",
    "latest_run": None,
}
RUN: dict[str, Any] = {
    "id": "job-" + LONG + "@1795658400000",
    "job_id": "job-" + LONG,
    "state": "failed",
    "scheduled_at": "2026-11-25T02:00:00.000Z",
    "attempts": [
        {"attempt": 1, "fence": 17, "ended_at": "2026-11-25T02:00:05.000Z", "error": "boom"},
        {"attempt": 2, "fence": 42, "ended_at": "2026-11-25T02:01:05.000Z", "error": "boom"},
    ],
    "error": "Traceback-free message\n" + LONG,
    "reason": None,
}


def _lines(text: str) -> list[str]:
    assert text
    return text.splitlines()


@pytest.mark.parametrize(
    "text",
    [
        render.jobs_table([JOB, {**JOB, "name": "日本語" * 40, "schedule": {"every": "5m"}}]),
        render.submitted_table(JOB),
        render.job_details({**JOB, "latest_run": RUN}),
        render.runs_table([RUN, {**RUN, "attempts": [], "error": None, "state": "queued"}]),
        render.cluster_view(
            {
                "node_id": "n1",
                "leader": "n2",
                "leader_url": "http://" + LONG,
                "term": 3,
                "nodes": [
                    {
                        "id": "n1",
                        "raft": "10.0.0.1:7701",
                        "http": "http://" + LONG,
                        "role": "follower",
                        "healthy": True,
                        "lag": 0,
                        "extra1": LONG,
                        "extra2": 1,
                        "extra3": 2,
                        "extra4": 3,
                        "extra5": 4,
                        "extra6": 5,
                        "extra7": 6,
                        "extra8": 7,
                        "extra9": 8,
                        "extra10": 9,
                        "extra11": 10,
                        "extra12": 11,
                        "extra13": 12,
                        "extra14": 13,
                        "extra15": 14,
                    },
                ],
            }
        ),
        render.workers_table(
            [
                {
                    "worker_id": LONG,
                    "queues": ["q" * 50, "r"],
                    "capacity": 8,
                    "leases": [1, 2],
                    "connected_at": "2026-11-25T01:00:00Z",
                }
            ]
        ),
    ],
)
def test_rendering_fits_80_columns(text: str) -> None:
    for line in _lines(text):
        assert render.display_width(line) <= 80, line
    assert "\x1b" not in text and "\n\n\n" not in text
    if "payload:" in text:  # a detail view wraps its values: nothing is cut
        assert "…" not in text
        assert LONG in "".join(line.strip() for line in _lines(text))
    else:  # a table's columns give up room
        assert "…" in text


def unwrapped(lines: list[str]) -> str:
    """Wrapped lines put back together (each without its indent, joined by a space)."""
    return " ".join(line.strip() for line in lines)


def test_table_details() -> None:
    run = {**RUN, "id": "01M8ADCPDZ145C4FJCBYS11A0G@1795645921727"}
    header, row, note, *error = _lines(render.runs_table([run]))
    assert header.split() == ["RUN", "STATE", "ATTEMPTS", "FENCE"]
    assert row.split() == [run["id"], "failed", "2", "42"]  # the id is never cut; last fence
    assert note == "  scheduled 2026-11-25 02:00:00Z  ended 2026-11-25 02:01:05Z"
    # the error has lines of its own, wrapped to the width, never cut
    assert all(line.startswith("    ") and len(line) <= 80 for line in error)
    assert unwrapped(error).replace(" ", "") == "Traceback-freemessage" + LONG
    # not a terminal: nothing is cut, one line each
    wide = _lines(render.runs_table([run], render.Style(render.UNLIMITED)))
    assert wide[3] == "    Traceback-free message " + LONG
    # ids are kept whole; the task column gives up its room; times are relative to now
    five_hours_before = datetime(2026, 11, 24, 21, 0, tzinfo=UTC).timestamp() * 1000
    now = render.Style(now_ms=int(five_hours_before))  # the next run is at 2026-11-25 02:00Z
    failed = {**RUN, "updated_at": "2026-11-24T20:48:00Z"}
    jobs = render.jobs_table([{**JOB, "id": ULID, "latest_run": failed}], now)
    header, row = _lines(jobs)
    assert header.startswith("ID  ") and header.endswith("NEXT RUN  LAST RUN")
    assert row.startswith(ULID) and row.split()[-5:] == ["in", "5h", "failed", "12m", "ago"]
    assert max(len(line) for line in _lines(jobs)) <= 80
    # wide: every column, nothing cut, the next run in the job's zone too
    wide = render.jobs_table([{**JOB, "id": ULID}], render.Style(render.UNLIMITED, wide=True))
    assert "reports." + LONG in wide and "2026-11-25 03:00:00+01:00 Europe/Berlin" in wide
    short = render.table(["A", "B"], [["1", "two"]])
    assert short == "A  B\n1  two"
    assert render.fmt_time("2026-11-25T03:00:00+01:00") == "2026-11-25 02:00:00Z"
    assert render.fmt_time(None) == "-"
    assert render.clean("a\x1b[31mb\nc\u202e") == "a\\x1b[31mb c\\u202e"
    assert render.truncate("日本語", 4) == "日…"
    job = render.job_details(JOB)
    assert "schedule:" in job and "cron 0 2 * * * (Europe/Berlin)" in job


ULID = "01M8ADCPDZ145C4FJCBYS11A0G"
RUN_ID = ULID + "@1795645921727"
GAP_NOTE = (
    "02:30 does not exist on 2026-03-29 in Europe/Berlin (clocks go from 02:00 to 03:00): "
    "runs at 03:00 (+02:00) instead"
)
FIRES: list[dict[str, Any]] = [
    {
        "scheduled_at": "2026-03-28T01:30:00.000Z",
        "due_at": "2026-03-28T01:30:00.000Z",
        "local": "2026-03-28T02:30:00+01:00",
        "note": None,
    },
    {
        "scheduled_at": "2026-03-29T01:00:00.000Z",
        "due_at": "2026-03-29T01:00:00.000Z",
        "local": "2026-03-29T03:00:00+02:00",
        "note": GAP_NOTE,
    },
]


def _fits(text: str, width: int = 80) -> None:
    for line in _lines(text):
        assert render.display_width(line) <= width, line
    assert "\x1b" not in text


def test_fires_table_puts_long_notes_under_their_fire_whole() -> None:
    text = render.fires_table(FIRES)
    _fits(text)
    lines = _lines(text)
    assert lines[0].split() == ["SCHEDULED", "(UTC)", "LOCAL"]
    assert lines[1] == "2026-03-28 01:30:00Z  2026-03-28 02:30:00+01:00"
    assert lines[2] == "2026-03-29 01:00:00Z  2026-03-29 03:00:00+02:00"
    assert all(line.startswith("    ") for line in lines[3:])
    assert " ".join(line.strip() for line in lines[3:]) == GAP_NOTE  # wrapped, nothing cut
    # short notes share the line
    short = render.fires_table([{**FIRES[1], "note": "shifted +1h (DST gap)"}])
    assert _lines(short) == [
        "SCHEDULED (UTC)       LOCAL                      NOTE",
        "2026-03-29 01:00:00Z  2026-03-29 03:00:00+02:00  shifted +1h (DST gap)",
    ]
    assert _lines(render.fires_table([FIRES[0]])) == [  # no notes: no NOTE column
        "SCHEDULED (UTC)       LOCAL",
        "2026-03-28 01:30:00Z  2026-03-28 02:30:00+01:00",
    ]
    assert render.fmt_local("2026-03-29T03:00:00.000+02:00") == "2026-03-29 03:00:00+02:00"
    assert render.fmt_local(None) == "-"
    assert render.fmt_local("soon\x1b") == "soon\\x1b"


def test_dlq_table_keeps_run_ids_whole_and_errors_on_their_own_line() -> None:
    dead = {**RUN, "id": RUN_ID, "job_id": ULID}
    header, row, note, *error = _lines(render.dlq_table([dead]))
    assert header.split() == ["RUN", "NAME", "·", "TASK", "ATTEMPTS"]
    assert row.split() == [RUN_ID, ULID, "2"]  # a view without names: the job id
    assert note == "  ended 2026-11-25 02:01:05Z"
    assert unwrapped(error).replace(" ", "") == "Traceback-freemessage" + LONG
    wide_cjk = render.dlq_table([{**dead, "error": "日本語" * 60}], render.Style(40))
    assert all(render.display_width(line) <= 40 for line in _lines(wide_cjk)), wide_cjk
    assert "".join(line.strip() for line in _lines(wide_cjk)[3:]) == "日本語" * 60


@pytest.mark.parametrize(
    "text",
    [
        render.fires_table([*FIRES, {**FIRES[0], "note": LONG, "local": "x" * 100}]),
        render.fires_table([{"scheduled_at": None, "local": None, "note": "日本語" * 60}]),
        render.dlq_table([RUN, {**RUN, "attempts": [], "error": None}]),
        render.runs_table([{**RUN, "state": "queued"}]),  # what trigger and dlq replay print
        "\n".join(render.watch_lines(None, [RUN, {**RUN, "id": RUN_ID, "error": "x\x1b[2J"}])),
    ],
)
def test_new_renders_fit_80_columns(text: str) -> None:
    _fits(text)


# ---- watch: what changed between two polls ---------------------------------------------------


def _run(
    rid: str, state: str, *attempts: tuple[int, int], error: str | None = None
) -> dict[str, Any]:
    return {
        "id": f"{ULID}@{rid}",
        "job_id": ULID,
        "state": state,
        "updated_at": "2026-11-25T02:00:05.120Z",
        "attempts": [{"attempt": a, "fence": f, "error": None} for a, f in attempts],
        "error": error,
        "reason": None,
    }


OLD_DONE = _run("1000", "succeeded", (1, 3))
OLDER_DONE = _run("0999", "succeeded", (1, 2))
QUEUED = _run("2000", "queued")
RUNNING = _run("2000", "running", (1, 7))
RETRYING = _run("2000", "retrying", (1, 7), error="boom")
RUNNING_AGAIN = _run("2000", "running", (1, 7), (2, 9))
NEXT = _run("3000", "scheduled")

# (previous poll, this poll, what is printed): lists newest first, as the API gives them
WATCH: list[tuple[str, list[dict[str, Any]] | None, list[dict[str, Any]], list[str]]] = [
    ("first poll: nothing yet", None, [], []),
    (
        "first poll: unfinished runs and the newest, oldest first",
        None,
        [RUNNING, OLD_DONE, OLDER_DONE],
        [
            f"02:00:05 {ULID}@2000 running   attempt 1 fence 7",
        ],
    ),
    (
        "first poll: only finished runs shows the newest",
        None,
        [OLD_DONE, OLDER_DONE],
        [f"02:00:05 {ULID}@1000 succeeded attempt 1 fence 3"],
    ),
    (
        "first poll: queued behind a finished one",
        None,
        [NEXT, OLD_DONE, QUEUED],
        [f"02:00:05 {ULID}@2000 queued", f"02:00:05 {ULID}@3000 scheduled"],
    ),
    ("nothing changed", [RUNNING, OLD_DONE], [RUNNING, OLD_DONE], []),
    (
        "state change",
        [QUEUED, OLD_DONE],
        [RUNNING, OLD_DONE],
        [f"02:00:05 {ULID}@2000 running   attempt 1 fence 7"],
    ),
    (
        "a failed attempt shows its error",
        [RUNNING],
        [RETRYING],
        [f"02:00:05 {ULID}@2000 retrying  attempt 1 fence 7\n         error: boom"],
    ),
    (
        "queued for the retry: the same error is not repeated",
        [RETRYING],
        [{**RETRYING, "state": "queued"}],
        [f"02:00:05 {ULID}@2000 queued    attempt 1 fence 7"],
    ),
    (
        "a new error is shown",
        [RETRYING],
        [{**RETRYING, "error": "boom again"}],
        [f"02:00:05 {ULID}@2000 retrying  attempt 1 fence 7\n         error: boom again"],
    ),
    (
        "a retry between two polls: same state, new attempt and fence",
        [RUNNING],
        [RUNNING_AGAIN],
        [f"02:00:05 {ULID}@2000 running   attempt 2 fence 9"],
    ),
    (
        "a new run, and the old one finishing, oldest first",
        [RUNNING],
        [NEXT, {**RUNNING, "state": "succeeded"}],
        [
            f"02:00:05 {ULID}@2000 succeeded attempt 1 fence 7",
            f"02:00:05 {ULID}@3000 scheduled",
        ],
    ),
    ("a run no longer listed is not reported", [NEXT, RUNNING], [NEXT], []),
    (
        "progress alone (updated_at) is not a change",
        [RUNNING],
        [{**RUNNING, "updated_at": "2026-11-25T02:09:00Z"}],
        [],
    ),
]


@pytest.mark.parametrize(
    ("previous", "current", "expected"), [w[1:] for w in WATCH], ids=[w[0] for w in WATCH]
)
def test_watch_prints_a_line_per_change(
    previous: list[dict[str, Any]] | None, current: list[dict[str, Any]], expected: list[str]
) -> None:
    assert render.watch_lines(previous, current) == expected
    json_lines = render.watch_lines(previous, current, "json")
    assert [orjson.loads(line)["id"] for line in json_lines] == [
        line.split()[1] for line in expected
    ]
    assert all("\n" not in line for line in json_lines)


def test_watch_line_without_times_or_attempts() -> None:
    line = render.watch_line({"id": "r", "state": "cancelled", "reason": "cancelled by user"})
    assert line == "--:--:-- r cancelled\n         error: cancelled by user"


# ---- shell completion ------------------------------------------------------------------------

COMMANDS = [
    "submit", "get", "list", "runs", "run", "wait", "cancel", "pause", "resume", "trigger",
    "update", "explain", "dlq", "cluster", "ready", "node", "workers", "ui", "watch", "apply",
    "snapshot", "completion",
]  # fmt: skip


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_script_mentions_every_command_and_option(
    shell: str, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    code, out, err = run(["completion", shell], capsysbinary)
    assert (code, err) == (EXIT_OK, "")
    script = out.decode()
    assert script.strip() and "schedctl" in script
    levels = completion_levels(build_parser())
    assert sorted(w for w, _ in levels[""].words) == sorted(COMMANDS)
    assert sorted(w for w, _ in levels["dlq"].words) == ["drop", "list", "replay"]
    assert sorted(w for w, _ in levels["snapshot"].words) == ["inspect", "save"]
    assert sorted(w for w, _ in levels["node"].words) == ["add", "list", "remove"]
    for command in COMMANDS:
        assert f"'{command}')" in script, command  # a case for what follows it
    for path in ("dlq list", "dlq replay", "dlq drop", "snapshot save", "snapshot inspect"):
        assert f"'{path}')" in script
    for option in ("--override", "--count", "--interval", "--max-attempts", "--token-file"):
        assert option in script
    assert "'table wide json'" in script and "'high normal low'" in script
    assert "__jobs" not in script.split("_schedctl_choices")[0]  # internal: not a command
    assert completion_script(build_parser(), shell) + "\n" == script
    checker = shutil.which(shell)
    if checker:  # the script parses
        subprocess.run([checker, "-n"], input=out, check=True)


BASH_CASES = [
    ("", "submit get runs cancel pause resume run wait list trigger update explain dlq cluster "
     "ready node workers ui watch apply snapshot completion"),
    ("node ", "list add remove"),
    ("dl", "dlq"),
    ("--server http://x:7700 dlq ", "list replay drop"),
    ("dlq replay R --o", "--output"),
    ("-o ", "table wide json"),
    ("update j1 --priority ", "high normal low"),
    ("explain --c", "--cron --count"),
    ("watch j1 --", "--help --server --token --token-file --output --quiet --interval"),
    ("completion ", "bash zsh"),
    ("snapshot ", "save inspect"),
    ("snapshot save b.snap --f", "--force"),
    ("get j1 ", ""),
    # a job is completed from the cluster's job names and ids (schedctl __jobs, stubbed here)
    ("get ", "nightly-report 01M8ADCPDZ145C4FJCBYS11A0G"),
    ("pause ni", "nightly-report"),
    ("run 01", "01M8ADCPDZ145C4FJCBYS11A0G"),
    ("--server http://x:7700 dlq replay ", "nightly-report 01M8ADCPDZ145C4FJCBYS11A0G"),
    ("list ", ""),
]  # fmt: skip
#: stands for `schedctl __jobs PREFIX`: what the cluster's live jobs are
JOBS_STUB = """schedctl() {
    [[ $1 == __jobs ]] && printf 'nightly-report\\n01M8ADCPDZ145C4FJCBYS11A0G\\n'
}
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(("line", "expected"), BASH_CASES, ids=[c[0] for c in BASH_CASES])
def test_bash_completion_completes(line: str, expected: str) -> None:
    script = completion_script(build_parser(), "bash")
    words = ["schedctl", *line.split(" ")]
    probe = (
        f"{script}\n{JOBS_STUB}COMP_WORDS=({' '.join(repr(w) for w in words)})\n"
        f'COMP_CWORD={len(words) - 1}\n_schedctl\necho "${{COMPREPLY[*]}}"\n'
    )
    done = subprocess.run(["bash"], input=probe, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == expected


# ---- exit codes against real sockets ---------------------------------------------------------


def test_unreachable_server_exits_4(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    code, out, err = run(["--server", DEAD, "get", "x"], capsysbinary)
    assert code == EXIT_UNAVAILABLE
    assert out == b""
    assert "cannot reach http://127.0.0.1:1 (connection refused)" in err
    assert "is schedd running?" in err and "--server" in err


@dataclass
class Canned:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class FakeServer:
    url: str
    routes: dict[tuple[str, str], Canned]
    seen: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)

    def hits(self, method: str, path: str) -> int:
        return sum(1 for m, p, _, _ in self.seen if (m, p) == (method, path))


@pytest.fixture
def server() -> Iterator[FakeServer]:
    routes: dict[tuple[str, str], Canned] = {}
    seen: list[tuple[str, str, dict[str, str], bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            seen.append((self.command, self.path, dict(self.headers.items()), body))
            canned = routes.get((self.command, self.path)) or Canned(
                404, b'{"error": {"code": "not_found", "message": "no job \'nope\'"}}'
            )
            if canned.delay:
                time.sleep(canned.delay)
            self.send_response(canned.status)
            for name, value in canned.headers.items():
                self.send_header(name, value)
            if canned.status != 204:
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(canned.body)))
            self.end_headers()
            if canned.status != 204:
                self.wfile.write(canned.body)

        do_GET = do_POST = do_DELETE = do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # the client gave up (the timeout test): nothing to report

    httpd = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield FakeServer(f"http://127.0.0.1:{httpd.server_address[1]}", routes, seen)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


# deliberately odd spacing, key order and number formatting: re-serialising would change them
JOB_BYTES = (
    b'{"id": "X",  "task":"t", "status":"active", "priority": 1.50, "schedule": null,'
    b' "next_run_at": "2026-11-25T02:00:00.000Z", "zzz": "\\u00e9"}'
)


def test_json_output_is_the_response_body_exactly(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    server.routes[("GET", "/api/v1/jobs/X")] = Canned(200, JOB_BYTES)
    code, out, err = run(["--server", server.url, "-o", "json", "get", "X"], capsysbinary)
    assert (code, err) == (EXIT_OK, "")
    assert out == JOB_BYTES + b"\n"
    # the same, with the options after the command, and failing over from a dead server
    code, out, _ = run(
        ["get", "X", "--server", DEAD, "--server", server.url, "-o", "json"], capsysbinary
    )
    assert (code, out) == (EXIT_OK, JOB_BYTES + b"\n")
    code, out, _ = run(["--server", server.url, "get", "X"], capsysbinary)
    assert code == EXIT_OK
    assert b"2026-11-25 02:00:00Z" in out and b"active" in out


def test_not_found_exits_3(server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    code, out, err = run(["--server", server.url, "-o", "json", "get", "nope"], capsysbinary)
    assert code == EXIT_NOT_FOUND
    assert out == b""
    assert err == f"schedctl: {server.url}: not_found: no job 'nope'\n"


def test_persistent_503_exits_4_after_bounded_retries(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    body = b'{"error": {"code": "unavailable", "message": "no leader yet"}}'
    server.routes[("GET", "/api/v1/cluster")] = Canned(503, body, {"Retry-After": "0"})
    started = time.monotonic()
    code, out, err = run(["--server", server.url, "cluster"], capsysbinary)
    assert code == EXIT_UNAVAILABLE
    assert time.monotonic() - started < 10
    assert server.hits("GET", "/api/v1/cluster") == MAX_RETRIES + 1
    assert out == b""
    assert f"{server.url}: unavailable: no leader yet" in err
    assert "schedctl cluster" in err


def test_submit_sends_the_body_and_token(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    created = b'{"id":"J1","status":"active","next_run_at":null,"task":"t"}'
    server.routes[("POST", "/api/v1/jobs")] = Canned(201, created)
    argv = ["--server", server.url, "--token", "s3cret", "submit", "t", "--in", "5m"]
    code, out, _ = run(argv, capsysbinary)
    assert code == EXIT_OK
    assert _lines(out.decode()) == ["ID  STATUS  NEXT RUN", "J1  active  -"]
    method, path, headers, body = server.seen[-1]
    assert (method, path) == ("POST", "/api/v1/jobs")
    assert orjson.loads(body) == {"task": "t", "schedule": {"in": "5m"}}
    assert headers["Authorization"] == "Bearer s3cret"
    assert headers["Content-Type"] == "application/json"


def test_server_errors_exit_2_for_bad_input_1_otherwise_with_field_and_hint(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    bad = b'{"error": {"code": "invalid_argument", "message": "expected 5 fields", "field": "schedule.cron"}}'
    server.routes[("POST", "/api/v1/jobs")] = Canned(400, bad)
    server.routes[("GET", "/api/v1/workers")] = Canned(
        401, b'{"error": {"code": "unauthenticated", "message": "a bearer token is required"}}'
    )
    code, _, err = run(["--server", server.url, "submit", "t", "--cron", "x"], capsysbinary)
    assert code == EXIT_USAGE  # the server found the input wrong, as schedctl would have
    assert err == f"schedctl: {server.url}: invalid_argument: schedule.cron: expected 5 fields\n"
    code, _, err = run(["--server", server.url, "workers"], capsysbinary)
    assert code == EXIT_SERVER
    assert "unauthenticated" in err and "SCHEDD_TOKEN" in err


def test_list_all_follows_cursors_and_cancel_prints_nothing_in_json(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    page1 = b'{"jobs": [{"id": "A", "task": "t", "status": "active"}], "next_cursor": "c1"}'
    page2 = b'{"jobs": [{"id": "B", "task": "t", "status": "done"}], "next_cursor": null}'
    server.routes[("GET", "/api/v1/jobs?limit=1")] = Canned(200, page1)
    server.routes[("GET", "/api/v1/jobs?limit=1&cursor=c1")] = Canned(200, page2)
    server.routes[("DELETE", "/api/v1/jobs/A")] = Canned(204)
    code, out, _ = run(["--server", server.url, "list", "--limit", "1", "--all"], capsysbinary)
    assert code == EXIT_OK
    rows = _lines(out.decode())
    assert rows[0].split()[:3] == ["ID", "NAME/TASK", "STATUS"]
    assert [r.split()[0] for r in rows[1:]] == ["A", "B"]
    argv = ["--server", server.url, "-o", "json", "list", "--limit", "1", "--all"]
    code, out, _ = run(argv, capsysbinary)
    assert (code, out) == (EXIT_OK, page1 + b"\n" + page2 + b"\n")
    code, out, err = run(["--server", server.url, "-o", "json", "cancel", "A"], capsysbinary)
    assert (code, out, err) == (EXIT_OK, b"", "")


def test_runs_and_dlq_list_page_like_list(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    first = orjson.dumps({"runs": [_run("2", "failed")], "next_cursor": "2"})
    last = orjson.dumps({"runs": [_run("1", "failed")], "next_cursor": None})
    for path in ("/api/v1/jobs/J1/runs", "/api/v1/dlq"):
        server.routes[("GET", f"{path}?limit=1")] = Canned(200, first)
        server.routes[("GET", f"{path}?limit=1&cursor=2")] = Canned(200, last)
    # one page, and a word that there are more
    code, out, err = run(["--server", server.url, "runs", "J1", "--limit", "1"], capsysbinary)
    assert code == EXIT_OK and f"{ULID}@2" in out.decode() and f"{ULID}@1" not in out.decode()
    assert err == "schedctl: there are more runs; pass --all to list every page\n"
    # every page
    argv = ["--server", server.url, "dlq", "list", "--limit", "1", "--all"]
    code, out, err = run(argv, capsysbinary)
    assert code == EXIT_OK and err == ""
    text = out.decode()
    assert f"{ULID}@2" in text and f"{ULID}@1" in text
    assert text.index(f"{ULID}@2") < text.index(f"{ULID}@1")


def test_unsafe_post_is_not_repeated_after_a_timeout(server: FakeServer) -> None:
    server.routes[("POST", "/api/v1/jobs")] = Canned(201, b"{}", delay=0.6)
    other = parse_server(server.url)
    client = Client([parse_server(server.url), other], timeout=0.2)
    with pytest.raises(Unreachable, match="may or may not have been applied"):
        client.request("POST", "/api/v1/jobs", body=b'{"task": "t"}', idempotent=False)
    assert server.hits("POST", "/api/v1/jobs") == 1


# ---- the job and dead-letter commands against a real socket ----------------------------------

JOB_J1 = b'{"id":"J1","task":"t","status":"paused","next_run_at":null,"schedule":{"every":60}}'
RUN_J1 = orjson.dumps(_run("1795645921727", "queued"))


def test_pause_update_and_trigger(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    server.routes[("PATCH", "/api/v1/jobs/J1")] = Canned(200, JOB_J1)
    server.routes[("GET", "/api/v1/jobs/J1")] = Canned(200, JOB_J1)  # update reads it first
    code, out, _ = run(["--server", server.url, "pause", "J1"], capsysbinary)
    assert code == EXIT_OK
    assert _lines(out.decode()) == ["ID  STATUS  NEXT RUN", "J1  paused  -"]
    assert orjson.loads(server.seen[-1][3]) == {"paused": True}
    assert server.seen[-1][2]["Content-Type"] == "application/json"
    code, out, _ = run(["--server", server.url, "-o", "json", "resume", "J1"], capsysbinary)
    assert (code, out) == (EXIT_OK, JOB_J1 + b"\n")
    assert orjson.loads(server.seen[-1][3]) == {"paused": False}
    argv = ["--server", server.url, "update", "J1", "--every", "1m", "--max-attempts", "2"]
    code, out, _ = run(argv, capsysbinary)
    assert code == EXIT_OK
    assert "schedule:" in out.decode() and "every 1m" in out.decode()
    assert orjson.loads(server.seen[-1][3]) == {
        "schedule": {"every": "1m"},
        "retry": {"max_attempts": 2},
    }

    conflict = b'{"error": {"code": "conflict", "message": "a run of this job is running"}}'
    server.routes[("POST", "/api/v1/jobs/J1/trigger")] = Canned(409, conflict)
    code, out, err = run(["--server", server.url, "trigger", "J1"], capsysbinary)
    assert (code, out) == (EXIT_SERVER, b"")
    assert "conflict: a run of this job is running" in err and "--override" in err
    server.routes[("POST", "/api/v1/jobs/J1/trigger")] = Canned(201, RUN_J1)
    code, out, _ = run(["--server", server.url, "trigger", "J1", "--override"], capsysbinary)
    assert code == EXIT_OK
    assert out.decode().splitlines()[1].split() == [f"{ULID}@1795645921727", "queued", "0", "-"]
    assert orjson.loads(server.seen[-1][3]) == {"overlap": "override"}


def test_explain_a_cron_expression(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    query = urlencode([("cron", "30 2 * * *"), ("timezone", "Europe/Berlin"), ("count", "2")])
    body = orjson.dumps({"fires": FIRES})
    server.routes[("GET", f"/api/v1/explain?{query}")] = Canned(200, body)
    server.routes[("GET", "/api/v1/jobs/J1/explain")] = Canned(200, b'{"fires": []}')
    argv = ["--server", server.url, "explain", "--cron", "30 2 * * *", "--tz", "Europe/Berlin"]
    code, out, err = run([*argv, "--count", "2"], capsysbinary)
    assert (code, err) == (EXIT_OK, "")
    # not a terminal: nothing is cut or wrapped (the notes in a column of their own)
    assert out.decode() == render.fires_table(FIRES, render.Style(render.UNLIMITED)) + "\n"
    assert GAP_NOTE in out.decode()
    code, out, _ = run([*argv, "--count", "2", "-o", "json"], capsysbinary)
    assert (code, out) == (EXIT_OK, body + b"\n")
    code, out, _ = run(["--server", server.url, "explain", "J1"], capsysbinary)
    assert (code, out) == (EXIT_OK, b"no fire times ahead\n")


def test_dead_letter_queue(server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    path = run_path(RUN_ID, under="dlq")
    assert path == f"/api/v1/dlq/{ULID}%401795645921727"
    assert run_path(RUN_ID) == f"/api/v1/runs/{ULID}%401795645921727"
    server.routes[("GET", "/api/v1/dlq")] = Canned(200, b'{"runs": []}')
    code, out, _ = run(["--server", server.url, "dlq", "list"], capsysbinary)
    assert (code, out) == (EXIT_OK, b"the dead-letter queue is empty\n")
    dead = orjson.dumps({"runs": [{**RUN, "id": RUN_ID, "job_id": ULID}]})
    server.routes[("GET", "/api/v1/dlq")] = Canned(200, dead)
    code, out, _ = run(["--server", server.url, "dlq", "list"], capsysbinary)
    assert _lines(out.decode())[1].split() == [RUN_ID, ULID, "2"]
    server.routes[("POST", path + "/replay")] = Canned(200, RUN_J1)
    code, out, _ = run(
        ["--server", server.url, "dlq", "replay", RUN_ID, "-o", "json"], capsysbinary
    )
    assert (code, out) == (EXIT_OK, RUN_J1 + b"\n")
    server.routes[("DELETE", path)] = Canned(204)
    code, out, err = run(["--server", server.url, "dlq", "drop", RUN_ID], capsysbinary)
    assert (code, err) == (EXIT_OK, "")
    assert out.decode() == f"dropped run {RUN_ID} from the dead-letter queue\n"
    code, out, err = run(
        ["--server", server.url, "-o", "json", "dlq", "drop", RUN_ID], capsysbinary
    )
    assert (code, out, err) == (EXIT_OK, b"", "")
    code, out, err = run(["--server", server.url, "dlq", "drop", "other@1"], capsysbinary)
    assert (code, out) == (EXIT_NOT_FOUND, b"")


def _job(status: str) -> Canned:
    return Canned(200, orjson.dumps({"id": "J1", "status": status}))


def _runs(*runs: dict[str, Any]) -> Canned:
    return Canned(200, orjson.dumps({"runs": list(runs)}))


@pytest.mark.parametrize("output", ["table", "json"])
def test_watch_follows_the_runs_until_the_job_is_done(server: FakeServer, output: str) -> None:
    job, runs = ("GET", "/api/v1/jobs/J1"), ("GET", "/api/v1/jobs/J1/runs")
    # what the server answers at each poll; the sleep between polls moves to the next
    script = [
        (_job("active"), _runs(QUEUED, OLD_DONE)),
        (_job("active"), _runs(RUNNING, OLD_DONE)),
        (_job("active"), _runs(RUNNING, OLD_DONE)),
        (_job("active"), _runs(RETRYING, OLD_DONE)),
        (_job("done"), _runs({**RUNNING_AGAIN, "state": "running"}, OLD_DONE)),  # not yet
        (_job("done"), _runs({**RUNNING_AGAIN, "state": "succeeded"}, OLD_DONE)),
    ]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        server.routes[job], server.routes[runs] = script[len(sleeps)]

    server.routes[job], server.routes[runs] = script[0]
    out, err = io.BytesIO(), io.StringIO()
    client = Client([parse_server(server.url)])
    assert watch(client, "J1", 0.25, _settings(output), PLAIN, out, err, sleep) == EXIT_OK
    assert sleeps == [0.25] * 5
    if output == "json":
        printed = [orjson.loads(line) for line in out.getvalue().splitlines()]
        assert [(r["state"], len(r["attempts"])) for r in printed] == [
            ("queued", 0),
            ("running", 1),
            ("retrying", 1),
            ("running", 2),
            ("succeeded", 2),
        ]
        assert err.getvalue() == ""
        return
    assert out.getvalue().decode().splitlines() == [
        f"02:00:05 {ULID}@2000 queued",
        f"02:00:05 {ULID}@2000 running   attempt 1 fence 7",
        f"02:00:05 {ULID}@2000 retrying  attempt 1 fence 7",
        "         error: boom",
        f"02:00:05 {ULID}@2000 running   attempt 2 fence 9",
        f"02:00:05 {ULID}@2000 succeeded attempt 2 fence 9",
    ]
    assert err.getvalue().splitlines() == [
        "schedctl: watching job J1 (times UTC); Ctrl-C to stop",
        "schedctl: job J1 is done; every run has finished (the latest succeeded)",
    ]


@pytest.mark.parametrize(("state", "code"), [("failed", 5), ("cancelled", 6), ("succeeded", 0)])
def test_watch_exits_with_the_latest_runs_outcome(
    server: FakeServer, state: str, code: int
) -> None:
    server.routes[("GET", "/api/v1/jobs/J1")] = _job("done")
    server.routes[("GET", "/api/v1/jobs/J1/runs")] = _runs(
        {**RUNNING_AGAIN, "state": state}, OLD_DONE
    )
    client = Client([parse_server(server.url)])
    out, err = io.BytesIO(), io.StringIO()
    assert watch(client, "J1", 1.0, _settings("table"), PLAIN, out, err) == code


def _settings(output: str, quiet: bool = False) -> Settings:
    return Settings(servers=(), token=None, output=output, timeout=10.0, quiet=quiet)


def test_watch_stops_quietly_on_ctrl_c_and_exits_3_for_an_unknown_job(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    server.routes[("GET", "/api/v1/jobs/J1")] = _job("active")
    server.routes[("GET", "/api/v1/jobs/J1/runs")] = _runs(RUNNING)

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    out, err = io.BytesIO(), io.StringIO()
    client = Client([parse_server(server.url)])
    assert watch(client, "J1", 1.0, _settings("table"), PLAIN, out, err, interrupt) == EXIT_OK
    assert out.getvalue().decode() == f"02:00:05 {ULID}@2000 running   attempt 1 fence 7\n"
    assert "Traceback" not in err.getvalue()
    code, out_bytes, err_text = run(["--server", server.url, "watch", "nope"], capsysbinary)
    assert (code, out_bytes) == (EXIT_NOT_FOUND, b"")
    assert "not_found" in err_text


def test_a_queued_run_shows_why_it_waits() -> None:
    why = "no connected worker serves task 'mail' on queue 'q'"
    queued = {**RUN, "attempts": [], "error": None, "state": "queued", "waiting": why}
    for text in (
        render.runs_table([queued], render.Style(200)),
        render.job_details({**JOB, "latest_run": queued}, render.Style(200)),
    ):
        assert why in text


# ---- fitting the terminal, ids only, naming jobs, runs, warnings -----------------------------


def test_the_width_is_the_terminals_and_nothing_is_cut_when_piped() -> None:
    assert terminal_style("table", False, {}).width == render.UNLIMITED
    assert terminal_style("table", False, {"COLUMNS": "100"}).width == 100
    assert terminal_style("table", True, {"COLUMNS": "64"}).width == 64
    assert terminal_style("table", True, {"COLUMNS": "junk"}).width >= 20
    wide = terminal_style("wide", True, {"COLUMNS": "64"})
    assert wide.wide and wide.width == render.UNLIMITED
    assert terminal_style("table", False, {}, now_ms=5).now_ms == 5


def test_quiet_prints_ids_only_and_a_submit_warning_goes_to_stderr(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    jobs = {"jobs": [{**JOB, "id": "A1"}, {**JOB, "id": "B2"}], "next_cursor": None}
    server.routes[("GET", "/api/v1/jobs?last_run=failed")] = Canned(200, orjson.dumps(jobs))
    code, out, _ = run(["--server", server.url, "-q", "list", "--state", "failed"], capsysbinary)
    assert (code, out) == (EXIT_OK, b"A1\nB2\n")
    warned = {**JOB, "id": "C3", "warnings": ["no worker is connected: task 't' waits"]}
    server.routes[("POST", "/api/v1/jobs")] = Canned(201, orjson.dumps(warned))
    code, out, err = run(["--server", server.url, "submit", "t", "-q"], capsysbinary)
    assert (code, out) == (EXIT_OK, b"C3\n")
    assert err == "schedctl: warning: no worker is connected: task 't' waits\n"


def test_a_job_is_named_by_a_unique_name_or_id_prefix(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    one = orjson.dumps({"jobs": [{**JOB, "id": ULID, "status": "active"}]})
    none = orjson.dumps({"jobs": []})
    server.routes[("GET", "/api/v1/jobs?name=nightly&limit=20")] = Canned(200, one)
    server.routes[("GET", f"/api/v1/jobs/{ULID}")] = Canned(200, orjson.dumps({**JOB, "id": ULID}))
    code, out, _ = run(["--server", server.url, "-q", "get", "nightly"], capsysbinary)
    assert (code, out) == (EXIT_OK, ULID.encode() + b"\n")
    server.routes[("GET", "/api/v1/jobs?name=01m8ad&limit=20")] = Canned(200, none)
    server.routes[("GET", "/api/v1/jobs?id_prefix=01m8ad&limit=10")] = Canned(200, one)
    code, out, _ = run(["--server", server.url, "-q", "get", "01m8ad"], capsysbinary)
    assert (code, out) == (EXIT_OK, ULID.encode() + b"\n")
    two = orjson.dumps({"jobs": [{**JOB, "id": "A1"}, {**JOB, "id": "B2"}]})
    server.routes[("GET", "/api/v1/jobs?name=twice&limit=20")] = Canned(200, two)
    code, out, err = run(["--server", server.url, "get", "twice"], capsysbinary)
    assert code == EXIT_USAGE and "ambiguous" in err and "A1, B2" in err
    # a page of 20 finished jobs of the name, the newest: the live one is asked for by status
    done = [{**JOB, "id": f"D{k}", "status": "done"} for k in range(20)]
    server.routes[("GET", "/api/v1/jobs?name=busy&limit=20")] = Canned(
        200, orjson.dumps({"jobs": done})
    )
    server.routes[("GET", "/api/v1/jobs?name=busy&status=active&limit=10")] = Canned(200, one)
    server.routes[("GET", "/api/v1/jobs?name=busy&status=paused&limit=10")] = Canned(200, none)
    code, out, _ = run(["--server", server.url, "-q", "get", "busy"], capsysbinary)
    assert (code, out) == (EXIT_OK, ULID.encode() + b"\n")
    # a run id's job part is resolved too, and cancelling a run asks the run's own endpoint
    run_id = f"{ULID}@1795645921727"
    cancelled = orjson.dumps({**RUN, "id": run_id, "state": "cancelled"})
    server.routes[("POST", f"/api/v1/runs/{ULID}%401795645921727/cancel")] = Canned(200, cancelled)
    code, out, _ = run(
        ["--server", server.url, "-q", "cancel", "nightly@1795645921727"], capsysbinary
    )
    assert (code, out) == (EXIT_OK, run_id.encode() + b"\n")


def test_update_changes_only_the_policies_and_retry_options_given(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    current = {
        **JOB,
        "id": "J1",
        "schedule": {
            "cron": "0 2 * * *",
            "timezone": "Europe/Berlin",
            "jitter": 0,
            "misfire": "run_once",
            "catchup_window": None,
            "overlap": "allow",
            "dst": {"gap": "shift", "repeat": "first"},
            "start_at": None,
            "end_at": None,
        },
        "retry": {"max_attempts": 5, "initial": 1, "max": 600, "multiplier": 2.0, "jitter": True},
    }
    server.routes[("GET", "/api/v1/jobs/J1")] = Canned(200, orjson.dumps(current))
    server.routes[("PATCH", "/api/v1/jobs/J1")] = Canned(200, orjson.dumps(current))
    argv = ["--server", server.url, "update", "J1", "--misfire", "skip", "--dst-repeat", "both"]
    code, _, err = run([*argv, "--retry-max", "5m", "--no-retry-jitter"], capsysbinary)
    assert code == EXIT_OK, err
    assert orjson.loads(server.seen[-1][3]) == {
        "schedule": {
            "cron": "0 2 * * *",
            "timezone": "Europe/Berlin",
            "jitter": 0,
            "misfire": "skip",
            "overlap": "allow",
            "dst": {"gap": "shift", "repeat": "both"},
        },
        "retry": {"max_attempts": 5, "initial": 1, "max": "5m", "multiplier": 2.0, "jitter": False},
    }
    # a new cron keeps the policies and the zone
    code, _, err = run(
        ["--server", server.url, "update", "J1", "--cron", "0 3 * * *"], capsysbinary
    )
    assert code == EXIT_OK, err
    assert orjson.loads(server.seen[-1][3])["schedule"]["cron"] == "0 3 * * *"
    assert orjson.loads(server.seen[-1][3])["schedule"]["overlap"] == "allow"


def test_a_run_shows_every_attempt_whole() -> None:
    run_view = {
        **RUN,
        "id": RUN_ID,
        "job_id": ULID,
        "due_at": "2026-11-25T02:00:00Z",
        "updated_at": "2026-11-25T02:01:05Z",
        "result": None,
        "attempts": [
            {
                "attempt": 1,
                "fence": 17,
                "worker_id": "w-1",
                "started_at": "2026-11-25T02:00:00Z",
                "ended_at": "2026-11-25T02:00:05Z",
                "outcome": "failed",
                "error": "boom " + LONG,
                "progress": {"done": 3},
                "progress_at": "2026-11-25T02:00:04Z",
                "traceback": 'Traceback (most recent call last):\n  File "t.py", line 3, in f\n'
                "    raise ValueError('boom')\nValueError: boom",
            }
        ],
    }
    text = render.run_details(run_view)
    lines = _lines(text)
    assert all(render.display_width(line) <= 80 for line in lines)
    assert "attempt 1: worker w-1, fence 17, failed" in text
    assert "started 2026-11-25 02:00:00Z, ended 2026-11-25 02:00:05Z, took 5s" in text
    assert 'progress: {"done":3}' in text
    assert LONG in "".join(line.strip() for line in lines)  # the error, whole
    assert '      File "t.py", line 3, in f' in lines  # the traceback, its own indentation kept


def test_ui_prints_the_address_on_the_node_that_made_the_code_and_opens_it(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    made = b'{"code": "c0de", "expires_at": "2026-11-27T10:00:00.000Z", "path": "/ui/#code=c0de"}'
    server.routes[("POST", "/api/v1/login/codes")] = Canned(201, made)
    opened: list[str] = []
    browsers = [True]
    monkeypatch.setattr(
        "webbrowser.open",
        lambda url: opened.append(url) or browsers[0],  # type: ignore[func-returns-value]
    )
    code, out, err = run(["--server", server.url, "ui"], capsysbinary)
    url = f"{server.url}/ui/#code=c0de"
    assert (code, out.decode(), err, opened) == (EXIT_OK, url + "\n", "", [url])
    browsers[0] = False  # no browser here: say what to do
    code, out, err = run(["--server", server.url, "ui"], capsysbinary)
    assert code == EXIT_OK and "open the address above" in err
    code, out, _ = run(["--server", server.url, "-o", "json", "ui", "--no-open"], capsysbinary)
    assert orjson.loads(out)["url"] == url and len(opened) == 2  # --no-open: not opened


def test_a_read_asks_for_the_highest_index_an_answer_gave(server: FakeServer) -> None:
    """schedctl reads what it wrote (or what it read before) on whichever server answers: each
    GET carries the highest X-Schedd-Index seen so far as X-Schedd-Min-Index."""
    server.routes[("POST", "/api/v1/jobs")] = Canned(201, JOB_BYTES, {"X-Schedd-Index": "42"})
    server.routes[("GET", "/api/v1/jobs/X")] = Canned(200, JOB_BYTES, {"X-Schedd-Index": "40"})
    client = Client([parse_server(server.url)])
    client.request("GET", "/api/v1/jobs/X")
    assert "X-Schedd-Min-Index" not in server.seen[-1][2]  # nothing seen yet
    client.request("POST", "/api/v1/jobs", body=b"{}")
    assert "X-Schedd-Min-Index" not in server.seen[-1][2]  # a write waits for nothing
    client.request("GET", "/api/v1/jobs/X")
    assert server.seen[-1][2]["X-Schedd-Min-Index"] == "42"
    assert client.index == 42  # the read's lower index does not lower it


def test_wait_prints_ages_as_of_when_it_prints_them(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that finished while ``wait`` waited is printed as past ("1s ago"), not as the
    future it was when the wait began ("in 10s")."""
    began = 1_795_000_000.0
    clock = [began]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    style = terminal_style("table", False, {})  # made when the command starts
    ended = datetime.fromtimestamp(began + 10, UTC).isoformat().replace("+00:00", "Z")
    run = {
        "id": "J1@1",
        "job_id": "J1",
        "state": "succeeded",
        "scheduled_at": ended,
        "updated_at": ended,
        "attempts": [{"attempt": 1, "started_at": ended, "ended_at": ended}],
    }
    server.routes[("GET", "/api/v1/runs/J1%401")] = Canned(
        200, orjson.dumps({**run, "state": "running"})
    )

    def sleep(seconds: float) -> None:  # the run finishes 10 s in; it is printed at 11 s
        clock[0] = began + 11
        server.routes[("GET", "/api/v1/runs/J1%401")] = Canned(200, orjson.dumps(run))

    out, err = io.BytesIO(), io.StringIO()
    client = Client([parse_server(server.url)])
    code = wait(client, "J1@1", None, _settings("table"), style, out, err, sleep)
    assert code == EXIT_OK
    text = out.getvalue().decode()
    assert "1s ago" in text and "in 10s" not in text, text


PLAN = {
    "action": "replay",
    "dry_run": True,
    "count": 3,
    "message": "replay 3 runs of 2 tasks",
    "tasks": [{"task": "mail.send", "count": 2}, {"task": "bill", "count": 1}],
    "run_ids": ["A@1", "B@2", "C@3"],
    "skipped": [],
}


def test_dlq_replay_by_filter_counts_first_then_sends_the_runs_shown(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    server.routes[("POST", "/api/v1/dlq/replay")] = Canned(200, orjson.dumps(PLAN))
    # without a terminal and without --yes: counted, then refused with what to do
    code, out, err = run(
        ["--server", server.url, "dlq", "replay", "--task", "mail.send"], capsysbinary
    )
    assert code == EXIT_USAGE and "replay 3 runs of 2 tasks: pass --yes" in err
    assert [orjson.loads(b) for m, p, _, b in server.seen if m == "POST"] == [
        {"dry_run": True, "task": "mail.send"}
    ]
    server.seen.clear()
    code, out, _ = run(
        ["--server", server.url, "dlq", "replay", "--error", "timeout", "--dry-run"],
        capsysbinary,
    )
    assert code == EXIT_OK and out.decode().splitlines()[0] == "replay 3 runs of 2 tasks"
    assert "mail.send" in out.decode() and len(server.seen) == 1
    server.seen.clear()
    server.routes[("POST", "/api/v1/dlq/replay")] = Canned(200, orjson.dumps(PLAN))
    code, out, err = run(["--server", server.url, "dlq", "replay", "--all", "--yes"], capsysbinary)
    assert code == EXIT_OK, err
    bodies = [orjson.loads(b) for m, _, _, b in server.seen if m == "POST"]
    assert bodies == [{"dry_run": True}, {"dry_run": False, "run_ids": ["A@1", "B@2", "C@3"]}]


def test_dlq_replay_of_several_ids_and_its_usage_errors(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    server.routes[("POST", "/api/v1/dlq/drop")] = Canned(200, orjson.dumps(PLAN))
    other = f"{ULID}@1795645921728"
    code, _, err = run(["--server", server.url, "dlq", "drop", RUN_ID, other, "-y"], capsysbinary)
    assert code == EXIT_OK, err
    bodies = [orjson.loads(b) for m, _, _, b in server.seen if m == "POST"]
    assert bodies[0] == {"dry_run": True, "run_ids": [RUN_ID, other]}
    for argv, says in (
        (["dlq", "replay"], "name the runs"),
        (["dlq", "replay", RUN_ID, "--task", "t"], "not both"),
        (["dlq", "drop", "--since", "soon", "-y"], "--since"),
    ):
        code, _, err = run(["--server", server.url, *argv], capsysbinary)
        assert code == EXIT_USAGE and says in err, err


def test_a_done_job_whose_run_failed_reads_failed_and_states_have_colours() -> None:
    failed_run = {**RUN, "state": "failed"}
    job = {"id": ULID, "task": "t", "status": "done", "latest_run": failed_run}
    plain = render.jobs_table([job], render.Style(200))
    assert _lines(plain)[1].split()[2] == "failed" and "\x1b[" not in plain
    colored = render.jobs_table([job], render.Style(200, color=True))
    assert "\x1b[31mfailed\x1b[0m" in colored
    # the layout is the same with colours: only the escapes differ
    assert re.sub(r"\x1b\[[0-9;]*m", "", colored) == plain
    ok = {**job, "latest_run": {**RUN, "state": "succeeded"}}
    assert _lines(render.jobs_table([ok], render.Style(200)))[1].split()[2] == "done"
    assert "\x1b[32mdone\x1b[0m" in render.jobs_table([ok], render.Style(200, color=True))
    details = render.job_details(job, render.Style(200, color=True))
    assert "\x1b[31mfailed\x1b[0m" in details
    runs = render.runs_table([{**RUN, "state": "retrying"}], render.Style(200, color=True))
    assert "\x1b[33mretrying\x1b[0m" in runs


def test_colours_only_on_a_terminal_and_never_with_no_color() -> None:
    assert terminal_style("table", True, {"COLUMNS": "90"}).color
    assert not terminal_style("table", False, {"COLUMNS": "90"}).color
    assert not terminal_style("table", True, {"COLUMNS": "90", "NO_COLOR": "1"}).color
    assert not terminal_style("table", True, {"COLUMNS": "90", "TERM": "dumb"}).color
    assert terminal_style("table", True, {"COLUMNS": "90", "NO_COLOR": ""}).color


def test_runs_are_named_by_their_job_and_the_dlq_shows_no_id_twice() -> None:
    run = {**RUN, "id": RUN_ID, "job_id": ULID, "job_name": "nightly", "task": "reports.build"}
    line = _lines(render.dlq_table([run], render.Style(120)))[1]
    assert line.split() == [RUN_ID, "nightly", "·", "reports.build", "2"]
    assert line.count(ULID) == 1  # only inside the run id
    unnamed = {**run, "job_name": None}
    assert _lines(render.dlq_table([unnamed], render.Style(120)))[1].split()[1] == "reports.build"
    details = render.run_details(run, render.Style(120))
    assert "name:" in details and "nightly" in details and "reports.build" in details


def test_cluster_lists_the_latest_leaders_in_words_and_contact_in_seconds() -> None:
    leaders = [
        {"term": t, "node": f"n{t % 3 + 1}", "index": 100 * t, "at": "2026-11-28T11:57:07.000Z"}
        for t in range(1, 9)
    ]
    view = {
        "node_id": "n1",
        "nodes": [{"id": "n1", "role": "leader", "last_contact": 0.061}],
        "leaders": leaders,
    }
    text = render.cluster_view(view, render.Style(120))
    assert "[{" not in text and "0.06s" in text
    assert "leaders (the latest 5 of 8, newest last):" in text
    assert "term 8: n3 since 2026-11-28 11:57:07Z (log index 800)" in text
    assert "term 3:" not in text


def test_a_paused_job_shows_no_next_run_and_a_job_never_run_no_last_run() -> None:
    pending = {**RUN, "state": "scheduled", "attempts": []}
    job = {
        "id": ULID,
        "task": "t",
        "status": "paused",
        "next_run_at": "2026-11-25T02:00:00.000Z",
        "latest_run": pending,
    }
    row = _lines(render.jobs_table([job], render.Style(200, now_ms=1_764_000_000_000)))[1]
    cells = row.split()
    assert cells[2] == "paused" and cells[-2:] == ["paused", "-"], row
    assert "none while paused" in render.job_details(job, render.Style(200))


def test_run_of_a_job_shows_its_latest_run(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    body = orjson.dumps({**RUN, "id": RUN_ID, "job_id": ULID})
    server.routes[("GET", f"/api/v1/jobs/{ULID}")] = Canned(
        200, orjson.dumps({"id": ULID, "status": "active", "latest_run": {"id": RUN_ID}})
    )
    server.routes[("GET", run_path(RUN_ID))] = Canned(200, body)
    code, out, err = run(["--server", server.url, "-o", "json", "run", ULID], capsysbinary)
    assert (code, out) == (EXIT_OK, body + b"\n"), err


def test_ready_waits_for_a_leader_and_says_why_not(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    from schedd.cli import ready

    monkeypatch.setattr(ready, "POLL_S", 0.05)  # several looks within the short timeouts below
    server.routes[("GET", "/api/v1/whoami")] = Canned(200, b'{"name": "admin", "role": "admin"}')
    server.routes[("GET", "/readyz")] = Canned(
        503, b'{"error": {"code": "unavailable", "message": "not ready: no known leader yet"}}'
    )
    code, _, err = run(["--server", server.url, "ready", "--timeout", "0.6s"], capsysbinary)
    assert code == 4 and "not ready after 0.6s" in err and "no known leader" in err
    assert server.hits("GET", "/readyz") >= 2  # asked again until the time was up
    server.routes[("GET", "/readyz")] = Canned(200, b'{"status": "ready", "leader": "n1"}')
    code, out, _ = run(["--server", server.url, "ready"], capsysbinary)
    assert code == EXIT_OK and out.decode() == f"ready: {server.url} (leader n1)\n"
    server.routes[("GET", "/api/v1/whoami")] = Canned(
        401, b'{"error": {"code": "unauthenticated", "message": "unknown token"}}'
    )
    started = time.monotonic()
    code, _, err = run(["--server", server.url, "--token", "not-ours-123", "ready"], capsysbinary)
    assert code == 1 and "does not know the token" in err
    assert time.monotonic() - started < 5  # at once, not after the 30 s
    # without a token (a node starting here writes it a moment later): it waits for one
    code, _, err = run(["--server", server.url, "ready", "--timeout", "0.5s"], capsysbinary)
    assert code == 4 and "no token yet" in err
    code, _, err = run(["--server", DEAD, "ready", "--timeout", "0.5s"], capsysbinary)
    assert code == 4 and "connection refused" in err


def test_explain_in_utc_shows_no_local_column_that_repeats_it() -> None:
    utc = [{"scheduled_at": "2026-11-25T02:00:00.000Z", "local": "2026-11-25T02:00:00+00:00"}]
    assert _lines(render.fires_table(utc, render.Style(80))) == [
        "SCHEDULED (UTC)",
        "2026-11-25 02:00:00Z",
    ]
    berlin = [{"scheduled_at": "2026-11-25T01:00:00.000Z", "local": "2026-11-25T02:00:00+01:00"}]
    assert "LOCAL" in render.fires_table(berlin, render.Style(80))


@pytest.mark.parametrize(
    "flag",
    [["--state", "failed"], ["--status", "failed"], ["--sort", "latest_run", "--task", "t"]],
)
def test_a_windowed_filter_follows_the_servers_short_pages(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes], flag: list[str]
) -> None:
    """The server reads a latest-run filter (or a filter in a sort by time) in windows and may
    answer an empty page with a cursor: schedctl goes on to the page that has them."""
    query = {
        "--status": "last_run=failed&status=done",
        "--state": "last_run=failed",
        "--sort": "task=t&sort=latest_run",
    }[flag[0]]
    empty = orjson.dumps({"jobs": [], "next_cursor": "w2"})
    found = orjson.dumps({"jobs": [{**JOB, "id": "F1"}], "next_cursor": None})
    server.routes[("GET", f"/api/v1/jobs?{query}")] = Canned(200, empty)
    server.routes[("GET", f"/api/v1/jobs?{query}&cursor=w2")] = Canned(200, found)
    code, out, _ = run(["--server", server.url, "-q", "list", *flag], capsysbinary)
    assert (code, out) == (EXIT_OK, b"F1\n")


def _bulk(
    answers: list[dict[str, Any]], sent: list[ApiRequest], argv_body: dict[str, Any], **kw: Any
) -> tuple[int, str, str]:
    """schedctl's bulk DLQ command against canned answers (the dry run's, then the real one's)."""
    from schedd.cli import dlq
    from schedd.cli.client import Response as CliResponse

    def call(req: ApiRequest) -> CliResponse:
        sent.append(req)
        data = orjson.dumps(answers[len(sent) - 1])
        return CliResponse(parse_server("http://x:7700"), 200, "OK", {}, data)

    out, err = io.BytesIO(), io.StringIO()
    req = ApiRequest("POST", "/api/v1/dlq/replay", body=argv_body)
    code = dlq.bulk(
        call, req, "replay", dry_run=False, yes=False, settings=_settings("table"), out=out,
        err=err, **kw,
    )  # fmt: skip
    return code, out.getvalue().decode(), err.getvalue()


def test_a_bulk_replay_asks_on_a_terminal_and_does_only_what_was_answered() -> None:
    done = {**PLAN, "dry_run": False, "message": "replayed 3 runs of 2 tasks"}
    sent: list[ApiRequest] = []
    code, out, err = _bulk(
        [PLAN, done], sent, {"dry_run": True, "task": "t"}, interactive=True,
        ask=lambda prompt, err: "replay these 3 runs?" in prompt,
    )  # fmt: skip
    assert code == EXIT_OK and out.startswith("replayed 3 runs of 2 tasks")
    assert "mail.send" in err  # the plan, shown before the question
    assert [r.body for r in sent][1] == {"dry_run": False, "run_ids": ["A@1", "B@2", "C@3"]}
    sent.clear()
    code, out, err = _bulk(
        [PLAN], sent, {"dry_run": True, "task": "t"}, interactive=True, ask=lambda p, e: False
    )
    assert (code, out, len(sent)) == (EXIT_OK, "", 1) and "nothing was done" in err


def test_a_bulk_replay_of_named_runs_none_of_them_in_the_queue_is_not_found() -> None:
    none = {**PLAN, "count": 0, "tasks": [], "run_ids": [], "skipped": ["A@1", "B@2"]}
    with pytest.raises(CliError) as caught:
        _bulk([none], [], {"dry_run": True, "run_ids": ["A@1", "B@2"]}, interactive=False)
    assert caught.value.exit_code == EXIT_NOT_FOUND and "A@1, B@2" in caught.value.message
    # by a filter that matches nothing: said, and not an error
    code, out, _ = _bulk([{**none, "skipped": []}], [], {"dry_run": True, "task": "t"})
    assert (code, out) == (EXIT_OK, "no dead-lettered run matches: nothing to replay\n")


def test_a_bad_choice_lists_the_choices_as_they_are_written(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    code, _, err = run(["list", "--sort", "soon"], capsysbinary)
    assert code == EXIT_USAGE
    assert "'created', 'next_fire', 'latest_run'" in err and "JobSort" not in err, err
    code, _, err = run(["submit", "t", "--every", "1m", "--overlap", "never"], capsysbinary)
    assert code == EXIT_USAGE and "Overlap" not in err and "'skip'" in err, err
