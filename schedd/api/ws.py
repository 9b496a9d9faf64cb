"""The worker websocket endpoint: it only moves frames between a socket and the leader."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import WSMsgType, web

from schedd import clock
from schedd.aio import within
from schedd.api.app import RUNTIME, require
from schedd.leader.workers import WorkerConn
from schedd.logs import log_event
from schedd.protocol import messages as m
from schedd.protocol.messages import ProtocolError

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0
MAX_FRAME = 1 << 20


async def worker_connect(request: web.Request) -> web.StreamResponse:
    require(request, "worker")
    rt = request.app[RUNTIME]
    ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=MAX_FRAME)
    await ws.prepare(request)
    rt.sockets.add(ws)
    try:
        return await _serve(request, ws)
    finally:
        rt.sockets.discard(ws)


async def _serve(request: web.Request, ws: web.WebSocketResponse) -> web.WebSocketResponse:
    rt = request.app[RUNTIME]
    try:
        first = await within(ws.receive(), HELLO_TIMEOUT_S)
        if first.type is not WSMsgType.TEXT:
            await ws.close()
            return ws
        hello = m.decode(first.data)
        if not isinstance(hello, m.Hello):
            raise ProtocolError(f"expected a hello frame first, got {type(hello).__name__.lower()}")
    except (TimeoutError, ProtocolError) as exc:
        await ws.send_str(m.encode(m.Error(code="invalid_argument", message=str(exc))))
        await ws.close()
        return ws

    leader = await rt.wait_leader_ready(timeout=3.0)
    if leader is None:
        await ws.send_str(m.encode(m.Redirect(leader=rt.leader_url())))
        await ws.close()
        return ws

    conn = WorkerConn(hello.worker_id, hello.queues, hello.capacity, clock.wall_ms())
    conn.send(m.Welcome(
        node_id=rt.config.node.id,
        heartbeat_interval=rt.config.scheduler.heartbeat_interval_ms / 1000,
        lease_timeout=rt.config.scheduler.heartbeat_timeout_ms / 1000,
    ))
    leader.connect(conn, hello.resume)
    writer = asyncio.create_task(_write(ws, conn))
    pending: set[asyncio.Task[None]] = set()
    try:
        async for frame in ws:
            if frame.type is not WSMsgType.TEXT:
                continue
            try:
                msg = m.decode(frame.data)
            except ProtocolError as exc:
                conn.send(m.Error(code="invalid_argument", message=str(exc)))
                continue
            if isinstance(msg, m.Heartbeat):
                leader.heartbeat(conn, msg.leases)
            elif isinstance(msg, m.Complete | m.Fail):
                task = asyncio.create_task(leader.finish(conn, msg))
                pending.add(task)
                task.add_done_callback(pending.discard)
            elif isinstance(msg, m.Drain):
                conn.draining = True
                log_event(log, "worker.draining", worker_id=conn.worker_id)
            else:
                conn.send(m.Error(code="invalid_argument",
                                  message=f"unexpected {type(msg).__name__.lower()} frame"))
            if conn.closed:
                break
    finally:
        leader.disconnect(conn)
        conn.close()
        for task in pending:
            task.cancel()
        with contextlib.suppress(Exception):
            await writer
        if not ws.closed:
            await ws.close()
    return ws


async def _write(ws: web.WebSocketResponse, conn: WorkerConn) -> None:
    while True:
        text = await conn.outbox.get()
        if text is None:
            await ws.close()
            return
        await ws.send_str(text)
