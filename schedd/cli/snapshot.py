"""``schedctl snapshot save`` and ``schedctl snapshot inspect``: backups of a node's state.

``save FILE`` streams ``GET /api/v1/snapshot`` from the first node of ``--server`` that answers
into ``FILE.part`` (mode 0600: an image holds every job's payload), feeding every byte to an
:class:`~schedd.storage.snapshots.ImageSink` that checks each frame's CRC-32 and, at the end,
the sizes and the SHA-256 of the whole.  Only an image that is whole and checked is synced and
renamed to ``FILE``; anything else (the connection dropped, a damaged frame, a stream that ends
early) removes the partial file, leaves an existing ``FILE`` as it was, and says what went
wrong.

``inspect FILE`` needs no server: it checks the whole file the same way and shows what the
image holds.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

from schedd.cli import render
from schedd.cli.client import Client, CliError, Response, UsageError, describe
from schedd.cli.settings import Settings
from schedd.core.durations import format_time
from schedd.protocol.headers import SHARD_HEADER, SHARDS_HEADER
from schedd.storage.bundle import is_bundle, unpack_bundle, write_bundle
from schedd.storage.snapshots import (
    IMAGE_MAGIC,
    ImageHeader,
    ImageSink,
    SnapshotError,
    fsync_path,
    verify_image,
)

PATH = "/api/v1/snapshot"
READ_SIZE = 1 << 20
PART = ".part"


def _bytes(n: int) -> str:
    """``1.2 MiB``; a whole number of bytes below 1 KiB."""
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _counts(header: ImageHeader) -> str:
    c = header.counts
    return (
        f"{c.get('jobs', 0):,} jobs, {c.get('runs', 0):,} runs, "
        f"{c.get('dead_letters', 0):,} dead letters"
    )


def _term(header: ImageHeader) -> str:
    return "unknown" if header.term is None else str(header.term)


def _summary(path: Path, size: int, header: ImageHeader, seconds: float | None) -> dict[str, Any]:
    """What ``save`` and ``inspect`` say about an image, as JSON (``-o json``)."""
    out: dict[str, Any] = {
        "file": str(path),
        "bytes": size,
        "checked": True,
        "schema": header.schema,
        "applied_index": header.applied_index,
        "term": header.term,
        "taken_at": format_time(header.created_ms) if header.created_ms else None,
        "node": header.node,
        "counts": dict(header.counts),
        "database_bytes": header.db_bytes,
        "wal_bytes": header.wal_bytes,
    }
    if seconds is not None:
        out["seconds"] = round(seconds, 3)
    return out


# ---- save ----------------------------------------------------------------------------------


def _target(file: str, force: bool) -> Path:
    """Where ``save`` writes (usage errors first: nothing is asked of a server for them)."""
    if file == "-":
        raise UsageError(
            "snapshot save: FILE must be a file: an image is checked whole before it is kept, "
            "and what was written to stdout could not be taken back if it failed the check"
        )
    dest = Path(file)
    if dest.is_dir():
        raise UsageError(f"snapshot save: {file} is a directory; give the file to write")
    if not dest.parent.is_dir():
        raise UsageError(f"snapshot save: {dest.parent} is not a directory")
    if dest.exists() and not force:
        raise UsageError(
            f"snapshot save: {file} exists; pass --force to replace it (it is replaced only "
            "once the new image is whole and checked)"
        )
    return dest


def save_image(
    client: Client,
    file: str,
    force: bool,
    settings: Settings,
    out: IO[bytes],
    server_error: Callable[[Response], CliError],
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """``schedctl snapshot save FILE [--force]``: an image of the node's state; of a cluster
    of several shards, a bundle of every shard's image (``schedd.storage.bundle``)."""
    dest = _target(file, force)
    started = clock()
    part = dest.with_name(dest.name + PART)
    parts = [part]
    try:
        resp, sink = _fetch(client, part, settings, server_error, None)
        headers = [sink.header]
        shards = _shards(resp)
        for shard in range(1, shards):
            parts.append(dest.with_name(f"{dest.name}{PART}.{shard}"))
            _, more = _fetch(client, parts[-1], settings, server_error, shard)
            headers.append(more.header)
        if shards > 1:
            whole = dest.with_name(f"{dest.name}{PART}.bundle")
            parts.append(whole)
            write_bundle(whole, parts[:shards])
            os.replace(whole, dest)
        else:
            os.replace(part, dest)
    finally:
        for left in parts:
            with contextlib.suppress(FileNotFoundError):
                left.unlink()
    with contextlib.suppress(OSError):
        fsync_path(dest.parent, directory=True)
    seconds = clock() - started
    size = dest.stat().st_size
    checked = [h for h in headers if h is not None]
    if shards > 1:
        return _said_bundle(dest, size, checked, seconds, settings, out)
    summary = _summary(dest, size, checked[0], seconds)
    if settings.output == "json":
        out.write(orjson.dumps(summary) + b"\n")
    elif settings.quiet:
        out.write(str(dest).encode() + b"\n")
    else:
        header = checked[0]
        line = (
            f"saved {dest}: {_bytes(size)}, node {header.node or '?'} at applied "
            f"index {header.applied_index} (term {_term(header)}), {_counts(header)}, in "
            f"{seconds:.1f}s"
        )
        out.write(render.clean(line).encode("utf-8", "replace") + b"\n")
    return 0


def _shards(resp: Response) -> int:
    """How many shards the answering node's cluster has (its front door says so)."""
    try:
        return max(1, int(resp.headers.get(SHARDS_HEADER.lower(), "1")))
    except ValueError:
        return 1


def _fetch(
    client: Client,
    part: Path,
    settings: Settings,
    server_error: Callable[[Response], CliError],
    shard: int | None,
) -> tuple[Response, ImageSink]:
    """One image (of ``shard``, or of the node's first) streamed into ``part`` and checked."""
    extra = None if shard is None else {SHARD_HEADER: str(shard)}
    resp = client.request("GET", PATH, stream=True, extra=extra)
    if resp.status >= 400 or resp.stream is None:
        raise server_error(resp)
    where = resp.server.url + PATH + ("" if shard is None else f" (shard {shard})")
    sink = ImageSink(None, where=where)
    try:
        _receive(resp, sink, part, settings.timeout, where)
    finally:
        resp.stream.close()
    header = sink.header
    assert header is not None
    said = resp.headers.get("x-schedd-applied-index")
    if said is not None and said != str(header.applied_index):
        raise CliError(
            f"{where}: the answer says applied index {render.clean(said)}, the image "
            f"{header.applied_index}; nothing was saved"
        )
    return resp, sink


def _said_bundle(
    dest: Path,
    size: int,
    headers: list[ImageHeader],
    seconds: float | None,
    settings: Settings,
    out: IO[bytes],
    verb: str = "saved",
) -> int:
    """What ``save`` and ``inspect`` say about a bundle."""
    if settings.output == "json":
        rows = [{"shard": k, **_summary(dest, 0, h, None)} for k, h in enumerate(headers)]
        for row in rows:
            del row["file"], row["bytes"]
        doc: dict[str, Any] = {"file": str(dest), "bytes": size, "checked": True, "shards": rows}
        if seconds is not None:
            doc["seconds"] = round(seconds, 3)
        out.write(orjson.dumps(doc) + b"\n")
        return 0
    if settings.quiet:
        out.write(str(dest).encode() + b"\n")
        return 0
    took = "" if seconds is None else f" in {seconds:.1f}s"
    lines = [f"{verb} {dest}: {_bytes(size)}, a cluster of {len(headers)} shards{took}"]
    for k, h in enumerate(headers):
        lines.append(
            f"  shard {k}: node {h.node or '?'} at applied index {h.applied_index} (term "
            f"{_term(h)}), {_counts(h)}"
        )
    text = "\n".join(render.clean(line) for line in lines)
    out.write(text.encode("utf-8", "replace") + b"\n")
    return 0


def _receive(resp: Response, sink: ImageSink, part: Path, timeout: float, where: str) -> None:
    """Write the answer's body into ``part`` while ``sink`` checks it, then sync the file;
    :class:`CliError` saying what went wrong (the caller removes ``part``)."""
    assert resp.stream is not None
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        while True:
            try:
                chunk = resp.stream.read(READ_SIZE)
            except Exception as exc:  # noqa: BLE001 - OSError, http.client's errors
                raise CliError(
                    f"{where}: the connection dropped after {sink.received:,} bytes of the "
                    f"image ({describe(exc, timeout, resp.server)}); nothing was saved"
                ) from None
            if not chunk:
                break
            f.write(chunk)
            try:
                sink.feed(chunk)
            except SnapshotError as exc:
                raise CliError(f"{exc}; nothing was saved") from None
        if not sink.complete:
            raise CliError(
                f"{where}: the image ended after {sink.received:,} bytes, before its end (the "
                "stream was cut short); nothing was saved"
            )
        f.flush()
        os.fsync(f.fileno())


# ---- inspect -------------------------------------------------------------------------------


def check_magic(path: Path) -> None:
    """:class:`SnapshotError` when the file at ``path`` does not even start as an image does
    (a file shorter than an image's header would otherwise be called one cut short)."""
    with open(path, "rb") as f:
        head = f.read(len(IMAGE_MAGIC))
    if not head:
        raise SnapshotError(f"{path}: an empty file, not a schedd snapshot")
    if not IMAGE_MAGIC.startswith(head):
        raise SnapshotError(f"{path}: not a schedd snapshot")


def inspect_image(file: str, settings: Settings, style: render.Style, out: IO[bytes]) -> int:
    """``schedctl snapshot inspect FILE``: check the whole file and show what it holds."""
    path = Path(file)
    if not path.is_file():
        what = "is not a file" if path.exists() else "no such file"
        raise UsageError(f"snapshot inspect: {file}: {what}")
    try:
        if is_bundle(path):
            return _inspect_bundle(path, settings, out)
        check_magic(path)
        checked = verify_image(path)
    except OSError as exc:
        raise CliError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except SnapshotError as exc:
        raise CliError(str(exc)) from None
    header = checked.header
    if settings.output == "json":
        out.write(orjson.dumps(_summary(path, checked.size, header, None)) + b"\n")
        return 0
    if settings.quiet:
        out.write(str(path).encode() + b"\n")
        return 0
    c = header.counts
    pairs = [
        ("file", str(path)),
        ("size", f"{_bytes(checked.size)} ({checked.size:,} bytes): whole, every frame and "
         "the SHA-256 checked"),
        ("taken", f"{render.fmt_when(header.created_ms, style)} on node {header.node or '?'}"),
        ("applied index", str(header.applied_index)),
        ("term", _term(header)),
        ("schema", str(header.schema)),
        ("jobs", f"{c.get('jobs', 0):,}"),
        ("runs", f"{c.get('runs', 0):,}"),
        ("dead letters", f"{c.get('dead_letters', 0):,}"),
        ("database", f"{_bytes(header.db_bytes)} and {_bytes(header.wal_bytes)} of "
         "write-ahead log"),
    ]  # fmt: skip
    out.write(render.details(pairs, style.width).encode("utf-8", "replace") + b"\n")
    return 0


def _inspect_bundle(path: Path, settings: Settings, out: IO[bytes]) -> int:
    """``inspect`` of a bundle: every shard's image checked whole, and what each holds."""
    with tempfile.TemporaryDirectory(prefix="schedd-inspect-", dir=path.parent) as tmp:
        images = unpack_bundle(path, Path(tmp))
        headers = [verify_image(image).header for image in images]
    return _said_bundle(path, path.stat().st_size, headers, None, settings, out, "checked")
