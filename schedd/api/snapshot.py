"""``GET /api/v1/snapshot``: a consistent image of this node's state database, streamed to an
admin as it is read (``schedctl snapshot save`` writes it to a file; ``schedd restore`` seeds
a new cluster from one).

The image (:class:`schedd.storage.snapshots.ImageSource`) pins one read transaction on the live
database and sends the database file and its write-ahead log as they are at the pin, while the
node goes on writing: nothing is copied on the node's disk, and it is sent at
``raft.snapshot_rate``.  The pin holds the write-ahead log's checkpoints back, so the log grows
for as long as an image streams.  Hence: :data:`MAX_SAVES` images at a time per node (429, with
how long the current one still needs, beyond), a client that reads nothing for
:data:`STALL_S` is dropped, and the image is closed (the read transaction let go) as soon as
its client goes away.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from schedd.api.ports import CONFIG, IMAGES, RAFT, TOKEN, Raft, peer
from schedd.errors import ResourceExhausted, Unavailable
from schedd.logs import log_event
from schedd.storage.snapshots import ImageSource, SnapshotError

log = logging.getLogger(__name__)

MAX_SAVES = 1  # images streaming from one node at once
STALL_S = 60.0  # a client that takes nothing for this long is dropped
CATCH_UP_S = 2.0  # how long an image waits for the database to hold what the node committed
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(eq=False)
class Save:
    """One image being streamed."""

    started: float = field(default_factory=time.monotonic)
    source: ImageSource | None = None

    def seconds_left(self, rate: float) -> float:
        if self.source is None:
            return 1.0
        h = self.source.header
        return max(0, h.db_bytes + h.wal_bytes - self.source.total) / rate


class Saves:
    """The images this node streams now, at most ``limit`` at once (event loop only)."""

    def __init__(self, limit: int = MAX_SAVES) -> None:
        self.limit = limit
        self.active: list[Save] = []

    def begin(self) -> Save | None:
        """A place for one more image, or None when ``limit`` stream already."""
        if len(self.active) >= self.limit:
            return None
        save = Save()
        self.active.append(save)
        return save

    def end(self, save: Save) -> None:
        self.active.remove(save)

    def retry_after(self, rate: float) -> int:
        """Seconds until the first of the images streaming now should be done (at least 1)."""
        left = min((s.seconds_left(rate) for s in self.active), default=1.0)
        return max(1, math.ceil(left))


SAVES: web.AppKey[Saves] = web.AppKey("saves", Saves)


async def _caught_up(raft: Raft) -> None:
    """Wait (a moment at most) until the database holds every entry this node knew to be
    committed when the request came: its applied entries are committed to the database within
    a fraction of a second, and the image holds what is committed there."""
    target = raft.commit_index
    for _ in range(round(CATCH_UP_S / 0.01)):
        if raft.state_index >= target:
            return
        await asyncio.sleep(0.01)


def file_name(node: str, applied_index: int) -> str:
    """``schedd-<node>-<applied index>.snap``, with anything but letters, digits, ``.``, ``_``
    and ``-`` in the node's id replaced."""
    return f"schedd-{_UNSAFE.sub('_', node)}-{applied_index}.snap"


async def snapshot(request: web.Request) -> web.StreamResponse:
    app = request.app
    config = app[CONFIG]
    rate = float(config.raft.snapshot_rate)
    saves = app[SAVES]
    save = saves.begin()
    if save is None:
        raise ResourceExhausted(
            f"this node is already streaming {len(saves.active)} snapshot"
            f"{'s' * (len(saves.active) != 1)} (at most {saves.limit} at once, each holds a "
            "read transaction on its database); retry when it is done, or ask another node",
            retry_after=saves.retry_after(rate),
        )
    try:
        await _caught_up(app[RAFT])
        try:
            source = await asyncio.to_thread(app[IMAGES].open_image)
        except (SnapshotError, sqlite3.Error, OSError) as exc:
            log_event(log, "snapshot.failed", logging.WARNING, error=str(exc))
            raise Unavailable(
                f"cannot read this node's state now ({exc}); retry, or ask another node",
                retry_after=1,
            ) from exc
        save.source = source
        try:
            return await _stream(request, source, rate)
        finally:
            await asyncio.shield(asyncio.to_thread(source.close))
    finally:
        saves.end(save)


async def _stream(request: web.Request, source: ImageSource, rate: float) -> web.StreamResponse:
    header = source.header
    node = request.app[CONFIG].node.id
    name = file_name(node, header.applied_index)
    response = web.StreamResponse(
        headers={
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'attachment; filename="{name}"',
            "X-Schedd-Applied-Index": str(header.applied_index),
            "Cache-Control": "no-store",
        }
    )
    response.enable_chunked_encoding()
    started = time.monotonic()
    fields: dict[str, Any] = {
        "node_id": node,
        "applied_index": header.applied_index,
        "by": request[TOKEN].name,
        "peer": peer(request),
    }
    log_event(
        log,
        "snapshot.streaming",
        **fields,
        bytes=header.db_bytes + header.wal_bytes,
        rate=int(rate),
    )
    reason = ""
    try:
        await response.prepare(request)
        while block := await asyncio.to_thread(source.read):
            async with asyncio.timeout(STALL_S):
                await response.write(block)
        await response.write_eof()
    except TimeoutError:
        reason = f"the client took nothing for {STALL_S:g}s"
    except (ConnectionError, SnapshotError) as exc:  # the client went away; reading failed
        reason = str(exc) or type(exc).__name__
    seconds = round(time.monotonic() - started, 3)
    if reason:
        log_event(
            log,
            "snapshot.stopped",
            **fields,
            sent=source.total,
            seconds=seconds,
            reason=reason,
        )
        if request.transport is not None:  # a cut stream never ends as a whole one would
            request.transport.close()
    else:
        log_event(log, "snapshot.streamed", **fields, bytes=source.total, seconds=seconds)
    return response
