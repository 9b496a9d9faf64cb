"""``GET /api/v1/events`` of a cluster of several shards: every shard's change feed, merged
by a node's front door into one stream.

Each shard's events come in its own order, interleaved with the other shards' as they arrive.
An event's ``id`` is a stamp (``schedd.core.events.next_stamp``): each shard stamps its
entries in its own log's order, with numbers that keep up with the clock, so one number says
where a client is in every shard. A merged event's id is the lowest of the positions the
shards' feeds have reached (every shard's events up to it were sent), and it is put only on
an event that carried an id in its shard's feed (the last of a shard's flush). A client that
resumes with it (``Last-Event-ID``, on any node) asks every shard for what came after it: it
loses nothing, and gets again the events that one shard had sent beyond the lowest.

So that the lowest does not stay with a shard that has had no entry for a while, the front
door asks such a shard for a barrier (an empty entry, stamped now) when it is more than
:data:`LAG_MS` behind the highest, at most once a :data:`LAG_MS` per shard (``nudge``). The
shards' feeds are asked ``?positions``: a barrier moves a feed without an event, and the feed
then says so in a ``position`` event, which is not passed on.

The stream starts with one ``hello`` (every shard's feed started) or ``reset`` (a shard no
longer holds the changes after the client's id: read the pages again), whose ``after`` is the
lowest of the shards'.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import orjson
from aiohttp import web

from schedd.core.events import STAMP_SHIFT, resume_position

HEARTBEAT_S: Final = 15.0
#: a shard whose feed is this far behind the most advanced one is asked for a barrier
LAG_MS: Final = 1_000


@dataclass
class Event:
    """One server-sent event as a shard's feed sent it."""

    kind: str = "message"
    data: str = ""
    id: int | None = None
    comment: bool = False
    retry: str | None = None


async def read_events(content: aiohttp.StreamReader) -> AsyncIterator[Event]:
    """The events of a ``text/event-stream`` body, one at a time (comments too)."""
    event = Event()
    seen = False
    async for raw in content:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if seen:
                yield event
            event, seen = Event(), False
            continue
        if line.startswith(":"):
            yield Event(comment=True)
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event.kind, seen = value, True
        elif name == "data":
            event.data = value if not event.data else event.data + "\n" + value
            seen = True
        elif name == "id":
            with contextlib.suppress(ValueError):
                event.id = int(value)
        elif name == "retry":
            event.retry = value
    if seen:
        yield event


@dataclass
class _Merge:
    shards: int
    positions: list[int]
    #: ask a shard for a barrier (it limits how often itself)
    nudge: Callable[[int], None]
    queue: asyncio.Queue[tuple[int, Event | None]] = field(default_factory=asyncio.Queue)

    def moved(self, shard: int, position: int) -> None:
        """Shard ``shard``'s feed reached ``position``: nudge the shards far behind."""
        self.positions[shard] = max(self.positions[shard], position)
        self.nudge_laggards()

    def nudge_laggards(self) -> None:
        ahead = max(self.positions)
        for k, at in enumerate(self.positions):
            if ahead - at > LAG_MS << STAMP_SHIFT:
                self.nudge(k)

    @property
    def position(self) -> int:
        return min(self.positions)


async def merged_events(
    request: web.Request,
    shards: int,
    open_feed: Callable[[int, dict[str, str]], Any],
    nudge: Callable[[int], None],
) -> web.StreamResponse:
    """The merged stream: ``open_feed(k, query)`` is shard k's ``GET /events`` answer (an
    aiohttp response, as a context manager) for the query given; ``nudge(k)`` asks shard k
    for a barrier."""
    last = resume_position(request.headers.get("Last-Event-ID"), request.query.get("last_event_id"))
    query = {k: v for k, v in request.query.items() if k not in ("last_event_id", "positions")}
    query["positions"] = "true"
    if last is not None:
        query["last_event_id"] = str(last)
    merge = _Merge(shards, [0] * shards, nudge)
    async with contextlib.AsyncExitStack() as stack:
        feeds = []
        for k in range(shards):
            upstream = await stack.enter_async_context(open_feed(k, dict(query)))
            if upstream.status != 200:
                return web.Response(
                    status=upstream.status,
                    body=await upstream.read(),
                    content_type="application/json",
                )
            feeds.append(upstream)
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await resp.prepare(request)
        pumps = [asyncio.create_task(_pump(k, f, merge)) for k, f in enumerate(feeds)]
        try:
            await _relay(resp, merge, request)
        except ConnectionError:
            pass
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        return resp


async def _pump(shard: int, upstream: Any, merge: _Merge) -> None:
    try:
        async for event in read_events(upstream.content):
            await merge.queue.put((shard, event))
    except (aiohttp.ClientError, ConnectionError):
        pass
    finally:
        await merge.queue.put((shard, None))  # this shard's feed ended


async def _relay(resp: web.StreamResponse, merge: _Merge, request: web.Request) -> None:
    """Write the shards' events as they come: first one start event once every shard's feed
    started, then each event, with the merged id where its shard's event had one (a shard's
    ``position`` events move the merged id and are not passed on)."""
    started: dict[int, Event] = {}
    early: list[tuple[int, Event]] = []
    ended = 0
    retry = "1000"
    follow = request.query.get("follow", "true") == "true"
    while len(started) < merge.shards:
        shard, event = await merge.queue.get()
        if event is None:
            if shard not in started or follow:
                return  # a shard's feed ended (its process went away): the client resumes
            ended += 1
            continue
        if event.comment:
            continue
        if shard not in started and event.kind in ("hello", "reset"):
            started[shard] = event
            retry = event.retry or retry
            if event.id is not None:
                merge.positions[shard] = event.id
        else:
            early.append((shard, event))
    merge.nudge_laggards()
    kind = "reset" if any(e.kind == "reset" for e in started.values()) else "hello"
    first = orjson.loads(started[0].data or "{}")
    body: dict[str, Any] = {"node_id": first.get("node_id"), "after": merge.position}
    reasons = [
        f"shard {k}: {orjson.loads(e.data).get('reason')}"
        for k, e in sorted(started.items())
        if e.kind == "reset"
    ]
    if reasons:
        body["reason"] = "; ".join(reasons)
    await resp.write(
        f"retry: {retry}\n".encode() + _frame(kind, orjson.dumps(body).decode(), merge)
    )
    for shard, event in early:
        await _write(resp, shard, event, merge)
    while ended < merge.shards:
        try:
            async with asyncio.timeout(HEARTBEAT_S):
                shard, got = await merge.queue.get()
        except TimeoutError:
            await resp.write(b": keepalive\n\n")
            continue
        if got is None:
            ended += 1
            if follow:
                return  # a shard's stream ended (its process went away): the client resumes
            continue
        if not got.comment:
            await _write(resp, shard, got, merge)


async def _write(resp: web.StreamResponse, shard: int, event: Event, merge: _Merge) -> None:
    if event.id is not None:
        merge.moved(shard, event.id)
    if event.kind == "position":
        return  # the shard's feed moved without an event: only the merged id moves
    await resp.write(_frame(event.kind, event.data, merge if event.id is not None else None))


def _frame(kind: str, data: str, merge: _Merge | None) -> bytes:
    head = "" if merge is None else f"id: {merge.position}\n"
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"{head}event: {kind}\n{lines}\n".encode()
