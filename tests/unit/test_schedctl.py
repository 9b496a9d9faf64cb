"""schedctl: command lines to requests, rendering, exit codes, and a tiny real HTTP server."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest

from schedd.cli import render
from schedd.cli.client import MAX_RETRIES, Client, Unreachable, parse_retry_after, parse_server
from schedd.cli.schedctl import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_SERVER,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    ApiRequest,
    build_request,
    main,
    parse_args,
    resolve_settings,
)

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
    # connection options are accepted after the command too
    (["get", "x", "-o", "json", "--server", DEAD], ApiRequest("GET", "/api/v1/jobs/x")),
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
    assert "…" in text
    assert "\x1b" not in text and "\n\n\n" not in text


def test_table_details() -> None:
    run = {**RUN, "id": "01M8ADCPDZ145C4FJCBYS11A0G@1795645921727"}
    header, row, note = _lines(render.runs_table([run]))
    assert header.split() == ["RUN", "STATE", "ATTEMPTS", "FENCE"]
    assert row.split() == [run["id"], "failed", "2", "42"]  # the id is never cut; last fence
    assert note.startswith("  scheduled 2026-11-25 02:00:00Z  ended 2026-11-25 02:01:05Z  Trace")
    assert note.endswith("…") and len(note) == 80
    # ids and times are kept whole; the task column gives up its room
    jobs = render.jobs_table([{**JOB, "id": "01M8ADCPDZ145C4FJCBYS11A0G"}])
    assert "01M8ADCPDZ145C4FJCBYS11A0G" in jobs and "2026-11-25 02:00:00Z" in jobs
    short = render.table(["A", "B"], [["1", "two"]])
    assert short == "A  B\n1  two"
    assert render.fmt_time("2026-11-25T03:00:00+01:00") == "2026-11-25 02:00:00Z"
    assert render.fmt_time(None) == "-"
    assert render.clean("a\x1b[31mb\nc\u202e") == "a\\x1b[31mb c\\u202e"
    assert render.truncate("日本語", 4) == "日…"
    job = render.job_details(JOB)
    assert "schedule:" in job and "cron 0 2 * * * (Europe/Berlin)" in job


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

        do_GET = do_POST = do_DELETE = _serve

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


def test_server_errors_exit_1_with_field_and_hint(
    server: FakeServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    bad = b'{"error": {"code": "invalid_argument", "message": "expected 5 fields", "field": "schedule.cron"}}'
    server.routes[("POST", "/api/v1/jobs")] = Canned(400, bad)
    server.routes[("GET", "/api/v1/workers")] = Canned(
        401, b'{"error": {"code": "unauthenticated", "message": "a bearer token is required"}}'
    )
    code, _, err = run(["--server", server.url, "submit", "t", "--cron", "x"], capsysbinary)
    assert code == EXIT_SERVER
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


def test_unsafe_post_is_not_repeated_after_a_timeout(server: FakeServer) -> None:
    server.routes[("POST", "/api/v1/jobs")] = Canned(201, b"{}", delay=0.6)
    other = parse_server(server.url)
    client = Client([parse_server(server.url), other], timeout=0.2)
    with pytest.raises(Unreachable, match="may or may not have been applied"):
        client.request("POST", "/api/v1/jobs", body=b'{"task": "t"}', idempotent=False)
    assert server.hits("POST", "/api/v1/jobs") == 1
