"""Raft snapshots of the node's database: consistent online copies, and installing one.

A snapshot is a plain SQLite file: a page-by-page copy of the live database taken inside one
read transaction (SQLite's online backup), so it holds exactly the entries up to the applied
index it was pinned at, plus a ``snapshot`` table with the Raft entries and the format it was
written in.  WAL readers never block the writer: the node keeps applying entries while a copy
is written, in its own thread, into its own temporary file, which is synced and renamed into
place only when complete.

:func:`read_snapshot` checks a file before anything trusts it (a schedd snapshot, a format and
a schema this version knows); :meth:`schedd.storage.sqlstate.SqlState.install` copies one into
the live database.
"""

from __future__ import annotations

import base64
import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from schedd.storage.schema import SCHEMA_VERSION, pin_pragmas

SNAPSHOT_FORMAT = 1
BACKUP_PAGES = 4096  # pages copied per backup step (16 MiB of 4 KiB pages)

RaftEntry = tuple[bytes, int, int]  # pysyncobj's (command, index, term)


class SnapshotError(Exception):
    """A snapshot file that cannot be used (the message says which and why)."""


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    applied_index: int  # the database's applied index: every entry up to it is in the copy
    raft: tuple[RaftEntry, RaftEntry, list[str]]  # last applied entry, the one before, cluster


def fsync_path(path: Path | str, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    for suffix in ("", "-journal", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{path}{suffix}")


def _entry(e: Any) -> list[Any]:
    command, index, term = e
    return [base64.b64encode(bytes(command)).decode("ascii"), int(index), int(term)]


def _entry_from(v: Any) -> RaftEntry:
    command, index, term = v
    return base64.b64decode(command), int(index), int(term)


def encode_raft(raft: Any) -> bytes:
    """pysyncobj's snapshot data (last applied entry, the one before, the cluster's nodes)."""
    last, prev, cluster = raft
    return orjson.dumps(
        {
            "last": _entry(last),
            "prev": _entry(prev),
            "cluster": sorted(str(getattr(n, "id", n)) for n in cluster),
        }
    )


def pin(live: Path) -> tuple[sqlite3.Connection, int]:
    """A connection to ``live`` holding a read transaction, and the applied index it sees:
    whatever is committed after this, a copy made through the connection does not hold."""
    src = sqlite3.connect(str(live), isolation_level=None, check_same_thread=False)
    try:
        pin_pragmas(src, readonly=True)
        src.execute("BEGIN")
        row = src.execute("SELECT value FROM meta WHERE key = 'applied_index'").fetchone()
    except BaseException:
        src.close()
        raise
    return src, int(row[0]) if row else 0


def write_copy(
    src: sqlite3.Connection, dest: Path, raft: Any, step: Callable[[], None] | None = None
) -> None:
    """Copy the database ``src`` is pinned on into ``dest`` (synced, then renamed into place),
    with ``raft`` in its ``snapshot`` table.  Releases ``src``.  ``step`` runs between the
    copy's steps (tests use it to hold a copy half-way)."""
    tmp = Path(f"{dest}.sqltmp")
    try:
        _remove(tmp)
        with contextlib.ExitStack() as stack:
            dst = stack.enter_context(
                contextlib.closing(sqlite3.connect(str(tmp), isolation_level=None))
            )  # creates the file
            fd = os.open(tmp, os.O_RDONLY)
            stack.callback(os.close, fd)

            def progress(*_: Any) -> None:
                # Sync each step's pages as they are written: the node's journal syncs (each
                # write the cluster acknowledges) never queue behind gigabytes flushed at once.
                os.fdatasync(fd)
                if step is not None:
                    step()

            src.backup(dst, pages=BACKUP_PAGES, progress=progress)
            dst.execute("PRAGMA journal_mode = DELETE")
            dst.execute("CREATE TABLE snapshot (key TEXT PRIMARY KEY, value) WITHOUT ROWID")
            dst.executemany(
                "INSERT INTO snapshot (key, value) VALUES (?, ?)",
                [("format", SNAPSHOT_FORMAT), ("raft", encode_raft(raft))],
            )
    finally:
        with contextlib.suppress(sqlite3.Error):
            src.execute("COMMIT")
        src.close()
    fsync_path(tmp)
    os.replace(tmp, dest)
    fsync_path(dest.parent, directory=True)


def read_snapshot(path: Path) -> SnapshotInfo:
    """What the snapshot at ``path`` holds; :class:`SnapshotError` when it cannot be used."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read the snapshot: {exc}") from exc
    if head != b"SQLite format 3\0":
        raise SnapshotError(
            f"{path}: not a schedd snapshot of this version (it is not an SQLite database; an "
            "older schedd wrote snapshots in another format): move it away, and the state "
            "database next to it, to rebuild this node from the cluster"
        )
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
    if fmt != SNAPSHOT_FORMAT or schema > SCHEMA_VERSION:
        raise SnapshotError(
            f"{path}: the snapshot has format {fmt} and schema version {schema}; this schedd "
            f"reads format {SNAPSHOT_FORMAT} up to schema version {SCHEMA_VERSION}: it was written "
            "by a newer schedd. Upgrade this node to the version the others run."
        )
    try:
        raft = orjson.loads(rows["raft"])
        info = (
            _entry_from(raft["last"]),
            _entry_from(raft["prev"]),
            [str(n) for n in raft["cluster"]],
        )
    except (KeyError, TypeError, ValueError, orjson.JSONDecodeError) as exc:
        raise SnapshotError(f"{path}: damaged Raft data in the snapshot: {exc}") from exc
    return SnapshotInfo(int(row[0]) if row else 0, info)


class CopyThread:
    """One background copy at a time: :meth:`start` pins and returns at once, :meth:`status`
    says how it went."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.pinned: int | None = None
        self.done = threading.Event()

    def start(
        self, live: Path, dest: Path, raft: Any, on_done: Callable[[CopyThread], None]
    ) -> None:
        src, self.pinned = pin(live)
        self.done.clear()

        def run() -> None:
            try:
                write_copy(src, dest, raft)
            except BaseException as exc:  # noqa: BLE001 - reported through error
                self.error = exc
            finally:
                try:
                    on_done(self)
                finally:
                    self.done.set()

        self._thread = threading.Thread(target=run, name="schedd-snapshot", daemon=True)
        self._thread.start()
