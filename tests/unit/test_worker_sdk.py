"""The worker SDK: registry, result/exception mapping, built-ins, the protocol against a scripted
websocket server, and the ``schedd-worker`` command line."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

import schedd.worker
from schedd.cli.worker import main as cli_main
from schedd.protocol.messages import (
    MAX_PROGRESS_BYTES,
    TRACEBACK_BYTES,
    TRACEBACK_LINES,
    Ack,
    Cancel,
    Complete,
    Drain,
    Fail,
    Heartbeat,
    Hello,
    Lease,
    LeaseRef,
    Message,
    Redirect,
    Welcome,
    decode,
    encode,
)
from schedd.worker import Context, NonRetryable, Registry, Worker, default_registry, task
from schedd.worker.builtins import SHELL_DISABLED
from schedd.worker.client import backoff_delay, normalise_server

T0 = "2026-11-25T02:00:00.000Z"


def lease(
    task: str = "t",
    payload: Any = None,
    *,
    run_id: str = "j@1",
    fence: int = 5,
    attempt: int = 1,
    deadline: str | None = None,
) -> Lease:
    return Lease(run_id, "j", attempt, fence, task, payload, T0, deadline, "key-1")


def in_seconds(s: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=s)).isoformat()


def make_worker(**kw: Any) -> Worker:
    kw.setdefault("registry", Registry())
    kw.setdefault("drain_timeout", 2.0)
    servers = kw.pop("servers", "http://127.0.0.1:1")
    return Worker(servers, **kw)


# -- registry ----------------------------------------------------------------------------------


def test_module_level_task_registers_in_the_default_registry() -> None:
    @task("tests.sdk.module_level")
    async def handler(ctx: Context, payload: Any) -> Any:
        return payload

    # the handle is the handler for the worker, and a way to submit for producers
    assert default_registry.get("tests.sdk.module_level") is handler
    assert handler.name == "tests.sdk.module_level" and callable(handler.submit)
    assert handler.delay == handler.submit
    assert Worker("http://x:1").registry is default_registry
    assert schedd.worker.task is task


def test_worker_task_registers_on_its_own_registry() -> None:
    reg = Registry()
    w = Worker(["http://a:1", "b:2/"], registry=reg)
    assert w.servers == ["http://a:1", "http://b:2"]

    @w.task("only.here")
    def handler(ctx: Context, payload: Any) -> Any:
        return 1

    assert reg.get("only.here") is handler
    assert "only.here" not in default_registry
    assert reg.names() == ["only.here"] and len(reg) == 1 and list(reg) == ["only.here"]
    assert w.handler_for("http") is not None  # built-ins on every worker
    assert w.handler_for("shell") is None  # ...but shell only when allowed
    assert make_worker(allow_shell=True).handler_for("shell") is not None


def test_registry_refuses_conflicts_and_bad_names() -> None:
    reg = Registry()

    @reg.task("x")
    def one(ctx: Context, payload: Any) -> None: ...

    reg.register("x", one)  # the same function again: fine

    def two(ctx: Context, payload: Any) -> None: ...

    with pytest.raises(ValueError, match="'x' is already registered"):
        reg.register("x", two)
    with pytest.raises(ValueError, match="task name"):
        reg.task("")
    with pytest.raises(TypeError, match="callable"):
        reg.register("y", 5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"servers": []}, "servers"),
        ({"servers": "ftp://x"}, "server"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 10_001}, "concurrency"),
        ({"queues": []}, "queues"),
    ],
)
def test_worker_refuses_bad_arguments(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_worker(**kw)


def test_backoff_is_capped_exponential_with_jitter() -> None:
    assert backoff_delay(1, 0.999) <= 0.1 and backoff_delay(1, 0.0) == pytest.approx(0.05)
    assert backoff_delay(2, 0.999) <= 0.2
    assert [backoff_delay(n, 0.9999) <= 2.0 for n in range(1, 100)] == [True] * 99
    assert backoff_delay(50, 0.9999) == pytest.approx(2.0, abs=1e-3)
    assert normalise_server(" 10.0.0.1:7700/ ") == "http://10.0.0.1:7700"


# -- handler results and exceptions ------------------------------------------------------------


class Boom(Exception):
    pass


class BadInput(NonRetryable):
    pass


async def test_async_handler_result_becomes_complete() -> None:
    w = make_worker()
    seen: list[Context] = []

    @w.task("t")
    async def handler(ctx: Context, payload: Any) -> Any:
        seen.append(ctx)
        return {"got": payload, "n": 1}

    out = await w.execute(lease(payload={"a": [1, 2]}, attempt=3, fence=9))
    assert out == Complete("j@1", 9, {"got": {"a": [1, 2]}, "n": 1})
    ctx = seen[0]
    assert (
        ctx.run_id,
        ctx.job_id,
        ctx.attempt,
        ctx.fence,
        ctx.idempotency_key,
        ctx.scheduled_at,
        ctx.deadline,
    ) == ("j@1", "j", 3, 9, "key-1", T0, None)
    assert not ctx.cancelled.is_set()


async def test_plain_def_handler_runs_in_a_thread() -> None:
    w = make_worker()
    loop_thread = threading.get_ident()

    @w.task("t")
    def handler(ctx: Context, payload: Any) -> Any:
        return {"same_thread": threading.get_ident() == loop_thread}

    assert await w.execute(lease()) == Complete("j@1", 5, {"same_thread": False})


@pytest.mark.parametrize(
    "exc,error,retryable",
    [
        (Boom("it broke"), "Boom: it broke", True),
        (ValueError(), "ValueError", True),
        (NonRetryable("bad payload"), "NonRetryable: bad payload", False),
        (BadInput("no such report"), "BadInput: no such report", False),
    ],
)
async def test_exceptions_become_fail(exc: Exception, error: str, retryable: bool) -> None:
    w = make_worker()

    @w.task("t")
    async def handler(ctx: Context, payload: Any) -> Any:
        raise exc

    out = await w.execute(lease())
    assert isinstance(out, Fail) and replace(out, traceback=None) == Fail(
        "j@1", 5, error, retryable
    )
    if not retryable:  # a deliberate NonRetryable (not raised from another error) says it all
        assert out.traceback is None
        return
    assert out.traceback is not None and "in handler\n    raise exc" in out.traceback
    assert out.traceback.splitlines()[-1].endswith(error)  # the exception, last


def _deep(n: int) -> None:
    if n:
        _deep(n - 1)
    raise ValueError("\n".join("x" * 300 for _ in range(30)))  # more lines than are kept


async def test_a_fail_carries_the_tail_of_the_traceback_bounded() -> None:
    w = make_worker()

    @w.task("t")
    def handler(ctx: Context, payload: Any) -> Any:
        try:
            _deep(40)
        except ValueError as exc:
            raise RuntimeError("wrapped") from exc

    out = await w.execute(lease())
    assert isinstance(out, Fail) and out.error == "RuntimeError: wrapped"
    assert out.traceback is not None
    lines = out.traceback.splitlines()
    assert lines[0] == "…" and len(lines) == TRACEBACK_LINES + 1  # the first lines cut
    assert len(out.traceback.encode()) <= TRACEBACK_BYTES
    assert lines[-1].endswith("RuntimeError: wrapped") and "in handler" in out.traceback


async def test_a_result_carries_the_handler_last_progress_when_it_can_be_sent() -> None:
    w = make_worker()

    @w.task("t")
    async def done(ctx: Context, payload: Any) -> Any:
        ctx.progress = payload
        return "ok"

    @w.task("boom")
    async def boom(ctx: Context, payload: Any) -> Any:
        ctx.progress = {"step": 2}
        raise Boom("late")

    assert await w.execute(lease(payload={"done": 10})) == Complete("j@1", 5, "ok", {"done": 10})
    too_large = "x" * MAX_PROGRESS_BYTES
    assert await w.execute(lease(payload=too_large)) == Complete("j@1", 5, "ok")
    failed = await w.execute(lease("boom"))
    assert isinstance(failed, Fail) and failed.progress == {"step": 2}


async def test_result_that_is_not_json_fails_for_good() -> None:
    w = make_worker()

    @w.task("t")
    async def handler(ctx: Context, payload: Any) -> Any:
        return {1, 2}

    out = await w.execute(lease())
    assert isinstance(out, Fail) and not out.retryable
    assert "not JSON-serialisable" in out.error


async def test_unknown_task_fails_for_good() -> None:
    out = await make_worker().execute(lease("no.such.task"))
    assert isinstance(out, Fail) and not out.retryable
    assert out.error.startswith("unknown task 'no.such.task'")


async def test_deadline_in_the_past_fails_with_timeout_at_once() -> None:
    w = make_worker()
    ran: list[int] = []

    @w.task("t")
    async def handler(ctx: Context, payload: Any) -> Any:
        ran.append(1)

    out = await w.execute(lease(deadline="2020-01-01T00:00:00Z"))
    assert out == Fail(
        "j@1",
        5,
        "timeout: its deadline had passed before it started (the job's timeout)",
        retryable=True,
    )
    assert ran == []


async def test_deadline_cancels_a_running_handler() -> None:
    w = make_worker()
    cancelled: list[bool] = []

    @w.task("t")
    async def handler(ctx: Context, payload: Any) -> Any:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    ls = lease(deadline=in_seconds(0.2))
    ctx = Context(ls.run_id, ls.job_id, ls.attempt, ls.fence, ls.task, ls.scheduled_at, ls.deadline)
    started = time.monotonic()
    out = await w.execute(ls, ctx)
    assert out == Fail("j@1", 5, "timeout: still running at its deadline (the job's timeout)", True)
    assert time.monotonic() - started < 5
    assert cancelled == [True] and ctx.cancelled.is_set()


async def test_handler_own_timeout_error_is_an_ordinary_failure() -> None:
    w = make_worker()

    @w.task("t")
    async def handler(ctx: Context, payload: Any) -> Any:
        raise TimeoutError("upstream slow")

    out = await w.execute(lease(deadline=in_seconds(30)))
    assert isinstance(out, Fail) and out.traceback is not None
    assert replace(out, traceback=None) == Fail(
        "j@1", 5, "TimeoutError: upstream slow", retryable=True
    )


# -- shell -------------------------------------------------------------------------------------


async def test_shell_is_disabled_by_default() -> None:
    out = await make_worker().execute(lease("shell", {"argv": ["/bin/echo", "hi"]}))
    assert out == Fail("j@1", 5, SHELL_DISABLED, retryable=False)
    assert "--allow-shell" in SHELL_DISABLED


async def test_shell_runs_argv_without_a_shell() -> None:
    w = make_worker(allow_shell=True)
    out = await w.execute(lease("shell", {"argv": ["/bin/echo", "hello", "$HOME", ";", "ls"]}))
    assert out == Complete("j@1", 5, {"exit_code": 0, "stdout": "hello $HOME ; ls\n", "stderr": ""})


async def test_shell_env_cwd_and_no_token(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDD_TOKEN", "secret")
    code = "import os; print(os.getcwd(), os.environ.get('X'), os.environ.get('SCHEDD_TOKEN'))"
    out = await make_worker(allow_shell=True).execute(
        lease(
            "shell", {"argv": [sys.executable, "-c", code], "cwd": str(tmp_path), "env": {"X": "1"}}
        )
    )
    assert isinstance(out, Complete)
    assert out.result["stdout"] == f"{tmp_path} 1 None\n"


@pytest.mark.parametrize(
    "payload,match",
    [
        ({"argv": "echo hi; rm -rf /"}, "argv: expected a non-empty list of strings"),
        ({"argv": []}, "argv: expected a non-empty list"),
        ({"argv": ["echo", 3]}, "argv: expected a non-empty list of strings"),
        ({"argv": ["/no/such/program"]}, "cannot start '/no/such/program'"),
        ({"argv": ["/bin/echo"], "env": {"A": 1}}, "payload.env"),
        ({"argv": ["/bin/echo"], "timeout": -1}, "payload.timeout"),
        ("echo hi", "payload: expected an object"),
    ],
)
async def test_shell_refuses_bad_payloads_for_good(payload: Any, match: str) -> None:
    out = await make_worker(allow_shell=True).execute(lease("shell", payload))
    assert isinstance(out, Fail) and not out.retryable
    assert match in out.error


async def test_shell_nonzero_exit_is_retryable_with_stderr_tail() -> None:
    code = "import sys; sys.stderr.write('x' * 10000 + 'the end'); sys.exit(3)"
    out = await make_worker(allow_shell=True).execute(
        lease("shell", {"argv": [sys.executable, "-c", code]})
    )
    assert isinstance(out, Fail) and out.retryable
    assert "exited with 3" in out.error and out.error.endswith("the end")
    assert len(out.error) < 3000


async def test_shell_timeout_kills_the_process() -> None:
    started = time.monotonic()
    out = await make_worker(allow_shell=True).execute(
        lease(
            "shell", {"argv": [sys.executable, "-c", "import time; time.sleep(30)"], "timeout": 0.3}
        )
    )
    assert isinstance(out, Fail) and out.retryable and "timed out after 0.3s" in out.error
    assert time.monotonic() - started < 10


async def test_shell_output_is_truncated_to_64k() -> None:
    code = "import sys; sys.stdout.write('a' * 200000 + 'END')"
    out = await make_worker(allow_shell=True).execute(
        lease("shell", {"argv": [sys.executable, "-c", code]})
    )
    assert isinstance(out, Complete)
    assert len(out.result["stdout"]) == 64 * 1024 and out.result["stdout"].endswith("END")


# -- http against a real local server ----------------------------------------------------------


@pytest.fixture
async def http_target() -> AsyncIterator[str]:
    async def echo(request: web.Request) -> web.Response:
        body = await request.text()
        return web.json_response(
            {
                "method": request.method,
                "body": body,
                "content_type": request.headers.get("Content-Type"),
                "x": request.headers.get("X-Test"),
            },
            headers={"X-Reply": "yes"},
        )

    async def status(request: web.Request) -> web.Response:
        return web.Response(status=int(request.match_info["code"]), text="status body")

    async def big(request: web.Request) -> web.Response:
        return web.Response(text="b" * 100_000)

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(text="late")

    app = web.Application()
    app.router.add_route("*", "/echo", echo)
    app.router.add_get("/status/{code}", status)
    app.router.add_get("/big", big)
    app.router.add_get("/slow", slow)
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_http_get(http_target: str) -> None:
    out = await make_worker().execute(
        lease("http", {"url": f"{http_target}/echo", "headers": {"X-Test": "1"}})
    )
    assert isinstance(out, Complete)
    assert out.result["status"] == 200 and out.result["headers"]["X-Reply"] == "yes"
    assert decode_json(out.result["body"]) == {
        "method": "GET",
        "body": "",
        "content_type": None,
        "x": "1",
    }


async def test_http_post_json_and_text(http_target: str) -> None:
    w = make_worker()
    out = await w.execute(
        lease("http", {"method": "post", "url": f"{http_target}/echo", "body": {"k": [1, 2]}})
    )
    assert isinstance(out, Complete)
    body = decode_json(out.result["body"])
    assert body["method"] == "POST" and decode_json(body["body"]) == {"k": [1, 2]}
    assert body["content_type"] == "application/json"
    out = await w.execute(
        lease(
            "http",
            {
                "method": "PUT",
                "url": f"{http_target}/echo",
                "body": "plain",
                "headers": {"Content-Type": "text/x"},
            },
        )
    )
    assert isinstance(out, Complete)
    assert decode_json(out.result["body"])["body"] == "plain"


async def test_http_5xx_retryable_4xx_not(http_target: str) -> None:
    w = make_worker()
    out = await w.execute(lease("http", {"url": f"{http_target}/status/503"}))
    assert isinstance(out, Fail) and out.retryable and "returned 503: status body" in out.error
    out = await w.execute(lease("http", {"url": f"{http_target}/status/404"}))
    assert isinstance(out, Fail) and not out.retryable and "returned 404" in out.error


async def test_http_body_truncated(http_target: str) -> None:
    out = await make_worker().execute(lease("http", {"url": f"{http_target}/big"}))
    assert isinstance(out, Complete)
    assert len(out.result["body"]) == 64 * 1024 and out.result["truncated"] is True


async def test_http_timeout_is_retryable(http_target: str) -> None:
    out = await make_worker().execute(lease("http", {"url": f"{http_target}/slow", "timeout": 0.2}))
    assert isinstance(out, Fail) and out.retryable and "timed out after 0.2s" in out.error


@pytest.mark.parametrize(
    "payload,match",
    [
        ({"url": "file:///etc/passwd"}, "payload.url"),
        ({}, "payload.url"),
        ({"url": "http://x", "method": "GET /"}, "payload.method"),
        ({"url": "http://x", "headers": {"a": 1}}, "payload.headers"),
        ({"url": "http://x", "timeout": "soon"}, "payload.timeout"),
    ],
)
async def test_http_bad_payload_fails_for_good(payload: Any, match: str) -> None:
    out = await make_worker().execute(lease("http", payload))
    assert isinstance(out, Fail) and not out.retryable and match in out.error


async def test_http_connection_refused_is_retryable() -> None:
    out = await make_worker().execute(lease("http", {"url": "http://127.0.0.1:1/", "timeout": 5}))
    assert isinstance(out, Fail) and out.retryable and "failed" in out.error


def decode_json(text: str) -> Any:
    import orjson

    return orjson.loads(text)


# -- the protocol, against a scripted websocket server -----------------------------------------


class FakeServer:
    """A websocket endpoint that records every frame and answers hello as told."""

    def __init__(self, name: str = "n1") -> None:
        self.name = name
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.sockets: list[web.WebSocketResponse] = []
        self.auth: list[str | None] = []
        self.on_hello: Callable[[Hello], Message | None] = lambda h: Welcome(name, 0.05, 10.0)
        self.hellos: list[Hello] = []
        self.server: TestServer | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/workers/connect", self._connect)
        self.server = TestServer(app)
        await self.server.start_server()
        self.url = str(self.server.make_url("")).rstrip("/")

    async def close(self) -> None:
        for ws in self.sockets:
            await ws.close()
        if self.server is not None:
            await self.server.close()

    async def _connect(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.auth.append(request.headers.get("Authorization"))
        self.sockets.append(ws)
        async for frame in ws:
            if frame.type is not WSMsgType.TEXT:
                continue
            msg = decode(frame.data)
            await self.inbox.put(msg)
            if isinstance(msg, Hello):
                self.hellos.append(msg)
                reply = self.on_hello(msg)
                if reply is not None:
                    await ws.send_str(encode(reply))
                if isinstance(reply, Redirect):
                    await ws.close()
        return ws

    async def send(self, msg: Message | str) -> None:
        await self.sockets[-1].send_str(msg if isinstance(msg, str) else encode(msg))

    async def drop(self) -> None:
        await self.sockets[-1].close()

    async def expect(self, kind: type[Any], within: float = 5.0) -> Any:
        """The next frame of ``kind`` (heartbeats are skipped unless asked for)."""
        async with asyncio.timeout(within):
            while True:
                msg = await self.inbox.get()
                if isinstance(msg, kind):
                    return msg
                if not isinstance(msg, Heartbeat):
                    raise AssertionError(f"expected {kind.__name__}, got {msg!r}")

    def assert_quiet(self) -> None:
        others = []
        while not self.inbox.empty():
            msg = self.inbox.get_nowait()
            if not isinstance(msg, Heartbeat):
                others.append(msg)
        assert others == []


@pytest.fixture
async def fake() -> AsyncIterator[FakeServer]:
    s = FakeServer()
    await s.start()
    try:
        yield s
    finally:
        await s.close()


@contextlib.asynccontextmanager
async def serving(worker: Worker) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    runner = asyncio.create_task(worker.serve(stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(runner, 15)


async def until(cond: Callable[[], bool], within: float = 5.0) -> None:
    """Poll ``cond`` (the worker's state has no events to wait on from outside)."""
    async with asyncio.timeout(within):
        while not cond():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def gate_worker(fake: FakeServer, **kw: Any) -> tuple[Worker, asyncio.Event, list[Context]]:
    """A worker whose task ``t`` waits for ``gate`` and returns its payload."""
    w = make_worker(servers=fake.url, token="tok", worker_id="w1", **kw)
    gate = asyncio.Event()
    ctxs: list[Context] = []

    @w.task("t")
    async def handler(ctx: Context, payload: Any) -> Any:
        ctxs.append(ctx)
        await gate.wait()
        return payload

    return w, gate, ctxs


async def test_hello_lease_complete_ack(fake: FakeServer) -> None:
    w, gate, ctxs = gate_worker(fake, queues=["a", "b"], concurrency=3)
    async with serving(w):
        hello = await fake.expect(Hello)
        assert hello == Hello("w1", ("a", "b"), 3, (), tasks=("http", "t"))  # what it runs
        assert fake.auth == ["Bearer tok"]
        await until(lambda: w.connected)
        await fake.send(lease(payload={"x": 1}))
        await until(lambda: len(ctxs) == 1)
        beat = await fake.expect(Heartbeat)  # lists the running lease
        while beat.leases == ():
            beat = await fake.expect(Heartbeat)
        assert beat.leases == (LeaseRef("j@1", 5),)
        gate.set()
        assert await fake.expect(Complete) == Complete("j@1", 5, {"x": 1})
        assert w.leases == (LeaseRef("j@1", 5),)  # held until acked
        await fake.send(Ack("j@1", True))
        await until(lambda: w.leases == ())
        assert w.node_id == "n1"
    assert await fake.expect(Drain)


async def test_failure_and_unknown_task_are_reported(fake: FakeServer) -> None:
    w, _gate, _ctxs = gate_worker(fake)

    @w.task("boom")
    def boom(ctx: Context, payload: Any) -> Any:
        raise Boom("kaput")

    async with serving(w):
        await fake.expect(Hello)
        await until(lambda: w.connected)
        await fake.send(lease("boom", run_id="a@1", fence=1))
        failed = await fake.expect(Fail)
        assert replace(failed, traceback=None) == Fail("a@1", 1, "Boom: kaput", True)
        assert failed.traceback and "in boom" in failed.traceback
        await fake.send(lease("nope", run_id="b@1", fence=2))
        out = await fake.expect(Fail)
        assert out.run_id == "b@1" and not out.retryable and "unknown task 'nope'" in out.error
        await fake.send(Ack("a@1", True))
        await fake.send(Ack("b@1", True))
        await until(lambda: w.leases == ())


async def test_progress_is_reported_in_heartbeats(fake: FakeServer) -> None:
    w, gate, ctxs = gate_worker(fake)
    async with serving(w):
        await fake.expect(Hello)
        await until(lambda: w.connected)
        await fake.send(lease())
        await until(lambda: len(ctxs) == 1)
        ctxs[0].progress = {"done": 3, "of": 10}
        async with asyncio.timeout(5):
            while True:
                beat = await fake.expect(Heartbeat)
                if beat.leases and beat.leases[0].progress is not None:
                    break
        assert beat.leases == (LeaseRef("j@1", 5, {"done": 3, "of": 10}),)
        gate.set()
        await fake.expect(Complete)
        await fake.send(Ack("j@1", True))
        await until(lambda: w.leases == ())


async def test_cancel_stops_the_handler_and_sends_nothing(fake: FakeServer) -> None:
    w, _gate, ctxs = gate_worker(fake)
    async with serving(w):
        await fake.expect(Hello)
        await until(lambda: w.connected)
        await fake.send(lease())
        await until(lambda: len(ctxs) == 1)
        await fake.send(Cancel("j@1", 4))  # an older fence: not ours, ignored
        await asyncio.sleep(0.1)
        assert not ctxs[0].cancelled.is_set()
        await fake.send(Cancel("j@1", 5))
        await until(lambda: ctxs[0].cancelled.is_set() and w.leases == ())
        await asyncio.sleep(0.2)
        fake.assert_quiet()
    assert await fake.expect(Drain)
    fake.assert_quiet()


async def test_refused_result_is_forgotten_and_logged(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    w, gate, _ctxs = gate_worker(fake)
    gate.set()
    async with serving(w):
        await fake.expect(Hello)
        await until(lambda: w.connected)
        await fake.send(lease())
        await fake.expect(Complete)
        with caplog.at_level(logging.WARNING, logger="schedd.worker.client"):
            await fake.send(Ack("j@1", False, "stale fence"))
            await until(lambda: w.leases == ())
        assert any("stale fence" in r.getMessage() for r in caplog.records)


async def test_capacity_is_never_exceeded(fake: FakeServer) -> None:
    w, gate, ctxs = gate_worker(fake, concurrency=1)
    async with serving(w):
        assert (await fake.expect(Hello)).capacity == 1
        await until(lambda: w.connected)
        await fake.send(lease(run_id="a@1", fence=1))
        await fake.send(lease(run_id="b@1", fence=2))
        refused = await fake.expect(Fail)
        assert refused.run_id == "b@1" and refused.retryable and "capacity" in refused.error
        assert len(ctxs) == 1
        await fake.send(Ack("b@1", True))
        gate.set()
        assert (await fake.expect(Complete)).run_id == "a@1"
        await fake.send(Ack("a@1", True))
        await until(lambda: w.leases == ())


async def test_duplicate_lease_is_ignored(fake: FakeServer) -> None:
    w, gate, ctxs = gate_worker(fake)
    async with serving(w):
        await fake.expect(Hello)
        await until(lambda: w.connected)
        await fake.send(lease())
        await fake.send(lease())
        await asyncio.sleep(0.2)
        assert len(ctxs) == 1
        gate.set()
        await fake.expect(Complete)
        await fake.send(Ack("j@1", True))
        await until(lambda: w.leases == ())
        fake.assert_quiet()


async def test_bad_frames_are_survived_and_bad_leases_refused(fake: FakeServer) -> None:
    w, gate, _ctxs = gate_worker(fake)
    gate.set()
    async with serving(w):
        await fake.expect(Hello)
        await until(lambda: w.connected)
        await fake.send("not json")
        await fake.send('{"type": "mystery"}')
        await fake.send('{"type": "lease", "run_id": "x@1", "fence": 3, "task": 5}')
        refused = await fake.expect(Fail)
        assert refused.run_id == "x@1" and refused.fence == 3 and not refused.retryable
        assert "lease.job_id" in refused.error
        await fake.send(lease())  # the connection still works
        assert await fake.expect(Complete) == Complete("j@1", 5, None)
        await fake.send(Ack("j@1", True))
        await until(lambda: w.leases == ())
        assert len(fake.sockets) == 1


async def test_reconnect_resumes_and_resends_unacked_results(fake: FakeServer) -> None:
    w, gate, ctxs = gate_worker(fake)
    async with serving(w):
        await fake.expect(Hello)
        await until(lambda: w.connected)
        await fake.send(lease(run_id="a@1", fence=1))
        await fake.send(lease(run_id="b@1", fence=2))
        await until(lambda: len(ctxs) == 2)

        @w.task("quick")
        async def quick(ctx: Context, payload: Any) -> Any:
            return "done"

        await fake.send(lease("quick", run_id="c@1", fence=3))
        assert await fake.expect(Complete) == Complete("c@1", 3, "done")  # never acked
        await fake.drop()  # the socket drops while a@1 and b@1 run
        hello = await fake.expect(Hello)
        assert {(r.run_id, r.fence) for r in hello.resume} == {("a@1", 1), ("b@1", 2), ("c@1", 3)}
        # the unacked result is sent again after welcome, with the same fence
        assert await fake.expect(Complete) == Complete("c@1", 3, "done")
        assert len(ctxs) == 2  # nothing was re-run
        await fake.send(Ack("c@1", True))
        await fake.send(Cancel("b@1", 2))  # the new leader no longer knows b@1
        await until(lambda: {r.run_id for r in w.leases} == {"a@1"})
        gate.set()
        assert await fake.expect(Complete) == Complete("a@1", 1, None)
        await fake.send(Ack("a@1", True))
        await until(lambda: w.leases == ())
        assert len(fake.hellos) == 2


async def test_result_finished_while_disconnected_is_sent_after_welcome(
    fake: FakeServer,
) -> None:
    w, gate, ctxs = gate_worker(fake)
    # welcome the first connection only; the second one is welcomed by hand below
    fake.on_hello = lambda h: Welcome("n1", 0.05, 10) if len(fake.hellos) == 1 else None
    async with serving(w):
        await fake.expect(Hello)
        await until(lambda: w.connected)
        await fake.send(lease())
        await until(lambda: len(ctxs) == 1)
        await fake.drop()
        await fake.expect(Hello)  # reconnected, but no welcome yet
        gate.set()
        await asyncio.sleep(0.2)
        fake.assert_quiet()  # no result before welcome
        await fake.send(Welcome("n1", 0.05, 10))
        assert await fake.expect(Complete) == Complete("j@1", 5, None)
        await fake.send(Ack("j@1", True))
        await until(lambda: w.leases == ())


async def test_redirect_to_the_leader(fake: FakeServer) -> None:
    leader = FakeServer("leader")
    await leader.start()
    try:
        fake.on_hello = lambda h: Redirect(leader.url)
        w, gate, _ctxs = gate_worker(fake)
        gate.set()
        async with serving(w):
            await fake.expect(Hello)
            await leader.expect(Hello)
            await until(lambda: w.connected and w.node_id == "leader")
            await leader.send(lease())
            assert await leader.expect(Complete) == Complete("j@1", 5, None)
            await leader.send(Ack("j@1", True))
            await until(lambda: w.leases == ())
        assert await leader.expect(Drain)
        assert leader.auth == ["Bearer tok"]
    finally:
        await leader.close()


async def test_no_leader_yet_backs_off_and_retries(fake: FakeServer) -> None:
    answers = [Redirect(None), Redirect(None)]
    fake.on_hello = lambda h: answers.pop(0) if answers else Welcome("n1", 0.05, 10)
    w, _gate, _ctxs = gate_worker(fake)
    async with serving(w):
        await until(lambda: w.connected)
        assert len(fake.hellos) == 3


async def test_unreachable_server_rotates_to_the_next(fake: FakeServer) -> None:
    w = make_worker(servers=["http://127.0.0.1:1", fake.url])
    async with serving(w):
        await fake.expect(Hello)
        await until(lambda: w.connected)


async def test_drain_finishes_running_work_and_refuses_new(fake: FakeServer) -> None:
    w, gate, ctxs = gate_worker(fake, drain_timeout=5.0)
    stop = asyncio.Event()
    runner = asyncio.create_task(w.serve(stop))
    try:
        await fake.expect(Hello)
        await until(lambda: w.connected)
        await fake.send(lease(run_id="a@1", fence=1))
        await until(lambda: len(ctxs) == 1)
        stop.set()
        await fake.expect(Drain)
        await fake.send(lease(run_id="b@1", fence=2))  # raced with drain
        refused = await fake.expect(Fail)
        assert refused.run_id == "b@1" and refused.retryable and "draining" in refused.error
        await fake.send(Ack("b@1", True))
        assert not runner.done()
        gate.set()
        assert await fake.expect(Complete) == Complete("a@1", 1, None)
        await fake.send(Ack("a@1", True))
        await asyncio.wait_for(runner, 5)
    finally:
        stop.set()
        await asyncio.wait_for(runner, 15)


async def test_drain_timeout_returns_unfinished_work(fake: FakeServer) -> None:
    w, _gate, ctxs = gate_worker(fake, drain_timeout=0.3)
    stop = asyncio.Event()
    runner = asyncio.create_task(w.serve(stop))
    try:
        await fake.expect(Hello)
        await until(lambda: w.connected)
        await fake.send(lease())
        await until(lambda: len(ctxs) == 1)
        stop.set()
        await fake.expect(Drain)
        returned = await fake.expect(Fail)
        assert returned.run_id == "j@1" and returned.retryable
        assert "shut down" in returned.error
        assert ctxs[0].cancelled.is_set()
        await fake.send(Ack("j@1", True))
        await asyncio.wait_for(runner, 5)
    finally:
        stop.set()
        await asyncio.wait_for(runner, 15)


# -- demo tasks --------------------------------------------------------------------------------


async def test_demo_tasks() -> None:
    import schedd.worker.demo_tasks  # noqa: F401 - registers on the default registry

    w = Worker("http://x:1")
    assert await w.execute(lease("demo.echo", {"a": 1})) == Complete("j@1", 5, {"a": 1})
    assert await w.execute(lease("demo.sleep", {"seconds": 0.01})) == Complete(
        "j@1", 5, {"slept": 0.01}
    )
    out = await w.execute(lease("demo.fail", {}))
    assert isinstance(out, Fail) and out.retryable
    out = await w.execute(lease("demo.flaky", {"succeed_on": 2}, attempt=1))
    assert isinstance(out, Fail) and out.retryable
    assert await w.execute(lease("demo.flaky", {"succeed_on": 2}, attempt=2)) == Complete(
        "j@1", 5, {"attempt": 2}
    )


# -- the command line --------------------------------------------------------------------------


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from schedd.cli.worker import main; sys.exit(main())",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def test_cli_help() -> None:
    res = run_cli("--help")
    assert res.returncode == 0
    for flag in (
        "--server",
        "--token",
        "--token-file",
        "--queue",
        "--concurrency",
        "--import",
        "--allow-shell",
        "--worker-id",
        "--log-level",
    ):
        assert flag in res.stdout


@pytest.mark.parametrize(
    "args,word",
    [
        (("--bogus",), "unrecognized arguments"),
        (("--concurrency", "0"), "--concurrency"),
        (("--concurrency", "lots"), "--concurrency"),
        (("--log-level", "loud"), "--log-level"),
        (("--import", "no_such_module_for_schedd_tests"), "no_such_module_for_schedd_tests"),
        (("--token", "a", "--token-file", "/x"), "not allowed with"),
        (("--token-file", "/nonexistent/token"), "--token-file"),
    ],
)
def test_cli_usage_errors_exit_2(args: tuple[str, ...], word: str) -> None:
    res = run_cli(*args)
    assert res.returncode == 2, res.stderr
    assert "usage: schedd-worker" in res.stderr and word in res.stderr


def test_cli_main_returns_codes_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["--help"]) == 0
    assert cli_main(["--nope"]) == 2
    assert "usage:" in capsys.readouterr().err


def test_cli_an_unknown_log_format_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCHEDD_LOG_FORMAT", "xml")
    assert cli_main(["--server", "http://127.0.0.1:9", "--token", "t"]) == 2
    err = capsys.readouterr().err
    assert "SCHEDD_LOG_FORMAT" in err and "expected auto, json, text" in err
    assert "Traceback" not in err


def test_cli_console_script_is_installed() -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "schedd-worker")
    res = subprocess.run(
        [exe, "--definitely-not-a-flag"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and "usage: schedd-worker" in res.stderr


def test_cli_runs_and_drains_on_sigterm(tmp_path: Any) -> None:
    """The real entry point against a server that is not there: it keeps retrying, and SIGTERM
    makes it exit 0 promptly."""
    mod = tmp_path / "my_tasks.py"
    mod.write_text(
        "from schedd.worker import task\n@task('mine')\ndef mine(ctx, p):\n    return p\n"
    )
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from schedd.cli.worker import main; sys.exit(main())",
            "--server",
            "http://127.0.0.1:1",
            "--import",
            "my_tasks",
            "--token-file",
            str(token),
            "--log-level",
            "debug",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        assert proc.stderr is not None
        lines = []
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if "connect_failed" in line:
                break
        assert any("mine" in ln for ln in lines), lines  # the imported task is served
        proc.terminate()
        _out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "worker.drain" in err and "worker.stopped" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


TOKENS_TOML = (
    '[[token]]\nname = "r"\nsecret = "reader"\nrole = "read"\n'
    '[[token]]\nname = "a"\nsecret = "the-admin"\nrole = "admin"\n'
)


def resolve_token(
    argv: list[str], cwd: Any, monkeypatch: pytest.MonkeyPatch, env_token: str | None = None
) -> str | None:
    from schedd.cli.worker import _servers, _token, build_parser

    monkeypatch.chdir(cwd)
    monkeypatch.delenv("SCHEDD_SERVER", raising=False)
    if env_token is None:
        monkeypatch.delenv("SCHEDD_TOKEN", raising=False)
    else:
        monkeypatch.setenv("SCHEDD_TOKEN", env_token)
    parser = build_parser()
    args = parser.parse_args(argv)
    return _token(parser, args, _servers(args.server))


def test_cli_token_sources(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "plain").write_text("  abc \n")
    (tmp_path / "tokens.toml").write_text(TOKENS_TOML)
    assert resolve_token(["--token", "t"], tmp_path, monkeypatch, env_token="e") == "t"
    assert resolve_token(["--token-file", "plain"], tmp_path, monkeypatch) == "abc"
    assert resolve_token(["--token-file", "tokens.toml"], tmp_path, monkeypatch) == "the-admin"
    assert resolve_token([], tmp_path, monkeypatch, env_token="e") == "e"
    assert resolve_token([], tmp_path, monkeypatch) is None
    # a local `schedd` with no config keeps its admin token in ./.schedd/tokens.toml
    (tmp_path / ".schedd").mkdir()
    (tmp_path / ".schedd" / "tokens.toml").write_text(TOKENS_TOML)
    assert resolve_token([], tmp_path, monkeypatch) == "the-admin"
    assert (
        resolve_token(["--server", "http://localhost:7700"], tmp_path, monkeypatch) == "the-admin"
    )
    # ...but it is never sent to another machine
    assert resolve_token(["--server", "http://10.0.0.1:7700"], tmp_path, monkeypatch) is None
    assert (
        resolve_token(
            ["--server", "http://127.0.0.1:7700", "--server", "http://10.0.0.1:7700"],
            tmp_path,
            monkeypatch,
        )
        is None
    )


def test_cli_server_list_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from schedd.cli.worker import DEFAULT_SERVER, _servers

    monkeypatch.setenv("SCHEDD_SERVER", "http://a:1, http://b:2,")
    assert _servers(None) == ["http://a:1", "http://b:2"]
    assert _servers(["http://c:3,http://d:4", "http://e:5"]) == [
        "http://c:3",
        "http://d:4",
        "http://e:5",
    ]
    monkeypatch.delenv("SCHEDD_SERVER")
    assert _servers(None) == [DEFAULT_SERVER]


def test_a_refusal_says_what_to_change() -> None:
    from schedd.worker import WorkerRefused

    assert "role may not run workers (use a worker or admin token)" in str(
        WorkerRefused("http://n1:7700", 403, True)
    )
    assert "no token was given (pass --token" in str(WorkerRefused("http://n1:7700", 401, False))


async def test_a_drain_from_the_server_finishes_what_runs_refuses_more_and_is_repeated_on_reconnect(
    fake: FakeServer,
) -> None:
    w, gate, ctxs = gate_worker(fake)
    async with serving(w):
        await fake.expect(Hello)
        await until(lambda: w.connected)
        await fake.send(lease(run_id="a@1", fence=1))
        await until(lambda: len(ctxs) == 1)
        await fake.send(Drain())  # an operator drained this worker
        await fake.send(lease(run_id="b@1", fence=2))  # (a leader would not send it)
        refused = await fake.expect(Fail)
        assert (refused.run_id, refused.retryable) == ("b@1", True) and len(ctxs) == 1
        await fake.send(Ack("b@1", True))
        await fake.drop()  # a failover: the new leader hears it drains
        await fake.expect(Hello)
        assert await fake.expect(Drain) == Drain()
        gate.set()  # what it held it finishes
        assert await fake.expect(Complete) == Complete("a@1", 1, None)
        await fake.send(Ack("a@1", True))
        await until(lambda: w.leases == ())
        assert w.connected  # drained, not stopped


async def test_a_traceback_starts_at_the_handler_and_a_plain_non_retryable_has_none() -> None:
    w = make_worker()

    @w.task("t")
    async def handler(ctx: Context, payload: Any) -> Any:
        raise ValueError("bad record")

    out = await w.execute(lease())
    assert isinstance(out, Fail) and out.traceback is not None
    assert "schedd/worker" not in out.traceback and "in handler" in out.traceback

    @w.task("sync")
    def plain(ctx: Context, payload: Any) -> Any:
        raise ValueError("bad record")

    out = await w.execute(replace(lease(), task="sync"))
    assert isinstance(out, Fail) and out.traceback is not None
    assert "asyncio" not in out.traceback and "concurrent" not in out.traceback
    assert out.traceback.splitlines()[1].strip().endswith("in plain")

    @w.task("no")
    async def refuse(ctx: Context, payload: Any) -> Any:
        raise NonRetryable("the account is closed")

    out = await w.execute(replace(lease(), task="no"))
    assert isinstance(out, Fail) and not out.retryable and out.traceback is None

    @w.task("caused")
    async def caused(ctx: Context, payload: Any) -> Any:
        try:
            {}["x"]
        except KeyError as err:
            raise NonRetryable("missing field") from err

    out = await w.execute(replace(lease(), task="caused"))
    assert isinstance(out, Fail) and out.traceback is not None and "KeyError" in out.traceback
