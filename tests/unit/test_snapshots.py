"""Snapshots without copies (schedd/storage/snapshots.py, schedd/raft/snapshots.py).

A compaction is a barrier: the database's log synced and a small marker written, whatever the
size of the state.  A whole copy is an image streamed from a pinned read transaction while the
node goes on writing and checkpointing, received beside the live database, checked, and
installed by rename; an install a stop interrupted is finished at start.  Real SQLite files,
commands applied through the real core."""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.config import SERIALIZER_STATE

from schedd.core import commands
from schedd.core.model import JobSpec
from schedd.raft import snapshots as raft_snapshots
from schedd.raft.snapshots import SqlSnapshots
from schedd.storage import snapshots
from schedd.storage.schema import SCHEMA_VERSION
from schedd.storage.sqlstate import SqlState, apply_entry
from tests.property.test_sql_state_property import answers

LAST_WHOLE_COPY_SCHEMA = 3  # whole-copy snapshots (raft-dump-v<N>) were written up to it

T0 = 1_800_000_000_000
RAFT = ((b"\x01last", 7, 2), (b"\x01prev", 6, 2), ["127.0.0.1:9001", "127.0.0.1:9002"])


def raft_at(index: int, term: int = 2) -> Any:
    return ((b"\x01last", index, term), (b"\x01prev", index - 1, term), RAFT[2])


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


def replayed(path: Path, entries: int, per_entry: int = 1) -> dict[str, Any]:
    """What a database that applied exactly ``entries`` entries answers."""
    state = filled(path, entries, per_entry)
    try:
        return answers(state)
    finally:
        state.close()


def stream(source: snapshots.ImageSource) -> bytes:
    return b"".join(source)


# -- the marker ---------------------------------------------------------------------------------
def test_a_marker_is_small_and_read_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "raft.dump"
    snapshots.write_marker(path, snapshots.Marker(RAFT, 9))
    assert path.stat().st_size < 1024
    assert not Path(f"{path}{snapshots.MARKER_TMP}").exists()
    marker = snapshots.read_marker(path)
    assert (marker.raft, marker.applied_index, marker.schema) == (RAFT, 9, SCHEMA_VERSION)
    assert (marker.index, marker.term) == (7, 2)
    info = snapshots.read_snapshot(path)
    assert (info.raft, info.applied_index, info.copy) == (RAFT, 9, False)


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x20
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda p: _flip(p, 40),
            "a damaged snapshot marker (its header's checksum does not match)",
        ),
        (lambda p: p.write_bytes(p.read_bytes()[:30]), "a damaged snapshot marker"),
        (lambda p: _flip(p, 8), "version"),  # the version field: from a newer schedd
        (lambda p: p.write_bytes(b"not a database at all, 16+ bytes"), "not a schedd snapshot"),
    ],
)
def test_a_marker_that_cannot_be_used_is_refused_saying_why(
    tmp_path: Path, damage: Any, message: str
) -> None:
    path = tmp_path / "raft.dump"
    snapshots.write_marker(path, snapshots.Marker(RAFT, 9))
    damage(path)
    with pytest.raises(snapshots.SnapshotError) as caught:
        snapshots.read_snapshot(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)


# -- the image ------------------------------------------------------------------------------------
def test_an_image_of_a_database_being_written_is_a_whole_state_at_or_after_its_pin(
    tmp_path: Path,
) -> None:
    """The node goes on applying and checkpointing while the image is read: the image installs
    as exactly the state of some entry at or after the one it was pinned at."""
    live = tmp_path / "live" / "state.db"
    live.parent.mkdir()
    state = filled(live, 30, per_entry=40)
    source = snapshots.ImageSource(live, rate=1e12, raft=raft_at(30), node="n1")
    assert source.header.applied_index == 30
    index = 30
    blocks = []
    while block := source.read():  # entries applied and checkpointed between the blocks
        blocks.append(block)
        index += 1
        submit(state, index, 20)
        if index % 3 == 0 and state.checkpointer is not None:
            state.checkpointer.checkpoint()
    source.close()
    state.close()
    sink = snapshots.ImageSink(tmp_path / "state.db.incoming")
    assert any(sink.feed(b) for b in blocks)
    assert sink.header is not None and sink.header.raft == raft_at(30)
    applied = snapshots.finalize_incoming(tmp_path / "state.db.incoming")
    assert applied >= 30
    got = SqlState(tmp_path / "state.db.incoming")
    try:
        assert got.applied_index == applied
        got_answers = answers(got)
    finally:
        got.close()
    # the same entries again, one per index, into a fresh database (index 1-30: 40 jobs each)
    ref = SqlState(tmp_path / "ref.db")
    try:
        for i in range(1, applied + 1):
            submit(ref, i, 40 if i <= 30 else 20)
        assert got_answers == answers(ref)
    finally:
        ref.close()


def test_an_image_is_sent_at_its_pace(tmp_path: Path) -> None:
    live = tmp_path / "state.db"
    filled(live, 40, per_entry=50).close()
    now = [0.0]
    rate = 256 << 10  # bytes a second
    source = snapshots.ImageSource(live, rate=rate, clock=lambda: now[0])
    try:
        for _ in range(200):  # let the reader thread read ahead
            if len(source._ready) >= 2:
                break
            time.sleep(0.01)
        sent = 0
        while (block := source.take()) is not None:
            sent += len(block)
        assert 0 < sent <= source.pacer.burst + snapshots.CHUNK + 4096  # one burst, no more
        now[0] += 1.0  # a second later: about rate more bytes
        later = 0
        for _ in range(200):
            block = source.take()
            if block is None and len(source._ready) == 0 and not source.done:
                time.sleep(0.01)
                continue
            if block is None:
                break
            later += len(block)
        assert rate / 2 <= later <= rate + snapshots.CHUNK + 4096
    finally:
        source.close()


def image_file(tmp_path: Path, entries: int = 10) -> Path:
    live = tmp_path / "src" / "state.db"
    live.parent.mkdir(exist_ok=True)
    filled(live, entries, per_entry=20).close()
    with snapshots.ImageSource(live, rate=1e12) as source:
        path = tmp_path / "backup.snap"
        snapshots.write_image(iter(source), path)
    return path


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d[:-500], "an incomplete snapshot"),
        (lambda d: d[:10], "an incomplete snapshot (the file ends before its header"),
        (lambda d: d[:5000] + bytes([d[5000] ^ 1]) + d[5001:], "checksum does not match"),
        (lambda d: b"PK\x03\x04" + d[4:], "not a schedd snapshot"),
        (lambda d: d + b"more", "data after the end of the snapshot"),
    ],
)
def test_a_damaged_image_is_refused_saying_why_and_leaves_nothing_behind(
    tmp_path: Path, damage: Any, message: str
) -> None:
    path = image_file(tmp_path)
    path.write_bytes(damage(path.read_bytes()))
    into = tmp_path / "out" / "state.db.incoming"
    into.parent.mkdir()
    with pytest.raises(snapshots.SnapshotError) as caught:
        snapshots.verify_image(path, into)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
    assert list(into.parent.iterdir()) == []


def test_a_whole_image_file_is_verified_with_its_counts(tmp_path: Path) -> None:
    path = image_file(tmp_path, entries=10)
    checked = snapshots.verify_image(path)
    assert checked.size == path.stat().st_size
    h = checked.header
    assert (h.applied_index, h.schema, h.counts["jobs"], h.counts["runs"]) == (
        10,
        SCHEMA_VERSION,
        200,
        200,
    )


# -- installing by rename -------------------------------------------------------------------------
def test_an_install_replaces_the_live_database_and_its_log_whole(tmp_path: Path) -> None:
    """The live database has committed entries still in its write-ahead log: the log is
    removed before the new file takes its name (a log beside a database it does not belong to
    would be replayed into it)."""
    path = image_file(tmp_path, entries=12)
    live = tmp_path / "state.db"
    state = filled(live, 5)
    submit(state, 6, 30)
    assert Path(f"{live}-wal").stat().st_size > 0
    incoming = tmp_path / f"state.db{snapshots.INCOMING}"
    snapshots.verify_image(path, incoming)
    assert snapshots.finalize_incoming(incoming) == 12
    snapshots.decide_install(incoming, live)
    state.reopen(lambda: snapshots.finish_install(live))
    try:
        assert state.applied_index == 12
        assert answers(state) == replayed(tmp_path / "ref.db", 12, per_entry=20)
        assert state.db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        state.close()


def test_an_install_a_stop_interrupted_is_finished_at_start(tmp_path: Path) -> None:
    path = image_file(tmp_path, entries=12)
    live = tmp_path / "state.db"
    filled(live, 5).close()
    incoming = tmp_path / f"state.db{snapshots.INCOMING}"
    snapshots.verify_image(path, incoming)
    snapshots.finalize_incoming(incoming)
    snapshots.decide_install(incoming, live)  # ... and the node stops here
    assert raft_snapshots.prepare(live)
    state = SqlState(live)
    try:
        assert state.applied_index == 12
    finally:
        state.close()
    assert not raft_snapshots.prepare(live)  # nothing more to do


def test_a_copy_still_coming_in_when_the_node_stopped_is_dropped_at_start(tmp_path: Path) -> None:
    path = image_file(tmp_path)
    live = tmp_path / "state.db"
    filled(live, 5).close()
    incoming = tmp_path / f"state.db{snapshots.INCOMING}"
    sink = snapshots.ImageSink(incoming)
    sink.feed(path.read_bytes()[:200_000])  # a part of a copy
    sink._close_files()  # ... and the node stops
    assert incoming.exists()
    assert not raft_snapshots.prepare(live)
    assert not incoming.exists() and not Path(f"{incoming}-wal").exists()
    state = SqlState(live)
    assert state.applied_index == 5
    state.close()


# -- the node's side: the barrier, start, sending and receiving -----------------------------------
class Machine:
    def __init__(self, live: Path) -> None:
        self.lock = threading.RLock()
        self.state = SqlState(live)

    def commit_now(self) -> None:
        if self.state.in_transaction:
            self.state.commit()


def node(
    tmp_path: Path, name: str, entries: int, *, rate: float = 1e12
) -> tuple[SqlSnapshots, Machine, list[str]]:
    d = tmp_path / name
    d.mkdir()
    filled(d / "state.db", entries, per_entry=5).close()
    machine = Machine(d / "state.db")
    seen: list[str] = []
    snaps = SqlSnapshots(
        machine,
        d / "state.db",
        d / "raft.dump",
        on_replaced=lambda: seen.append("replaced"),
        on_fatal=lambda m: seen.append(f"fatal: {m}"),
        rate=rate,
        node=name,
    )
    return snaps, machine, seen


def test_a_compaction_syncs_the_log_and_writes_a_marker_without_copying_the_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snaps, machine, _ = node(tmp_path, "n1", 40)
    # the 41st entry applied and not yet committed (a leader command waits a little): the
    # barrier commits it, and the marker vouches for it
    jobs = (("J41-0", JobSpec(task="t")),)
    assert apply_entry(
        machine.state, commands.encode_entry([commands.Submit("r41", T0, jobs)]), 41, commit=False
    )
    synced: list[str] = []
    real = snapshots.fsync_path

    def spy(path: Path | str, *, directory: bool = False) -> None:
        synced.append(os.path.basename(str(path)))
        real(path, directory=directory)

    monkeypatch.setattr(snapshots, "fsync_path", spy)
    written: list[str] = []
    real_open = os.open

    def opened(path: Any, flags: int, *a: Any) -> int:
        if flags & os.O_WRONLY or flags & os.O_RDWR:
            written.append(os.path.basename(str(path)))
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", opened)
    snaps.serialize(str(tmp_path / "n1" / "raft.dump.tmp"), raft_at(40))
    assert snaps.wait_barrier(10)
    assert snaps.check() == SERIALIZER_STATE.SUCCESS
    assert snaps.check() == SERIALIZER_STATE.NOT_SERIALIZING and snaps.busy_for() is None
    assert "state.db-wal" in synced  # the log synced before the marker says it holds 41
    assert written == [f"raft.dump{snapshots.MARKER_TMP}"]  # nothing but the marker written
    marker = snapshots.read_marker(tmp_path / "n1" / "raft.dump")
    assert (marker.index, marker.applied_index) == (40, 41)
    assert snaps.last_index == 40 and snaps.last_duration is not None
    assert not (tmp_path / "n1" / "raft.dump.tmp").exists()  # pysyncobj's name never written


def test_a_failed_barrier_is_reported_and_the_old_marker_kept(tmp_path: Path) -> None:
    snaps, _, _ = node(tmp_path, "n1", 6)
    dump = tmp_path / "n1" / "raft.dump"
    snapshots.write_marker(dump, snapshots.Marker(raft_at(5), 5))
    before = dump.read_bytes()
    Path(f"{dump}{snapshots.MARKER_TMP}").mkdir()  # the marker cannot be written
    snaps.serialize(str(dump) + ".tmp", raft_at(6))
    assert snaps.wait_barrier(10)
    assert snaps.check() == SERIALIZER_STATE.FAILED
    assert dump.read_bytes() == before


def test_at_start_the_marker_is_loaded_and_the_journal_told_its_entries(tmp_path: Path) -> None:
    snaps, machine, seen = node(tmp_path, "n1", 14)
    dump = tmp_path / "n1" / "raft.dump"
    snapshots.write_marker(dump, snapshots.Marker(RAFT, 9))
    told: list[tuple[object, object]] = []
    snaps.on_loaded = lambda prev, last: told.append((prev, last))
    assert snaps.deserialize(str(dump)) == RAFT
    assert told == [(RAFT[1], RAFT[0])] and seen == []
    assert machine.state.applied_index == 14  # untouched: the journal replays after it


def test_at_start_a_database_older_than_its_marker_stops_the_node_saying_what_to_do(
    tmp_path: Path,
) -> None:
    snaps, _, seen = node(tmp_path, "n1", 4)
    dump = tmp_path / "n1" / "raft.dump"
    snapshots.write_marker(dump, snapshots.Marker(RAFT, 9))  # compacted up to 7
    with pytest.raises(snapshots.SnapshotError):
        snaps.deserialize(str(dump))
    assert len(seen) == 1 and seen[0].startswith("fatal: ")
    assert "holds the entries up to 4" in seen[0] and "compacted up to 7" in seen[0]
    assert "rebuild it from the cluster" in seen[0]


def test_at_start_a_whole_copy_from_an_older_schedd_is_still_used(tmp_path: Path) -> None:
    """raft.dump of format 1 (a whole copy): installed when the live database is older."""
    sample = (
        Path(__file__).resolve().parents[1] / "data" / f"raft-dump-v{LAST_WHOLE_COPY_SCHEMA}.sqlite"
    )
    snaps, machine, seen = node(tmp_path, "n1", 4)
    dump = tmp_path / "n1" / "raft.dump"
    shutil.copyfile(sample, dump)
    info = snapshots.read_snapshot(dump)
    assert info.copy and info.applied_index > 4
    assert snaps.deserialize(str(dump)) == info.raft
    assert machine.state.applied_index == info.applied_index and seen == ["replaced"]


def pump(leader: SqlSnapshots, follower: SqlSnapshots, raft: Any, *, apply: Any = None) -> int:
    """Move a copy from ``leader`` to ``follower`` as pysyncobj would; the pieces sent."""
    pieces = 0
    for _ in range(100_000):
        data = leader.transmission("f", raft)
        if data is None:
            time.sleep(0.001)
            continue
        pieces += 1
        if apply is not None:
            apply(pieces)
        if follower.receive(data):
            return pieces
    raise AssertionError("the copy never completed")


def test_a_copy_goes_from_the_leader_to_a_follower_and_is_installed_by_rename(
    tmp_path: Path,
) -> None:
    leader, lm, _ = node(tmp_path, "lead", 60)
    follower, fm, seen = node(tmp_path, "fol", 3)
    follower.running = True
    before = os.stat(tmp_path / "lead" / "state.db").st_ino
    index = [60]

    def more(_: int) -> None:  # the leader goes on applying while it sends
        index[0] += 1
        submit(lm.state, index[0], 5)

    assert leader.holding() is False
    pump(leader, follower, raft_at(50), apply=more)
    assert leader.holding() is False and leader.sent["completed"] == 1
    # the follower's database is the copy, renamed into place; the leader wrote nothing
    assert os.stat(tmp_path / "lead" / "state.db").st_ino == before
    assert not Path(f"{tmp_path}/fol/state.db{snapshots.INSTALL}").exists()
    assert fm.state.applied_index >= 60  # newer than its Raft data (50): fine
    marker = snapshots.read_marker(tmp_path / "fol" / "raft.dump")
    assert (marker.index, marker.applied_index) == (50, fm.state.applied_index)
    assert follower.deserialize(str(tmp_path / "fol" / "raft.dump")) == raft_at(50)
    assert seen == ["replaced"]
    got = answers(fm.state)
    assert got == replayed_with(tmp_path / "ref.db", fm.state.applied_index)
    # the entries the copy already holds are skipped when the log brings them
    blob = commands.encode_entry([commands.Submit("r55", T0, (("X", JobSpec(task="t")),))])
    assert apply_entry(fm.state, blob, 55) is None


def replayed_with(path: Path, applied: int) -> dict[str, Any]:
    state = SqlState(path)
    try:
        for i in range(1, applied + 1):
            submit(state, i, 5)
        return answers(state)
    finally:
        state.close()


def test_no_copy_begins_while_a_barrier_is_written_and_compaction_waits_while_one_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader, _, _ = node(tmp_path, "lead", 20, rate=64 << 10)
    go = threading.Event()
    real = snapshots.fsync_path

    def slow(path: Path | str, *, directory: bool = False) -> None:
        go.wait(10)
        real(path, directory=directory)

    monkeypatch.setattr(snapshots, "fsync_path", slow)
    leader.serialize(str(tmp_path / "lead" / "raft.dump.tmp"), raft_at(20))
    assert leader.check() == SERIALIZER_STATE.SERIALIZING
    assert leader.transmission("f", raft_at(19)) is None  # the log's start is about to move
    assert not leader.holding()
    go.set()
    assert leader.wait_barrier(10)
    assert leader.check() == SERIALIZER_STATE.SUCCESS
    for _ in range(1000):
        if leader.transmission("f", raft_at(20)) is not None:
            break
        time.sleep(0.005)
    assert leader.holding()
    leader.sweep(leading=False)  # this node no longer leads: the copy goes
    assert not leader.holding() and leader.sent["dropped"] == 1


def test_a_copy_whose_log_start_moved_starts_again_with_the_new_one(tmp_path: Path) -> None:
    """The hazard of pysyncobj's own transfers: a compaction during a transfer left it going
    with the old Raft data.  Here the copy starts again, from its first piece."""
    leader, _, _ = node(tmp_path, "lead", 30, rate=1e12)
    follower, fm, _ = node(tmp_path, "fol", 2)
    follower.running = True
    first = None
    for _ in range(1000):
        first = leader.transmission("f", raft_at(20))
        if first is not None:
            break
        time.sleep(0.001)
    assert first is not None and first[1] is True
    assert follower.receive(first) is False
    data = None
    for _ in range(1000):  # the log was compacted up to 25 meanwhile (its cap reached)
        data = leader.transmission("f", raft_at(25))
        if data is not None:
            break
        time.sleep(0.001)
    assert data is not None and data[1] is True  # a new copy, from its first piece
    assert leader.sent["restarted"] == 1
    assert follower.receive(data) is False
    pump(leader, follower, raft_at(25))
    assert snapshots.read_marker(tmp_path / "fol" / "raft.dump").index == 25
    assert fm.state.applied_index == 30


def test_a_damaged_piece_makes_the_follower_drop_the_copy_and_wait_for_the_next(
    tmp_path: Path,
) -> None:
    leader, _, _ = node(tmp_path, "lead", 30)
    follower, fm, seen = node(tmp_path, "fol", 2)
    follower.running = True
    pieces = []
    while True:
        data = leader.transmission("f", raft_at(30))
        if data is None:
            time.sleep(0.001)
            continue
        pieces.append(data)
        if data[2]:
            break
    block, first, last = pieces[3]
    pieces[3] = (block[:100] + bytes([block[100] ^ 1]) + block[101:], first, last)
    assert not any(follower.receive(p) for p in pieces)
    assert follower.received["failed"] == 1 and seen == []
    assert fm.state.applied_index == 2
    assert not follower.incoming_path.exists()


def test_a_piece_lost_on_the_way_is_noticed_at_the_next_one(tmp_path: Path) -> None:
    live = tmp_path / "src" / "state.db"
    live.parent.mkdir()
    filled(live, 20, per_entry=20).close()
    with snapshots.ImageSource(live, rate=1e12) as source:
        blocks = list(source)
    assert len(blocks) > 6
    sink = snapshots.ImageSink(tmp_path / "state.db.incoming")
    for block in blocks[:3]:
        assert sink.feed(block) is False
    with pytest.raises(snapshots.SnapshotError, match="a piece is missing"):
        sink.feed(blocks[4])  # the fourth never came
    assert not (tmp_path / "state.db.incoming").exists()


def test_a_marker_keeps_long_commands_as_digests_and_takes_them_back_from_the_journal(
    tmp_path: Path,
) -> None:
    big = b"\x00" + b"j" * 200_000  # a batch of a thousand jobs is about this long
    raft = ((big, 7, 2), (big + b"x", 6, 2), RAFT[2])
    snaps, _, seen = node(tmp_path, "n1", 9)
    dump = tmp_path / "n1" / "raft.dump"
    snapshots.write_marker(dump, snapshots.Marker(raft, 9))
    assert dump.stat().st_size < 1024  # small, whatever the entries hold
    journal = {6: raft[1], 7: raft[0], 8: (b"\x00next", 8, 2)}
    snaps.entry_at = journal.get
    told: list[tuple[object, object]] = []
    snaps.on_loaded = lambda prev, last: told.append((prev, last))
    assert snaps.deserialize(str(dump)) == raft  # whole again, as pysyncobj compares them
    assert told == [(raft[1], raft[0])] and seen == []
    # a journal that does not hold them (lost, replaced): the node stops, saying what to do
    snaps.entry_at = {6: raft[1], 7: (b"\x00other", 7, 2)}.get
    with pytest.raises(snapshots.SnapshotError):
        snaps.deserialize(str(dump))
    assert len(seen) == 1 and "does not hold the entries the snapshot marker names" in seen[0]


def test_a_whole_copy_from_a_leader_of_an_older_schedd_is_installed(tmp_path: Path) -> None:
    """During a rolling upgrade the leader may still run the older schedd, which sends its
    raft.dump (a whole SQLite copy, format 1) as it is: it is installed as the leader meant."""
    frozen = (
        Path(__file__).resolve().parents[1] / "data" / f"raft-dump-v{LAST_WHOLE_COPY_SCHEMA}.sqlite"
    )
    sample = tmp_path / "old-leader.dump"
    shutil.copyfile(frozen, sample)
    db = sqlite3.connect(sample)  # the frozen sample's Raft data names index 31: a real copy
    db.execute(  # holds at least the entries its Raft data names
        "UPDATE snapshot SET value = ? WHERE key = 'raft'", (snapshots.encode_raft(raft_at(10)),)
    )
    db.commit()
    db.close()
    want = snapshots.read_snapshot(sample)
    assert want.copy and want.applied_index == 10
    follower, fm, seen = node(tmp_path, "fol", 2)
    follower.running = True
    data = sample.read_bytes()
    pieces = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    results = [follower.receive((p, i == 0, False)) for i, p in enumerate(pieces)]
    assert results == [False] * len(pieces)
    assert follower.receive((b"", False, True)) is True  # pysyncobj's last, empty piece
    assert fm.state.applied_index == want.applied_index
    assert "snapshot" not in {
        r[0] for r in fm.state.db.execute("SELECT name FROM sqlite_master").fetchall()
    }
    assert follower.deserialize(str(tmp_path / "fol" / "raft.dump")) == want.raft
    assert seen == ["replaced"]
