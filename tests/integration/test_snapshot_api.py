"""``GET /api/v1/snapshot`` against a real one-node cluster: an admin gets a whole, checked image
of the node's state; other roles are refused; one image streams at a time, and a client that
goes away lets go of its image (and of the read transaction it holds) at once."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from pathlib import Path

import aiohttp
import pytest

from schedd.api.snapshot import SAVES
from schedd.auth import Role, Token, TokenStore
from schedd.raft.snapshots import restore_data_dir
from schedd.storage.snapshots import ImageSink
from tests.conftest import Node, running_node, wait_for

API = "/api/v1"
SECRETS = {role: f"{role.value}-secret-0123456789abcdef" for role in Role}


async def submit(http: aiohttp.ClientSession, node: Node, body: dict[str, object]) -> str:
    async with http.post(node.url + API + "/jobs", json=body, headers=node.headers()) as r:
        assert r.status == 201, await r.text()
        return str((await r.json())["id"])


async def fill(http: aiohttp.ClientSession, node: Node) -> None:
    """60 jobs of 60 kB each: with raft.snapshot_rate at 1 MiB/s an image takes seconds."""
    big = {"task": "t", "schedule": {"in": "1h"}, "payload": "x" * 60_000}
    for _ in range(4):
        async with http.post(
            node.url + API + "/jobs/batch", json={"jobs": [big] * 15}, headers=node.headers()
        ) as r:
            assert r.status == 201, await r.text()


async def fetch_image(
    http: aiohttp.ClientSession, node: Node
) -> tuple[aiohttp.ClientResponse, bytes]:
    async with http.get(node.url + API + "/snapshot", headers=node.headers()) as r:
        return r, await r.read()


async def test_an_admin_gets_an_image_of_the_state_that_checks_and_restores(
    node: Node, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    ids = [await submit(http, node, {"task": "t", "schedule": {"in": "1h"}}) for _ in range(5)]
    # a membership change: the image records this cluster's membership
    async with http.post(
        node.url + API + "/cluster/nodes", json={"raft": "127.0.0.1:31990"}, headers=node.headers()
    ) as added:
        assert added.status == 201, await added.text()
    r, data = await fetch_image(http, node)
    assert r.status == 200
    assert r.content_type == "application/octet-stream"
    assert r.headers["Transfer-Encoding"] == "chunked"
    sink = ImageSink(None, where="the answer")
    for i in range(0, len(data), 10_000):  # in pieces, as schedctl gets it
        sink.feed(data[i : i + 10_000])
    assert sink.complete and sink.header is not None
    header = sink.header
    assert r.headers["X-Schedd-Applied-Index"] == str(header.applied_index)
    assert header.applied_index >= node.rt.node.state_index - 1 > 0
    assert header.node == node.rt.config.node.id
    assert header.counts["jobs"] == 5
    name = re.fullmatch(r'attachment; filename="(.+)"', r.headers["Content-Disposition"])
    assert name is not None and name.group(1) == f"schedd-n1-{header.applied_index}.snap"

    # the image is the state: a node restored from it holds the jobs
    image = tmp_path / "backup.snap"
    image.write_bytes(data)
    restore_data_dir(image, tmp_path / "restored" / "raft", None, ["127.0.0.1:1"])
    db = sqlite3.connect(tmp_path / "restored" / "raft" / "state.db")
    try:
        held = {row[0] for row in db.execute("SELECT id FROM jobs")}
        members = db.execute("SELECT value FROM meta WHERE key = 'members'").fetchone()
    finally:
        db.close()
    assert held == set(ids)
    # a new cluster: its members are its own nodes' raft.peers, not the backed-up cluster's
    assert members is None


async def test_only_an_admin_may_take_an_image(node: Node, http: aiohttp.ClientSession) -> None:
    node.rt.tokens = TokenStore(
        [(Token(role.value, role), secret) for role, secret in SECRETS.items()]
    )
    for role in (Role.READ, Role.SUBMIT, Role.WORKER):
        async with http.get(node.url + API + "/snapshot", headers=node.headers(SECRETS[role])) as r:
            assert r.status == 403, role
            assert (await r.json())["error"]["code"] == "permission_denied"
    async with http.get(node.url + API + "/snapshot") as r:
        assert r.status == 401
    async with http.get(
        node.url + API + "/snapshot", headers=node.headers(SECRETS[Role.ADMIN])
    ) as r:
        assert r.status == 200
        await r.read()


async def test_one_image_at_a_time_and_a_client_that_goes_away_lets_go_of_it(
    tmp_path: Path,
) -> None:
    # 1 MiB/s (the least raft.snapshot_rate takes) and a few MiB of state: an image takes
    # seconds to stream
    async with running_node(tmp_path / "n1", raft={"snapshot_rate": "1MiB"}) as node:
        saves = node.rt._runner.app[SAVES]
        async with aiohttp.ClientSession() as http:
            await fill(http, node)

            first = await http.get(node.url + API + "/snapshot", headers=node.headers())
            assert first.status == 200
            assert await first.content.readexactly(1000)
            assert len(saves.active) == 1

            async with http.get(node.url + API + "/snapshot", headers=node.headers()) as r:
                assert r.status == 429
                error = (await r.json())["error"]
                assert error["code"] == "resource_exhausted"
                assert "already streaming 1 snapshot" in error["message"]
                assert int(r.headers["Retry-After"]) >= 1

            first.close()  # the client goes away mid-stream
            started = time.monotonic()
            await wait_for(lambda: not saves.active, timeout=5)
            released_s = time.monotonic() - started

            r, data = await fetch_image(http, node)
            assert r.status == 200
            sink = ImageSink(None)
            assert sink.feed(data)
            assert sink.header is not None and sink.header.counts["jobs"] == 60
    assert released_s < 2, f"the image was let go of {released_s:.2f}s after its client left"


async def test_a_client_that_takes_nothing_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("schedd.api.snapshot.STALL_S", 0.5)
    async with running_node(tmp_path / "n1", raft={"snapshot_rate": "1MiB"}) as node:
        saves = node.rt._runner.app[SAVES]
        async with aiohttp.ClientSession() as http:
            await fill(http, node)
            # a client that asks and then reads nothing: the socket's buffers fill, and then
            # the node waits no longer than STALL_S for it
            _reader, writer = await asyncio.open_connection(
                "127.0.0.1", int(node.url.rsplit(":", 1)[1])
            )
            try:
                writer.write(
                    f"GET {API}/snapshot HTTP/1.1\r\nHost: x\r\n"
                    f"Authorization: Bearer {node.token}\r\n\r\n".encode()
                )
                await writer.drain()
                await wait_for(lambda: saves.active, timeout=5)
                await wait_for(lambda: not saves.active, timeout=15)
            finally:
                writer.close()
