"""``GET /internal/shard-link``: one websocket from a node's front door to this shard's leader,
carrying the worker connections of every worker that front door serves (a cluster of several
shards), instead of a websocket per worker.

Each message, both ways, is a JSON list of envelopes, what one turn of the sender's loop
produced: ``{"w": n, "t": kind, ...}`` where ``n`` names a worker's session on the front
door, and ``kind`` is

* ``hello`` (from the front door): the worker's hello frame for this shard (``f``), the node
  whose websocket it holds (``node``), its address (``host``) and its whole capacity
  (``whole``); answered, as on a worker's own connection, by a ``welcome`` frame;
* ``frame``: one frame of the worker protocol (``f``), as the worker or the leader sent it;
* ``bye``: the worker's connection ends (it left, or the leader closed it: the front door says
  hello again for it);
* ``redirect`` (from here, with no ``w``): this node's process does not lead the shard (any
  more): ``leader`` is the URL of the node that does (null: none known yet).

No token: the upgrade carries ``X-Schedd-Link: <at>.<proof>`` (the sender's clock and an
HMAC-SHA256 of it with the Raft secret, as a join does), and a cluster without one takes links
from its own machine only.  The front door authenticated each worker before it said hello for
it.  A link lost ends every worker connection on it: their leases wait for the front door's
next hello with ``resume``, as after a worker's own reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from schedd.aio import PerTurn
from schedd.api.caps import check_signed
from schedd.api.ports import CONFIG, NODE, RAFT, SOCKETS, WorkerHub, peer
from schedd.api.ws import Where, new_conn, on_frame, place, welcome
from schedd.leader.workers import WorkerConn
from schedd.logs import log_event
from schedd.protocol import messages
from schedd.protocol.messages import ProtocolError
from schedd.protocol.signed import LINK_HEADER, MAX_LINK_MESSAGE, link_proof

log = logging.getLogger(__name__)


def _check_signed(request: web.Request) -> None:
    at_text, _, given = request.headers.get(LINK_HEADER, "").partition(".")
    at = int(at_text) if at_text.isdigit() else None
    check_signed(request, at, given, lambda secret: link_proof(secret, at or 0), LINK_HEADER)


def encode(envelopes: list[dict[str, Any]]) -> bytes:
    return orjson.dumps(envelopes)


async def shard_link(request: web.Request) -> web.StreamResponse:
    _check_signed(request)
    app = request.app
    ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=MAX_LINK_MESSAGE)
    await ws.prepare(request)
    app[SOCKETS].add(ws)
    try:
        leader, url = await place(Where(app[NODE], app[RAFT]), ws)
        if leader is None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_bytes(encode([{"t": "redirect", "leader": url}]))
            return ws
        await ws.send_bytes(encode([{"t": "ready"}]))
        await _Link(app, ws, leader, peer(request)).run()
    finally:
        app[SOCKETS].discard(ws)
        if not ws.closed:
            await ws.close()
    return ws


class _Box(asyncio.Queue[str | None]):
    """A worker connection's outbox on a link: its frames go into the link's next message."""

    def __init__(self, link: _Link, w: int) -> None:
        super().__init__()
        self.link = link
        self.w = w
        self.conn: WorkerConn | None = None

    def put_nowait(self, item: str | None) -> None:
        if item is None:
            self.link.closed(self.w, self.conn)
        else:
            self.link.put({"w": self.w, "t": "frame", "f": item})

    def empty(self) -> bool:  # (a connection closed with ``discard`` drops what waits)
        return not self.link.waiting(self.w)

    def get_nowait(self) -> str | None:
        self.link.drop_waiting(self.w)
        return None


class _Link:
    def __init__(
        self, app: web.Application, ws: web.WebSocketResponse, leader: WorkerHub, host: str | None
    ) -> None:
        self.app = app
        self.ws = ws
        self.leader = leader
        self.host = host
        self.conns: dict[int, WorkerConn] = {}
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.out: PerTurn[dict[str, Any]] = PerTurn(
            lambda turn: self.queue.put_nowait(encode(turn))
        )
        self.ended = False

    # -- to the front door -------------------------------------------------------------------
    def put(self, envelope: dict[str, Any]) -> None:
        self.out.put(envelope)

    def waiting(self, w: int) -> bool:
        """Whether a frame for worker ``w`` waits to be sent."""
        return any(e.get("w") == w and e["t"] == "frame" for e in self.out.pending)

    def drop_waiting(self, w: int) -> None:
        """Forget the frames for worker ``w`` not sent yet."""
        self.out.pending = [
            e for e in self.out.pending if not (e.get("w") == w and e["t"] == "frame")
        ]

    def closed(self, w: int, conn: WorkerConn | None) -> None:
        """Worker ``w``'s connection ``conn`` is closed: by the leader (a newer one of the same
        worker took its place, or the leader steps down), then the front door hears ``bye``;
        or as the front door asked (it is no longer among the link's)."""
        if conn is not None and self.conns.get(w) is conn:
            self.put({"w": w, "t": "bye"})
            asyncio.get_running_loop().call_soon(self._drop, w, conn)

    def _drop(self, w: int, conn: WorkerConn) -> None:
        if self.conns.get(w) is conn:
            del self.conns[w]
            self.leader.disconnect(conn)
        if not self.leader.ready.is_set():
            self.redirect()

    def redirect(self) -> None:
        """This process leads the shard no more: the front door links to the leader."""
        if not self.ended:
            self.ended = True
            self.put({"t": "redirect", "leader": self.app[NODE].leader_url()})
            asyncio.get_running_loop().call_soon(self.queue.put_nowait, None)

    async def _write(self) -> None:
        while (data := await self.queue.get()) is not None:
            await self.ws.send_bytes(data)
        await self.ws.close()

    # -- from the front door -----------------------------------------------------------------
    async def run(self) -> None:
        writer = asyncio.create_task(self._write())
        try:
            async for frame in self.ws:
                if frame.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                    continue
                try:
                    envelopes = orjson.loads(frame.data)
                except orjson.JSONDecodeError:
                    continue
                if not isinstance(envelopes, list):
                    continue
                for envelope in envelopes:
                    if isinstance(envelope, dict) and isinstance(envelope.get("w"), int):
                        self._from_door(envelope)
                if self.ended:
                    break
        finally:
            self.ended = True
            conns, self.conns = self.conns, {}
            for conn in conns.values():
                self.leader.disconnect(conn)
                conn.close()
            writer.cancel()
            with contextlib.suppress(BaseException):
                await writer

    def _from_door(self, envelope: dict[str, Any]) -> None:
        w: int = envelope["w"]
        kind = envelope.get("t")
        text = envelope.get("f")
        if kind == "frame" and isinstance(text, str):
            conn = self.conns.get(w)
            if conn is not None and not conn.closed:
                on_frame(self.leader, conn, text)
        elif kind == "hello" and isinstance(text, str):
            self._bye(w)
            self._hello(w, envelope, text)
        elif kind == "bye":
            self._bye(w)

    def _bye(self, w: int) -> None:
        conn = self.conns.pop(w, None)
        if conn is not None:
            self.leader.disconnect(conn)
            conn.close()

    def _hello(self, w: int, envelope: dict[str, Any], text: str) -> None:
        if not self.leader.ready.is_set():
            self.redirect()
            return
        try:
            hello = messages.decode(text)
            if not isinstance(hello, messages.Hello):
                raise ProtocolError(f"expected a hello frame, got {type(hello).__name__.lower()}")
        except ProtocolError as exc:
            self.put(
                {
                    "w": w,
                    "t": "frame",
                    "f": messages.encode(messages.Error(code="invalid_argument", message=str(exc))),
                }
            )
            self.put({"w": w, "t": "bye"})
            return
        node, host, whole = envelope.get("node"), envelope.get("host"), envelope.get("whole")
        box = _Box(self, w)
        conn = new_conn(
            hello,
            node if isinstance(node, str) else self.app[CONFIG].node.id,
            host if isinstance(host, str) else self.host,
            whole_capacity=whole if isinstance(whole, int) else None,
            outbox=box,
        )
        box.conn = conn
        self.conns[w] = conn
        conn.send(welcome(self.app))
        self.leader.connect(conn, hello.resume)
        log_event(log, "link.hello", level=logging.DEBUG, worker_id=hello.worker_id, w=w)
