"""``schedctl snapshot save`` and ``inspect`` against small aiohttp servers that serve a real
image whole, cut half-way, ended early or with a byte flipped: only a whole, checked image is
ever kept, under its name; anything else leaves no file (and an existing one as it was), and
says in one line what went wrong."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from schedd.cli.schedctl import EXIT_OK, EXIT_SERVER, EXIT_USAGE, main
from schedd.core.durations import format_time
from schedd.storage.snapshots import verify_image

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "snapshot-image-v1.snap"
IMAGE = SAMPLE.read_bytes()
HEADER = verify_image(SAMPLE).header  # the frozen sample's: what every answer must say
COUNTS = HEADER.counts
KIB = f"{len(IMAGE) / 1024:.1f} KiB"
assert 1024 <= len(IMAGE) < 1 << 20 and HEADER.term is not None
TOKEN = "admin-secret-0123456789abcdef"

Serve = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _flipped(at: int) -> bytes:
    data = bytearray(IMAGE)
    data[at] ^= 0x01
    return bytes(data)


async def _stream(request: web.Request, data: bytes, *, cut: bool) -> web.StreamResponse:
    """``data`` chunked, in pieces; ``cut``: the connection closed after the last piece
    instead of the stream's end."""
    resp = web.StreamResponse(
        headers={
            "Content-Type": "application/octet-stream",
            "X-Schedd-Applied-Index": str(HEADER.applied_index),
        }
    )
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    for i in range(0, len(data), 50_000):
        await resp.write(data[i : i + 50_000])
    if cut:
        assert request.transport is not None
        request.transport.close()
        return resp
    await resp.write_eof()
    return resp


async def whole(request: web.Request) -> web.StreamResponse:
    return await _stream(request, IMAGE, cut=False)


async def cut_half_way(request: web.Request) -> web.StreamResponse:
    return await _stream(request, IMAGE[: len(IMAGE) // 2], cut=True)


async def ended_early(request: web.Request) -> web.StreamResponse:
    return await _stream(request, IMAGE[: len(IMAGE) // 2], cut=False)


async def flipped(request: web.Request) -> web.StreamResponse:
    return await _stream(request, _flipped(len(IMAGE) // 2), cut=False)


async def refused(request: web.Request) -> web.StreamResponse:
    body = {"error": {"code": "permission_denied", "message": "role read may not do admin"}}
    return web.json_response(body, status=403)


async def busy(request: web.Request) -> web.StreamResponse:
    body = {"error": {"code": "resource_exhausted", "message": "already streaming 1 snapshot"}}
    return web.json_response(body, status=429, headers={"Retry-After": "7"})


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Serve], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Serve) -> str:
        app = web.Application()
        app.router.add_get("/api/v1/snapshot", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def schedctl(
    capsysbinary: pytest.CaptureFixture[bytes], *argv: str
) -> tuple[int, bytes, str]:
    code = await asyncio.to_thread(main, list(argv))
    captured = capsysbinary.readouterr()
    return code, captured.out, captured.err.decode()


def save_argv(url: str, *rest: str) -> list[str]:
    return ["--server", url, "--token", TOKEN, "snapshot", "save", *rest]


async def test_a_whole_image_is_saved_checked_and_summed_up(
    serve: Callable[[Serve], Awaitable[str]],
    capsysbinary: pytest.CaptureFixture[bytes],
    tmp_path: Path,
) -> None:
    url = await serve(whole)
    dest = tmp_path / "backup.snap"
    code, out, err = await schedctl(capsysbinary, *save_argv(url, str(dest)))
    assert (code, err) == (EXIT_OK, "")
    assert dest.read_bytes() == IMAGE
    assert dest.stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "backup.snap.part").exists()
    line = out.decode()
    assert line.count("\n") == 1
    assert line.startswith(
        f"saved {dest}: {KIB}, node {HEADER.node} at applied index {HEADER.applied_index} "
        f"(term {HEADER.term}), "
    )
    assert (
        f"{COUNTS['jobs']} jobs, {COUNTS['runs']} runs, {COUNTS['dead_letters']} dead letters, in "
    ) in line

    # refused without --force, before anything is asked; replaced with it
    dest.write_bytes(b"last night's")
    code, out, err = await schedctl(capsysbinary, *save_argv(url, str(dest)))
    assert (code, out) == (EXIT_USAGE, b"")
    assert err == (
        f"schedctl: snapshot save: {dest} exists; pass --force to replace it (it is replaced "
        "only once the new image is whole and checked)\n"
    )
    assert dest.read_bytes() == b"last night's"
    code, out, _ = await schedctl(capsysbinary, *save_argv(url, str(dest), "--force", "-o", "json"))
    assert code == EXIT_OK
    summary = orjson.loads(out)
    assert summary["file"] == str(dest) and summary["bytes"] == len(IMAGE)
    assert (summary["applied_index"], summary["term"], summary["node"]) == (
        HEADER.applied_index,
        HEADER.term,
        HEADER.node,
    )
    assert summary["counts"] == COUNTS
    assert dest.read_bytes() == IMAGE

    code, out, err = await schedctl(capsysbinary, *save_argv(url, "-"))
    assert code == EXIT_USAGE and "FILE must be a file" in err


@pytest.mark.parametrize(
    ("handler", "says"),
    [
        (cut_half_way, "the connection dropped after "),
        (ended_early, f"the image ended after {len(IMAGE) // 2:,} bytes, before its end"),
        (flipped, "a damaged snapshot (a frame's checksum does not match at byte "),
    ],
    ids=["cut-half-way", "ended-early", "byte-flipped"],
)
async def test_an_image_that_is_not_whole_leaves_no_file_and_says_why(
    serve: Callable[[Serve], Awaitable[str]],
    capsysbinary: pytest.CaptureFixture[bytes],
    tmp_path: Path,
    handler: Serve,
    says: str,
) -> None:
    url = await serve(handler)
    dest = tmp_path / "backup.snap"
    code, out, err = await schedctl(capsysbinary, *save_argv(url, str(dest)))
    assert (code, out) == (EXIT_SERVER, b"")
    assert err.startswith(f"schedctl: {url}/api/v1/snapshot: ") and says in err, err
    assert err.endswith("; nothing was saved\n") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []

    # an existing backup stays as it was, even with --force
    dest.write_bytes(IMAGE)
    code, _, _ = await schedctl(capsysbinary, *save_argv(url, str(dest), "--force"))
    assert code == EXIT_SERVER
    assert dest.read_bytes() == IMAGE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup.snap"]


async def test_a_refusal_is_the_servers_error_and_writes_nothing(
    serve: Callable[[Serve], Awaitable[str]],
    capsysbinary: pytest.CaptureFixture[bytes],
    tmp_path: Path,
) -> None:
    for handler, says in (
        (
            refused,
            "permission_denied: role read may not do admin "
            "(a snapshot needs a token with the admin role)",
        ),
        (busy, "resource_exhausted: already streaming 1 snapshot (retry after 7s)"),
    ):
        url = await serve(handler)
        code, out, err = await schedctl(capsysbinary, *save_argv(url, str(tmp_path / "b.snap")))
        assert (code, out) == (EXIT_SERVER, b"")
        assert err.startswith(f"schedctl: {url}: {says}"), err
        assert list(tmp_path.iterdir()) == []


async def test_inspect_shows_what_an_image_holds(
    capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path
) -> None:
    path = tmp_path / "backup.snap"
    shutil.copy(SAMPLE, path)
    code, out, err = await schedctl(capsysbinary, "snapshot", "inspect", str(path))
    assert (code, err) == (EXIT_OK, "")
    text = out.decode()
    for line in (
        f"file:          {path}",
        f"size:          {KIB} ({len(IMAGE):,} bytes): whole, every frame and the SHA-256 checked",
        f"taken:         {format_time(HEADER.created_ms)[:10]} ",
        f"applied index: {HEADER.applied_index}",
        f"term:          {HEADER.term}",
        f"schema:        {HEADER.schema}",
        f"jobs:          {COUNTS['jobs']}",
        f"runs:          {COUNTS['runs']}",
        f"dead letters:  {COUNTS['dead_letters']}",
    ):
        assert line in text, (line, text)
    assert f" ago) on node {HEADER.node}\n" in text
    code, out, _ = await schedctl(capsysbinary, "snapshot", "inspect", str(path), "-o", "json")
    assert code == EXIT_OK
    assert orjson.loads(out) == {
        "file": str(path),
        "bytes": len(IMAGE),
        "checked": True,
        "schema": HEADER.schema,
        "applied_index": HEADER.applied_index,
        "term": HEADER.term,
        "taken_at": format_time(HEADER.created_ms),
        "node": HEADER.node,
        "counts": COUNTS,
        "database_bytes": HEADER.db_bytes,
        "wal_bytes": HEADER.wal_bytes,
    }


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (IMAGE[: len(IMAGE) * 2 // 3], "an incomplete snapshot (the file ends before its end, "),
        (IMAGE[:40], "an incomplete snapshot (the file ends before its header, after 40 bytes)"),
        (
            _flipped(len(IMAGE) // 3),
            "a damaged snapshot (a frame's checksum does not match at byte ",
        ),
        (b"SQLite format 3\x00" + bytes(100), "not a schedd snapshot"),
        (b"hello\n", "not a schedd snapshot"),
        (b"", "an empty file, not a schedd snapshot"),
    ],
    ids=["truncated", "truncated-in-header", "byte-flipped", "sqlite", "text", "empty"],
)
async def test_inspect_of_a_damaged_file_is_one_clear_line(
    capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path, content: bytes, says: str
) -> None:
    path = tmp_path / "backup.snap"
    path.write_bytes(content)
    code, out, err = await schedctl(capsysbinary, "snapshot", "inspect", str(path))
    assert (code, out) == (EXIT_SERVER, b"")
    assert err.startswith(f"schedctl: {path}: {says}"), err
    assert err.count("\n") == 1 and "Traceback" not in err


async def test_inspect_of_no_file_is_a_usage_error(
    capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path
) -> None:
    code, _, err = await schedctl(capsysbinary, "snapshot", "inspect", str(tmp_path / "nope"))
    assert code == EXIT_USAGE
    assert err == f"schedctl: snapshot inspect: {tmp_path / 'nope'}: no such file\n"


def sharded(second: Serve) -> Serve:
    """A node of a cluster of two shards: shard 0's image, saying there are two, and shard 1's
    answered by ``second`` when asked for by number."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.headers.get("X-Schedd-Shard") == "1":
            return await second(request)
        resp = web.StreamResponse(
            headers={"X-Schedd-Shards": "2", "X-Schedd-Applied-Index": str(HEADER.applied_index)}
        )
        await resp.prepare(request)
        await resp.write(IMAGE)
        await resp.write_eof()
        return resp

    return handler


async def test_a_cluster_of_several_shards_is_saved_as_one_bundle_of_every_shard(
    serve: Callable[[Serve], Awaitable[str]],
    capsysbinary: pytest.CaptureFixture[bytes],
    tmp_path: Path,
) -> None:
    url = await serve(sharded(whole))
    dest = tmp_path / "cluster.snap"
    code, out, err = await schedctl(capsysbinary, *save_argv(url, str(dest)))
    assert (code, err) == (EXIT_OK, ""), err
    lines = out.decode().splitlines()
    assert lines[0].startswith(f"saved {dest}: ") and "a cluster of 2 shards" in lines[0]
    assert [ln.split(":")[0].strip() for ln in lines[1:]] == ["shard 0", "shard 1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.snap"]  # no part left
    code, out, err = await schedctl(capsysbinary, "-o", "json", "snapshot", "inspect", str(dest))
    assert code == EXIT_OK, err
    shown = orjson.loads(out)
    assert [s["shard"] for s in shown["shards"]] == [0, 1]
    assert all(s["counts"] == COUNTS for s in shown["shards"])

    # one shard's image cut short: nothing is kept, the backup already there stays
    bad = await serve(sharded(cut_half_way))
    code, out, err = await schedctl(capsysbinary, *save_argv(bad, str(dest), "--force"))
    assert (code, out) == (EXIT_SERVER, b"")
    assert f"{bad}/api/v1/snapshot (shard 1): the connection dropped" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.snap"]
    code, _, _ = await schedctl(capsysbinary, "snapshot", "inspect", str(dest))
    assert code == EXIT_OK
