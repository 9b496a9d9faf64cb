"""The worker: one websocket to the leader, leases in, results out, failover without re-runs.

A lease is *held* from the moment it arrives until the server acks its result (or cancels it).
Held leases are listed in every ``hello.resume`` and every heartbeat; a result whose ack never
came is sent again, with the same fence, after the next ``welcome``.  So a worker that loses its
socket keeps its handlers running, reconnects (the same server first, then the others, or the
leader a follower points to) and nothing it finished is run again.

One connection at a time: a socket is closed and done with before the next one is opened, so a
``hello.resume`` lists every lease this worker will ever get from its earlier connections (the
leader ends at once the leases it recorded for this worker id that are not listed).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import secrets
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from traceback import format_exception
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from schedd.aio import wait_event
from schedd.client.tasks import TaskHandle
from schedd.core.durations import parse_time
from schedd.errors import InvalidArgument
from schedd.net import TrustError, ca_context
from schedd.protocol.messages import (
    MAX_CAPACITY,
    MAX_FRAME_BYTES,
    Ack,
    Cancel,
    Complete,
    Drain,
    Error,
    Fail,
    Heartbeat,
    Hello,
    Lease,
    LeaseRef,
    Message,
    traceback_tail,
)
from schedd.protocol.timing import HANDSHAKE_TIMEOUT_S
from schedd.worker.builtins import SHELL_DISABLED, TaskFailed, builtin_handlers
from schedd.worker.connection import CONNECT_TIMEOUT, Connection, describe

# what this module's users import from it (the worker's API and its tests)
from schedd.worker.connection import STABLE_SESSION as STABLE_SESSION
from schedd.worker.connection import WorkerRefused as WorkerRefused
from schedd.worker.connection import backoff_delay as backoff_delay
from schedd.worker.connection import normalise_server as normalise_server
from schedd.worker.leases import Acked, Held, LeaseBook, progress_to_send
from schedd.worker.registry import (
    Context,
    Handler,
    NonRetryable,
    P,
    R,
    Registry,
    default_registry,
    is_async,
)

log = logging.getLogger(__name__)


def _log_to_stderr_unless_configured() -> logging.Handler | None:
    """A stderr handler at INFO for the worker's loggers when nothing handles their lines (no
    handler on them or the root; the program never configured logging); None otherwise."""
    worker_log = logging.getLogger("schedd.worker")
    if worker_log.hasHandlers():
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    worker_log.addHandler(handler)
    if worker_log.level == logging.NOTSET and logging.getLogger().level > logging.INFO:
        worker_log.setLevel(logging.INFO)
    return handler


ERROR_LIMIT = 8192  # characters of an error message sent to the server
MAX_RESULT_BYTES = MAX_FRAME_BYTES - 4096
#: an attempt stopped at its deadline (the job's ``timeout``): one wording for every run of every
#: job, so the dead-letter queue groups them, starting with what a DLQ error filter looks for
TIMEOUT_ERROR = "timeout: still running at its deadline (the job's timeout)"
#: a lease whose deadline had passed before the worker could start it
TIMEOUT_BEFORE_START = "timeout: its deadline had passed before it started (the job's timeout)"


SHUTDOWN_ERROR = "worker shut down before the task finished"


def tls_context(cafile: str | os.PathLike[str], what: str = "cafile") -> ssl.SSLContext:
    """A TLS context trusting only the CA certificates in ``cafile`` (PEM); ``ValueError``
    naming ``what`` when the file cannot be used."""
    try:
        return ca_context(cafile)
    except TrustError as exc:
        raise ValueError(f"{what}: {exc}") from None


class Worker:
    """A schedd worker.  See the module docstring and ``docs/worker-protocol.md``."""

    def __init__(
        self,
        servers: Sequence[str] | str,
        token: str | None = None,
        queues: Sequence[str] = ("default",),
        concurrency: int = 8,
        worker_id: str | None = None,
        registry: Registry | None = None,
        allow_shell: bool = False,
        drain_timeout: float = 30.0,
        cafile: str | os.PathLike[str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        raw = [servers] if isinstance(servers, str) else list(servers)
        self.servers = [normalise_server(s) for s in raw if s.strip()]
        if not self.servers:
            raise ValueError("servers: expected at least one server URL")
        if isinstance(queues, str):
            queues = [queues]
        self.queues = tuple(queues)
        if not self.queues or not all(isinstance(q, str) and q for q in self.queues):
            raise ValueError(f"queues: expected a non-empty list of queue names, got {queues!r}")
        if (
            isinstance(concurrency, bool)
            or not isinstance(concurrency, int)
            or not 1 <= concurrency <= MAX_CAPACITY
        ):
            raise ValueError(f"concurrency: expected 1..{MAX_CAPACITY}, got {concurrency!r}")
        self.concurrency = concurrency
        self.token = token
        self.worker_id = worker_id or (
            f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        self.registry = default_registry if registry is None else registry
        self.allow_shell = allow_shell
        self.drain_timeout = drain_timeout
        # https/wss: the CAs in cafile, or ssl_context as given, or the system's trusted CAs
        if cafile is not None and ssl_context is not None:
            raise ValueError("cafile, ssl_context: pass one or the other")
        self._ssl: ssl.SSLContext | bool = (
            tls_context(cafile) if cafile is not None else ssl_context or True
        )
        self._builtins = builtin_handlers(allow_shell)
        self._book = LeaseBook(concurrency)
        self._idle = asyncio.Event()
        self._idle.set()
        self._draining = False
        self._conn = Connection(self.servers, token, self._ssl, self)

    # -- registration ----------------------------------------------------------------------

    def task(self, name: str) -> Callable[[Callable[P, R]], TaskHandle[P, R]]:
        """Decorator: register a handler on this worker's registry (returns its
        :class:`~schedd.client.tasks.TaskHandle`)."""
        return self.registry.task(name)

    def served_tasks(self) -> tuple[str, ...]:
        """The tasks this worker runs (said in its hello: the leader leases it no others)."""
        return tuple(sorted({*self.registry.names(), *self._builtins}))

    def handler_for(self, name: str) -> Handler | None:
        return self.registry.get(name) or self._builtins.get(name)

    # -- introspection ---------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while welcomed on a live socket."""
        return self._conn.connected

    @property
    def node_id(self) -> str | None:
        """The node that welcomed this worker last."""
        return self._conn.node_id

    @property
    def leases(self) -> tuple[LeaseRef, ...]:
        """Every lease held: running, or finished with the result not yet acked."""
        return self._book.refs()

    # -- running ---------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM, then drain and return.  A second signal exits at once.

        When the program has not configured logging, the worker's own lines (where it connects,
        which node welcomed it, failures) go to stderr at INFO while it runs: a script that
        just calls ``run()`` still says what it is doing."""
        factory: Callable[[], asyncio.AbstractEventLoop] | None = None
        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
            pass
        handler = _log_to_stderr_unless_configured()
        try:
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(self._serve_until_signal())
        finally:
            if handler is not None:
                logging.getLogger("schedd.worker").removeHandler(handler)

    async def _serve_until_signal(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        main = asyncio.current_task()
        installed = []

        def on_signal(name: str) -> None:
            if stop.is_set():
                log.warning("worker.signal signal=%s second signal: exiting now", name)
                if main is not None:
                    main.cancel()
            else:
                log.info("worker.signal signal=%s draining (again to exit at once)", name)
                stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, on_signal, sig.name)
                installed.append(sig)
        try:
            await self.serve(stop)
        except asyncio.CancelledError:
            if not stop.is_set():
                raise
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    async def serve(self, stop: asyncio.Event | None = None) -> None:
        """Connect and work until ``stop`` is set, then drain: send ``drain``, take no new
        leases, wait up to ``drain_timeout`` for running handlers, hand back what is still
        running (``fail``, retryable) and wait briefly for the acks."""
        stop = stop or asyncio.Event()
        self._draining = False
        self._conn.bind()
        self._idle = asyncio.Event()
        if not self._book:
            self._idle.set()
        log.info(
            "worker.start worker_id=%s servers=%s queues=%s concurrency=%d tasks=%s",
            self.worker_id,
            ",".join(self.servers),
            ",".join(self.queues),
            self.concurrency,
            ",".join(sorted({*self.registry.names(), *self._builtins})),
        )
        timeout = aiohttp.ClientTimeout(
            total=None, connect=HANDSHAKE_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT
        )
        async with aiohttp.ClientSession(timeout=timeout) as session:
            conn = asyncio.create_task(self._conn.run(session), name="schedd-worker-conn")
            stopped = asyncio.create_task(stop.wait())
            try:
                await asyncio.wait({conn, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if conn.done():
                    conn.result()  # an unexpected error: let it out
                await self._drain()
            finally:
                stopped.cancel()
                conn.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await conn
                await self._abort_all()
                await self._conn.close()
        log.info("worker.stopped worker_id=%s", self.worker_id)

    async def _drain(self) -> None:
        self._draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout
        log.info("worker.drain held=%d timeout=%gs", len(self._book), self.drain_timeout)
        await self._conn.send(Drain())
        running = [h.task for h in self._book if h.task is not None and not h.task.done()]
        if running:
            await asyncio.wait(running, timeout=self.drain_timeout)
        for held in self._book:
            if held.outcome is None:
                log.warning(
                    "worker.drain_timeout run_id=%s returned to the server", held.lease.run_id
                )
                self._abandon(held)
                held.outcome = Fail(held.lease.run_id, held.lease.fence, SHUTDOWN_ERROR, True)
        for held in self._book:
            if not held.sent:
                await self._send_outcome(held)
        if self._book:
            await wait_event(self._idle, max(1.0, deadline - loop.time()))
        if self._book:
            log.warning("worker.drain_unacked run_ids=%s", ",".join(self._book.run_ids()))

    async def _abort_all(self) -> None:
        tasks = []
        for held in self._book:
            self._abandon(held)
            if held.task is not None:
                tasks.append(held.task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._book.clear()
        self._idle.set()

    # -- what the connection asks (Peer) ------------------------------------------------------

    def hello(self) -> Hello:
        return Hello(
            self.worker_id, self.queues, self.concurrency, self.leases, tasks=self.served_tasks()
        )

    async def welcomed(self) -> None:
        if self._draining:
            await self._conn.send(Drain())
        for held in self._book:
            held.sent = False
            await self._send_outcome(held)

    def beat_period(self, interval: float) -> float:
        return self._book.beat_period(interval)

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(self.leases)

    def held(self) -> int:
        return len(self._book)

    # -- messages from the server ----------------------------------------------------------

    async def dispatch(self, msg: Message) -> None:
        if isinstance(msg, Lease):
            await self._on_lease(msg)
        elif isinstance(msg, Ack):
            self._on_ack(msg)
        elif isinstance(msg, Cancel):
            self._on_cancel(msg)
        elif isinstance(msg, Drain):
            if not self._draining:
                log.warning(
                    "worker.drained_by_server held=%d: finishing the leases held, taking no new "
                    "ones (restart the worker to take work again)",
                    len(self._book),
                )
            self._draining = True
        elif isinstance(msg, Error):
            log.error("worker.server_error code=%s message=%s", msg.code, msg.message)
        else:
            log.warning("worker.unexpected_message type=%s", msg.TYPE)

    async def _on_lease(self, lease: Lease) -> None:
        ctx = Context(
            run_id=lease.run_id,
            job_id=lease.job_id,
            attempt=lease.attempt,
            fence=lease.fence,
            task=lease.task,
            scheduled_at=lease.scheduled_at,
            deadline=lease.deadline,
            idempotency_key=lease.idempotency_key,
            worker_id=self.worker_id,
        )
        got = self._book.receive(lease, ctx, self._draining)
        held = got.held
        if held is None:
            log.debug("worker.duplicate_lease run_id=%s fence=%d", lease.run_id, lease.fence)
            return
        if got.replaced is not None:
            log.info(
                "worker.lease_replaced run_id=%s fence=%d->%d",
                lease.run_id,
                got.replaced.lease.fence,
                lease.fence,
            )
            self._abandon(got.replaced)
        if lease.heartbeat_interval is not None:
            self._conn.beat_sooner.set()
        self._idle.clear()
        if got.refused is not None:
            log.warning("worker.lease_refused run_id=%s reason=%s", lease.run_id, got.refused)
            await self._send_outcome(held)
            return
        log.debug(
            "worker.lease run_id=%s task=%s attempt=%d fence=%d",
            lease.run_id,
            lease.task,
            lease.attempt,
            lease.fence,
        )
        held.task = asyncio.create_task(self._run(held), name=f"schedd-task:{lease.run_id}")

    def _on_ack(self, ack: Ack) -> None:
        kind, held = self._book.acked(ack)
        if held is None:
            log.debug("worker.ack_unknown run_id=%s", ack.run_id)
            return
        if kind is Acked.RUNNING:
            log.debug("worker.ack_running run_id=%s (kept)", ack.run_id)
            return
        if kind is Acked.REVOKED:
            log.warning(
                "worker.lease_refused_by_server run_id=%s fence=%d reason=%s",
                ack.run_id,
                held.lease.fence,
                ack.reason,
            )
            self._abandon(held)  # the lease is no longer ours: stop working on it
        elif kind is Acked.REFUSED:
            log.warning(
                "worker.result_refused run_id=%s fence=%d reason=%s",
                ack.run_id,
                held.lease.fence,
                ack.reason,
            )
        self._released()

    def _on_cancel(self, cancel: Cancel) -> None:
        held = self._book.cancelled(cancel)
        if held is None:
            log.debug("worker.cancel_ignored run_id=%s fence=%d", cancel.run_id, cancel.fence)
            return
        log.info("worker.cancel run_id=%s fence=%d", cancel.run_id, cancel.fence)
        self._abandon(held)
        self._released()

    def _abandon(self, held: Held) -> None:
        held.ctx.cancelled.set()
        if held.task is not None and not held.task.done():
            held.task.cancel()

    def _released(self) -> None:
        if not self._book:
            self._idle.set()

    # -- running handlers ------------------------------------------------------------------

    async def _run(self, held: Held) -> None:
        await _until(held.lease.not_before)
        outcome = await self.execute(held.lease, held.ctx)
        # Let other handlers due at the same instant start before this result is sent: sending
        # costs more than a short handler, and many runs leased ahead wake up together.
        await asyncio.sleep(0)
        if not self._book.finished(held, outcome):
            return  # cancelled or replaced meanwhile
        log.log(
            logging.INFO if isinstance(outcome, Fail) else logging.DEBUG,
            "worker.finished run_id=%s outcome=%s%s",
            held.lease.run_id,
            outcome.TYPE,
            f" error={outcome.error!r}" if isinstance(outcome, Fail) else "",
        )
        await self._send_outcome(held)

    async def _send_outcome(self, held: Held) -> None:
        if held.outcome is not None and not held.sent:
            held.sent = await self._conn.send(held.outcome)

    async def execute(self, lease: Lease, ctx: Context | None = None) -> Complete | Fail:
        """Run the handler for ``lease`` and map what happens to ``complete`` or ``fail``, with
        the handler's last ``ctx.progress`` (when it can be sent) and, when it raised, the tail
        of the traceback.

        Needs no server: handy to test handlers.  Raises only ``CancelledError`` (when the
        calling task is cancelled)."""
        if ctx is None:
            ctx = Context(
                lease.run_id,
                lease.job_id,
                lease.attempt,
                lease.fence,
                lease.task,
                lease.scheduled_at,
                lease.deadline,
                lease.idempotency_key,
                self.worker_id,
            )
        outcome = await self._outcome(lease, ctx)
        progress = progress_to_send(ctx)
        return outcome if progress is None else replace(outcome, progress=progress)

    async def _outcome(self, lease: Lease, ctx: Context) -> Complete | Fail:
        run_id, fence = lease.run_id, lease.fence
        handler = self.handler_for(lease.task)
        if handler is None:
            if lease.task == "shell":
                return Fail(run_id, fence, SHELL_DISABLED, retryable=False)
            known = ", ".join(sorted({*self.registry.names(), *self._builtins})) or "none"
            return Fail(
                run_id,
                fence,
                f"unknown task {lease.task!r} (this worker serves: {known})",
                retryable=False,
            )
        remaining = None
        if lease.deadline is not None:
            try:
                remaining = parse_time(lease.deadline, "lease.deadline") / 1000 - time.time()
            except InvalidArgument as exc:
                return Fail(run_id, fence, exc.message, retryable=False)
            if remaining <= 0:
                ctx.cancelled.set()
                return Fail(run_id, fence, TIMEOUT_BEFORE_START, retryable=True)
        try:
            async with asyncio.timeout(remaining) as window:
                result = await _call(handler, ctx, lease.payload)
        except TimeoutError as exc:
            if window.expired():
                ctx.cancelled.set()
                log.warning("worker.timeout run_id=%s deadline=%s", run_id, lease.deadline)
                return Fail(run_id, fence, TIMEOUT_ERROR, retryable=True)
            return _failure(run_id, fence, exc, handler)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being cancelled: no result
            return _failure(run_id, fence, exc, handler)
        except Exception as exc:  # noqa: BLE001 - the task's failure is the run's result
            return _failure(run_id, fence, exc, handler)
        try:
            raw = orjson.dumps(result)
        except TypeError as exc:
            return Fail(run_id, fence, f"result is not JSON-serialisable: {exc}", retryable=False)
        if len(raw) > MAX_RESULT_BYTES:
            return Fail(
                run_id,
                fence,
                f"result is {len(raw)} bytes; the limit is {MAX_RESULT_BYTES}",
                retryable=False,
            )
        return Complete(run_id, fence, orjson.loads(raw))


async def _call(handler: Handler, ctx: Context, payload: Any) -> Any:
    if is_async(handler):
        result = await handler(ctx, payload)
    else:
        result = await asyncio.to_thread(handler, ctx, payload)
    if inspect.isawaitable(result):
        result = await result
    return result


def _failure(
    run_id: str, fence: int, exc: BaseException, handler: Callable[..., Any] | None = None
) -> Fail:
    """The ``fail`` of ``handler`` that raised ``exc``: its one-line description and the tail of
    its traceback (not for a built-in task's own failure, whose message says it all)."""
    retryable = not isinstance(exc, NonRetryable)
    if isinstance(exc, NonRetryable | TaskFailed):
        log.warning(
            "worker.task_failed run_id=%s retryable=%s error=%s", run_id, retryable, describe(exc)
        )
    else:
        log.warning("worker.task_raised run_id=%s", run_id, exc_info=exc)
    tb = None
    # a deliberate NonRetryable says it all, unless it is raised from another error (its cause)
    said = isinstance(exc, TaskFailed) or (isinstance(exc, NonRetryable) and exc.__cause__ is None)
    if not said:
        # as Python prints it (chained exceptions included), from the handler's own frame on
        # (the frames that led to it, this SDK's and the thread pool's, are every run's), the
        # end kept: the innermost frames
        tb = traceback_tail("".join(format_exception(type(exc), exc, _from(exc, handler))))
    return Fail(run_id, fence, describe(exc), retryable=retryable, traceback=tb)


def _from(exc: BaseException, handler: Callable[..., Any] | None) -> TracebackType | None:
    """``exc``'s traceback from the frame of ``handler``'s own code on (all of it when that
    frame is not in it)."""
    code = getattr(inspect.unwrap(handler), "__code__", None) if handler is not None else None
    frames = exc.__traceback__
    while frames is not None and frames.tb_frame.f_code is not code:
        frames = frames.tb_next
    return frames if frames is not None else exc.__traceback__


async def _until(not_before: str | None) -> None:
    """Wait until ``not_before`` (a lease handed out ahead of its due time) on this worker's
    clock; never return before it."""
    if not_before is None:
        return
    start = parse_time(not_before, "lease.not_before") / 1000
    # A wall-clock instant, not an event: sleep, and again if the loop's monotonic timer woke a
    # little before the wall clock got there.
    while (wait := start - time.time()) > 0:  # noqa: ASYNC110
        await asyncio.sleep(wait)
