"""``GET /api/v1/events`` of a cluster of several shards: every shard's change feed, merged
by a node's front door into one stream.

Each shard's events come in its own order, interleaved with the other shards' as they arrive.
A merged event's ``id`` is where every shard's feed stands after it (``s1.`` and base64 JSON
of one event id per shard, None for a shard whose feed has said nothing yet): an id changes
only with an event that carried one in its shard's feed (the last of a shard's flush), so a
client that resumes with it (``Last-Event-ID``, on any node) gets again at worst the events
of a flush it had not finished, as with one shard, and loses none.  The stream starts with
one ``hello`` (every shard's feed started) or ``reset`` (a shard no longer holds the changes
after the client's id: read the pages again), whose ``after`` is that id.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from schedd.errors import InvalidArgument

ID_PREFIX = "s1."
HEARTBEAT_S = 15.0


def encode_id(positions: Sequence[int | None]) -> str:
    raw = orjson.dumps(list(positions))
    return ID_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_id(text: str, shards: int, name: str) -> list[int | None]:
    """Each shard's event id from a merged id (:class:`InvalidArgument` naming ``name``)."""
    body = text.strip()
    try:
        if not body.startswith(ID_PREFIX):
            raise ValueError(body)
        value = orjson.loads(base64.urlsafe_b64decode(body[3:] + "=" * (-len(body[3:]) % 4)))
        if not isinstance(value, list) or len(value) != shards:
            raise ValueError(body)
        for v in value:
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(body)
    except ValueError:
        raise InvalidArgument(
            f"{name}: expected the id of an event of this API's stream (with several shards, "
            f"an id like {ID_PREFIX}...), got {text[:60]!r}",
            field=name,
        ) from None
    return value


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
    positions: list[int | None]
    queue: asyncio.Queue[tuple[int, Event | None]] = field(default_factory=asyncio.Queue)


async def merged_events(
    request: web.Request,
    shards: int,
    open_feed: Callable[[int, dict[str, str]], Any],
) -> web.StreamResponse:
    """The merged stream: ``open_feed(k, query)`` is shard k's ``GET /events`` answer (an
    aiohttp response, as a context manager) for the query given."""
    last = request.headers.get("Last-Event-ID") or request.query.get("last_event_id")
    name = "Last-Event-ID" if request.headers.get("Last-Event-ID") else "last_event_id"
    positions: list[int | None] = (
        decode_id(last, shards, name) if last and last.strip() else [None] * shards
    )
    query = {k: v for k, v in request.query.items() if k != "last_event_id"}
    merge = _Merge(shards, positions)
    async with contextlib.AsyncExitStack() as stack:
        feeds = []
        for k in range(shards):
            asked = dict(query)
            if positions[k] is not None:
                asked["last_event_id"] = str(positions[k])
            upstream = await stack.enter_async_context(open_feed(k, asked))
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
    started, then each event, with the merged id where its shard's event had one."""
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
    kind = "reset" if any(e.kind == "reset" for e in started.values()) else "hello"
    first = orjson.loads(started[0].data or "{}")
    body: dict[str, Any] = {"node_id": first.get("node_id"), "after": encode_id(merge.positions)}
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
        merge.positions[shard] = event.id
    await resp.write(_frame(event.kind, event.data, merge if event.id is not None else None))


def _frame(kind: str, data: str, merge: _Merge | None) -> bytes:
    head = "" if merge is None else f"id: {encode_id(merge.positions)}\n"
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"{head}event: {kind}\n{lines}\n".encode()
