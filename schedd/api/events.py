"""``GET /api/v1/events``: the changes this node applies, as server-sent events.

Each event's ``id`` is the Raft index of the last entry it covers, the same on every node
(``schedd.core.events``), so a client resumes with ``Last-Event-ID`` here or on any other node.
In a cluster of several shards it is that entry's stamp (``next_stamp``), and a front door
merges the shards' streams (``schedd.shard.feeds``): asked with ``?positions``, a stream also
says where it stands when that moved without an event (``position`` events, with an id only).
A stream pulls what its client has not seen from the node's ring at most every ``FLUSH_S``: a
burst of entries is one write per kind, each record once with its latest state.  A client that
falls behind the ring (it reads too slowly, or comes back from too far) gets ``reset`` and reads
its pages again; one that does not take a write within ``WRITE_TIMEOUT_S`` is dropped.  So a
stream holds at most one batch of at most the ring's size, however slow its client.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import orjson
from aiohttp import web

from schedd.aio import wait_event, within
from schedd.api.ports import CONFIG, EVENTS, METRICS, RAFT, EventFeed, Raft
from schedd.api.views import StreamStartView, change_view
from schedd.core.events import (
    KINDS,
    Change,
    EventFilter,
    coalesce,
    parse_kinds,
    resume_position,
)
from schedd.core.validate import parse_ident
from schedd.errors import InvalidArgument
from schedd.logs import log_event

log = logging.getLogger(__name__)

FLUSH_S: Final = 0.1  # a stream writes at most this often (what came meanwhile is coalesced)
HEARTBEAT_S: Final = 15.0  # a comment after this long without a write, for proxies
CHECK_S: Final = 1.0  # a quiet stream looks this often whether its client went away
WRITE_TIMEOUT_S: Final = 30.0  # a client that does not take a batch within this is dropped
RETRY_MS: Final = 1000  # the reconnection delay an EventSource client is told


def _last_event_id(request: web.Request) -> int | None:
    return resume_position(request.headers.get("Last-Event-ID"), request.query.get("last_event_id"))


def _wanted(request: web.Request) -> EventFilter:
    q = request.query
    kinds: frozenset[str] = frozenset()
    if "types" in q:
        try:
            kinds = parse_kinds(q["types"])
        except ValueError as exc:
            raise InvalidArgument(
                f"types: expected a comma-separated list of {', '.join(KINDS)}, got {exc}",
                field="types",
            ) from None
    job_id = q.get("job_id")
    if job_id is not None and not 1 <= len(job_id) <= 200:
        raise InvalidArgument("job_id: expected a job id", field="job_id")
    namespace = q.get("namespace")
    if namespace is not None:
        parse_ident(namespace, "namespace")
    return EventFilter(kinds, job_id, namespace)


def _follow(request: web.Request) -> bool:
    raw = request.query.get("follow", "true")
    if raw not in ("true", "false"):
        raise InvalidArgument(f"follow: expected true or false, got {raw!r}", field="follow")
    return raw == "true"


def frame(kind: str, data: bytes, event_id: int | None = None) -> bytes:
    """One server-sent event (``data`` is one line of JSON)."""
    head = b"" if event_id is None else b"id: %d\n" % event_id
    return head + b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def batch_frames(batch: list[tuple[str, list[Change]]], upto: int) -> bytes:
    """A flush's events, one per kind; only the last carries the id, so a client cut off in
    the middle resumes before the flush and gets it again (each record's latest state, twice
    at worst) instead of missing its end."""
    out = []
    for i, (kind, changes) in enumerate(batch):
        data = orjson.dumps([change_view(c) for c in changes])
        out.append(frame(kind, data, upto if i == len(batch) - 1 else None))
    return b"".join(out)


class _Stream:
    def __init__(self, request: web.Request, resp: web.StreamResponse, wanted: EventFilter) -> None:
        self.request = request
        #: say where the stream stands when that moved without an event (for the front door
        #: of a cluster of several shards)
        cfg = request.app[CONFIG]
        self.positions = cfg.cluster.shards > 1 and "positions" in request.query
        self.told = -1  # the latest id written
        self.resp = resp
        self.wanted = wanted
        self.feed: EventFeed = request.app[EVENTS]
        self.raft: Raft = request.app[RAFT]
        self.node_id = cfg.node.id
        self.limit = cfg.http.events_buffer
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.last_write = loop.time()
        self.last_flush = -FLUSH_S

    def gone(self) -> bool:
        transport = self.request.transport
        return transport is None or transport.is_closing()

    async def write(self, data: bytes) -> None:
        await within(self.resp.write(data), WRITE_TIMEOUT_S)
        self.last_write = self.loop.time()

    async def start(self, kind: str, after: int, reason: str | None = None) -> None:
        body: StreamStartView = {"node_id": self.node_id, "after": after}
        if reason is not None:
            body["reason"] = reason
        await self.write(b"retry: %d\n" % RETRY_MS + frame(kind, orjson.dumps(body), after))
        self.told = after

    async def reset(self, after: int) -> int:
        """Tell the client it missed changes: it reads its pages again, and gets the changes
        after what those show (the reads see up to the state index)."""
        point = max(self.raft.state_position, self.feed.horizon)
        self.request.app[METRICS].event_resets.inc()
        log_event(log, "events.reset", level=logging.DEBUG, after=after, now_after=point)
        await self.start(
            "reset",
            point,
            f"this node no longer holds the changes after {after} (it keeps the latest "
            f"{self.limit}): read the pages again; the changes after {point} follow",
        )
        return point

    async def flush(self, after: int) -> int:
        """Send what came after ``after``; the position to go on from."""
        while True:
            pulled = self.feed.pull(after, self.limit)
            if pulled is None:
                after = await self.reset(after)
                continue
            if pulled.upto == after:
                return await self.reached(after, pulled.reached)
            batch = coalesce(pulled.changes, self.wanted)
            if batch:
                await self.write(batch_frames(batch, pulled.upto))
                self.told = pulled.upto
            after = pulled.upto
            if len(pulled.changes) < self.limit:
                return await self.reached(after, pulled.reached)

    async def reached(self, after: int, reached: int | None) -> int:
        """With ``?positions``: every entry up to ``reached`` was pulled; say so when no
        event said it (a front door's merged id moves on with it)."""
        if not self.positions or reached is None or reached <= after:
            return after
        if reached > self.told:
            await self.write(frame("position", b"{}", reached))
            self.told = reached
        return reached

    async def run(self, after: int, follow: bool) -> None:
        waiter = self.feed.listen()
        try:
            while not self.feed.closed and not self.gone():
                waiter.clear()
                after = await self.flush(after)
                self.last_flush = self.loop.time()
                if not follow:
                    return
                while not self.feed.closed and not self.gone():
                    quiet = self.loop.time() - self.last_write
                    if quiet >= HEARTBEAT_S:
                        await self.write(b": keepalive\n\n")
                        continue
                    if await wait_event(waiter, min(CHECK_S, HEARTBEAT_S - quiet)):
                        break
                # coalesce: at most one flush per FLUSH_S
                wait = self.last_flush + FLUSH_S - self.loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
        finally:
            self.feed.unlisten(waiter)


async def events(request: web.Request) -> web.StreamResponse:
    wanted = _wanted(request)
    follow = _follow(request)
    last = _last_event_id(request)
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # a proxy that buffers would hold the events back
        }
    )
    await resp.prepare(request)
    stream = _Stream(request, resp, wanted)
    metrics = request.app[METRICS]
    metrics.event_streams.inc()
    try:
        feed = stream.feed
        if last is None:
            after = max(stream.raft.state_position, feed.horizon)
            await stream.start("hello", after)
        elif last < feed.horizon:
            after = await stream.reset(last)
        else:
            after = last
            await stream.start("hello", after)
        await stream.run(after, follow)
    except ConnectionError:
        pass  # the client went away
    except TimeoutError:  # it does not read: drop it (it reconnects and resumes, or resets)
        transport = request.transport
        if transport is not None:
            transport.abort()
    finally:
        metrics.event_streams.dec()
    return resp
