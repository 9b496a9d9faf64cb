"""``GET /api/v1/events`` on a real node: framing and auth, what a client that comes back with
``Last-Event-ID`` gets (exactly what it missed), a reset when it comes back from further than
the node keeps, and a client that does not read is dropped rather than buffered for."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schedd.api import events as events_api
from schedd.protocol import messages
from tests.conftest import Node, running_node, start_node, wait_for
from tests.integration.test_worker_protocol import connect
from tests.sse import Event, Stream, changes

API = "/api/v1"


@asynccontextmanager
async def stream(
    http: aiohttp.ClientSession,
    node: Node,
    query: str = "",
    headers: dict[str, str] | None = None,
) -> AsyncIterator[Stream]:
    async with http.get(
        node.url + API + "/events" + query, headers={**node.headers(), **(headers or {})}
    ) as r:
        assert r.status == 200, await r.text()
        yield Stream(r)


async def submit(http: aiohttp.ClientSession, node: Node, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(node.url + API + "/jobs", json=body, headers=node.headers()) as r:
        assert r.status == 201, await r.text()
        job: dict[str, Any] = await r.json()
        return job


async def backlog(http: aiohttp.ClientSession, node: Node, after: int) -> list[Event]:
    """What the node holds after ``after`` (follow=false: the stream ends)."""
    async with stream(http, node, f"?follow=false&last_event_id={after}") as s:
        return await s.rest()


def latest(events: list[Event]) -> dict[tuple[str, str], tuple[int, Any]]:
    """Each record's latest change: (kind, id) -> (index, state)."""
    out: dict[tuple[str, str], tuple[int, Any]] = {}
    for event in events:
        if event.kind in ("job", "run"):
            for c in event.data:
                out[(event.kind, c["id"])] = (c["index"], c.get("state", c.get("status")))
    return out


async def test_a_stream_needs_a_token_and_sends_framed_json_events_with_raft_indexes(
    node: Node, http: aiohttp.ClientSession
) -> None:
    async with http.get(node.url + API + "/events") as r:
        assert r.status == 401 and (await r.json())["error"]["code"] == "unauthenticated"
    async with stream(http, node, "?types=job,run") as s:
        assert s.resp.content_type == "text/event-stream"
        assert s.resp.headers["Cache-Control"] == "no-cache"
        hello = await s.until("hello")
        assert hello.data["node_id"] == "n1" and hello.id == hello.data["after"]
        assert hello.id == node.rt.node.state_index  # what the pages read now show
        job = await submit(http, node, {"task": "t"})
        seen: dict[str, Any] = {}
        while seen.get("state") != "queued":
            event = await s.next()
            assert event is not None and event.kind in ("job", "run")
            for c in event.data:
                assert c["index"] > hello.id
                if event.kind == "run":
                    seen = c
        assert seen["job_id"] == job["id"] and seen["id"] == job["latest_run"]["id"]
        assert (seen["attempt"], seen["fence"], seen["worker_id"]) == (0, None, None)
        assert s.last_id is not None and s.last_id >= seen["index"]
        assert s.last_id <= node.rt.node.applied_index


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("?types=run,bogus", "types"),
        ("?types=", "types"),
        ("?namespace=Not+An+Ident", "namespace"),
        ("?last_event_id=-1", "last_event_id"),
        ("?follow=maybe", "follow"),
    ],
)
async def test_bad_parameters_are_a_400_naming_the_field(
    node: Node, http: aiohttp.ClientSession, query: str, field: str
) -> None:
    async with http.get(node.url + API + "/events" + query, headers=node.headers()) as r:
        body = await r.json()
        assert r.status == 400 and body["error"]["field"] == field, body
    async with http.get(
        node.url + API + "/events", headers={**node.headers(), "Last-Event-ID": "12ab"}
    ) as r:
        assert r.status == 400 and (await r.json())["error"]["field"] == "Last-Event-ID"
    # a bad last_event_id is refused though a good Last-Event-ID (which wins) comes with it
    async with http.get(
        node.url + API + "/events?follow=false&last_event_id=" + str(1 << 90),
        headers={**node.headers(), "Last-Event-ID": "3"},
    ) as r:
        assert r.status == 400 and (await r.json())["error"]["field"] == "last_event_id"


async def test_a_client_that_comes_back_with_last_event_id_gets_exactly_what_it_missed(
    node: Node, http: aiohttp.ClientSession
) -> None:
    worker = await connect(http, node, "w1")
    async with stream(http, node) as s:
        start = (await s.until("hello")).data["after"]
        first = await submit(http, node, {"task": "t"})
        lease = await worker.expect(messages.Lease)
        while latest(s.events).get(("run", first["latest_run"]["id"]), (0, ""))[1] != "running":
            await s.next()
        resumed_from = s.last_id
        assert resumed_from is not None
    # while the client is away: the first run finishes, two more jobs come, one is cancelled
    await worker.send(messages.Complete(run_id=lease.run_id, fence=lease.fence))
    await worker.expect(messages.Ack)
    second = await submit(http, node, {"task": "t", "schedule": {"in": "1h"}})
    third = await submit(http, node, {"task": "t", "schedule": {"in": "1h"}})
    async with http.delete(node.url + API + f"/jobs/{third['id']}", headers=node.headers()) as r:
        assert r.status == 204
    everything = await backlog(http, node, start)  # what a client that never left has seen
    missed = {k: v for k, v in latest(everything).items() if v[0] > resumed_from}
    async with stream(http, node, "?follow=false", {"Last-Event-ID": str(resumed_from)}) as again:
        got = await again.rest()
    assert got[0].kind == "hello" and got[0].id == resumed_from
    assert latest(got) == missed  # each missed record with its latest state, nothing else
    assert missed[("run", first["latest_run"]["id"])][1] == "succeeded"
    assert missed[("job", second["id"])][1] == "active"
    assert missed[("job", third["id"])][1] == "cancelled"
    assert missed[("run", third["latest_run"]["id"])][1] == "cancelled"
    assert all(c["index"] > resumed_from for e in got[1:] for c in e.data)
    await worker.ws.close()


async def test_a_client_from_further_back_than_the_ring_is_told_to_reset(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running_node(tmp_path / "n1", api={"events_buffer": 1000}) as node:
        async with stream(http, node, "?follow=false") as s:
            start = (await s.until("hello")).data["after"]
        async with http.post(
            node.url + API + "/jobs/batch",
            json={"jobs": [{"task": "t", "schedule": {"in": "1h"}}] * 600},
            headers=node.headers(),
        ) as r:
            assert r.status == 201
        last = await submit(http, node, {"task": "t", "schedule": {"in": "1h"}})
        horizon = node.rt.node.events.horizon
        assert horizon > start  # 1,202 changes: the batch's entry made room for the last submit
        got = await backlog(http, node, start)
        reset = got[0]
        assert reset.kind == "reset" and reset.id == reset.data["after"] >= horizon
        assert "read the pages again" in reset.data["reason"]
        # the pages read now show what the reset point covers; what comes after it follows
        assert reset.id >= node.rt.node.state_index > horizon
        async with http.get(node.url + API + f"/jobs/{last['id']}", headers=node.headers()) as r:
            assert r.status == 200
        after = await submit(http, node, {"task": "t", "schedule": {"in": "1h"}})
        assert set(latest(await backlog(http, node, reset.id))) == {
            ("job", after["id"]),
            ("run", after["latest_run"]["id"]),
        }


async def test_types_job_id_and_namespace_filter_what_a_stream_sends(
    node: Node, http: aiohttp.ClientSession
) -> None:
    start = node.rt.node.state_index
    mine = await submit(http, node, {"task": "t", "namespace": "a", "schedule": {"in": "1h"}})
    other = await submit(http, node, {"task": "t", "namespace": "b", "schedule": {"in": "1h"}})
    async with stream(
        http, node, f"?follow=false&last_event_id={start}&types=run&namespace=a"
    ) as s:
        got = await s.rest()
    assert {e.kind for e in got} == {"hello", "run"}
    assert [c["job_id"] for c in changes(got, "run")] == [mine["id"]]
    async with stream(http, node, f"?follow=false&last_event_id={start}&job_id={other['id']}") as s:
        got = await s.rest()
    assert {c["id"] for c in changes(got, "job")} == {other["id"]}


async def test_open_streams_end_when_the_node_stops(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    node = await start_node(tmp_path / "n1")
    async with stream(http, node) as s:
        await s.until("hello")
        stopping = asyncio.create_task(node.rt.stop())
        assert await s.next(timeout=5) is None  # the stream ends, well before the drain time
        await asyncio.wait_for(stopping, 10)


def open_streams(node: Node) -> float:
    value = node.rt.metrics.registry.get_sample_value("schedd_event_streams")
    assert value is not None
    return value


async def test_a_client_that_stops_reading_is_dropped_not_buffered_for(
    tmp_path: Path, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events_api, "WRITE_TIMEOUT_S", 0.5)
    async with running_node(tmp_path / "n1", api={"events_buffer": 10_000}) as node:
        host, port = node.url.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_connect(sock, (host, int(port)))
            request = (
                f"GET {API}/events HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {node.token}\r\n\r\n"
            )
            await loop.sock_sendall(sock, request.encode())
            await wait_for(lambda: open_streams(node) == 1)
            # the client reads nothing while the node goes on: its stream cannot write (the
            # ring holds several batches, so the stream has them to send, not only resets)
            big = {"task": "t", "name": "x" * 150, "schedule": {"in": "1h"}}
            for _ in range(60):
                if open_streams(node) == 0:
                    break
                async with http.post(
                    node.url + API + "/jobs/batch",
                    json={"jobs": [big] * 500},
                    headers=node.headers(),
                ) as r:
                    assert r.status == 201
            await wait_for(lambda: open_streams(node) == 0, timeout=5)
            resets = node.rt.metrics.registry.get_sample_value("schedd_event_resets_total")
            assert resets is not None
        finally:
            sock.close()


RANK = {"scheduled": 0, "queued": 1, "running": 2, "succeeded": 3}


async def test_a_run_event_is_sent_once_a_read_on_the_node_shows_it(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """The leader's fires, leases and results are committed to the database up to 0.1 s after
    they are applied; their events wait for it, so a client that reads the run when told finds
    it at least as far along as the event said."""
    worker = await connect(http, node, "w-visible", capacity=4)
    checked = 0
    async with stream(http, node, "?types=run") as s:
        await s.next()  # hello
        jobs = {(await submit(http, node, {"task": "t"}))["id"] for _ in range(6)}

        async def work() -> None:
            acks = 0
            while acks < len(jobs):  # each lease completed as it comes, until each is acked
                msg = await worker.recv()
                if isinstance(msg, messages.Lease):
                    await worker.send(messages.Complete(run_id=msg.run_id, fence=msg.fence))
                acks += isinstance(msg, messages.Ack)

        working = asyncio.create_task(work())
        done: set[str] = set()
        while done != jobs:
            event = await s.next(timeout=10)
            assert event is not None and event.kind == "run"
            for c in event.data:
                async with http.get(
                    node.url + API + f"/runs/{c['id']}", headers=node.headers()
                ) as r:
                    run = await r.json()
                assert RANK[run["state"]] >= RANK[c["state"]], (c, run["state"])
                checked += 1
                if c["state"] == "succeeded":
                    done.add(c["job_id"])
        await working
    assert checked >= len(jobs) * 2  # a queued or running change, and the end, of each
    await worker.ws.close()
