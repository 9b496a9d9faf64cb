"""The change feeds of several shards merged into one stream by a node's front door
(schedd.shard.feeds), over real HTTP: one start event, every shard's events in its own order,
an id (an integer, as with one shard) that is the lowest position the shards' feeds reached
and is put only on an event that carried an id in its shard, a shard's ``position`` events
that move it without being passed on, a barrier asked of a shard far behind, and a resume
that asks every shard for what came after the client's id."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from schedd.core.events import STAMP_SHIFT
from schedd.errors import InvalidArgument
from schedd.shard.feeds import LAG_MS, merged_events

LAG = LAG_MS << STAMP_SHIFT


def sse(kind: str, data: Any, event_id: int | None = None) -> bytes:
    head = b"" if event_id is None else b"id: %d\n" % event_id
    return head + f"event: {kind}\ndata: {orjson.dumps(data).decode()}\n\n".encode()


@dataclass
class Shard:
    """A shard's GET /events: hello (at the client's id, else at ``start``), then ``flush``
    (each written as given: kind, data, id) and the end of the stream."""

    start: int
    flush: list[tuple[str, Any, int | None]]
    asked: list[dict[str, str]] = field(default_factory=list)

    def app(self) -> web.Application:
        async def events(request: web.Request) -> web.StreamResponse:
            self.asked.append(dict(request.query))
            after = int(request.query.get("last_event_id", self.start))
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            hello = sse("hello", {"node_id": "n1", "after": after}, after)
            await resp.write(b"retry: 1000\n" + hello + b": keepalive\n\n")
            for kind, data, event_id in self.flush:
                await resp.write(sse(kind, data, event_id))
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_get("/api/v1/events", events)
        return app


Door = tuple[TestClient, list[int], list[Shard]]


async def serve(shards: list[Shard]) -> AsyncIterator[Door]:
    servers = [TestServer(shard.app()) for shard in shards]
    for server in servers:
        await server.start_server()
    session = aiohttp.ClientSession()
    nudged: list[int] = []

    async def events(request: web.Request) -> web.StreamResponse:
        def open_feed(k: int, query: dict[str, str]) -> Any:
            return session.get(servers[k].make_url("/api/v1/events"), params=query)

        try:
            return await merged_events(request, len(shards), open_feed, nudged.append)
        except InvalidArgument as exc:
            return web.json_response(exc.to_dict(), status=400)

    app = web.Application()
    app.router.add_get("/api/v1/events", events)
    async with TestClient(TestServer(app)) as client:
        yield client, nudged, shards
    await session.close()
    for server in servers:
        await server.close()


@pytest.fixture
async def door() -> AsyncIterator[Door]:
    """Two shards near each other; each flushes a job then a run (the id on the last)."""
    two = [
        Shard(100, [("job", [{"shard": 0}], None), ("run", [{"shard": 0}], 150)]),
        Shard(120, [("job", [{"shard": 1}], None), ("run", [{"shard": 1}], 130)]),
    ]
    async for served in serve(two):
        yield served


def parse(text: str) -> list[dict[str, str]]:
    out = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and line[0] != ":"
        )
        if "event" in fields:
            out.append(fields)
    return out


async def test_one_start_every_shards_events_and_the_lowest_position_as_id(door: Door) -> None:
    client, nudged, two = door
    resp = await client.get("/api/v1/events?follow=false&types=job,run")
    assert resp.status == 200
    events = parse(await resp.text())
    assert events[0]["event"] == "hello"
    assert events[0]["id"] == "100"  # the lowest of the shards' starts
    assert orjson.loads(events[0]["data"])["after"] == 100
    rest = events[1:]
    assert sorted(e["event"] for e in rest) == ["job", "job", "run", "run"]
    for shard in (0, 1):  # each shard's events in its own order
        mine = [e for e in rest if orjson.loads(e["data"])[0]["shard"] == shard]
        assert [e["event"] for e in mine] == ["job", "run"]
        assert "id" not in mine[0]  # the flush's first: no id of its own
        assert mine[1]["id"].isdigit()
    assert rest[-1]["id"] == "130"  # both flushes whole: the lowest is shard 1's 130
    for shard in two:  # each feed asked for its positions too
        assert shard.asked[-1] == {"follow": "false", "types": "job,run", "positions": "true"}
    assert nudged == []  # nobody far behind

    # resumed with that id: every shard asked for what came after it
    resumed = await client.get("/api/v1/events?follow=false", headers={"Last-Event-ID": "130"})
    first = parse(await resumed.text())[0]
    assert first["id"] == "130" and orjson.loads(first["data"])["after"] == 130
    for shard in two:
        assert shard.asked[-1] == {"follow": "false", "positions": "true", "last_event_id": "130"}


async def test_a_position_moves_the_id_unseen_and_a_shard_far_behind_is_nudged() -> None:
    shards = [
        Shard(LAG * 5, [("position", {}, LAG * 9)]),  # moved without an event
        Shard(LAG * 3, [("job", [{"shard": 1}], LAG * 6)]),
        Shard(LAG * 8, []),
    ]
    async for client, nudged, _ in serve(shards):
        resp = await client.get("/api/v1/events?follow=false")
        events = parse(await resp.text())
        assert [e["event"] for e in events] == ["hello", "job"]  # no position passed on
        assert events[0]["id"] == str(LAG * 3)
        # the job's id is the lowest of 9, 6 and 8 (in lags): shard 1's position
        assert events[1]["id"] == str(LAG * 6)
        # at the start, shards 0 and 1 were over a lag behind shard 2; then shard 1 (at 6)
        # behind shard 0 (at 9)
        assert set(nudged) == {0, 1} and 2 not in nudged


async def test_an_id_that_is_not_an_events_is_refused_naming_it(door: Door) -> None:
    client, _, two = door
    for bad in ("s1.bm9wZQ", "-1", "1.5", str(1 << 63)):
        resp = await client.get("/api/v1/events", headers={"Last-Event-ID": bad})
        assert resp.status == 400, bad
        assert (await resp.json())["error"]["field"] == "Last-Event-ID"
    resp = await client.get("/api/v1/events?last_event_id=x")
    assert resp.status == 400 and (await resp.json())["error"]["field"] == "last_event_id"
    assert all(shard.asked == [] for shard in two)  # no shard was asked
