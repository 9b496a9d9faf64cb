"""DurableJournal: round trip, crash recovery (torn tail at every byte, flipped byte), truncation
and compaction, the state file, the frozen format, and the sync-before-acknowledge hook."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pysyncobj.journal import FileJournal
from pysyncobj.transport import TCPTransport

from schedd.raft import journal as jmod
from schedd.raft.journal import (
    HEADER_SIZE,
    UNKNOWN_VOTE,
    DurableJournal,
    DurableTransport,
    JournalError,
    RaftState,
    encode_header,
    encode_record,
)

Entry = tuple[bytes, int, int]


def entries(n: int, start: int = 1, term: int = 1) -> list[Entry]:
    return [(f"cmd-{i}".encode() * (1 + i % 3), i, term + i // 4) for i in range(start, start + n)]


def write(path: Path, items: list[Entry]) -> None:
    j = DurableJournal(str(path))
    for e in items:
        j.add(*e)
    j._destroy()


def reopen(path: Path) -> DurableJournal:
    return DurableJournal(str(path))


def record_bounds(path: Path) -> list[tuple[int, int]]:
    j = reopen(path)
    ends = list(j._ends)
    j._destroy()
    return list(zip([HEADER_SIZE, *ends[:-1]], ends, strict=True))


def truncated_events(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "raft.journal_truncated"]


# -- basics ------------------------------------------------------------------------------------
def test_round_trip_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    items = entries(50)
    j = DurableJournal(str(path))
    assert len(j) == 0
    for e in items:
        j.add(*e)
    assert len(j) == 50 and j[0] == items[0] and j[-1] == items[-1]
    assert j[10:13] == items[10:13] and j[45:] == items[45:]  # pysyncobj slices the log
    j._destroy()
    j = reopen(path)
    assert list(j[:]) == items and j.damage is None
    j._destroy()


def test_add_is_not_written_before_sync_and_sync_makes_it_durable(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    j = DurableJournal(str(path))
    for e in entries(3):
        j.add(*e)
    j.sync()
    for e in entries(2, start=4):
        j.add(*e)
    crashed = reopen(path)  # a second reader sees what a crash now would leave
    assert len(crashed) == 3
    crashed._destroy()
    j.sync()
    assert len(reopen(path)) == 5
    j._destroy()


def test_commit_index_beyond_synced_entries_forces_a_sync(tmp_path: Path) -> None:
    # A one-node leader counts only itself: the commit must not run ahead of its disk.
    path = tmp_path / "raft.journal"
    j = DurableJournal(str(path))
    for e in entries(4):
        j.add(*e)
    syncs = j.syncs
    j.setRaftCommitIndex(4)
    assert j.syncs == syncs + 1 and len(reopen(path)) == 4
    j.setRaftCommitIndex(4)
    assert j.syncs == syncs + 1  # nothing new: no sync
    j._destroy()


# -- recovery ----------------------------------------------------------------------------------
def test_torn_tail_at_every_byte_of_the_last_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = tmp_path / "full.journal"
    items = entries(6)
    write(src, items)
    start, end = record_bounds(src)[-1]
    data = src.read_bytes()
    for cut in range(start + 1, end):
        path = tmp_path / f"cut-{cut}.journal"
        path.write_bytes(data[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="schedd.raft.journal"):
            j = reopen(path)
        assert list(j[:]) == items[:-1], cut
        assert (
            j.damage is not None
            and j.damage.offset == start
            and j.damage.dropped_bytes == cut - start
        )
        assert os.path.getsize(path) == start  # cut on disk, not only ignored
        [event] = truncated_events(caplog)
        assert event.fields["offset"] == start and event.fields["dropped_records"] == 1  # type: ignore[attr-defined]
        j.add(*items[-1])  # appending after the cut gives a clean journal again
        j._destroy()
        again = reopen(path)
        assert list(again[:]) == items and again.damage is None
        again._destroy()


def test_zero_filled_tail_is_cut(tmp_path: Path) -> None:
    # Some file systems extend the file before the data lands: the tail reads as zeros.
    path = tmp_path / "raft.journal"
    write(path, entries(3))
    with open(path, "ab") as f:
        f.write(b"\0" * 4096)
    j = reopen(path)
    assert len(j) == 3 and j.damage is not None and j.damage.reason.startswith("impossible")
    j._destroy()


@pytest.mark.parametrize("where", ["length", "crc", "index", "term", "command"])
def test_flipped_byte_in_the_middle_cuts_there(
    tmp_path: Path, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "raft.journal"
    items = entries(20)
    write(path, items)
    start, _ = record_bounds(path)[7]
    offset = start + {"length": 0, "crc": 5, "index": 8, "term": 17, "command": 25}[where]
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="schedd.raft.journal"):
        j = reopen(path)
    assert list(j[:]) == items[:7]  # never garbage, never anything after the damage
    assert j.damage is not None and j.damage.offset == start and os.path.getsize(path) == start
    assert truncated_events(caplog)
    kept = list(tmp_path.glob("raft.journal.dropped.*"))
    assert len(kept) == 1 and kept[0].read_bytes() == bytes(data[start:])  # for forensics
    j._destroy()


def test_valid_records_out_of_sequence_are_cut(tmp_path: Path) -> None:
    # Checksums are per record: a stale record after newer ones must not be read back.
    path = tmp_path / "raft.journal"
    items = entries(3, term=5)
    write(path, items)
    with open(path, "ab") as f:
        f.write(encode_record(b"stale", 4, 2))  # older term
        f.write(encode_record(b"gap", 9, 9))
    j = reopen(path)
    assert list(j[:]) == items and j.damage is not None and "out of sequence" in j.damage.reason
    j._destroy()


def test_damaged_header_keeps_the_intact_records(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    items = entries(4)
    write(path, items)
    data = bytearray(path.read_bytes())
    data[3] ^= 0xFF
    path.write_bytes(bytes(data))
    j = reopen(path)
    assert list(j[:]) == items
    j._destroy()
    assert path.read_bytes()[:HEADER_SIZE] == encode_header()
    assert list(tmp_path.glob("raft.journal.damaged.*"))


def test_a_journal_from_a_newer_version_is_refused_not_wiped(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    path.write_bytes(encode_header(version=99) + encode_record(b"x", 1, 1))
    with pytest.raises(JournalError, match="newer"):
        reopen(path)
    assert path.read_bytes()[:HEADER_SIZE] == encode_header(version=99)


# -- truncation and compaction ------------------------------------------------------------------
def test_delete_entries_from_then_reopen(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    items = entries(10)
    j = DurableJournal(str(path))
    for e in items[:6]:
        j.add(*e)
    j.sync()
    for e in items[6:]:
        j.add(*e)
    j.deleteEntriesFrom(8)  # only unwritten records
    assert list(j[:]) == items[:8]
    j.deleteEntriesFrom(4)  # into the written part
    assert list(j[:]) == items[:4] and len(reopen(path)) == 4  # durable at once
    replaced = [(b"new", 5, 2), (b"new", 6, 2)]
    for e in replaced:
        j.add(*e)
    j.deleteEntriesFrom(99)  # beyond the end: nothing
    j._destroy()
    assert list(reopen(path)[:]) == items[:4] + replaced


def test_delete_entries_to_then_reopen(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    dump = tmp_path / "raft.dump"
    dump.write_bytes(b"snapshot")
    items = entries(30)
    j = DurableJournal(str(path), snapshot_path=str(dump))
    for e in items[:20]:
        j.add(*e)
    j.sync()
    for e in items[20:]:
        j.add(*e)  # some still pending: they survive the rewrite
    size = os.path.getsize(path)
    j.deleteEntriesTo(18)
    assert list(j[:]) == items[18:]  # at once in memory; the file follows in the background
    assert os.path.getsize(path) == size
    assert j.finish_compaction(wait=True)
    assert os.path.getsize(path) < size
    assert list(reopen(path)[:]) == items[18:]  # durable once finished, pending ones included
    j.deleteEntriesFrom(5)  # offsets are right after the rewrite
    j.add(b"after", items[18][1] + 5, 9)
    j.deleteEntriesTo(0)
    j._destroy()
    assert list(reopen(path)[:]) == [*items[18:23], (b"after", items[18][1] + 5, 9)]
    assert not list(tmp_path.glob("*.tmp"))


def test_clear_then_reopen(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    write(path, entries(5))
    j = reopen(path)
    j.clear()
    j.add(b"snap-1", 40, 3)
    j.add(b"snap-2", 41, 3)
    j._destroy()
    assert list(reopen(path)[:]) == [(b"snap-1", 40, 3), (b"snap-2", 41, 3)]


# -- state -------------------------------------------------------------------------------------
def test_term_vote_and_commit_index_survive(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    j = DurableJournal(str(path))
    for e in entries(5):
        j.add(*e)
    j.setCurrentTerm(7, "127.0.0.1:4321")
    crashed = reopen(path)  # the term and vote are durable at once
    assert crashed.getCurrentTerm() == 7 and crashed.getVotedForNodeId() == "127.0.0.1:4321"
    crashed._destroy()
    j.setRaftCommitIndex(3)
    j.onOneSecondTimer()  # the commit index is stored lazily, like FileJournal does
    j.setCurrentTerm(8, None)
    j._destroy()
    j = reopen(path)
    assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()) == (8, None, 3)
    j._destroy()


def test_commit_index_is_clamped_to_the_recovered_log(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    j = DurableJournal(str(path))
    for e in entries(10):
        j.add(*e)
    j.setRaftCommitIndex(10)
    j._destroy()
    start, _ = record_bounds(path)[6]
    os.truncate(path, start + 3)
    j = reopen(path)
    assert len(j) == 6 and j.getRaftCommitIndex() == 6
    j._destroy()


def test_damaged_state_file_never_lets_the_node_vote_twice(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    j = DurableJournal(str(path))
    j.add(b"x", 1, 4)
    j.setCurrentTerm(5, "n2")
    j._destroy()
    state = tmp_path / "raft.journal.state"
    state.write_bytes(state.read_bytes()[:-3])
    j = reopen(path)
    assert j.getCurrentTerm() == 4 and j.getVotedForNodeId() == UNKNOWN_VOTE and len(j) == 1
    j._destroy()


# -- format ------------------------------------------------------------------------------------
FROZEN_JOURNAL = bytes.fromhex(
    "534348444a524e4c01000000a8bb736d11000000ba9f9c12010000000000000000000000000000000017000000"
    "a8890dac02000000000000000300000000000000016a6f622d343210000000b98354480300000000000000030000"
    "0000000000"
)
FROZEN_ENTRIES = [(b"\x00", 1, 0), (b"\x01job-42", 2, 3), (b"", 3, 3)]
FROZEN_STATE = (
    b'SCHDSTAT\x01\x00\x00\x00=\x00\x00\x00ie\xa0\xca{"commit_index": 2, "term": 7, '
    b'"voted_for": "127.0.0.1:4321"}'
)


def test_frozen_format_version_1(tmp_path: Path) -> None:
    # If this fails the on-disk format changed: bump VERSION and read the old one too.
    assert encode_header() + b"".join(encode_record(*e) for e in FROZEN_ENTRIES) == FROZEN_JOURNAL
    assert RaftState(7, "127.0.0.1:4321", 2).encode() == FROZEN_STATE
    path = tmp_path / "raft.journal"
    path.write_bytes(FROZEN_JOURNAL)
    (tmp_path / "raft.journal.state").write_bytes(FROZEN_STATE)
    j = reopen(path)
    assert list(j[:]) == FROZEN_ENTRIES and j.damage is None
    assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()) == (
        7,
        "127.0.0.1:4321",
        2,
    )
    j._destroy()


def test_a_pysyncobj_file_journal_is_imported(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    old = FileJournal(str(path))
    items = entries(12)
    for e in items:
        old.add(*e)
    old.setCurrentTerm(6, "127.0.0.1:9")
    old.setRaftCommitIndex(11)
    old.onOneSecondTimer()
    old._destroy()
    j = reopen(path)
    assert list(j[:]) == items
    assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()) == (
        6,
        "127.0.0.1:9",
        11,
    )
    j._destroy()
    assert (tmp_path / "raft.journal.pysyncobj.bak").exists()
    assert list(reopen(path)[:]) == items  # now in our format


# -- the acknowledgement hook ------------------------------------------------------------------
def test_transport_syncs_before_log_bearing_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "raft.journal"
    j = DurableJournal(str(path))
    seen: list[tuple[str, int]] = []

    def fake_send(self: Any, node: Any, message: Any) -> bool:
        crashed = reopen(path)
        seen.append((message["type"], len(crashed)))
        crashed._destroy()
        return True

    monkeypatch.setattr(TCPTransport, "send", fake_send)
    transport = DurableTransport.__new__(DurableTransport)
    transport.durable_journal = j
    j.add(b"a", 1, 1)
    transport.send(None, {"type": "apply_command_response", "request_id": 1})
    transport.send(None, {"type": "next_node_idx", "next_node_idx": 2, "success": True})
    j.add(b"b", 2, 1)
    transport.send(None, {"type": "append_entries", "entries": [(b"b", 2, 1)]})
    assert seen == [("apply_command_response", 0), ("next_node_idx", 1), ("append_entries", 2)]
    j._destroy()


def test_durable_journal_is_installed_only_inside_the_block(tmp_path: Path) -> None:
    import pysyncobj.syncobj as so

    original = so.createJournal
    with jmod.durable_journal() as durable:
        made = so.createJournal(str(tmp_path / "raft.journal"))
        assert isinstance(made, DurableJournal) and durable.journal is made
    assert so.createJournal is original
    made._destroy()


# -- property: any sequence of operations, crash or clean close, reads back consistently -------
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 4)),
        st.tuples(st.just("sync"), st.just(0)),
        st.tuples(st.just("from"), st.integers(0, 30)),
        st.tuples(st.just("to"), st.integers(0, 30)),
        st.tuples(st.just("finish"), st.just(0)),
        st.tuples(st.just("crash"), st.just(0)),
        st.tuples(st.just("close"), st.just(0)),
    ),
    max_size=40,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_model(tmp_path: Path, ops: list[tuple[str, int]]) -> None:
    root = tmp_path / "m"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    path = root / "raft.journal"
    j = DurableJournal(str(path))
    model: list[Entry] = []
    durable = 0  # model[:durable] must survive a crash
    base = 1  # the index of the first entry of the log (the model's first, once it has one)
    for op, n in ops:
        if op == "add":
            for _ in range(n):
                nxt = model[-1][1] + 1 if model else base
                e = (os.urandom(n), nxt, 1)
                j.add(*e)
                model.append(e)
        elif op == "sync":
            j.sync()
            durable = len(model)
        elif op == "from":
            j.deleteEntriesFrom(n)
            model = model[:n]
            durable = min(durable, len(model))
        elif op == "to" and n:
            base = model[min(n, len(model)) - 1][1] + 1 if model else base
            j.deleteEntriesTo(n)
            model = model[n:]
            durable = max(0, durable - n)
        elif op == "finish":
            if j.finish_compaction(wait=True):
                durable = len(model)  # the rename came after a sync of everything kept
        elif op in ("crash", "close"):
            if op == "close":
                j._destroy()
                durable = len(model)
            else:
                if j._compaction is not None:
                    j._compaction.discard()  # its thread dies with the process
                os.close(j._fd)  # no sync, no write of what is pending: a crash
            j = DurableJournal(str(path))
            # Records before the log's first entry are a head whose compaction did not finish
            # (at start, the node drops them again when it loads the snapshot: skip_to).
            stale = sum(1 for e in j[:] if e[1] < base)
            assert list(j[:stale]) == [e for e in j[:] if e[1] < base]
            j.deleteEntriesTo(stale)
            got = list(j[:])
            assert got[:durable] == model[:durable] and got == model[: len(got)]
            assert j.damage is None
            model, durable = got, len(got)
        assert list(j[:]) == model
    j._destroy()


# -- a node that lost acknowledged entries does not help elect a leader until it has them back --
def damaged_with_commit(tmp_path: Path, n: int, commit: int, victim: int) -> Path:
    path = tmp_path / "raft.journal"
    j = DurableJournal(str(path))
    for e in entries(n):
        j.add(*e)
    j.setRaftCommitIndex(commit)
    j._destroy()
    start, _ = record_bounds(path)[victim]
    data = bytearray(path.read_bytes())
    data[start + 12] ^= 0x10
    path.write_bytes(bytes(data))
    return path


def test_lost_acknowledged_entries_make_the_node_abstain_until_caught_up(tmp_path: Path) -> None:
    path = damaged_with_commit(tmp_path, n=10, commit=9, victim=4)
    j = reopen(path)
    assert len(j) == 4 and not j.may_vote() and j.abstain_until == 10  # 4 kept + 6 dropped
    j._destroy()
    j = reopen(path)  # the abstention survives a restart
    assert not j.may_vote()
    for e in entries(5, start=5):
        j.add(*e)
    j.sync()
    assert not j.may_vote()  # index 9 < 10
    j.add(*entries(1, start=10)[0])
    assert not j.may_vote()  # not before it is durable
    j.sync()
    assert j.may_vote() and j.abstain_until is None
    j._destroy()
    j = reopen(path)
    assert j.may_vote()
    j._destroy()


def test_a_torn_tail_after_power_loss_does_not_make_the_node_abstain(tmp_path: Path) -> None:
    # The state file is written after the log is synced: a stored commit index never covers
    # a record a power loss can tear, so every node of a cluster that lost power can vote.
    path = tmp_path / "raft.journal"
    j = DurableJournal(str(path))
    for e in entries(10):
        j.add(*e)
    j.setRaftCommitIndex(9)
    j._destroy()
    start, _ = record_bounds(path)[-1]
    os.truncate(path, start + 5)
    j = reopen(path)
    assert len(j) == 9 and j.damage is not None and j.may_vote()
    j._destroy()


def test_an_abstaining_node_withholds_votes_and_looks_out_of_date(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = reopen(damaged_with_commit(tmp_path, n=10, commit=10, victim=4))
    sent: list[Any] = []
    monkeypatch.setattr(
        TCPTransport, "send", lambda self, node, message: sent.append(message) or True
    )
    transport = DurableTransport.__new__(DurableTransport)
    transport.durable_journal = j
    assert transport.send(None, {"type": "response_vote", "term": 3})
    transport.send(
        None, {"type": "request_vote", "term": 4, "last_log_index": 4, "last_log_term": 1}
    )
    assert sent == [{"type": "request_vote", "term": 4, "last_log_index": 0, "last_log_term": -1}]
    for e in entries(6, start=5):
        j.add(*e)
    transport.send(None, {"type": "next_node_idx", "next_node_idx": 11, "success": True})
    transport.send(None, {"type": "response_vote", "term": 5})
    assert sent[-1] == {"type": "response_vote", "term": 5}
    j._destroy()


def test_a_failed_sync_stops_everything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failures: list[OSError] = []
    monkeypatch.setattr(DurableJournal, "on_io_failure", staticmethod(failures.append))
    j = DurableJournal(str(tmp_path / "raft.journal"))
    j.add(b"a", 1, 1)

    def eio(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(jmod, "_fdatasync", eio)
    with pytest.raises(JournalError):
        j.sync()
    monkeypatch.undo()  # the disk "works" again: still nothing is acknowledged
    with pytest.raises(JournalError, match="failed earlier"):
        j.sync()
    assert len(failures) == 1 and failures[0].errno == 5
    j._destroy()  # closes without writing


def test_the_snapshot_is_made_durable_before_the_head_it_replaces_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pysyncobj renames the dump into place without fsync; dropping the journal's head (or all
    # of it, when a snapshot is installed) must not outlive the snapshot in a power loss.
    dump = tmp_path / "raft.dump"
    dump.write_bytes(b"snapshot")
    j = DurableJournal(str(tmp_path / "raft.journal"), snapshot_path=str(dump))
    for e in entries(10):
        j.add(*e)
    j.sync()
    order: list[str] = []
    real_sync, real_replace = jmod._fsync_file, os.replace
    monkeypatch.setattr(
        jmod, "_fsync_file", lambda p: (order.append(f"fsync {Path(p).name}"), real_sync(p))[1]
    )
    monkeypatch.setattr(
        os,
        "replace",
        lambda a, b: (order.append(f"rename {Path(a).name} {Path(b).name}"), real_replace(a, b))[1],
    )
    j.deleteEntriesTo(5)
    assert j.finish_compaction(wait=True)
    assert order == ["fsync raft.dump", "rename raft.journal.compact raft.journal"]
    order.clear()
    j.clear()
    assert order == ["fsync raft.dump"]
    j._destroy()


def test_a_finished_compaction_copy_discarded_twice_is_closed_removed_and_harmless(
    tmp_path: Path,
) -> None:
    src = tmp_path / "journal"
    src.write_bytes(b"x" * 100)
    fd = os.open(src, os.O_RDONLY)
    copy = jmod._Compaction(os.dup(fd), 10, 100, 1, str(tmp_path / "copy"), None)
    os.close(fd)
    copy.start()
    copy.join(10)
    assert copy.done and copy.error is None and copy.fd >= 0  # the copy, still open
    assert (tmp_path / "copy").stat().st_size == jmod.HEADER_SIZE + 90
    copy.discard()
    assert copy.fd == -1 and not (tmp_path / "copy").exists()  # closed and forgotten
    copy.discard()  # again (the journal closing after it dropped the copy): nothing to do
    assert copy.fd == -1


# -- what the snapshots and the vote guard ask of it ---------------------------------------------
def test_an_entry_is_found_by_its_index_and_the_log_knows_its_size(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    items = entries(6, start=10)
    j = DurableJournal(str(path))
    try:
        assert j.entry_at(10) is None and j.size_bytes() == 0
        for e in items:
            j.add(*e)
        assert j.entry_at(10) == items[0] and j.entry_at(15) == items[5]
        assert j.entry_at(9) is None and j.entry_at(16) is None
        assert j.size_bytes() == sum(len(jmod.encode_record(*e)) for e in items)
        j.deleteEntriesTo(2)  # a compaction drops the head: it is no longer found or counted
        assert j.entry_at(11) is None and j.entry_at(12) == items[2]
        assert j.size_bytes() == sum(len(jmod.encode_record(*e)) for e in items[2:])
    finally:
        j._destroy()


def test_a_node_that_starts_empty_knows_it_and_abstains_until_caught_up(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    j = DurableJournal(str(path))
    assert j.new and j.holds_no_data() and j.may_vote()
    j.add(b"\x01", 1, 0)  # pysyncobj's first no-op, of term 0: not data
    assert j.holds_no_data()
    j.abstain_as_new("10.0.0.2:7701")  # a peer's hello: it holds data
    assert not j.may_vote() and j.abstain_until == jmod.UNTIL_LEADER_CONTACT
    j._destroy()
    again = DurableJournal(str(path))  # a restart does not make it forget
    try:
        assert not again.new and not again.may_vote()
        again.leader_contact(5)  # a leader: commit index 5
        assert again.abstain_until == 5 and not again.may_vote()
        for e in entries(4, start=2, term=3):
            again.add(*e)
        assert not again.holds_no_data()
        again.sync()  # synced up to 5: caught up
        assert again.may_vote() and again.abstain_until is None
        again.leader_contact(9)  # no longer abstaining: nothing changes
        assert again.may_vote()
    finally:
        again._destroy()
    last = DurableJournal(str(path))
    assert last.may_vote()
    last._destroy()
