"""The change feeds of several shards merged into one stream by a node's front door
(schedd.shard.feeds), over real HTTP: one start event, every shard's events in its own order,
an id that says where each shard's feed stands and moves only with an event that carried an
id in its shard, and a resume that asks each shard for what came after its own position."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from schedd.errors import InvalidArgument
from schedd.shard.feeds import decode_id, encode_id, merged_events


def sse(kind: str, data: Any, event_id: int | None = None) -> bytes:
    head = b"" if event_id is None else b"id: %d\n" % event_id
    return head + f"event: {kind}\ndata: {orjson.dumps(data).decode()}\n\n".encode()


def shard_feed(shard: int, asked: list[dict[str, str]]) -> web.Application:
    """A shard's GET /events: hello, then a flush of two events (the id on the last)."""

    async def events(request: web.Request) -> web.StreamResponse:
        asked.append(dict(request.query))
        after = int(request.query.get("last_event_id", "10"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"retry: 1000\n" + sse("hello", {"node_id": "n1", "after": after}, after))
        await resp.write(b": keepalive\n\n")
        await resp.write(sse("job", [{"shard": shard, "n": 1}]))
        await resp.write(sse("run", [{"shard": shard, "n": 2}], after + 5))
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/events", events)
    return app


@pytest.fixture
async def door() -> AsyncIterator[tuple[TestClient, list[list[dict[str, str]]]]]:
    asked: list[list[dict[str, str]]] = [[], []]
    shards = [TestServer(shard_feed(k, asked[k])) for k in range(2)]
    for server in shards:
        await server.start_server()
    session = aiohttp.ClientSession()

    async def events(request: web.Request) -> web.StreamResponse:
        def open_feed(k: int, query: dict[str, str]) -> Any:
            return session.get(shards[k].make_url("/api/v1/events"), params=query)

        try:
            return await merged_events(request, 2, open_feed)
        except InvalidArgument as exc:
            return web.json_response(exc.to_dict(), status=400)

    app = web.Application()
    app.router.add_get("/api/v1/events", events)
    async with TestClient(TestServer(app)) as client:
        yield client, asked
    await session.close()
    for server in shards:
        await server.close()


def parse(text: str) -> list[dict[str, str]]:
    out = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and line[0] != ":"
        )
        if "event" in fields:
            out.append(fields)
    return out


async def test_one_start_every_shards_events_and_ids_that_resume_each_shard(
    door: tuple[TestClient, list[list[dict[str, str]]]],
) -> None:
    client, asked = door
    resp = await client.get("/api/v1/events?follow=false&types=job,run")
    assert resp.status == 200
    events = parse(await resp.text())
    assert events[0]["event"] == "hello"
    assert decode_id(events[0]["id"], 2, "id") == [10, 10]
    assert orjson.loads(events[0]["data"])["after"] == events[0]["id"]
    rest = events[1:]
    assert sorted(e["event"] for e in rest) == ["job", "job", "run", "run"]
    for shard in (0, 1):  # each shard's events in its own order
        mine = [e for e in rest if orjson.loads(e["data"])[0]["shard"] == shard]
        assert [e["event"] for e in mine] == ["job", "run"]
        assert "id" not in mine[0]  # the flush's first: no id of its own
    assert decode_id(rest[-1]["id"], 2, "id") == [15, 15]  # both flushes whole
    assert asked == [[{"follow": "false", "types": "job,run"}]] * 2

    # resumed: each shard asked from its own position
    resumed = await client.get(
        "/api/v1/events?follow=false", headers={"Last-Event-ID": encode_id([15, None])}
    )
    first = parse(await resumed.text())[0]
    assert decode_id(first["id"], 2, "id") == [15, 10]
    assert asked[0][-1] == {"follow": "false", "last_event_id": "15"}
    assert asked[1][-1] == {"follow": "false"}


async def test_an_id_of_another_stream_is_refused_naming_it(
    door: tuple[TestClient, list[list[dict[str, str]]]],
) -> None:
    client, asked = door
    for bad in ("812", "s1.bm9wZQ", encode_id([1, 2, 3]), encode_id([-1, 2])):
        resp = await client.get("/api/v1/events", headers={"Last-Event-ID": bad})
        assert resp.status == 400, bad
        assert (await resp.json())["error"]["field"] == "Last-Event-ID"
    assert asked == [[], []]  # no shard was asked
