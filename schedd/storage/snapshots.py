"""Snapshots of the node's database without copies: the compaction marker, the image a
follower or a backup is sent, and installing one by rename.

The database is the state, and it is durable by itself: each applied entry commits with its
index (``meta.applied_index``), and replaying an entry it already holds does nothing.  So the
Raft log is compacted without copying it (etcd, Vault and CockroachDB do the same):

The marker (``raft.dump``)
    ``SCHDMARK | version:u16 | flags:u16 | length:u32 | crc32(payload):u32 | payload`` where the
    payload is JSON: the Raft data pysyncobj keeps with a snapshot (the entry compacted up to,
    the one before it, the cluster's nodes), the database's applied index when the marker was
    written (at or after that entry), the schema version and the time.  Written by
    :func:`write_marker` (temporary file, sync, rename, sync of the directory) once the database
    is synced up to its applied index: that is the whole compaction.  At start the database
    must hold at least the marker's entry, or the journal after it cannot be replayed.

The image (a follower that needs a whole copy, ``schedctl snapshot save``)
    A stream: ``SCHDSNAP | version:u16 | flags:u16 | length:u32 | crc32(header):u32 | header``
    (JSON: the applied index it was pinned at, the schema, the Raft data, counts, sizes), then
    frames ``kind:u8 | length:u32 | crc32(payload):u32 | offset:u64 | payload`` - the database
    file's bytes (kind 1), then its write-ahead log's (kind 2), each at its offset in its file,
    so a frame lost on the way is noticed at the next one - and an end frame (kind 9, JSON: the
    sizes and the SHA-256 of every byte before it).  :class:`ImageSource` pins a read transaction
    and streams the database file and the write-ahead log as they are at the pin: no
    checkpoint copies a frame past a pinned reader into the database, and the log is not
    started again while one reads it, so the two files read while the node goes on writing are
    what a power cut at the pin would have left (or a little later: frames committed meanwhile
    may be in the log's tail, and SQLite's own recovery keeps whole transactions only).  It is
    paced (bytes a second) and nothing is written on the sending node.

Installing an image
    :class:`ImageSink` writes the stream into ``state.db.incoming`` and its ``-wal`` beside the
    live database, syncing as it goes, and checks every frame and the digest;
    :func:`finalize_incoming` lets SQLite recover the log into the file (a checkpoint) and
    names it ``state.db.install`` - from then on the install is decided: :func:`finish_install`
    removes the live database's log and renames the new file over it, at once or, after a
    stop, when the node starts.  Nothing is written twice.

A format-1 ``raft.dump`` (a whole SQLite copy, written by schedd before markers) is still read
(:func:`read_snapshot`), so a node upgraded in place starts from it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import sqlite3
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final

import orjson

from schedd.storage.schema import SCHEMA_VERSION, pin_pragmas

RaftEntry = tuple[bytes, int, int]  # pysyncobj's (command, index, term)
#: what pysyncobj keeps with a snapshot: the last entry it holds, the one before, the cluster
RaftData = tuple[RaftEntry, RaftEntry, list[str]]

LEGACY_FORMAT: Final = 1  # raft.dump as a whole SQLite copy
MARKER_MAGIC: Final = b"SCHDMARK"
MARKER_VERSION: Final = 1
IMAGE_MAGIC: Final = b"SCHDSNAP"
IMAGE_VERSION: Final = 1
_HEAD: Final = struct.Struct("<8sHHII")  # magic, version, flags, length, crc32
_FRAME: Final = struct.Struct("<BIIQ")  # kind, length, crc32, offset in its file
FRAME_DB: Final = 1
FRAME_WAL: Final = 2
FRAME_END: Final = 9
CHUNK: Final = 64 << 10  # bytes of a file per frame
SYNC_EVERY: Final = 16 << 20  # an incoming image is synced this often
MAX_HEADER: Final = 16 << 20

INCOMING: Final = ".incoming"  # state.db.incoming (+ -wal): an image being received
INSTALL: Final = ".install"  # state.db.install: a received image, decided to replace state.db
_SIDE: Final = ("-wal", "-shm", "-journal")

_fdatasync = getattr(os, "fdatasync", os.fsync)


class SnapshotError(Exception):
    """A snapshot, marker or image that cannot be used (the message says which and why)."""


def fsync_path(path: Path | str, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_database(path: Path | str) -> None:
    """Remove a database file and its log, shared-memory and rollback files, if there."""
    for suffix in ("", *_SIDE):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{path}{suffix}")


# -- Raft data ------------------------------------------------------------------------------------
def _entry(e: Any) -> list[Any]:
    command, index, term = e
    return [base64.b64encode(bytes(command)).decode("ascii"), int(index), int(term)]


def _entry_from(v: Any) -> RaftEntry:
    command, index, term = v
    return base64.b64decode(command), int(index), int(term)


def raft_json(raft: Any) -> dict[str, Any]:
    """pysyncobj's snapshot data (last entry, the one before, the cluster's nodes) as JSON."""
    last, prev, cluster = raft
    return {
        "last": _entry(last),
        "prev": _entry(prev),
        "cluster": sorted(str(getattr(n, "id", n)) for n in cluster),
    }


def raft_from_json(d: Any) -> RaftData:
    """Raises ``KeyError``, ``TypeError`` or ``ValueError`` unless ``d`` is Raft data."""
    return _entry_from(d["last"]), _entry_from(d["prev"]), [str(n) for n in d["cluster"]]


def encode_raft(raft: Any) -> bytes:
    return orjson.dumps(raft_json(raft))


# -- headed files: a magic, a version and a checksummed JSON payload --------------------------------
def _headed(magic: bytes, version: int, payload: dict[str, Any]) -> bytes:
    body = orjson.dumps(payload)
    return _HEAD.pack(magic, version, 0, len(body), zlib.crc32(body)) + body


def _unhead(head: bytes, magic: bytes, version: int, what: str, where: object) -> int:
    """The payload's length in a header; :class:`SnapshotError` unless it is ours."""
    found, got, _, length, _ = _HEAD.unpack(head)
    if found != magic:
        raise SnapshotError(f"{where}: not a schedd {what}")
    if got > version:
        raise SnapshotError(
            f"{where}: a {what} of version {got}; this schedd reads up to version {version}: "
            "it was written by a newer schedd. Upgrade this node to the version the others run."
        )
    if length > MAX_HEADER:
        raise SnapshotError(f"{where}: a damaged {what} (a header of {length} bytes)")
    return int(length)


def _payload(head: bytes, body: bytes, what: str, where: object) -> dict[str, Any]:
    *_, length, crc = _HEAD.unpack(head)
    if len(body) != length or zlib.crc32(body) != crc:
        raise SnapshotError(f"{where}: a damaged {what} (its header's checksum does not match)")
    try:
        d = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise SnapshotError(f"{where}: a damaged {what}: {exc}") from exc
    if not isinstance(d, dict):
        raise SnapshotError(f"{where}: a damaged {what} (its header is not an object)")
    return d


def _not_newer(schema: int, where: object, what_to_do: str) -> None:
    if schema > SCHEMA_VERSION:
        raise SnapshotError(
            f"{where}: written at schema version {schema}; this schedd knows up to "
            f"{SCHEMA_VERSION}: it was written by a newer schedd. {what_to_do}"
        )


# -- the marker -----------------------------------------------------------------------------------
#: a command of the marker's two entries longer than this is kept as its SHA-256 only (the
#: journal holds the entry itself: see :func:`resolve_marker`)
INLINE_COMMAND_MAX: Final = 4096


@dataclass(frozen=True, slots=True)
class Marker:
    """What a compaction leaves: the Raft data of the entry the log was compacted up to, and
    the database's applied index then (every entry up to it is in the database).

    pysyncobj keeps the log's first two entries whole (it compares them with the journal's), but
    a marker is meant to be small and an entry can be a batch of a thousand jobs: a longer
    command is written as its SHA-256 (``digests``; the entry's command then reads as ``b""``)
    and taken back from the journal at start (:func:`resolve_marker`)."""

    raft: RaftData
    applied_index: int
    schema: int = SCHEMA_VERSION
    written_ms: int = 0
    #: the SHA-256 of the last and the entry-before-last's commands when they are not in the file
    digests: tuple[str | None, str | None] = (None, None)

    @property
    def index(self) -> int:
        return self.raft[0][1]

    @property
    def term(self) -> int:
        return self.raft[0][2]


#: the marker is written under this name first (not pysyncobj's own ``.tmp``: pysyncobj renames
#: that over the snapshot file as soon as the serializer returns, while the marker is written)
MARKER_TMP: Final = ".new"


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: a temporary file, synced, renamed, the directory synced."""
    tmp = Path(f"{path}{MARKER_TMP}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_path(path.parent, directory=True)


def _marker_entry(e: RaftEntry) -> list[Any]:
    command, index, term = e
    if len(command) <= INLINE_COMMAND_MAX:
        return _entry(e)
    return [None, int(index), int(term), hashlib.sha256(command).hexdigest()]


def write_marker(path: Path, marker: Marker) -> None:
    last, prev, cluster = marker.raft
    payload = {
        "raft": {
            "last": _marker_entry(last),
            "prev": _marker_entry(prev),
            "cluster": sorted(str(getattr(n, "id", n)) for n in cluster),
        },
        "applied_index": marker.applied_index,
        "schema": marker.schema,
        "written_ms": marker.written_ms or int(time.time() * 1000),
    }
    atomic_write(path, _headed(MARKER_MAGIC, MARKER_VERSION, payload))


def _read_marker(path: Path, data: bytes) -> Marker:
    if len(data) < _HEAD.size:
        raise SnapshotError(f"{path}: a damaged snapshot marker (it is {len(data)} bytes)")
    head = data[: _HEAD.size]
    _unhead(head, MARKER_MAGIC, MARKER_VERSION, "snapshot marker", path)
    d = _payload(head, data[_HEAD.size :], "snapshot marker", path)
    try:
        entries: list[RaftEntry] = []
        digests: list[str | None] = []
        for key in ("last", "prev"):
            v = d["raft"][key]
            if v[0] is None:  # kept as its digest
                entries.append((b"", int(v[1]), int(v[2])))
                digests.append(str(v[3]))
            else:
                entries.append(_entry_from(v[:3]))
                digests.append(None)
        raft = (entries[0], entries[1], [str(n) for n in d["raft"]["cluster"]])
        marker = Marker(
            raft,
            int(d["applied_index"]),
            int(d["schema"]),
            int(d.get("written_ms", 0)),
            (digests[0], digests[1]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotError(f"{path}: damaged Raft data in the snapshot marker: {exc!r}") from exc
    _not_newer(marker.schema, path, "Upgrade this node to the version the others run.")
    return marker


def resolve_marker(marker: Marker, entry_at: Callable[[int], RaftEntry | None]) -> RaftData | None:
    """The marker's Raft data with every command whole: those kept as digests taken from
    ``entry_at(index)`` (the journal), when it holds the entry with that term and digest; None
    when it does not."""
    if marker.digests == (None, None):
        return marker.raft
    last, prev, cluster = marker.raft
    out = []
    for entry, digest in zip((last, prev), marker.digests, strict=True):
        if digest is None:
            out.append(entry)
            continue
        found = entry_at(entry[1])
        if (
            found is None
            or found[2] != entry[2]
            or hashlib.sha256(bytes(found[0])).hexdigest() != digest
        ):
            return None
        out.append((bytes(found[0]), int(found[1]), int(found[2])))
    return out[0], out[1], cluster


# -- format 1: a whole SQLite copy --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A ``raft.dump`` as read at start: a marker, or a format-1 copy of the database."""

    applied_index: int  # the database's applied index the file vouches for
    raft: RaftData
    copy: bool = False  # a format-1 whole copy (installed if the live database is older)
    marker: Marker | None = None  # what the marker holds (its long commands as digests)


def _read_copy(path: Path) -> SnapshotInfo:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise SnapshotError(f"{path}: cannot open the snapshot: {exc}") from exc
    try:
        rows = dict(db.execute("SELECT key, value FROM snapshot").fetchall())
        schema = int(db.execute("PRAGMA user_version").fetchone()[0])
        row = db.execute("SELECT value FROM meta WHERE key = 'applied_index'").fetchone()
    except sqlite3.Error as exc:
        raise SnapshotError(f"{path}: not a complete schedd snapshot: {exc}") from exc
    finally:
        db.close()
    fmt = rows.get("format")
    if fmt != LEGACY_FORMAT or schema > SCHEMA_VERSION:
        raise SnapshotError(
            f"{path}: the snapshot has format {fmt} and schema version {schema}; this schedd "
            f"reads format {LEGACY_FORMAT} up to schema version {SCHEMA_VERSION}: it was written "
            "by a newer schedd. Upgrade this node to the version the others run."
        )
    try:
        raft = raft_from_json(orjson.loads(rows["raft"]))
    except (KeyError, TypeError, ValueError, orjson.JSONDecodeError) as exc:
        raise SnapshotError(f"{path}: damaged Raft data in the snapshot: {exc}") from exc
    return SnapshotInfo(int(row[0]) if row else 0, raft, copy=True)


def read_snapshot(path: Path) -> SnapshotInfo:
    """What the ``raft.dump`` at ``path`` holds; :class:`SnapshotError` when it cannot be used."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read the snapshot: {exc}") from exc
    if data[:16] == b"SQLite format 3\0":
        return _read_copy(path)
    if data[:8] != MARKER_MAGIC:
        raise SnapshotError(
            f"{path}: not a schedd snapshot of this version (neither a snapshot marker nor an "
            "SQLite database; an older schedd wrote snapshots in another format): to rebuild "
            "this node from the cluster, move it away with everything else in its directory, "
            "the Raft journal included (and raft.journal_dir's, if set): a compacted journal "
            "without its snapshot leaves the node applying nothing"
        )
    marker = _read_marker(path, data)
    return SnapshotInfo(marker.applied_index, marker.raft, marker=marker)


def read_marker(path: Path) -> Marker:
    """The marker at ``path`` (:class:`SnapshotError` if it is none, or damaged)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read the snapshot marker: {exc}") from exc
    return _read_marker(path, data)


# -- pinning --------------------------------------------------------------------------------------
def pin(live: Path) -> tuple[sqlite3.Connection, int]:
    """A connection to ``live`` holding a read transaction, and the applied index it sees."""
    src = sqlite3.connect(str(live), isolation_level=None, check_same_thread=False)
    try:
        pin_pragmas(src, readonly=True)
        src.execute("BEGIN")
        row = src.execute("SELECT value FROM meta WHERE key = 'applied_index'").fetchone()
    except BaseException:
        src.close()
        raise
    return src, int(row[0]) if row else 0


def state_counts(db: sqlite3.Connection) -> dict[str, int]:
    """The numbers of jobs, runs and dead-lettered runs in the state database ``db`` is
    connected to (what an image's header and ``schedd inspect`` show)."""
    meta = dict(
        db.execute("SELECT key, value FROM meta WHERE key IN ('jobs_kept', 'runs_kept')").fetchall()
    )
    return {
        "jobs": int(meta.get("jobs_kept", 0)),
        "runs": int(meta.get("runs_kept", 0)),
        "dead_letters": int(db.execute("SELECT count(*) FROM dlq").fetchone()[0]),
    }


# -- the image: sending ---------------------------------------------------------------------------
class Pacer:
    """A token bucket: ``rate`` bytes a second, bursts of up to ``burst`` bytes."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        self.rate = float(rate)
        self.burst = max(float(burst), 1.0)
        self.clock = clock
        self.tokens = self.burst
        self.at = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def take(self, n: int) -> bool:
        """Spend ``n`` bytes now if there are enough (a chunk larger than the burst may go when
        the bucket is full)."""
        self._refill()
        if self.tokens >= n or self.tokens >= self.burst:
            self.tokens -= n
            return True
        return False

    def wait_for(self, n: int) -> float:
        """Seconds until ``n`` bytes may go."""
        self._refill()
        need = min(float(n), self.burst) - self.tokens
        return max(0.0, need / self.rate)


@dataclass(frozen=True, slots=True)
class ImageHeader:
    applied_index: int  # pinned at: the image holds at least every entry up to it
    schema: int
    raft: RaftData | None  # the Raft data it goes with (a follower's), or None (a backup)
    term: int | None  # the term of the entry at applied_index, where known
    db_bytes: int
    wal_bytes: int
    page_size: int
    counts: dict[str, int]
    created_ms: int
    node: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": IMAGE_VERSION,
            "applied_index": self.applied_index,
            "schema": self.schema,
            "raft": None if self.raft is None else raft_json(self.raft),
            "term": self.term,
            "db_bytes": self.db_bytes,
            "wal_bytes": self.wal_bytes,
            "page_size": self.page_size,
            "counts": self.counts,
            "created_ms": self.created_ms,
            "node": self.node,
            **self.extra,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], where: object) -> ImageHeader:
        known = {"format", "applied_index", "schema", "raft", "term", "db_bytes", "wal_bytes"}
        known |= {"page_size", "counts", "created_ms", "node"}
        try:
            header = cls(
                applied_index=int(d["applied_index"]),
                schema=int(d["schema"]),
                raft=None if d.get("raft") is None else raft_from_json(d["raft"]),
                term=None if d.get("term") is None else int(d["term"]),
                db_bytes=int(d["db_bytes"]),
                wal_bytes=int(d["wal_bytes"]),
                page_size=int(d["page_size"]),
                counts={str(k): int(v) for k, v in dict(d.get("counts", {})).items()},
                created_ms=int(d.get("created_ms", 0)),
                node=str(d.get("node", "")),
                extra={k: v for k, v in d.items() if k not in known},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"{where}: a damaged snapshot header: {exc!r}") from exc
        _not_newer(header.schema, where, "Restore it with that version (or newer).")
        if header.db_bytes < 0 or header.wal_bytes < 0:
            raise SnapshotError(f"{where}: a damaged snapshot header (negative sizes)")
        return header


def _frame(kind: int, payload: bytes, offset: int = 0) -> bytes:
    return _FRAME.pack(kind, len(payload), zlib.crc32(payload), offset) + payload


class ImageSource:
    """A consistent image of the live database at ``live``, as the bytes of an image stream.

    Construction pins a read transaction (the caller commits what it applied first: the image
    holds what is committed) and opens both files; a thread reads ahead of the consumer, a
    few frames at a time.  :meth:`take` hands out the next block of the stream when the pace
    allows (never waits: the Raft thread calls it), :meth:`read` waits for it (a backup).
    :meth:`close` lets go of the read transaction (and ends the thread); always call it."""

    AHEAD = 16  # frames read ahead

    def __init__(
        self,
        live: Path,
        *,
        rate: float,
        raft: RaftData | None = None,
        term: int | None = None,
        node: str = "",
        extra: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.live = live
        self._ready: deque[bytes] = deque()
        self._cond = threading.Condition()
        self._ended = False  # the reader produced the end frame (or failed)
        self._closed = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._fds: list[int] = []
        self._conn, applied = pin(live)
        try:
            page_size = int(self._conn.execute("PRAGMA page_size").fetchone()[0])
            schema = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
            counts = state_counts(self._conn)
            if term is None:  # the term of the leader that wrote the last entries
                row = self._conn.execute(
                    "SELECT value FROM meta WHERE key = 'leader_term'"
                ).fetchone()
                term = int(row[0]) if row else None
            db_fd = os.open(live, os.O_RDONLY)
            self._fds.append(db_fd)
            wal_fd: int | None = None
            with contextlib.suppress(FileNotFoundError):
                wal_fd = os.open(f"{live}-wal", os.O_RDONLY)
                self._fds.append(wal_fd)
            db_bytes = os.fstat(db_fd).st_size
            wal_bytes = 0 if wal_fd is None else os.fstat(wal_fd).st_size
        except BaseException:
            self.close()
            raise
        self.header = ImageHeader(
            applied_index=applied,
            schema=schema,
            raft=raft,
            term=term,
            db_bytes=db_bytes,
            wal_bytes=wal_bytes,
            page_size=page_size,
            counts=counts,
            created_ms=int(time.time() * 1000),
            node=node,
            extra=dict(extra or {}),
        )
        self.total = 0  # bytes handed out
        self.pacer = Pacer(rate, max(rate / 8, 4 * CHUNK), clock)
        self._files = [(FRAME_DB, db_fd, db_bytes), (FRAME_WAL, wal_fd, wal_bytes)]
        self._thread = threading.Thread(target=self._produce, name="schedd-image", daemon=True)
        self._thread.start()

    def _blocks(self) -> Iterator[bytes]:
        digest = hashlib.sha256()
        head = _headed(IMAGE_MAGIC, IMAGE_VERSION, self.header.to_json())
        digest.update(head)
        yield head
        for kind, fd, size in self._files:
            off = 0
            while off < size:
                want = min(CHUNK, size - off)
                data = os.pread(fd, want, off) if fd is not None else b""
                if not data:
                    if kind != FRAME_WAL:
                        raise SnapshotError(f"{self.live}: the file shrank while it was sent")
                    # The log was started again and cut back (possible when the pin saw it
                    # fully copied into the database, which then stays as it was): zeros end
                    # it where it was cut, and recovery stops at the first frame they hold.
                    data = bytes(want)
                block = _frame(kind, data, off)
                digest.update(block)
                yield block
                off += len(data)
        end = {
            "db_bytes": self.header.db_bytes,
            "wal_bytes": self.header.wal_bytes,
            "sha256": digest.hexdigest(),
        }
        yield _frame(FRAME_END, orjson.dumps(end))

    def _produce(self) -> None:
        try:
            for block in self._blocks():
                with self._cond:
                    while len(self._ready) >= self.AHEAD and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                    self._ready.append(block)
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - reported through error / take
            self.error = exc
        finally:
            with self._cond:
                self._ended = True
                self._cond.notify_all()

    @property
    def done(self) -> bool:
        """Every byte of the stream was handed out."""
        with self._cond:
            return self._ended and not self._ready and self.error is None

    def take(self) -> bytes | None:
        """The next block of the stream if one is read and the pace allows, else None (raises
        :class:`SnapshotError` if reading failed).  Never waits."""
        with self._cond:
            if self.error is not None:
                raise SnapshotError(f"{self.live}: reading the image failed: {self.error}")
            if not self._ready or not self.pacer.take(len(self._ready[0])):
                return None
            block = self._ready.popleft()
            self._cond.notify_all()
        self.total += len(block)
        return block

    def read(self, timeout: float | None = None) -> bytes:
        """The next block, waiting for the reader and the pace; ``b""`` at the end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                if self.error is not None:
                    raise SnapshotError(f"{self.live}: reading the image failed: {self.error}")
                if not self._ready:
                    if self._ended:
                        return b""
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError("the image reader is late")
                    self._cond.wait(left)
                    continue
                wait = self.pacer.wait_for(len(self._ready[0]))
            if wait > 0:
                time.sleep(min(wait, 0.25))
                continue
            block = self.take()
            if block is not None:
                return block

    def __iter__(self) -> Iterator[bytes]:
        while block := self.read():
            yield block

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("COMMIT")
        self._conn.close()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def __enter__(self) -> ImageSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the image: receiving -------------------------------------------------------------------------
class _Syncer:
    """Syncs files in a thread of its own, so the caller (the Raft thread) never waits for a
    disk flush while an image comes in; :meth:`drain` waits for what was asked."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._wanted: list[int] = []
        self._busy = False
        self.error: OSError | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="schedd-image-sync", daemon=True)
        self._thread.start()

    def want(self, fd: int) -> None:
        with self._cond:
            if fd not in self._wanted:
                self._wanted.append(fd)
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._wanted and not self._stop:
                    self._cond.wait()
                if self._stop and not self._wanted:
                    return
                fds, self._wanted = self._wanted, []
                self._busy = True
            for fd in fds:
                try:
                    _fdatasync(fd)
                except OSError as exc:
                    self.error = exc
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def drain(self) -> None:
        with self._cond:
            while self._wanted or self._busy:
                self._cond.wait()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(30)


class ImageSink:
    """Writes an image stream fed to it (:meth:`feed`) into ``dest`` and ``dest-wal`` (with
    ``dest`` None, only checks it), checking each frame and, at the end, the sizes and the
    digest.  :class:`SnapshotError` on anything wrong (what was written is then removed);
    ``where`` names the stream in messages (default: ``dest``)."""

    def __init__(self, dest: Path | None, where: object = None) -> None:
        self.dest = dest
        self.where = where if where is not None else dest
        if dest is not None:
            remove_database(dest)
        self._buf = bytearray()
        self._digest = hashlib.sha256()
        self.header: ImageHeader | None = None
        self.received = 0
        self.complete = False
        self._written = {FRAME_DB: 0, FRAME_WAL: 0}
        self._files: dict[int, BinaryIO] = {}
        self._unsynced = 0
        self._syncer: _Syncer | None = None

    def _write(self, kind: int, payload: bytes) -> None:
        self._written[kind] += len(payload)
        if self.dest is None:
            return
        f = self._files.get(kind)
        if f is None:
            path = self.dest if kind == FRAME_DB else Path(f"{self.dest}-wal")
            f = self._files[kind] = open(path, "wb")  # closed in _close_files
        f.write(payload)
        self._unsynced += len(payload)
        if self._unsynced >= SYNC_EVERY:
            self._unsynced = 0
            self._sync(wait=False)

    def _sync(self, *, wait: bool) -> None:
        if self._syncer is None:
            self._syncer = _Syncer()
        for f in self._files.values():
            f.flush()
            self._syncer.want(f.fileno())
        if wait:
            self._syncer.drain()

    def feed(self, data: bytes) -> bool:
        """Take the next bytes of the stream; True once the whole image is in and checked."""
        if self.complete:
            raise SnapshotError(f"{self.where}: data after the end of the snapshot")
        self._buf += data
        self.received += len(data)
        try:
            self._parse()
        except (SnapshotError, OSError):
            self.abort()
            raise
        return self.complete

    def _parse(self) -> None:
        buf = self._buf
        if self.header is None:
            if len(buf) < _HEAD.size:
                return
            head = bytes(buf[: _HEAD.size])
            length = _unhead(head, IMAGE_MAGIC, IMAGE_VERSION, "snapshot", self.where)
            if len(buf) < _HEAD.size + length:
                return
            body = bytes(buf[_HEAD.size : _HEAD.size + length])
            fields = _payload(head, body, "snapshot", self.where)
            self.header = ImageHeader.from_json(fields, self.where)
            self._digest.update(head + body)
            del buf[: _HEAD.size + length]
        while len(buf) >= _FRAME.size:
            kind, length, crc, offset = _FRAME.unpack_from(buf)
            if length > (MAX_HEADER if kind == FRAME_END else 2 * CHUNK):
                raise SnapshotError(f"{self.where}: a damaged snapshot (a frame of {length} bytes)")
            if len(buf) < _FRAME.size + length:
                return
            payload = bytes(buf[_FRAME.size : _FRAME.size + length])
            if zlib.crc32(payload) != crc:
                raise SnapshotError(
                    f"{self.where}: a damaged snapshot (a frame's checksum does not match at "
                    f"byte {self.received - len(buf)})"
                )
            if kind == FRAME_END:
                del buf[: _FRAME.size + length]
                if buf:
                    raise SnapshotError(f"{self.where}: data after the end of the snapshot")
                self._end(payload)
                return
            if kind not in self._written:
                raise SnapshotError(f"{self.where}: a damaged snapshot (a frame of kind {kind})")
            if offset != self._written[kind]:
                raise SnapshotError(
                    f"{self.where}: an incomplete snapshot (a piece is missing: the "
                    f"{'database' if kind == FRAME_DB else 'log'} goes on at byte {offset}, "
                    f"after {self._written[kind]})"
                )
            self._digest.update(buf[: _FRAME.size + length])
            self._write(kind, payload)
            del buf[: _FRAME.size + length]

    def _end(self, payload: bytes) -> None:
        assert self.header is not None
        try:
            end = orjson.loads(payload)
            sizes = (int(end["db_bytes"]), int(end["wal_bytes"]))
            digest = str(end["sha256"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"{self.where}: a damaged snapshot end: {exc!r}") from exc
        got = (self._written[FRAME_DB], self._written[FRAME_WAL])
        want = (self.header.db_bytes, self.header.wal_bytes)
        if got != sizes or got != want:
            raise SnapshotError(
                f"{self.where}: an incomplete snapshot (database and log of {got} bytes, "
                f"expected {want})"
            )
        if self._digest.hexdigest() != digest:
            raise SnapshotError(f"{self.where}: a damaged snapshot (its SHA-256 does not match)")
        if self.dest is not None:
            if FRAME_DB not in self._files:  # an empty database file (never, but whole)
                self._write(FRAME_DB, b"")
            self._sync(wait=True)
        self._close_files()
        self.complete = True

    def _close_files(self) -> None:
        for f in self._files.values():
            with contextlib.suppress(OSError):
                f.close()
        self._files.clear()
        if self._syncer is not None:
            self._syncer.close()
            self._syncer = None

    def abort(self) -> None:
        """Drop what was received."""
        self._close_files()
        if self.dest is not None:
            remove_database(self.dest)


class CopySink:
    """A whole SQLite copy as a leader of an older schedd sends it (its ``raft.dump`` of
    format 1, byte for byte, with the Raft data in a ``snapshot`` table): written to ``dest``
    as it comes, synced as it goes, and read at the end (:meth:`finish`)."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        remove_database(dest)
        self._file: BinaryIO | None = open(dest, "wb")  # closed in finish/abort
        self.received = 0
        self.complete = False
        self._unsynced = 0

    def feed(self, data: bytes) -> bool:
        assert self._file is not None
        self._file.write(data)
        self.received += len(data)
        self._unsynced += len(data)
        if self._unsynced >= SYNC_EVERY:
            self._unsynced = 0
            self._file.flush()
            _fdatasync(self._file.fileno())
        return False

    def finish(self) -> SnapshotInfo:
        """The copy is in: its Raft data and applied index (the ``snapshot`` table dropped,
        as it is not state).  :class:`SnapshotError` if it is not a whole schedd copy."""
        assert self._file is not None
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        info = _read_copy(self.dest)
        try:
            db = sqlite3.connect(str(self.dest), isolation_level=None)
            try:
                db.execute("DROP TABLE IF EXISTS snapshot")
            finally:
                db.close()
        except sqlite3.Error as exc:
            raise SnapshotError(f"{self.dest}: cannot open the received copy: {exc}") from exc
        self.complete = True
        return info

    def abort(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        remove_database(self.dest)


def read_meta(path: Path) -> dict[str, str]:
    """The ``meta`` table of a stopped node's state database ({} when there is no database).
    Opened read-write: after a kill its write-ahead log may need the shared-memory file, which
    a read-only connection cannot make.  ``sqlite3.Error`` when it is no schedd database."""
    if not path.exists():
        return {}
    db = sqlite3.connect(str(path))
    try:
        return {str(k): str(v) for k, v in db.execute("SELECT key, value FROM meta")}
    finally:
        db.close()


def write_meta(path: Path, values: dict[str, str | None]) -> None:
    """Set (or, None, delete) keys of a stopped node's state database's ``meta`` table, in one
    synced transaction (a restore forgets the backed-up cluster's membership; a forced
    recovery writes its own)."""
    db = sqlite3.connect(str(path), isolation_level=None)
    try:
        db.execute("PRAGMA synchronous = FULL")
        db.execute("BEGIN IMMEDIATE")
        for key, value in values.items():
            if value is None:
                db.execute("DELETE FROM meta WHERE key = ?", (key,))
            else:
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
        db.execute("COMMIT")
        if db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
            raise SnapshotError(f"{path}: its log could not be copied in")
    finally:
        db.close()
    for suffix in _SIDE:  # all in the file now
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{path}{suffix}")
    fsync_path(path)


def finalize_incoming(incoming: Path) -> int:
    """Make the received image at ``incoming`` one self-contained, synced database file (SQLite
    recovers the received log and a checkpoint copies it in), check it, and return its applied
    index.  :class:`SnapshotError` if it is no schedd database."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(f"{incoming}-shm")  # never one of the image's: SQLite rebuilds it
    try:
        db = sqlite3.connect(str(incoming), isolation_level=None)
    except sqlite3.Error as exc:
        raise SnapshotError(f"{incoming}: cannot open the received snapshot: {exc}") from exc
    try:
        db.execute("PRAGMA synchronous = FULL")
        busy = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        if busy:
            raise SnapshotError(f"{incoming}: the received snapshot's log could not be copied in")
        row = db.execute("SELECT value FROM meta WHERE key = 'applied_index'").fetchone()
        schema = int(db.execute("PRAGMA user_version").fetchone()[0])
        check = db.execute("PRAGMA quick_check(1)").fetchone()[0] if _small(incoming) else "ok"
    except sqlite3.Error as exc:
        raise SnapshotError(f"{incoming}: not a schedd database: {exc}") from exc
    finally:
        db.close()
    if check != "ok":
        raise SnapshotError(f"{incoming}: the received snapshot is damaged: {check}")
    if schema > SCHEMA_VERSION:
        raise SnapshotError(f"{incoming}: schema version {schema} (newer than this schedd)")
    for suffix in _SIDE:
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{incoming}{suffix}")
    fsync_path(incoming)
    return int(row[0]) if row else 0


QUICK_CHECK_MAX = 256 << 20  # a received database up to this size is checked page by page


def _small(path: Path) -> bool:
    return os.path.getsize(path) <= QUICK_CHECK_MAX


def decide_install(incoming: Path, live: Path) -> Path:
    """Name the finalized ``incoming`` as the database that replaces ``live``: from here on, a
    node that stops finishes the install when it starts (:func:`finish_install`)."""
    install = Path(f"{live}{INSTALL}")
    os.replace(incoming, install)
    fsync_path(live.parent, directory=True)
    return install


def finish_install(live: Path) -> bool:
    """If an install was decided (``state.db.install`` exists), put it in place of ``live``:
    the live database's log and shared memory are removed first (a log beside a database it
    does not belong to would be replayed into it), then the new file is renamed over it.  The
    caller has closed every connection to ``live``.  True if it did."""
    install = Path(f"{live}{INSTALL}")
    if not install.exists():
        return False
    for suffix in _SIDE:
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{live}{suffix}")
    os.replace(install, live)
    fsync_path(live.parent, directory=True)
    return True


def clear_incoming(live: Path) -> None:
    """Remove an image that was being received when the node stopped."""
    remove_database(Path(f"{live}{INCOMING}"))


# -- images as files (backups) --------------------------------------------------------------------
def write_image(blocks: Iterator[bytes] | Sequence[bytes], dest: Path) -> int:
    """Write an image stream into the file ``dest`` (a temporary file, synced, renamed); the
    number of bytes written."""
    tmp = Path(f"{dest}.part")
    n = 0
    with open(tmp, "wb") as f:
        for block in blocks:
            f.write(block)
            n += len(block)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dest)
    with contextlib.suppress(OSError):
        fsync_path(dest.parent if str(dest.parent) else Path("."), directory=True)
    return n


@dataclass(frozen=True, slots=True)
class ImageFile:
    """A checked image file: its header and size."""

    header: ImageHeader
    size: int


def verify_image(path: Path, into: Path | None = None) -> ImageFile:
    """Read the image file at ``path`` whole, checking every frame and the digest (and, with
    ``into``, writing the database it holds there, as a follower does).  :class:`SnapshotError`
    saying what is wrong."""
    sink = ImageSink(into, where=path)
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                if sink.feed(chunk):
                    break
    except OSError as exc:
        sink.abort()
        raise SnapshotError(f"{path}: cannot read it: {exc}") from exc
    if not sink.complete:
        sink.abort()
        if sink.header is None and not IMAGE_MAGIC.startswith(bytes(sink._buf[:8])[:8] or b"?"):
            raise SnapshotError(f"{path}: not a schedd snapshot")
        where = "before its header" if sink.header is None else "before its end"
        raise SnapshotError(
            f"{path}: an incomplete snapshot (the file ends {where}, after {sink.received} "
            "bytes): it was cut short; take another"
        )
    assert sink.header is not None
    return ImageFile(sink.header, sink.received)


def dump_json(header: ImageHeader) -> str:
    return json.dumps(header.to_json(), indent=2, sort_keys=True)
