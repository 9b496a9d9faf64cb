"""Raft snapshots of the state database (schedd/storage/snapshots.py, schedd/raft/snapshots.py):
a copy holds exactly the entries up to the index it was pinned at however much is applied while
it is written; a snapshot is checked before it is trusted; installing one replaces the live
database whole; at start a newer live database is kept, and a snapshot from the leader always
replaces it.  Real SQLite files, commands applied through the real core."""

from __future__ import annotations

import gzip
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.config import SERIALIZER_STATE

from schedd.core import commands
from schedd.core.model import JobSpec
from schedd.raft.snapshots import SqlSnapshots
from schedd.storage import snapshots
from schedd.storage.schema import SCHEMA_VERSION
from schedd.storage.sqlstate import SqlState, apply_entry
from tests.property.test_sql_state_property import answers

T0 = 1_800_000_000_000
RAFT = ((b"\x01last", 7, 2), (b"\x01prev", 6, 2), ["127.0.0.1:9001", "127.0.0.1:9002"])


def submit(state: SqlState, index: int, n: int = 1) -> None:
    jobs = tuple((f"J{index}-{k}", JobSpec(task="t", payload="x" * 200)) for k in range(n))
    assert apply_entry(
        state, commands.encode_entry([commands.Submit(f"r{index}", T0 + index, jobs)]), index
    )


def filled(path: Path, entries: int, per_entry: int = 1) -> SqlState:
    state = SqlState(path)
    for i in range(1, entries + 1):
        submit(state, i, per_entry)
    return state


def test_a_copy_holds_exactly_the_entries_up_to_its_pin_while_more_are_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live, dump = tmp_path / "state.db", tmp_path / "raft.dump"
    state = filled(live, 20, per_entry=50)
    src, pinned = snapshots.pin(live)
    assert pinned == 20
    monkeypatch.setattr(snapshots, "BACKUP_PAGES", 1)  # many steps: entries land between them
    index = iter(range(21, 10_000))
    steps = 0

    def apply_more() -> None:
        nonlocal steps
        steps += 1
        submit(state, next(index), 20)

    snapshots.write_copy(src, dump, RAFT, step=apply_more)
    assert steps > 10 and state.applied_index > 30
    info = snapshots.read_snapshot(dump)
    assert info.applied_index == 20 and info.raft == RAFT
    copy = SqlState(tmp_path / "copy.db")
    copy.install(dump)
    try:
        assert copy.applied_index == 20 and len(copy.jobs) == 20 * 50
        assert sorted(copy.jobs) == sorted(j for j in state.jobs if int(j[1:].split("-")[0]) <= 20)
        assert sqlite3.connect(dump).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        copy.close()
        state.close()
    assert not (tmp_path / "raft.dump.sqltmp").exists()


def test_the_copy_is_synced_step_by_step_as_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not one flush of the whole file at the end: each step's pages go to disk before the next
    # step, so the journal's syncs never wait behind a whole snapshot's writeback.
    live, dump = tmp_path / "state.db", tmp_path / "raft.dump"
    state = filled(live, 10, per_entry=50)
    state.close()
    monkeypatch.setattr(snapshots, "BACKUP_PAGES", 8)
    synced_sizes: list[int] = []
    real = snapshots.os.fdatasync

    def fdatasync(fd: int) -> None:
        real(fd)
        synced_sizes.append(snapshots.os.fstat(fd).st_size)

    monkeypatch.setattr(snapshots.os, "fdatasync", fdatasync)
    src, _ = snapshots.pin(live)
    snapshots.write_copy(src, dump, RAFT)
    pages = sqlite3.connect(dump).execute("PRAGMA page_count").fetchone()[0]
    assert pages > 4 * 8
    assert len(synced_sizes) >= pages // 8  # once a step
    assert synced_sizes == sorted(synced_sizes) and synced_sizes[0] < synced_sizes[-1]


def test_the_write_ahead_log_shrinks_back_once_a_long_copy_lets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A snapshot copy pins the database for as long as it writes, and the log grows meanwhile;
    # the first checkpoint after it cuts the file back to the limit instead of keeping its
    # largest size for good.
    from schedd.storage import schema

    monkeypatch.setattr(schema, "WAL_SIZE_LIMIT", 256 << 10)
    live = tmp_path / "state.db"
    wal = tmp_path / "state.db-wal"
    state = SqlState(live)
    try:
        src, _ = snapshots.pin(live)  # held like a copy in progress
        for i in range(1, 41):
            submit(state, i, 50)
        grown = wal.stat().st_size
        assert grown > 4 * (256 << 10)
        assert state.checkpointer is not None
        state.checkpointer.checkpoint()  # it copies only what the copy no longer needs
        submit(state, 41, 5)
        assert wal.stat().st_size >= grown  # the writer never checkpoints: it goes on
        src.execute("COMMIT")
        src.close()
        _, copied = state.checkpointer.checkpoint()  # (the thread's look, run here)
        assert copied > 0
        submit(state, 42, 5)  # the writer starts the log again, and cuts it back
        assert wal.stat().st_size <= 256 << 10, f"still {wal.stat().st_size} bytes"
    finally:
        state.close()


def test_an_installed_snapshot_answers_as_the_database_it_was_copied_from(tmp_path: Path) -> None:
    live = tmp_path / "state.db"
    state = filled(live, 12, per_entry=3)
    src, _ = snapshots.pin(live)
    snapshots.write_copy(src, tmp_path / "raft.dump", RAFT)
    expected = answers(state)
    state.close()
    restored = filled(tmp_path / "other.db", 30)  # a node that went its own way
    reader = sqlite3.connect(tmp_path / "other.db")  # an API reader, open all along
    assert reader.execute("SELECT count(*) FROM jobs").fetchone() == (30,)
    restored.install(tmp_path / "raft.dump")
    try:
        assert answers(restored) == expected
        assert reader.execute("SELECT count(*) FROM jobs").fetchone() == (36,)
        reader.close()
        restored.close()
        restored = SqlState(tmp_path / "other.db")  # and after a restart
        assert answers(restored) == expected
        tables = {r[0] for r in restored.db.execute("SELECT name FROM sqlite_master")}
        assert "snapshot" not in tables  # the Raft data stays with the snapshot
        submit(restored, 13)  # and it goes on from there
        assert restored.applied_index == 13
    finally:
        restored.close()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda p: p.write_bytes(gzip.compress(b"an old pickled snapshot")),
            "not a schedd snapshot of this version (it is not an SQLite database",
        ),
        (
            lambda p: sqlite3.connect(p).execute("CREATE TABLE x (a)"),
            "not a complete schedd snapshot: no such table: snapshot",
        ),
        (
            lambda p: _snapshot_with(p, version=99),
            f"schema version 99; this schedd reads format 1 up to schema version {SCHEMA_VERSION}: "
            "it was written "
            "by a newer schedd",
        ),
        (lambda p: _snapshot_with(p, raft=b"{"), "damaged Raft data in the snapshot"),
    ],
)
def test_a_snapshot_that_cannot_be_used_is_refused_saying_why(
    tmp_path: Path, make: Any, message: str
) -> None:
    path = tmp_path / "raft.dump"
    make(path)
    with pytest.raises(snapshots.SnapshotError) as caught:
        snapshots.read_snapshot(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)


def _snapshot_with(path: Path, version: int = 1, raft: bytes | None = None) -> None:
    state = filled(path.parent / "src.db", 2)
    src, _ = snapshots.pin(path.parent / "src.db")
    snapshots.write_copy(src, path, RAFT)
    state.close()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"PRAGMA user_version = {version}")
    if raft is not None:
        db.execute("UPDATE snapshot SET value = ? WHERE key = 'raft'", (raft,))
    db.close()


class Machine:
    def __init__(self, live: Path) -> None:
        self.lock = threading.RLock()
        self.state = SqlState(live)

    def commit_now(self) -> None:
        if self.state.in_transaction:
            self.state.commit()


def snapshots_of(tmp_path: Path, live_entries: int) -> tuple[SqlSnapshots, Machine, list[str]]:
    """A snapshot of 10 entries at raft.dump, and a live database of ``live_entries``."""
    src_db = filled(tmp_path / "src.db", 10)
    src, _ = snapshots.pin(tmp_path / "src.db")
    snapshots.write_copy(src, tmp_path / "raft.dump", RAFT)
    src_db.close()
    filled(tmp_path / "state.db", live_entries).close()
    machine = Machine(tmp_path / "state.db")
    seen: list[str] = []
    snaps = SqlSnapshots(
        machine,
        tmp_path / "state.db",
        tmp_path / "raft.dump",  # type: ignore[arg-type]
        on_replaced=lambda: seen.append("replaced"),
        on_fatal=lambda m: seen.append(f"fatal: {m}"),
    )
    return snaps, machine, seen


def test_at_start_a_live_database_newer_than_the_snapshot_is_kept(tmp_path: Path) -> None:
    snaps, machine, seen = snapshots_of(tmp_path, live_entries=14)
    assert snaps.deserialize(str(tmp_path / "raft.dump")) == RAFT
    assert machine.state.applied_index == 14 and seen == []  # the journal replays after 14


def test_at_start_a_live_database_older_than_the_snapshot_is_replaced(tmp_path: Path) -> None:
    snaps, machine, seen = snapshots_of(tmp_path, live_entries=4)
    assert snaps.deserialize(str(tmp_path / "raft.dump")) == RAFT
    assert machine.state.applied_index == 10 and seen == ["replaced"]


def test_a_snapshot_from_the_leader_always_replaces_the_live_database(tmp_path: Path) -> None:
    snaps, machine, seen = snapshots_of(tmp_path, live_entries=14)
    snaps.running = True
    assert snaps.deserialize(str(tmp_path / "raft.dump")) == RAFT
    assert machine.state.applied_index == 10 and seen == ["replaced"]
    assert "J12-0" not in machine.state.jobs


def test_a_snapshot_that_cannot_be_used_stops_the_node_instead_of_being_skipped(
    tmp_path: Path,
) -> None:
    snaps, machine, seen = snapshots_of(tmp_path, live_entries=4)
    (tmp_path / "raft.dump").write_bytes(b"not a database at all, 16+ bytes")
    with pytest.raises(snapshots.SnapshotError):
        snaps.deserialize(str(tmp_path / "raft.dump"))
    assert len(seen) == 1 and seen[0].startswith("fatal: ") and "not a schedd snapshot" in seen[0]
    assert machine.state.applied_index == 4  # untouched


def test_a_snapshot_is_written_in_the_background_and_reported_once(tmp_path: Path) -> None:
    snaps, machine, _ = snapshots_of(tmp_path, live_entries=5)
    # the sixth entry applied and not yet committed (a leader command waits a little): the
    # copy still holds every entry applied before it began
    jobs = (("J6-0", JobSpec(task="t")),)
    assert apply_entry(
        machine.state, commands.encode_entry([commands.Submit("r6", T0 + 6, jobs)]), 6, commit=False
    )
    assert machine.state.committed_index == 5
    (tmp_path / "raft.dump").unlink()
    snaps.serialize(str(tmp_path / "raft.dump.tmp"), RAFT)
    assert snaps.busy_for() is not None
    copy = snaps._copy
    assert copy is not None and copy.done.wait(10)
    assert snaps.check() == SERIALIZER_STATE.SUCCESS
    assert snaps.check() == SERIALIZER_STATE.NOT_SERIALIZING and snaps.busy_for() is None
    assert snapshots.read_snapshot(tmp_path / "raft.dump").applied_index == 6
    assert snaps.last_index == 6 and snaps.last_duration is not None
    assert not (tmp_path / "raft.dump.tmp").exists()  # pysyncobj's own name is never written


def test_a_failed_copy_is_reported_and_the_old_snapshot_kept(tmp_path: Path) -> None:
    snaps, machine, _ = snapshots_of(tmp_path, live_entries=6)
    before = (tmp_path / "raft.dump").read_bytes()
    (tmp_path / "raft.dump.sqltmp").mkdir()  # the copy cannot create its file
    snaps.serialize(str(tmp_path / "raft.dump.tmp"), RAFT)
    copy = snaps._copy
    assert copy is not None and copy.done.wait(10)
    assert snaps.check() == SERIALIZER_STATE.FAILED
    assert (tmp_path / "raft.dump").read_bytes() == before
    # the copy let go of its read transaction: the writer can checkpoint the whole WAL
    submit(machine.state, 7)
    busy, _, _ = machine.state.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    assert busy == 0


def test_at_start_the_journal_is_told_the_snapshots_last_two_entries(tmp_path: Path) -> None:
    snaps, _, seen = snapshots_of(tmp_path, live_entries=14)
    told: list[tuple[object, object]] = []
    snaps.on_loaded = lambda prev, last: told.append((prev, last))
    snaps.deserialize(str(tmp_path / "raft.dump"))
    last, prev, _ = RAFT
    assert told == [(prev, last)] and seen == []
    snaps.running = True  # a snapshot from the leader replaces the journal: nothing to align
    snaps.deserialize(str(tmp_path / "raft.dump"))
    assert told == [(prev, last)]


def test_a_journal_that_cannot_drop_its_head_at_start_stops_the_node(tmp_path: Path) -> None:
    snaps, _, seen = snapshots_of(tmp_path, live_entries=14)

    def broken(prev: object, last: object) -> None:
        raise OSError("Bad file descriptor")

    snaps.on_loaded = broken
    with pytest.raises(OSError):
        snaps.deserialize(str(tmp_path / "raft.dump"))
    assert len(seen) == 1 and seen[0].startswith("fatal: ") and "Bad file descriptor" in seen[0]
