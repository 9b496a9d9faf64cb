"""The front door's client of a shard's API: HTTP/1.1 over the shard's Unix socket, with its
connections kept and reused, against a real aiohttp server."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from schedd.shard.link import LinkError, ShardLink


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    """A server on a Unix socket: (its path, the peer of each request it answered)."""
    seen: list[str] = []

    async def echo(request: web.Request) -> web.StreamResponse:
        seen.append(str(id(request.transport)))
        body = await request.read()
        if request.query.get("chunked"):
            response = web.StreamResponse(status=202, headers={"X-Kind": "chunked"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            for part in (b"one,", b"two,", body):
                await response.write(part)
            await response.write_eof()
            return response
        return web.json_response(
            {
                "method": request.method,
                "path": request.path_qs,
                "body": body.decode(),
                "auth": request.headers.get("Authorization"),
            },
            status=201,
            headers={"X-Kind": "whole"},
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app, keepalive_timeout=30)
    await runner.setup()
    where = Path(tempfile.mkdtemp(prefix="link-"))
    path = str(where / "s.sock")
    await web.UnixSite(runner, path).start()
    try:
        yield path, seen
    finally:
        await runner.cleanup()
        shutil.rmtree(where, ignore_errors=True)


async def test_requests_are_answered_whole_on_one_kept_connection(
    server: tuple[str, list[str]],
) -> None:
    path, seen = server
    link = ShardLink(path)
    try:
        for k in range(3):
            status, headers, body = await link.request(
                "POST", f"/api/v1/jobs?k={k}", [("Authorization", "Bearer t")], b'{"a": 1}'
            )
            assert status == 201 and ("X-Kind", "whole") in headers
            doc = json.loads(body)
            assert doc["path"] == f"/api/v1/jobs?k={k}" and doc["auth"] == "Bearer t"
            assert doc["body"] == '{"a": 1}'
        status, headers, body = await link.request("GET", "/x?chunked=1", [], b"three")
        assert (status, body) == (202, b"one,two,three")
        assert len(set(seen)) == 1  # one connection, kept between the requests
    finally:
        await link.close()


async def test_a_connection_the_shard_closed_is_replaced_and_a_gone_shard_named(
    server: tuple[str, list[str]], tmp_path: Path
) -> None:
    path, seen = server
    link = ShardLink(path)
    try:
        await link.request("GET", "/a", [], b"")
        for _, writer in link._idle:  # as a shard's keep-alive timeout or restart would
            writer.transport.abort()
        status, _, _ = await link.request("GET", "/b", [], b"")
        assert status == 201 and len(set(seen)) == 2
    finally:
        await link.close()
    with pytest.raises(LinkError, match="cannot connect"):
        await ShardLink(str(tmp_path / "none.sock")).request("GET", "/", [], b"")
