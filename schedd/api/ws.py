"""The worker websocket endpoint: it only moves frames between a socket and the leader."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import weakref
from dataclasses import dataclass

from aiohttp import WSMsgType, web

from schedd import clock
from schedd.aio import within
from schedd.api.ports import CONFIG, NODE, RAFT, SOCKETS, Node, Raft, WorkerHub, peer
from schedd.leader.workers import WorkerConn
from schedd.logs import log_event
from schedd.protocol import messages
from schedd.protocol.messages import ProtocolError
from schedd.protocol.timing import HELLO_HOLD_S, HELLO_TIMEOUT_S

log = logging.getLogger(__name__)

MAX_FRAME = 1 << 20
# A hello that reaches a node which neither leads nor knows a leader it can reach (an election
# is going on: the leader died, or this node is the new leader still rebuilding) is held up to
# HELLO_HOLD_S until it does, then answered: welcome, or a redirect to the new leader.  So a fleet
# of workers that lost its leader waits on the followers, one connection each, instead of
# polling them, and reconnects the moment a leader is known.  Under the SDK's handshake
# timeout (both in schedd/protocol/timing.py).
LOOK_EVERY_S = 0.02  # one look at "who leads" per period, shared by every hello held
# Workers held through an election are released at once when a leader is known; each waits a
# random part of (held x SPREAD_PER_HELD_S, at most SPREAD_MAX_S) first, so hundreds of
# reconnections do not reach the new leader in the same millisecond (its listen backlog).
SPREAD_PER_HELD_S = 0.001
SPREAD_MAX_S = 0.5


async def worker_connect(request: web.Request) -> web.StreamResponse:
    sockets = request.app[SOCKETS]
    ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=MAX_FRAME)
    await ws.prepare(request)
    sockets.add(ws)
    try:
        return await _serve(request, ws)
    finally:
        sockets.discard(ws)


async def _serve(request: web.Request, ws: web.WebSocketResponse) -> web.WebSocketResponse:
    app = request.app
    try:
        first = await within(ws.receive(), HELLO_TIMEOUT_S)
        if first.type is not WSMsgType.TEXT:
            await ws.close()
            return ws
        hello = messages.decode(first.data)
        if not isinstance(hello, messages.Hello):
            raise ProtocolError(f"expected a hello frame first, got {type(hello).__name__.lower()}")
    except (TimeoutError, ProtocolError) as exc:
        await ws.send_str(
            messages.encode(messages.Error(code="invalid_argument", message=str(exc)))
        )
        await ws.close()
        return ws

    leader, url = await place(Where(app[NODE], app[RAFT]), ws)
    if leader is None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.send_str(messages.encode(messages.Redirect(leader=url)))
        await ws.close()
        return ws

    conn = new_conn(hello, app[CONFIG].node.id, peer(request))
    conn.send(welcome(app))
    leader.connect(conn, hello.resume)
    writer = asyncio.create_task(_write(ws, conn))
    try:
        async for frame in ws:
            if frame.type is not WSMsgType.TEXT:
                continue
            on_frame(leader, conn, frame.data)
            if conn.closed:
                break
    finally:
        leader.disconnect(conn)
        conn.close()
        with contextlib.suppress(Exception):
            await writer
        if not ws.closed:
            await ws.close()
    return ws


def new_conn(
    hello: messages.Hello,
    node: str,
    host: str | None,
    whole_capacity: int | None = None,
    outbox: asyncio.Queue[str | None] | None = None,
) -> WorkerConn:
    """The leader's connection for a worker that said ``hello`` (through ``node``, from
    ``host``), heard now."""
    connected = clock.wall_ms()
    return WorkerConn(
        hello.worker_id,
        hello.queues,
        hello.capacity,
        connected,
        None if hello.tasks is None else frozenset(hello.tasks),
        node=node,
        host=host,
        heard_ms=connected,
        whole_capacity=whole_capacity,
        outbox=asyncio.Queue() if outbox is None else outbox,
    )


def on_frame(leader: WorkerHub, conn: WorkerConn, text: str) -> None:
    """One frame from the worker of ``conn``, to its leader."""
    leader.heard(conn)
    try:
        msg = messages.decode(text)
    except ProtocolError as exc:
        conn.send(messages.Error(code="invalid_argument", message=str(exc)))
        return
    if isinstance(msg, messages.Heartbeat):
        leader.heartbeat(conn, msg.leases)
    elif isinstance(msg, messages.Complete | messages.Fail):
        leader.finish(conn, msg)  # acked on this connection once committed
    elif isinstance(msg, messages.Capacity):
        leader.set_capacity(conn, msg.capacity)
    elif isinstance(msg, messages.Drain):
        conn.draining = True
        log_event(log, "worker.draining", worker_id=conn.worker_id)
    else:
        conn.send(
            messages.Error(
                code="invalid_argument",
                message=f"unexpected {type(msg).__name__.lower()} frame",
            )
        )


def welcome(app: web.Application) -> messages.Welcome:
    cfg = app[CONFIG]
    return messages.Welcome(
        node_id=cfg.node.id,
        heartbeat_interval=cfg.scheduler.heartbeat_interval_ms / 1000,
        lease_timeout=cfg.scheduler.heartbeat_timeout_ms / 1000,
    )


@dataclass(frozen=True, slots=True)
class Where:
    """What a hello's placement looks at: the node (its leader, whether it drains, the leader's
    URL) and its Raft replica (who leads, and whether that leader is connected)."""

    node: Node
    raft: Raft


async def place(where: Where, ws: web.WebSocketResponse) -> tuple[WorkerHub | None, str | None]:
    """Where a worker's hello goes: (this node's leader once ready, None), or (None, the URL of
    the leader to redirect to, None when none is known), holding it up to ``HELLO_HOLD_S`` while
    this node neither leads nor reaches a leader it can name."""
    node = where.node
    leader, url, settled = _look(where)
    if settled or node.draining:
        return leader, url
    looks = _LOOKS.get(node)
    if looks is None:
        looks = _LOOKS[node] = _Looks(where)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HELLO_HOLD_S
    looks.held += 1
    try:
        while not settled:
            if loop.time() >= deadline or ws.closed or node.draining:
                return None, node.leader_url()
            leader, url, settled = await looks.next()
        held = looks.held
    finally:
        looks.held -= 1
    if leader is None and held > 1:
        await asyncio.sleep(random.uniform(0.0, min(SPREAD_MAX_S, held * SPREAD_PER_HELD_S)))
    return leader, url


def _look(where: Where) -> tuple[WorkerHub | None, str | None, bool]:
    """(this node's ready leader, None, True) · (None, a leader URL this node reaches, True) ·
    (None, the leader URL it last heard of, False) while that is not settled."""
    node, raft = where.node, where.raft
    leader = node.leader
    if leader is not None and leader.ready.is_set():
        return leader, None, True
    if leader is not None or raft.is_leader:
        return None, None, False  # elected here: claiming and rebuilding
    url = node.leader_url()
    addr = raft.leader_addr
    if url is None or addr is None:
        return None, url, False
    # A follower names its leader until its own election timeout runs out, also one that
    # died: only a leader its Raft connection still reaches is named without waiting.
    return None, url, raft.leader_reachable()


class _Looks:
    """``_look`` once per ``LOOK_EVERY_S`` for all the hellos held on this node."""

    def __init__(self, where: Where) -> None:
        self.where = where
        self.held = 0
        self._next: asyncio.Future[tuple[WorkerHub | None, str | None, bool]] | None = None

    async def next(self) -> tuple[WorkerHub | None, str | None, bool]:
        fut = self._next
        if fut is None or fut.done():
            loop = asyncio.get_running_loop()
            fut = self._next = loop.create_future()
            loop.call_later(LOOK_EVERY_S, self._resolve, fut)
        return await asyncio.shield(fut)

    def _resolve(self, fut: asyncio.Future[tuple[WorkerHub | None, str | None, bool]]) -> None:
        if fut.done():
            return
        try:
            fut.set_result(_look(self.where))
        except Exception:  # a look that failed is "not settled yet"
            log.debug("ws.look_failed", exc_info=True)
            fut.set_result((None, None, False))


_LOOKS: weakref.WeakKeyDictionary[Node, _Looks] = weakref.WeakKeyDictionary()


async def _write(ws: web.WebSocketResponse, conn: WorkerConn) -> None:
    while True:
        text = await conn.outbox.get()
        if text is None:
            await ws.close()
            return
        await ws.send_str(text)
