"""Reading your own writes on any node.

Every write's answer carries the index of the Raft entry it was applied in
(``X-Schedd-Index``), and every read of the replicated state the index the node's reads had
reached when it answered.  A read may ask for at least an index (``min_index``, as a query
parameter or the ``X-Schedd-Min-Index`` header: the highest index its client has seen): the
node waits until its reads see that entry, for at most ``READ_WAIT_S``, and else answers 503
with ``Retry-After``.  So a client that passes the highest index it was given sees its own
writes whichever node answers, as Consul's blocking reads and etcd's revisions allow.

``consistency=consistent`` (or ``X-Schedd-Consistency: consistent``) asks for the latest
state of the cluster: the node commits a no-op entry through the leader (a round trip that
only a leader still holding a majority completes) and answers once its reads see it, so the
read reflects every write acknowledged before it began.  It costs a write.
"""

from __future__ import annotations

from aiohttp import web

from schedd import clock
from schedd.api.common import WRITTEN, Handler, commit, unwrap
from schedd.api.ports import CONFIG, RAFT, Raft
from schedd.core import commands
from schedd.core.events import MAX_INDEX, ms_after, stamp_of_ms
from schedd.errors import InvalidArgument, Unavailable
from schedd.protocol.headers import CONSISTENCY_HEADER, INDEX_HEADER, MIN_INDEX_HEADER

READ_WAIT_S = 5.0  # the longest a read waits for its min_index
#: with several shards: a min_index stamp further ahead of this node's clock is no client's
AHEAD_MS = 60_000
MODES = ("default", "consistent")


def _min_index(request: web.Request) -> int:
    """The highest of ``min_index`` and ``X-Schedd-Min-Index`` (0 when neither is given)."""
    wanted = 0
    for name, raw in (
        ("min_index", request.query.get("min_index")),
        (MIN_INDEX_HEADER, request.headers.get(MIN_INDEX_HEADER)),
    ):
        if raw is None:
            continue
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if not 0 <= value <= MAX_INDEX:
            raise InvalidArgument(
                f"{name}: expected an integer from 0 to {MAX_INDEX} (the X-Schedd-Index of an "
                f"earlier answer), got {raw!r}",
                field=name,
            )
        wanted = max(wanted, value)
    return wanted


def _mode(request: web.Request) -> str:
    """``consistency`` (or ``X-Schedd-Consistency``; ``default`` when neither is given)."""
    mode = "default"
    for name, raw in (
        (CONSISTENCY_HEADER, request.headers.get(CONSISTENCY_HEADER)),
        ("consistency", request.query.get("consistency")),
    ):
        if raw is None:
            continue
        if raw not in MODES:
            raise InvalidArgument(
                f"{name}: expected one of {', '.join(MODES)}, got {raw!r}", field=name
            )
        mode = raw if mode == "default" else mode
    return mode


def fresh(handler: Handler) -> Handler:
    """``handler``, a read of the replicated state, answered once this node's reads see
    ``min_index`` (or, ``consistent``, the latest committed entry), with ``X-Schedd-Index``."""

    async def read(request: web.Request) -> web.StreamResponse:
        raft = request.app[RAFT]
        wanted = _min_index(request)
        if request.app[CONFIG].cluster.shards > 1:
            wanted = await _stamped(raft, wanted, _mode(request))
        elif _mode(request) == "consistent":
            barrier = unwrap(await commit(raft, lambda rid, now: commands.Barrier(rid, now)))
            wanted = max(wanted, int(barrier))  # a barrier answers the index it was applied at
        if wanted and not await raft.wait_visible(wanted, READ_WAIT_S):
            raise Unavailable(
                f"this node's reads have reached entry {raft.state_index}, not yet entry "
                f"{wanted} (min_index) after {READ_WAIT_S:g}s: retry, or read from another node",
                field="min_index",
                retry_after=1,
            )
        seen = raft.state_position
        response = await handler(request)
        response.headers[INDEX_HEADER] = str(seen)
        return response

    read.__name__ = handler.__name__
    return read


async def _stamped(raft: Raft, wanted: int, mode: str) -> int:
    """A shard of several: the index to wait for, so that the reads see every entry up to
    stamp ``wanted`` (``min_index``; 0 when none), or every write acknowledged before now
    (``consistent``).  A stamp compares across shards, so the highest a client saw may be
    another shard's, which this one's log never reaches by itself: when the reads are not
    there yet, a barrier is committed, stamped at least ``wanted``; the reads that see it
    see every entry stamped up to ``wanted`` (stamps grow with the log).  A stamp more than
    :data:`AHEAD_MS` ahead of this node's clock is no client's: it is refused at once (503),
    never forced into the log (it would hold this shard's stamps ahead of the clock)."""
    behind = wanted > raft.state_position
    if mode != "consistent" and not behind:
        return 0
    floor = 0
    if behind:
        if wanted > stamp_of_ms(clock.wall_ms() + AHEAD_MS):
            raise Unavailable(
                f"this node's reads have reached stamp {raft.state_position}, not yet "
                f"{wanted} (min_index), which is ahead of the cluster's clock: pass an "
                "X-Schedd-Index this cluster gave",
                field="min_index",
                retry_after=1,
            )
        floor = ms_after(wanted)
    barrier = unwrap(await commit(raft, lambda rid, now: commands.Barrier(rid, max(now, floor))))
    return int(barrier)  # a barrier answers the index it was applied at


def indexed(handler: Handler) -> Handler:
    """``handler``, a write, its answer carrying the index of the entry it committed."""

    async def write(request: web.Request) -> web.StreamResponse:
        token = WRITTEN.set(0)
        try:
            response = await handler(request)
            if entry := WRITTEN.get():
                response.headers[INDEX_HEADER] = str(entry)
            return response
        finally:
            WRITTEN.reset(token)

    write.__name__ = handler.__name__
    return write
