"""A TCP proxy between Raft peers, with faults: cut, one-way cut, delay, drop.

pysyncobj keeps ONE connection per pair of nodes, opened by the node whose own address sorts
higher, and the opener's first frame names it (its own ``raft.listen``).  The proxied harness
gives node *i* three ports: HTTP, its real Raft port ``R_i`` (its ``raft.listen``) and a proxy
port ``P_i`` that the other nodes list in ``raft.peers``.  Ports are handed out so that every
port of node *i* is below every port of node *j* for i < j; the higher node therefore always
opens the connection, through the lower node's proxy.  The proxy reads the first frame, learns
which node is calling, rewrites the name from ``R_caller`` to ``P_caller`` (what the callee
knows it by) and then forwards whole frames in both directions, so a fault acts on messages of a
*directed link* (src → dst) without ever cutting a frame in half.

Frames are pysyncobj's: a native 4-byte length, then ``zlib(pickle(message))``.  Only clusters
without a Raft secret (loopback) can be proxied: with a secret the first frames are encrypted.

The proxy runs in its own thread with its own event loop (the test's loop is busy with HTTP
clients and must never delay Raft traffic); every control method is thread-safe, takes effect
before it returns, and :meth:`ProxyNet.stop` closes every socket and joins the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import struct
import threading
import time
import zlib
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import pysyncobj.pickle as ps_pickle

FRAME_HEADER = struct.Struct("i")
MAX_FRAME = 256 * 1024 * 1024


@dataclass
class LinkState:
    """Faults on one directed link src → dst."""

    blocked: bool = False  # frames src → dst are dropped (a two-way cut blocks both directions)
    delay_ms: float = 0.0  # every frame src → dst is held this long (order kept)
    drop: float = 0.0  # per frame src → dst, the probability that the connection is closed

    @property
    def clean(self) -> bool:
        return not self.blocked and self.delay_ms == 0 and self.drop == 0


@dataclass(eq=False)
class _Conn:
    src: int
    dst: int
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    def close(self) -> None:
        for w in self.writers:
            with contextlib.suppress(Exception):
                w.transport.abort()  # no lingering: like a dropped link
        self.closed.set()


def encode_frame(message: Any) -> bytes:
    data = zlib.compress(ps_pickle.dumps(message), 3)
    return FRAME_HEADER.pack(len(data)) + data


class ProxyNet:
    """One listening proxy per node; faults per directed link between nodes."""

    def __init__(
        self, real_ports: list[int], proxy_ports: list[int], host: str = "127.0.0.1", seed: int = 0
    ) -> None:
        assert len(real_ports) == len(proxy_ports)
        self.host = host
        self.real_ports = list(real_ports)
        self.proxy_ports = list(proxy_ports)
        self.size = len(real_ports)
        self._by_real = {f"{host}:{p}": i for i, p in enumerate(real_ports)}
        self._links: dict[tuple[int, int], LinkState] = {
            (a, b): LinkState() for a in range(self.size) for b in range(self.size) if a != b
        }
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._conns: set[_Conn] = set()
        self._servers: list[asyncio.base_events.Server] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self.stats = {
            "connections": 0,
            "refused": 0,
            "frames": 0,
            "dropped_frames": 0,
            "closed_by_drop": 0,
            "unknown_callers": 0,
        }

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._listen())
            except BaseException as exc:  # noqa: BLE001 - reported to start()
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()
                self._stopped.set()

        self._thread = threading.Thread(target=main, name="raft-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            self._thread.join(5)
            self._thread = None
            raise RuntimeError(f"proxy failed to listen: {failure[0]!r}")

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(10)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._thread = None

    async def _listen(self) -> None:
        for dst, port in enumerate(self.proxy_ports):
            server = await asyncio.start_server(
                functools.partial(self._accept, dst), self.host, port, reuse_address=True
            )
            self._servers.append(server)

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        for conn in list(self._conns):
            conn.close()
        tasks = [t for conn in list(self._conns) for t in conn.tasks]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        me = asyncio.current_task()
        rest = [t for t in asyncio.all_tasks() if t is not me]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    # -- controls (thread-safe; effective when they return) -----------------------------------
    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            return
        asyncio.run_coroutine_threadsafe(coro, loop).result(10)

    def _set(self, pairs: list[tuple[int, int]], **changes: Any) -> None:
        with self._lock:
            for pair in pairs:
                link = self._links[pair]
                for k, v in changes.items():
                    setattr(link, k, v)
        self._call(self._enforce())

    async def _enforce(self) -> None:
        """Close the open connections of links cut both ways (new ones are refused)."""
        for conn in list(self._conns):
            if self._cut(conn.src, conn.dst):
                conn.close()

    def _cut(self, a: int, b: int) -> bool:
        with self._lock:
            return self._links[(a, b)].blocked and self._links[(b, a)].blocked

    def links(self) -> dict[tuple[int, int], LinkState]:
        with self._lock:
            return {k: LinkState(v.blocked, v.delay_ms, v.drop) for k, v in self._links.items()}

    def cut(self, a: int, b: int) -> None:
        """Both directions between a and b: open connections closed, new ones refused."""
        self._set([(a, b), (b, a)], blocked=True)

    def cut_one_way(self, src: int, dst: int) -> None:
        """Frames src → dst are silently dropped; dst → src still flows."""
        self._set([(src, dst)], blocked=True)

    def isolate(self, node: int) -> None:
        for other in range(self.size):
            if other != node:
                self.cut(node, other)

    def partition(self, *groups: list[int]) -> None:
        """Cut every link between different groups."""
        where = {n: gi for gi, g in enumerate(groups) for n in g}
        for a in range(self.size):
            for b in range(a + 1, self.size):
                if where.get(a, -1 - a) != where.get(b, -1 - b):
                    self.cut(a, b)

    def delay(self, src: int, dst: int, ms: float) -> None:
        self._set([(src, dst)], delay_ms=float(ms))

    def drop(self, src: int, dst: int, probability: float) -> None:
        self._set([(src, dst)], drop=float(probability))

    def heal(self, a: int | None = None, b: int | None = None) -> None:
        """Everything (no arguments), or both directions of one link."""
        pairs = list(self._links) if a is None or b is None else [(a, b), (b, a)]
        self._set(pairs, blocked=False, delay_ms=0.0, drop=0.0)

    def healed(self) -> bool:
        with self._lock:
            return all(v.clean for v in self._links.values())

    # -- data path ---------------------------------------------------------------------------
    async def _accept(
        self, dst: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        conn: _Conn | None = None
        try:
            try:
                first = await asyncio.wait_for(_read_frame(reader), 10)
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError):
                return
            src, rewritten = self._identify(first)
            if src is None or self._cut(src, dst):
                self.stats["refused" if src is not None else "unknown_callers"] += 1
                return
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.real_ports[dst]), 5
                )
            except (OSError, TimeoutError):
                return  # the node is down: the caller sees a closed connection, as it would
            self.stats["connections"] += 1
            conn = _Conn(src, dst, [writer, up_writer])
            self._conns.add(conn)
            me = asyncio.current_task()
            assert me is not None
            conn.tasks = [
                asyncio.create_task(self._pump(conn, src, dst, reader, up_writer, rewritten)),
                asyncio.create_task(self._pump(conn, dst, src, up_reader, writer, None)),
            ]
            await conn.closed.wait()
        finally:
            if conn is not None:
                conn.close()
                for t in conn.tasks:
                    t.cancel()
                await asyncio.gather(*conn.tasks, return_exceptions=True)
                self._conns.discard(conn)
            else:
                writer.transport.abort()

    def _identify(self, frame: bytes) -> tuple[int | None, bytes]:
        """Which node opened this connection (its first frame names its raft.listen), and that
        frame rewritten to the name the callee knows it by (its proxy address)."""
        try:
            raw = zlib.decompress(frame[FRAME_HEADER.size :])
        except zlib.error:
            return None, frame
        for addr, i in self._by_real.items():
            if addr.encode() in raw:
                return i, encode_frame(f"{self.host}:{self.proxy_ports[i]}")
        return None, frame

    async def _pump(
        self,
        conn: _Conn,
        src: int,
        dst: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        first: bytes | None,
    ) -> None:
        """Frames src → dst, with that link's faults; delayed frames keep their order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            try:
                while True:
                    at, frame = await queue.get()
                    wait = at - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    writer.write(frame)
                    await writer.drain()
            finally:
                conn.close()

        sender = asyncio.create_task(deliver())
        try:
            while not sender.done():
                if first is not None:
                    frame, first = first, None
                else:
                    frame = await _read_frame(reader)
                self.stats["frames"] += 1
                with self._lock:
                    link = self._links[(src, dst)]
                    blocked, delay_ms, drop = link.blocked, link.delay_ms, link.drop
                if blocked:
                    self.stats["dropped_frames"] += 1
                    continue
                if drop and self._rng.random() < drop:
                    self.stats["closed_by_drop"] += 1
                    break
                queue.put_nowait((time.monotonic() + delay_ms / 1000, frame))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, OSError):
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender
            conn.close()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    header = await reader.readexactly(FRAME_HEADER.size)
    (n,) = FRAME_HEADER.unpack(header)
    if not 0 <= n <= MAX_FRAME:
        raise ValueError(f"bad frame length {n}")
    return header + await reader.readexactly(n)
