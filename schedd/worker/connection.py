"""The worker's connection to the cluster: one websocket at a time, opened again by how the
last one ended (the rules are :meth:`Connection.run`'s), the ``hello`` and ``welcome``, the
heartbeats, and the frames the worker sends on it.  What it says and what it does with the
server's frames is the worker's (:class:`Peer`, :class:`schedd.worker.client.Worker`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from schedd.aio import wait_event
from schedd.protocol.messages import (
    MAX_FRAME_BYTES,
    Fail,
    Heartbeat,
    Hello,
    Message,
    ProtocolError,
    Redirect,
    Welcome,
    decode,
    encode,
)
from schedd.protocol.timing import CONNECT_PATH, HANDSHAKE_TIMEOUT_S

#: the worker's lines keep one logger name, whichever module says them
log = logging.getLogger("schedd.worker.client")

BACKOFF_MIN = 0.1
BACKOFF_MAX = 2.0
# After a "no leader yet" answer (a redirect naming no leader, or naming one that cannot be
# reached, or a 503): the cluster answers but is electing a leader, which takes about a Raft
# election timeout.  Retry soon, jittered, without growing the backoff, for NO_LEADER_QUICK_FOR
# seconds of such answers in a row; then the backoff grows as for any failure (a cluster that
# lost its quorum is not polled this often by every worker of a fleet forever).  A server holds
# a hello up to HELLO_HOLD_S (3 s, schedd/protocol/timing.py) until it knows a leader, so
# against a current server these retries are rare: one connection per worker per hold, not 5-10
# a second.
NO_LEADER_RETRY = (0.1, 0.2)  # seconds: uniform
NO_LEADER_QUICK_FOR = 5.0
# A server that could not be reached (refused, timed out) is passed over for this long while
# another may answer: the rotation skips it and a redirect to it is not followed (an older
# follower names the dead leader until it learns the new one: at once when the leader's process
# died, after its election timeout, 1-2 s by default, when its host vanished).  Short, because a node that was down may come back and be elected (or, at start,
# be the leader before its HTTP port listens): then this is what its first workers lose.
DOWN_FOR = 1.0
NEXT_SERVER_MAX = 0.1  # seconds (uniform from 0) before trying the next server after one is down
CONNECT_TIMEOUT = 3.0  # the TCP connect: a dead host answers nothing, not even a refusal
WS_PING = 15.0  # websocket-level ping: notices a dead peer between protocol frames
MAX_REDIRECTS = 5  # in a row, before backing off
STABLE_SESSION = 5.0  # seconds welcomed before a drop stops counting as a failure
ERROR_LIMIT = 8192  # characters of an error message sent to the server

WebSocket = aiohttp.ClientWebSocketResponse


def backoff_delay(failures: int, rand: float) -> float:
    """Seconds to wait after ``failures`` (≥ 1) failed attempts in a row: 0.1 s doubling to 2 s,
    with "equal jitter" (``rand`` in [0, 1) picks a point in the upper half of the step)."""
    base = min(BACKOFF_MAX, BACKOFF_MIN * 2.0 ** max(0, min(failures - 1, 16)))
    return base * (0.5 + rand / 2)


def no_leader_delay(rand: float) -> float:
    """Seconds to wait after a "no leader yet" answer (``rand`` in [0, 1)): 0.1-0.2 s."""
    low, high = NO_LEADER_RETRY
    return low + (high - low) * rand


def normalise_server(url: str) -> str:
    """``10.0.0.1:7700`` → ``http://10.0.0.1:7700``; trailing slashes dropped."""
    text = url.strip().rstrip("/")
    if "://" not in text:
        text = "http://" + text
    if not text.startswith(("http://", "https://", "ws://", "wss://")) or text.endswith("://"):
        raise ValueError(f"server: expected an http(s) URL like http://10.0.0.1:7700, got {url!r}")
    return text


def describe(exc: BaseException) -> str:
    """``"Type: message"`` (or just ``"Type"``), bounded."""
    text = str(exc)
    out = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return out if len(out) <= ERROR_LIMIT else out[: ERROR_LIMIT - 3] + "..."


class WorkerRefused(Exception):
    """A server refused the worker's credentials: 401 (no token, or one it does not know) or
    403 (the token's role may not run workers).  Retrying cannot help: :meth:`Worker.serve`
    stops with this error, and ``schedd-worker`` exits with status 3."""

    def __init__(self, server: str, status: int, token_given: bool) -> None:
        self.server, self.status, self.token_given = server, status, token_given
        if status == 403:
            why = "the token's role may not run workers (use a worker or admin token)"
        elif token_given:
            why = "the server does not know the token that was given"
        else:
            why = (
                "no token was given (pass --token, --token-file or SCHEDD_TOKEN; token= in the SDK)"
            )
        super().__init__(f"{server} refused the worker ({status}): {why}")


@dataclass(frozen=True)
class _End:
    """How one connection ended."""

    # "unreachable" (no answer: refused, timed out) | "failed" (answered, never welcomed) |
    # "dropped" (after welcome) | "redirect" (``leader`` None: no leader yet; a 503 too)
    kind: str
    welcomed: bool = False
    leader: str | None = None


def _is_down(down: dict[str, float], url: str, now: float) -> bool:
    """``url`` could not be reached within the last ``DOWN_FOR`` seconds."""
    when = down.get(url)
    return when is not None and now - when < DOWN_FOR


class Peer(Protocol):
    """What a :class:`Connection` asks of its worker."""

    def hello(self) -> Hello:
        """The ``hello`` to open each connection with."""

    async def welcomed(self) -> None:
        """Welcomed (the socket is ready to send on): say what must be said again."""

    async def dispatch(self, msg: Message) -> None:
        """A frame from the server (other than ``welcome`` and ``redirect``)."""

    def beat_period(self, interval: float) -> float:
        """Seconds between heartbeats, the server asking for ``interval``."""

    def heartbeat(self) -> Heartbeat:
        """The next heartbeat."""

    def held(self) -> int:
        """How many leases the worker holds (for the log)."""


class Connection:
    """The worker's one connection at a time to the servers ``servers``."""

    def __init__(
        self, servers: list[str], token: str | None, ssl: ssl.SSLContext | bool, peer: Peer
    ) -> None:
        self.servers = servers
        self.token = token
        self._ssl = ssl
        self.peer = peer
        self._ws: WebSocket | None = None  # set between welcome and the socket's end
        self._send_lock = asyncio.Lock()
        self.beat_sooner = asyncio.Event()  # a lease asks for more frequent heartbeats
        self._failures = 0  # connection attempts in a row that did not reach welcome
        self.node_id: str | None = None  # the node that welcomed us last

    @property
    def connected(self) -> bool:
        """True while welcomed on a live socket."""
        return self._ws is not None and not self._ws.closed

    def bind(self) -> None:
        """Use the running event loop (a worker may serve again, on another loop)."""
        self._send_lock = asyncio.Lock()

    async def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            await ws.close()

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Connect, and reconnect whenever the socket ends.  How soon, by how it ended:

        * welcomed, then dropped: the same server again after ``backoff_delay`` (50-100 ms
          after a session that lasted ``STABLE_SESSION``; growing while sessions end sooner);
        * redirected: at once to the leader named (up to ``MAX_REDIRECTS`` in a row), unless it
          could not be reached within the last ``DOWN_FOR`` seconds;
        * "no leader yet": a redirect naming no (usable) leader, a 503, or a leader named by a
          redirect that cannot be reached.  The cluster answers but is electing: the next
          server after ``no_leader_delay`` (0.1-0.2 s), the backoff not growing, for
          ``NO_LEADER_QUICK_FOR`` seconds of such answers in a row; then the backoff grows;
        * unreachable: the next server not found unreachable within ``DOWN_FOR`` after 0-0.1 s;
          when every server is unreachable, the backoff grows (to ``BACKOFF_MAX``);
        * failed otherwise (401/403 at the upgrade, no welcome in time, ...): the backoff grows,
          the next server.
        """
        loop = asyncio.get_running_loop()
        target = origin = self.servers[0]  # origin: the last server of the rotation tried
        failures = 0  # attempts in a row that failed: the backoff's exponent
        redirects = 0
        leaderless_since: float | None = None  # the first "no leader yet" of a streak
        leaderless = 0
        down: dict[str, float] = {}  # server -> when it last could not be reached
        while True:
            began = loop.time()
            end = await self._session(session, target)
            now = loop.time()
            if end.kind == "unreachable":
                down[target] = now
            else:
                down.pop(target, None)
            if end.welcomed:
                leaderless_since, leaderless = None, 0
                if now - began >= STABLE_SESSION:
                    failures = self._failures = 0
            leader = None
            with contextlib.suppress(ValueError):
                leader = normalise_server(end.leader) if end.leader else None
            if (
                end.kind == "redirect"
                and leader
                and leader != target
                and redirects < MAX_REDIRECTS
                and not _is_down(down, leader, now)
            ):
                log.info("worker.redirect from=%s to=%s", target, leader)
                target, redirects = leader, redirects + 1
                continue
            no_leader = end.kind == "redirect" or (end.kind == "unreachable" and redirects > 0)
            redirects = 0
            if no_leader:
                if leaderless_since is None:
                    leaderless_since = now
                leaderless += 1
                quick = now - leaderless_since < NO_LEADER_QUICK_FOR
                log.log(
                    logging.INFO if leaderless < 3 or leaderless % 30 == 0 else logging.DEBUG,
                    "worker.no_leader server=%s leader=%s answers=%d: trying %s",
                    target,
                    leader or "unknown",
                    leaderless,
                    "again soon" if quick else "again with backoff",
                )
                if quick:
                    delay = no_leader_delay(random.random())
                else:
                    failures += 1
                    delay = backoff_delay(failures, random.random())
                # on from the server that answered, not from a leader it named that is gone
                target = origin = self._next_server(origin, down, now)[0]
            elif end.kind == "unreachable":
                nxt, fresh = self._next_server(target, down, now)
                if fresh:  # another server may answer: no backoff for this one
                    delay = random.uniform(0.0, NEXT_SERVER_MAX)
                else:
                    failures += 1
                    delay = backoff_delay(failures, random.random())
                target = origin = nxt
            else:  # dropped, or failed
                failures += 1
                delay = backoff_delay(failures, random.random())
                if end.kind != "dropped":  # after a drop: the same server first
                    target = origin = self._next_server(target, down, now)[0]
            self._failures = failures
            log.debug(
                "worker.reconnect target=%s in=%.3fs after=%s failures=%d",
                target,
                delay,
                "no_leader" if no_leader else end.kind,
                failures,
            )
            await asyncio.sleep(delay)

    def _loud(self) -> bool:
        """Log connection trouble for the first attempts of a streak and now and then after."""
        return self._failures < 3 or self._failures % 30 == 0

    def _next_server(self, current: str, down: dict[str, float], now: float) -> tuple[str, bool]:
        """The server after ``current`` in the rotation that has not been found unreachable
        within ``DOWN_FOR`` (and True), or, when there is none, simply the next one (and False).
        A ``current`` outside the list (a leader named by a redirect) rotates from the start."""
        n = len(self.servers)
        first = (self.servers.index(current) + 1) % n if current in self.servers else 0
        order = [self.servers[(first + k) % n] for k in range(n)]
        for url in order:
            if not _is_down(down, url, now):
                return url, True
        return order[0], False

    async def _session(self, session: aiohttp.ClientSession, target: str) -> _End:
        url = target + CONNECT_PATH
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            async with session.ws_connect(
                url,
                headers=headers,
                heartbeat=WS_PING,
                max_msg_size=MAX_FRAME_BYTES * 4,
                ssl=self._ssl,
            ) as ws:
                return await self._converse(ws, target)
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status == 503:  # no quorum / no leader yet: the server answers, try soon
                log.log(
                    logging.INFO if self._loud() else logging.DEBUG,
                    "worker.connect_refused server=%s status=503 %s",
                    target,
                    exc.message,
                )
                return _End("redirect")
            if exc.status in (401, 403):  # retrying cannot help: stop, saying why
                raise WorkerRefused(target, exc.status, self.token is not None) from None
            log.log(
                logging.WARNING if self._loud() else logging.DEBUG,
                "worker.connect_refused server=%s status=%s %s",
                target,
                exc.status,
                exc.message,
            )
        except aiohttp.ClientConnectorCertificateError as exc:
            log.log(
                logging.ERROR if self._loud() else logging.DEBUG,
                "worker.connect_failed server=%s TLS certificate refused: %s (pass cafile= / "
                "--cacert / SCHEDD_CACERT with the CA that signed the server's certificate)",
                target,
                exc.certificate_error,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.log(
                logging.WARNING if self._loud() else logging.DEBUG,
                "worker.connect_failed server=%s failures=%d error=%s",
                target,
                self._failures + 1,
                describe(exc),
            )
            return _End("unreachable")
        return _End("failed")

    async def _converse(self, ws: WebSocket, target: str) -> _End:
        hello = self.peer.hello()
        if not await self.send_on(ws, hello):
            return _End("failed")
        welcomed = False
        beats: asyncio.Task[None] | None = None
        try:
            while True:
                try:
                    frame = await ws.receive(timeout=None if welcomed else HANDSHAKE_TIMEOUT_S)
                except TimeoutError:
                    log.warning("worker.handshake_timeout server=%s", target)
                    return _End("failed")
                if frame.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    log.info("worker.disconnected server=%s code=%s", target, ws.close_code)
                    return _End("dropped" if welcomed else "failed", welcomed)
                try:
                    msg = decode(frame.data)
                except ProtocolError as exc:
                    log.warning("worker.bad_frame server=%s error=%s", target, exc.message)
                    await self._refuse_bad_lease(ws, frame.data, exc)
                    continue
                if isinstance(msg, Welcome):
                    welcomed = True
                    beats = await self._on_welcome(ws, msg, beats)
                elif isinstance(msg, Redirect):
                    return _End("redirect", welcomed, msg.leader)
                else:
                    await self.peer.dispatch(msg)
        finally:
            if self._ws is ws:
                self._ws = None
            if beats is not None:
                beats.cancel()

    async def _refuse_bad_lease(self, ws: WebSocket, data: Any, exc: ProtocolError) -> None:
        """A lease frame we cannot read but can name: fail it for good rather than let it
        expire and come back, forever."""
        try:
            obj = orjson.loads(data)
        except (orjson.JSONDecodeError, TypeError):
            return
        if not isinstance(obj, dict) or obj.get("type") != "lease":
            return
        run_id, fence = obj.get("run_id"), obj.get("fence")
        if isinstance(run_id, str) and run_id and type(fence) is int and fence >= 0:
            error = f"worker could not read the lease: {exc.message}"
            await self.send_on(ws, Fail(run_id, fence, error, retryable=False))

    async def _on_welcome(
        self, ws: WebSocket, msg: Welcome, beats: asyncio.Task[None] | None
    ) -> asyncio.Task[None]:
        log.info(
            "worker.welcome node=%s heartbeat_interval=%gs lease_timeout=%gs resumed=%d",
            msg.node_id,
            msg.heartbeat_interval,
            msg.lease_timeout,
            self.peer.held(),
        )
        self.node_id = msg.node_id
        self._ws = ws
        if beats is not None:
            beats.cancel()
        beats = asyncio.create_task(self._heartbeats(max(0.05, msg.heartbeat_interval)))
        await self.peer.welcomed()
        return beats

    async def _heartbeats(self, interval: float) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            wait = last + self.peer.beat_period(interval) - loop.time()
            if wait > 0:
                self.beat_sooner.clear()
                # woken early by a lease that asks for a shorter period: measure again
                await wait_event(self.beat_sooner, wait)
                continue
            last = loop.time()
            await self.send(self.peer.heartbeat())

    async def send_on(self, ws: WebSocket, msg: Message) -> bool:
        try:
            text = encode(msg)
        except ProtocolError as exc:  # pragma: no cover - every value we send is JSON
            log.error("worker.encode_failed type=%s error=%s", msg.TYPE, exc.message)
            return False
        try:
            async with self._send_lock:
                await ws.send_str(text)
        except (ConnectionError, aiohttp.ClientError, RuntimeError) as exc:
            log.debug("worker.send_failed type=%s error=%s", msg.TYPE, describe(exc))
            return False
        return True

    async def send(self, msg: Message) -> bool:
        ws = self._ws
        if ws is None or ws.closed:
            return False
        return await self.send_on(ws, msg)
