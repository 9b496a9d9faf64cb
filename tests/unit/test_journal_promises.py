"""DurableJournal promises a mutation test found unguarded: why a cut was made and how much it
dropped, how long a node that lost acknowledged entries abstains, what the events and errors
say (with the file they are about), that the import of a pysyncobj journal keeps the original
and never resurrects deleted entries, and that syncs happen exactly when durability needs them
(before a commit or acknowledgement, not again when nothing is pending)."""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.journal import FileJournal
from pysyncobj.transport import TCPTransport

from schedd.raft import journal as jmod
from schedd.raft.journal import (
    HEADER_SIZE,
    MAGIC,
    MAX_PAYLOAD,
    UNKNOWN_VOTE,
    DurableJournal,
    DurableTransport,
    JournalError,
    RaftState,
    encode_header,
    encode_record,
)
from tests.unit.test_journal import damaged_with_commit, entries, record_bounds, reopen, write

Entry = tuple[bytes, int, int]
LOGGER = "schedd.raft.journal"


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == name]


def fields(record: logging.LogRecord) -> dict[str, Any]:
    return dict(record.fields)  # type: ignore[attr-defined]


def open_logged(path: Path, caplog: pytest.LogCaptureFixture, **kw: Any) -> DurableJournal:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        return DurableJournal(str(path), **kw)


def flip(path: Path, offset: int, mask: int = 0x10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def bounds(items: list[Entry]) -> list[tuple[int, int]]:
    """Where each record of a journal written with ``items`` starts and ends (without opening
    it: opening a damaged journal repairs it)."""
    out, off = [], HEADER_SIZE
    for e in items:
        out.append((off, off + len(encode_record(*e))))
        off = out[-1][1]
    return out


def synced(path: Path, items: list[Entry]) -> DurableJournal:
    j = DurableJournal(str(path))
    for e in items:
        j.add(*e)
    j.sync()
    return j


# -- why and where recovery cut -----------------------------------------------------------------
HEAD = struct.Struct("<II")


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (encode_record(b"next", 4, 1)[:5], "torn record header"),
        (encode_record(b"next", 4, 1)[:8], "torn record (runs past the end of the file)"),
        (encode_record(b"next", 4, 1)[:-1], "torn record (runs past the end of the file)"),
        (HEAD.pack(MAX_PAYLOAD, 0), "torn record (runs past the end of the file)"),
        (HEAD.pack(MAX_PAYLOAD + 1, 0), f"impossible record length {MAX_PAYLOAD + 1}"),
        (HEAD.pack(15, 0) + b"\0" * 15, "impossible record length 15"),
        (encode_record(b"next", 4, 1)[:-1] + b"X", "checksum mismatch"),
    ],
    ids=["header", "header-only", "payload", "max-length", "too-long", "too-short", "crc"],
)
def test_the_cut_says_whether_a_write_was_torn_or_data_is_corrupt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tail: bytes, reason: str
) -> None:
    # A torn tail is the expected result of a power loss; a checksum mismatch or an impossible
    # length is a disk or operator problem: the operator reads which one in the event.
    path = tmp_path / "raft.journal"
    write(path, entries(3))
    with open(path, "ab") as f:
        f.write(tail)
    j = open_logged(path, caplog)
    assert len(j) == 3 and j.damage is not None and j.damage.reason == reason
    [event] = events(caplog, "raft.journal_truncated")
    assert fields(event)["reason"] == reason
    j._destroy()


def test_a_zero_filled_tail_counts_as_one_dropped_record(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    write(path, entries(3))
    with open(path, "ab") as f:
        f.write(b"\0" * 4096)
    j = reopen(path)
    assert j.damage is not None and j.damage.dropped_records == 1 and j.damage.dropped_bytes == 4096
    j._destroy()


def test_records_after_the_damage_are_counted_even_with_empty_commands(tmp_path: Path) -> None:
    # The count says how much the node lost (and how far it abstains): every record-shaped
    # thing after the bad one, the shortest possible (an empty command) included.
    path = tmp_path / "raft.journal"
    items = [(b"", i, 1) for i in range(1, 7)]
    write(path, items)
    start, _ = record_bounds(path)[1]
    flip(path, start + 5)  # the checksum of the second record
    j = reopen(path)
    assert list(j[:]) == items[:1]
    assert j.damage is not None and j.damage.dropped_records == 5 and j.damage.last_kept_index == 1
    j._destroy()


def test_an_out_of_sequence_record_is_reported_with_both_positions(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    items = [(b"a", 1, 1), (b"b", 2, 3), (b"c", 3, 5)]
    write(path, items)
    with open(path, "ab") as f:
        f.write(encode_record(b"stale", 4, 2))
    j = reopen(path)
    assert list(j[:]) == items and j.damage is not None
    assert j.damage.reason == "out of sequence: index 4 term 2 after index 3 term 5"
    j._destroy()


def test_an_empty_journal_file_is_initialised_silently(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A crash between creating the file and writing its header leaves 0 bytes: not damage.
    path = tmp_path / "raft.journal"
    path.touch()
    j = open_logged(path, caplog)
    assert len(j) == 0 and j.damage is None
    assert not events(caplog, "raft.journal_header_damaged")
    assert not list(tmp_path.glob("raft.journal.damaged.*"))
    assert path.read_bytes() == encode_header()
    j._destroy()


# -- the truncation event and the abstain window -------------------------------------------------
def test_the_truncation_event_says_what_was_lost_and_for_how_long_the_node_abstains(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = damaged_with_commit(tmp_path, n=10, commit=9, victim=4)
    _, end_of_kept = bounds(entries(10))[3]
    size = os.path.getsize(path)
    j = open_logged(path, caplog)
    [event] = events(caplog, "raft.journal_truncated")
    assert event.levelno == logging.ERROR
    assert fields(event) == {
        "path": str(path),
        "offset": end_of_kept,
        "reason": "checksum mismatch",
        "dropped_records": 6,
        "dropped_bytes": size - end_of_kept,
        "kept_records": 4,
        "last_kept_index": 4,
        "stored_commit_index": 9,
        "lost_acknowledged": True,
        "abstain_until": 10,
        "note": "the node re-syncs the rest from the leader",
    }
    j._destroy()


def test_a_torn_tail_is_a_warning_and_no_abstention(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "raft.journal"
    j = DurableJournal(str(path))
    for e in entries(5):
        j.add(*e)
    j.setRaftCommitIndex(4)
    j._destroy()
    start, _ = record_bounds(path)[-1]
    os.truncate(path, start + 3)
    j = open_logged(path, caplog)
    [event] = events(caplog, "raft.journal_truncated")
    assert event.levelno == logging.WARNING
    assert fields(event)["lost_acknowledged"] is False and fields(event)["abstain_until"] is None
    assert fields(event)["stored_commit_index"] == 4 and fields(event)["kept_records"] == 4
    j._destroy()


def test_damage_in_the_first_record_abstains_until_the_stored_commit_index(tmp_path: Path) -> None:
    path = damaged_with_commit(tmp_path, n=5, commit=5, victim=0)
    j = reopen(path)
    assert len(j) == 0 and j.damage is not None and j.damage.last_kept_index is None
    assert not j.may_vote() and j.abstain_until == 5  # nothing kept + 5 dropped, commit 5
    j._destroy()


def test_uncountable_damage_still_abstains_until_the_stored_commit_index(tmp_path: Path) -> None:
    # A flipped length field makes the rest of the file unreadable: only one record is
    # counted as dropped, but the stored commit index proves 9 entries had been acknowledged.
    path = tmp_path / "raft.journal"
    j = DurableJournal(str(path))
    for e in entries(10):
        j.add(*e)
    j.setRaftCommitIndex(9)
    j._destroy()
    start, _ = record_bounds(path)[4]
    flip(path, start + 3, 0x40)  # the length's high byte: the record runs far past the end
    j = reopen(path)
    assert len(j) == 4 and j.damage is not None and j.damage.dropped_records == 1
    assert j.abstain_until == 9
    j._destroy()


def test_new_damage_while_abstaining_never_shortens_the_abstention(tmp_path: Path) -> None:
    path = damaged_with_commit(tmp_path, n=10, commit=9, victim=4)
    j = reopen(path)
    assert len(j) == 4 and j.abstain_until == 10
    j._destroy()
    start, _ = bounds(entries(4))[2]
    flip(path, start + 12)  # now only 2 records are intact, 2 dropped, commit still 9
    j = reopen(path)
    assert len(j) == 2 and j.abstain_until == 10
    j._destroy()


def test_catching_up_is_logged_with_the_index_reached(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = damaged_with_commit(tmp_path, n=10, commit=9, victim=4)
    j = reopen(path)
    for e in entries(6, start=5):
        j.add(*e)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        j.sync()
    [event] = events(caplog, "raft.journal_caught_up")
    assert event.levelno == logging.WARNING and fields(event) == {"path": str(path), "index": 10}
    j._destroy()


def test_compaction_that_makes_the_log_durable_past_the_window_ends_the_abstention(
    tmp_path: Path,
) -> None:
    path = damaged_with_commit(tmp_path, n=10, commit=9, victim=4)
    j = reopen(path)
    assert j.abstain_until == 10
    for e in entries(6, start=5):
        j.add(*e)  # pending: the compaction writes and syncs them
    j.deleteEntriesTo(2)
    assert j.abstain_until == 10  # the head dropped from memory syncs nothing
    assert j.finish_compaction(wait=True)
    assert j.may_vote() and j.abstain_until is None
    j._destroy()
    assert reopen(path).may_vote()


# -- the state file ------------------------------------------------------------------------------
def state_bytes() -> bytes:
    return RaftState(7, "n2", 5).encode()


def with_version(data: bytes, version: int) -> bytes:
    return data[:8] + struct.pack("<H", version) + data[10:]


@pytest.mark.parametrize(
    ("damaged", "message"),
    [
        (state_bytes()[:10], "short state file"),
        (b"SCHDSTAX" + state_bytes()[8:], "bad state header (magic b'SCHDSTAX', version 1)"),
        (with_version(state_bytes(), 2), "bad state header (magic b'SCHDSTAT', version 2)"),
        (state_bytes()[:20], "state file has 0 payload bytes, its header says 49"),
        (state_bytes()[:-3], "state file has 46 payload bytes, its header says 49"),
        (state_bytes()[:-1] + b"]", "state checksum mismatch"),
    ],
    ids=["short", "magic", "version", "header-only", "cut", "crc"],
)
def test_a_damaged_state_file_is_reported_with_its_path_and_cause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damaged: bytes, message: str
) -> None:
    path = tmp_path / "raft.journal"
    write(path, entries(3, term=2))
    (tmp_path / "raft.journal.state").write_bytes(damaged)
    j = open_logged(path, caplog)
    [event] = events(caplog, "raft.state_damaged")
    assert event.levelno == logging.ERROR
    assert fields(event) == {"path": str(path) + ".state", "error": message}
    # never trusted: the vote is unknown, the term the last one in the log, the commit index
    # back at pysyncobj's start
    assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()) == (
        2,
        UNKNOWN_VOTE,
        1,
    )
    j._destroy()


def test_a_damaged_state_file_with_an_empty_log_restarts_at_term_zero(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    write(path, [])
    (tmp_path / "raft.journal.state").write_bytes(b"garbage")
    j = reopen(path)
    assert len(j) == 0 and (j.getCurrentTerm(), j.getVotedForNodeId()) == (0, UNKNOWN_VOTE)
    j._destroy()


def test_the_frozen_state_format_with_an_abstention(tmp_path: Path) -> None:
    # If this fails the state file's format changed (keys are stored sorted).
    assert RaftState(7, None, 2, 12).encode() == (
        b'SCHDSTAT\x01\x00\x00\x00F\x00\x00\x00w\xbf[\xb9{"abstain_until": 12, '
        b'"commit_index": 2, "term": 7, "voted_for": null}'
    )
    assert RaftState.decode(RaftState(7, None, 2, 12).encode()) == RaftState(7, None, 2, 12)


def test_the_state_is_written_once_per_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "raft.journal"
    j = synced(path, entries(4))
    writes: list[str] = []
    real = jmod.atomic_write

    def counted(p: str, data: bytes) -> None:
        writes.append(Path(p).name)
        real(p, data)

    monkeypatch.setattr(jmod, "atomic_write", counted)
    j.setRaftCommitIndex(3)
    assert writes == []  # lazily, like pysyncobj's FileJournal
    j.onOneSecondTimer()
    assert writes == ["raft.journal.state"]
    j.onOneSecondTimer()
    j._destroy()
    assert writes == ["raft.journal.state"]  # nothing changed since: no rewrite
    assert reopen(path).getRaftCommitIndex() == 3


# -- importing a pysyncobj FileJournal -------------------------------------------------------------
def legacy(path: Path, items: list[Entry], delete_from: int | None = None) -> bytes:
    old = FileJournal(str(path))
    for e in items:
        old.add(*e)
    if delete_from is not None:
        old.deleteEntriesFrom(delete_from)
    old._destroy()
    return path.read_bytes()


def legacy_bounds(data: bytes, n: int) -> list[tuple[int, int]]:
    out, off = [], 40
    for _ in range(n):
        (size,) = struct.unpack_from("<I", data, off)
        out.append((off, off + 8 + size))
        off += 8 + size
    return out


def test_an_import_without_pysyncobj_meta_starts_from_the_defaults(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "raft.journal"
    items = entries(5)
    original = legacy(path, items)
    assert not (tmp_path / "raft.journal.meta").exists()
    j = open_logged(path, caplog)
    assert list(j[:]) == items
    assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()) == (0, None, 1)
    [event] = events(caplog, "raft.journal_imported")
    assert event.levelno == logging.WARNING
    assert fields(event) == {
        "path": str(path),
        "entries": 5,
        "backup": str(path) + ".pysyncobj.bak",
    }
    j._destroy()
    assert (tmp_path / "raft.journal.pysyncobj.bak").read_bytes() == original  # untouched


def test_an_unreadable_pysyncobj_meta_means_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    legacy(path, entries(3))
    (tmp_path / "raft.journal.meta").write_bytes(b"\x80not a pickle")
    j = reopen(path)
    assert len(j) == 3 and (j.getCurrentTerm(), j.getRaftCommitIndex()) == (0, 1)
    j._destroy()


def test_entries_pysyncobj_had_deleted_are_not_imported(tmp_path: Path) -> None:
    # FileJournal.deleteEntriesFrom only moves its "last record" offset: the deleted records
    # are still in the file after it, intact and in sequence.
    path = tmp_path / "raft.journal"
    items = entries(10)
    legacy(path, items, delete_from=7)
    j = reopen(path)
    assert list(j[:]) == items[:7]
    j._destroy()


@pytest.mark.parametrize("where", ["at a record boundary", "inside a record"])
def test_a_pysyncobj_journal_cut_short_imports_its_whole_records(
    tmp_path: Path, where: str
) -> None:
    path = tmp_path / "raft.journal"
    items = entries(6)
    data = legacy(path, items)
    start, end = legacy_bounds(data, 6)[4]
    path.write_bytes(data[: start if where == "at a record boundary" else end - 3])
    j = reopen(path)
    assert list(j[:]) == items[:4]
    j._destroy()


def test_a_pysyncobj_record_with_a_bad_trailer_ends_the_import(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    items = entries(6)
    data = bytearray(legacy(path, items))
    _, end = legacy_bounds(bytes(data), 6)[3]
    data[end - 4] ^= 0x01  # the size repeated after the record
    path.write_bytes(bytes(data))
    j = reopen(path)
    assert list(j[:]) == items[:3]
    j._destroy()


def test_a_pysyncobj_record_too_short_for_index_and_term_ends_the_import(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    data = legacy(path, [])
    bogus = struct.pack("<I", 4) + b"abcd" + struct.pack("<I", 4)
    path.write_bytes(data[:36] + struct.pack("<I", 40 + len(bogus)) + bogus)
    j = reopen(path)
    assert len(j) == 0
    j._destroy()


def test_a_gap_in_a_pysyncobj_journal_ends_the_import(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    items = [*entries(3), (b"late", 5, 1), (b"later", 6, 1)]
    legacy(path, items)
    j = reopen(path)
    assert list(j[:]) == items[:3]
    j._destroy()


def test_empty_commands_are_imported(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    items = [(b"", 1, 1), (b"x", 2, 1), (b"", 3, 2)]
    legacy(path, items)
    j = reopen(path)
    assert list(j[:]) == items
    j._destroy()


# -- the header -----------------------------------------------------------------------------------
def test_a_newer_header_alone_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    path.write_bytes(encode_header(version=2))
    with pytest.raises(JournalError, match=re.escape(f"{path} has journal format 2, newer")):
        reopen(path)
    assert path.read_bytes() == encode_header(version=2)


@pytest.mark.parametrize(
    "header",
    [
        MAGIC + b"\x01\x00",  # cut inside the header
        encode_header(version=3)[:12] + encode_header()[12:],  # version damaged, checksum not fixed
        struct.pack("<8sHH", MAGIC, 1, 1)
        + struct.pack(
            "<I", zlib.crc32(struct.pack("<8sHH", MAGIC, 1, 1))
        ),  # this version, unknown flags: not a newer one
    ],
    ids=["torn", "bit-flipped-version", "flags"],
)
def test_a_damaged_header_is_rebuilt_not_taken_for_a_newer_format(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, header: bytes
) -> None:
    path = tmp_path / "raft.journal"
    items = entries(3)
    body = b"".join(encode_record(*e) for e in items) if len(header) == HEADER_SIZE else b""
    path.write_bytes(header + body)
    j = open_logged(path, caplog)
    assert list(j[:]) == items[: 3 if body else 0]
    [event] = events(caplog, "raft.journal_header_damaged")
    assert event.levelno == logging.ERROR
    assert fields(event) == {"path": str(path), "header": header[:HEADER_SIZE].hex()}
    j._destroy()
    assert path.read_bytes()[:HEADER_SIZE] == encode_header()
    [kept] = tmp_path.glob("raft.journal.damaged.*")
    assert kept.read_bytes() == header + body


def test_failing_to_keep_the_dropped_bytes_does_not_stop_recovery(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "raft.journal"
    write(path, entries(3))
    with open(path, "ab") as f:
        f.write(b"torn")
    monkeypatch.setattr(time, "time_ns", lambda: 42)
    (tmp_path / "raft.journal.dropped.42").mkdir()  # cannot be opened for writing
    j = open_logged(path, caplog)
    assert len(j) == 3 and os.path.getsize(path) == bounds(entries(3))[-1][1]
    [failed] = [r for r in caplog.records if r.exc_info]
    assert failed.getMessage() == "could not keep the dropped journal bytes"
    assert failed.levelno == logging.ERROR
    j._destroy()


# -- failures name the operation and the file ------------------------------------------------------
def eio(*args: Any) -> Any:
    raise OSError(errno.EIO, "Input/output error")


def break_sync(j: DurableJournal, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jmod, "_fdatasync", eio)
    j.add(*entries(1, start=6)[0])
    j.sync()


def break_snapshot_sync(j: DurableJournal, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fsync", eio)
    j.clear()


def break_state_write(j: DurableJournal, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jmod, "atomic_write", eio)
    j.setCurrentTerm(3, "n1")


def break_truncate(j: DurableJournal, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "ftruncate", eio)
    j.deleteEntriesFrom(2)


def break_compaction(j: DurableJournal, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "pread", eio)
    j.deleteEntriesTo(2)
    j.finish_compaction(wait=True)


@pytest.mark.parametrize(
    ("op", "breaker"),
    [
        ("sync", break_sync),
        ("sync snapshot", break_snapshot_sync),
        ("write state", break_state_write),
        ("truncate", break_truncate),
        ("compact", break_compaction),
    ],
)
def test_a_failed_write_names_the_operation_and_the_file(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    op: str,
    breaker: Any,
) -> None:
    failures: list[OSError] = []
    monkeypatch.setattr(DurableJournal, "on_io_failure", staticmethod(failures.append))
    path = tmp_path / "raft.journal"
    dump = tmp_path / "raft.dump"
    dump.write_bytes(b"snapshot")
    j = DurableJournal(str(path), snapshot_path=str(dump))
    for e in entries(5):
        j.add(*e)
    j.sync()
    with caplog.at_level(logging.INFO, logger=LOGGER), pytest.raises(JournalError) as raised:
        breaker(j, monkeypatch)
    assert str(raised.value) == f"journal {path}: {op} failed: [Errno 5] Input/output error"
    [event] = events(caplog, "raft.journal_failed")
    assert event.levelno == logging.CRITICAL
    got = fields(event)
    room = {k: got.pop(k) for k in ("free_bytes", "total_bytes")}  # of the file's filesystem
    assert got == {"path": str(path), "op": op, "error": "[Errno 5] Input/output error"}
    assert 0 <= room["free_bytes"] <= room["total_bytes"] and room["total_bytes"] > 0
    assert [f.errno for f in failures] == [errno.EIO]
    monkeypatch.undo()
    j._destroy()


def test_a_journal_shorter_on_disk_than_in_memory_fails_the_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures: list[OSError] = []
    monkeypatch.setattr(DurableJournal, "on_io_failure", staticmethod(failures.append))
    path = tmp_path / "raft.journal"
    j = synced(path, entries(5))
    start, _ = record_bounds(path)[3]
    os.truncate(path, start)  # somebody else cut the file under the running node
    j.deleteEntriesTo(2)
    with pytest.raises(JournalError, match=re.escape(f"journal {path}: compact failed: short")):
        j.finish_compaction(wait=True)
    [failure] = failures
    assert str(failure) == f"short read at offset {start}"
    j._destroy()


def test_compaction_copies_the_tail_exactly_through_short_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pread may return fewer bytes than asked (a signal, some file systems): the rewritten
    # journal must still hold every kept record, byte for byte.
    path = tmp_path / "raft.journal"
    items = entries(8)
    j = synced(path, items)
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: real(fd, min(n, 1), off))
    j.deleteEntriesTo(3)
    assert j.finish_compaction(wait=True)
    monkeypatch.undo()
    j._destroy()
    again = reopen(path)
    assert list(again[:]) == items[3:] and again.damage is None
    again._destroy()


def test_a_failed_write_stops_the_process_with_status_70(monkeypatch: pytest.MonkeyPatch) -> None:
    # The supervisor restarts the node from its disk (systemd Restart=on-failure); the logs
    # written up to the failure are flushed first.
    exits: list[int] = []
    flushed: list[bool] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            pass

        def flush(self) -> None:
            flushed.append(True)

    handler = Handler()
    root = logging.getLogger()
    root.addHandler(handler)
    monkeypatch.setattr(os, "_exit", exits.append)
    try:
        jmod.exit_process(OSError(errno.EIO, "Input/output error"))
    finally:
        root.removeHandler(handler)
    assert exits == [70] and flushed


# -- truncation ------------------------------------------------------------------------------------
def test_dropping_unwritten_records_drops_them_from_the_disk_too(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    items = entries(8)
    j = synced(path, items[:4])
    for e in items[4:]:
        j.add(*e)
    j.deleteEntriesFrom(6)  # records 7 and 8 were never written
    j.sync()
    assert list(reopen(path)[:]) == items[:6]
    j._destroy()


def test_dropping_unwritten_records_costs_no_disk_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "raft.journal"
    items = entries(8)
    j = synced(path, items[:4])
    for e in items[4:]:
        j.add(*e)
    calls: list[str] = []
    monkeypatch.setattr(jmod, "_fdatasync", lambda fd: calls.append("fdatasync"))
    monkeypatch.setattr(os, "ftruncate", lambda fd, n: calls.append("ftruncate"))
    j.deleteEntriesFrom(4)  # exactly the unwritten ones
    assert calls == [] and list(j[:]) == items[:4]
    monkeypatch.undo()
    j._destroy()
    assert list(reopen(path)[:]) == items[:4]


@pytest.mark.parametrize("start", [0, -2])
def test_delete_entries_from_the_start_empties_the_log(tmp_path: Path, start: int) -> None:
    path = tmp_path / "raft.journal"
    j = synced(path, entries(4))
    j.deleteEntriesFrom(start)
    assert len(j) == 0 and len(reopen(path)) == 0  # durable at once
    j._destroy()


def test_a_truncation_is_durable_on_its_own(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    j = synced(path, entries(8))
    j.deleteEntriesFrom(5)
    syncs = j.syncs
    j.sync()  # nothing left to do
    assert j.syncs == syncs
    j._destroy()


def test_after_a_truncation_only_a_commit_past_the_kept_log_forces_a_sync(tmp_path: Path) -> None:
    # The synced index follows the cut: a commit the disk already covers costs nothing
    # (group commit), one past it syncs first.
    path = tmp_path / "raft.journal"
    j = synced(path, entries(10))
    j.deleteEntriesFrom(6)
    j.add(b"new", 7, 9)
    syncs = j.syncs
    j.setRaftCommitIndex(6)
    assert j.syncs == syncs and len(reopen(path)) == 6
    j.setRaftCommitIndex(7)
    assert j.syncs == syncs + 1 and reopen(path)[-1] == (b"new", 7, 9)
    j._destroy()


def test_after_a_truncation_a_commit_of_a_replacement_entry_is_durable(tmp_path: Path) -> None:
    # Terms above indexes: the synced index must be an index, never a term.
    path = tmp_path / "raft.journal"
    items = [(b"old", i, 50) for i in range(1, 11)]
    j = synced(path, items)
    j.deleteEntriesFrom(6)
    j.add(b"new", 7, 51)
    j.add(b"new", 8, 51)
    j.setRaftCommitIndex(8)
    assert list(reopen(path)[:]) == [*items[:6], (b"new", 7, 51), (b"new", 8, 51)]
    j._destroy()


def test_after_clearing_a_commit_of_the_first_new_entry_is_durable(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    j = synced(path, entries(5))
    j.clear()
    j.add(b"restart", 1, 7)
    j.setRaftCommitIndex(1)
    assert list(reopen(path)[:]) == [(b"restart", 1, 7)]
    j._destroy()


def test_a_commit_index_already_on_disk_does_not_sync_pending_entries(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    j = synced(path, entries(4))
    j.add(*entries(1, start=5)[0])
    syncs = j.syncs
    j.setRaftCommitIndex(4)
    assert j.syncs == syncs and len(reopen(path)) == 4
    j._destroy()


# -- compaction ------------------------------------------------------------------------------------
def test_compacting_one_entry_drops_it(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    items = entries(4)
    j = synced(path, items)
    j.deleteEntriesTo(1)
    assert j.finish_compaction(wait=True)
    assert list(j[:]) == items[1:] and list(reopen(path)[:]) == items[1:]
    j._destroy()


class HeldCopy:
    """Holds the background copy of a compaction until released (a large journal, a busy disk)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        real = jmod._Compaction.run

        def run(job: Any) -> None:
            self.started.set()
            assert self.release.wait(10)
            real(job)

        monkeypatch.setattr(jmod._Compaction, "run", run)


def copy_held(
    path: Path, items: list[Entry], head: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[DurableJournal, HeldCopy]:
    """A synced journal of ``items`` whose first ``head`` entries were compacted away, with the
    background copy started and held."""
    j = synced(path, items)
    held = HeldCopy(monkeypatch)
    j.deleteEntriesTo(head)
    assert held.started.wait(10)
    return j, held


def test_compaction_drops_the_head_at_once_and_rewrites_the_file_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "raft.journal"
    items = entries(30)
    j, held = copy_held(path, items[:20], 15, monkeypatch)
    assert list(j[:]) == items[15:20]
    for e in items[20:25]:
        j.add(*e)
    j.sync()  # the log goes on while the copy waits; syncs do not wait for it
    j.onOneSecondTimer()
    assert not j.finish_compaction()  # not ready: nothing changes on disk
    assert list(reopen(path)[:]) == items[:25]  # the whole log, head included, until the rename
    held.release.set()
    for e in items[25:]:
        j.add(*e)  # pending at the swap: written with it
    assert j.finish_compaction(wait=True) and j.compactions == 1
    assert not (tmp_path / "raft.journal.compact").exists()
    again = reopen(path)
    assert list(again[:]) == items[15:] and again.damage is None
    again._destroy()
    j.deleteEntriesFrom(3)  # the offsets follow the new file
    j._destroy()
    assert list(reopen(path)[:]) == items[15:18]


def test_a_truncation_into_the_copied_records_cancels_the_copy_and_compacts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "raft.journal"
    items = entries(20)
    j, held = copy_held(path, items, 5, monkeypatch)
    j.deleteEntriesFrom(3)  # a new leader overwrites the tail the copy holds
    other = [(b"other", i, 9) for i in range(9, 12)]
    for e in other:
        j.add(*e)
    j.sync()
    held.release.set()
    assert not j.finish_compaction(wait=True)  # stale: dropped, and a fresh copy started
    assert j.finish_compaction(wait=True) and j.compactions == 1
    j._destroy()
    again = reopen(path)
    assert list(again[:]) == items[5:8] + other and again.damage is None
    again._destroy()


def test_a_truncation_into_a_fresh_copy_throws_that_copy_away_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each truncation under a copy makes it stale, the second as well as the first; and the
    copy that is kept says how long it took, in milliseconds."""
    gates = [threading.Event(), threading.Event()]
    started = [threading.Event(), threading.Event()]
    copies: list[Any] = []
    real = jmod._Compaction.run

    def run(job: Any) -> None:
        n = len(copies)
        copies.append(job)
        if n < len(gates):
            started[n].set()
            assert gates[n].wait(10)
        real(job)
        job.seconds = 0.123456  # as if the copy had taken that long

    monkeypatch.setattr(jmod._Compaction, "run", run)
    path = tmp_path / "raft.journal"
    items = entries(20)
    j = synced(path, items)
    j.deleteEntriesTo(5)
    assert started[0].wait(10)
    j.deleteEntriesFrom(3)  # under the first copy
    other = [(b"other", i, 9) for i in range(9, 12)]
    for e in other:
        j.add(*e)
    j.sync()
    gates[0].set()
    assert not j.finish_compaction(wait=True)  # stale: a fresh copy starts
    assert started[1].wait(10)
    j.deleteEntriesFrom(4)  # under the fresh copy, which holds ``other``
    later = [(b"later", i, 10) for i in range(10, 13)]
    for e in later:
        j.add(*e)
    j.sync()
    gates[1].set()
    assert not j.finish_compaction(wait=True)  # stale again, not taken for the log
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert j.finish_compaction(wait=True) and j.compactions == 1
    assert len(copies) == 3 and copies[-1].fd == -1  # its file is the journal's now
    (done,) = events(caplog, "raft.journal_compacted")
    assert fields(done)["copy_seconds"] == 0.123
    j._destroy()
    again = reopen(path)
    assert list(again[:]) == items[5:8] + other[:1] + later and again.damage is None
    again._destroy()


def test_a_stop_before_the_rename_leaves_the_head_which_skip_to_drops_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "raft.journal"
    items = entries(12)
    j, held = copy_held(path, items, 6, monkeypatch)
    monkeypatch.setattr(j._compaction, "cancelled", True)
    held.release.set()
    j._destroy()  # the copy is discarded, the journal is whole
    assert not (tmp_path / "raft.journal.compact").exists()
    again = reopen(path)
    assert list(again[:]) == items
    assert not again.skip_to(items[6], items[8])  # not consecutive: not the snapshot's pair
    assert not again.skip_to((b"else", 7, 1), items[7])  # another log: pysyncobj discards it
    assert list(again[:]) == items
    assert not DurableJournal(str(path) + ".empty").skip_to(items[6], items[7])  # no log at all
    assert not again.skip_to(items[0], items[1])  # the log starts there: nothing to drop
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert again.skip_to(items[6], items[7])
    (dropped,) = events(caplog, "raft.journal_head_dropped")
    assert fields(dropped)["records"] == 6 and fields(dropped)["first_index"] == items[6][1]
    assert fields(dropped)["path"] == str(path)
    assert list(again[:]) == items[6:]
    assert again.finish_compaction(wait=True)
    again._destroy()
    assert list(reopen(path)[:]) == items[6:]


def test_a_copy_left_by_a_crash_is_removed_at_open(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    write(path, entries(3))
    (tmp_path / "raft.journal.compact").write_bytes(b"half a copy")
    j = reopen(path)
    assert list(j[:]) == entries(3) and not (tmp_path / "raft.journal.compact").exists()
    j._destroy()


def test_compaction_leaves_nothing_to_sync(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    j = synced(path, entries(5))
    for e in entries(3, start=6):
        j.add(*e)  # pending: the swap writes and syncs them with the rest
    j.deleteEntriesTo(3)
    assert j.finish_compaction(wait=True)
    syncs = j.syncs
    j.sync()
    j.setRaftCommitIndex(8)  # all durable: no sync
    assert j.syncs == syncs
    j.add(*entries(1, start=9)[0])
    j.setRaftCommitIndex(9)
    assert j.syncs == syncs + 1
    j._destroy()


# -- the transport ---------------------------------------------------------------------------------
def test_the_transport_passes_messages_through_to_their_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[Any, Any]] = []

    def fake_send(self: Any, node: Any, message: Any) -> bool:
        sent.append((node, message))
        return True

    monkeypatch.setattr(TCPTransport, "send", fake_send)
    node = object()
    transport = DurableTransport.__new__(DurableTransport)
    transport.durable_journal = None  # an in-memory journal: nothing to sync
    assert transport.send(node, {"type": "append_entries", "entries": []})
    j = DurableJournal(str(tmp_path / "raft.journal"))
    transport.durable_journal = j
    assert transport.send(node, b"not a dict")
    assert sent == [(node, {"type": "append_entries", "entries": []}), (node, b"not a dict")]
    j._destroy()


# -- durability bookkeeping ------------------------------------------------------------------------
def test_a_journal_opened_and_closed_without_changes_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "raft.journal"
    write(path, entries(3))
    before = path.read_bytes()
    calls: list[int] = []
    monkeypatch.setattr(jmod, "_fdatasync", calls.append)
    j = reopen(path)
    j.sync()
    j.onOneSecondTimer()
    j._destroy()
    assert calls == [] and j.syncs == 0
    assert path.read_bytes() == before and not (tmp_path / "raft.journal.state").exists()


def test_syncs_counts_the_fdatasync_calls_that_made_entries_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = jmod._fdatasync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(jmod, "_fdatasync", counted)
    j = DurableJournal(str(tmp_path / "raft.journal"))
    for e in entries(3):
        j.add(*e)
        j.sync()
        j.sync()  # nothing new: no second fdatasync
    assert j.syncs == len(calls) == 3
    j._destroy()


def test_records_reach_the_disk_whole_through_short_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pwrite may write fewer bytes than asked (a signal, a full disk about to fail).
    path = tmp_path / "raft.journal"
    real = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, off: real(fd, bytes(data[:1]), off))
    j = DurableJournal(str(path))
    items = entries(6)
    for e in items:
        j.add(*e)
    j.sync()
    j.setCurrentTerm(4, "n3")
    monkeypatch.undo()
    j._destroy()
    again = reopen(path)
    assert list(again[:]) == items and again.damage is None and again.getCurrentTerm() == 4
    again._destroy()


def test_after_reopening_only_a_commit_past_the_disk_forces_a_sync(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    write(path, entries(5))
    j = reopen(path)
    j.add(*entries(1, start=6)[0])
    syncs = j.syncs
    j.setRaftCommitIndex(5)
    assert j.syncs == syncs and len(reopen(path)) == 5
    j.setRaftCommitIndex(6)
    assert j.syncs == syncs + 1 and len(reopen(path)) == 6
    j._destroy()


def test_the_first_entry_of_a_new_journal_is_durable_before_it_is_committed(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    j = DurableJournal(str(path))
    j.add(b"no-op", 1, 0)  # what pysyncobj adds to an empty log
    j.setRaftCommitIndex(1)
    assert list(reopen(path)[:]) == [(b"no-op", 1, 0)]
    j._destroy()


def test_the_journal_and_its_state_are_private_to_the_service_user(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    old = os.umask(0o022)
    try:
        j = DurableJournal(str(path))
        for e in entries(3):
            j.add(*e)
        j.setCurrentTerm(1, None)
        j.deleteEntriesTo(1)
        assert j.finish_compaction(wait=True)  # rewritten
        j._destroy()
    finally:
        os.umask(old)
    for p in (path, tmp_path / "raft.journal.state"):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p


def test_a_gap_in_added_indexes_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    j = DurableJournal(str(tmp_path / "raft.journal"))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for e in entries(5):
            j.add(*e)
        assert not events(caplog, "raft.journal_gap")
        j.add(b"x", 7, 2)
    [event] = events(caplog, "raft.journal_gap")
    assert event.levelno == logging.ERROR and fields(event) == {"index": 7, "after": 5}
    j._destroy()


def test_closing_twice_closes_nothing_the_second_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = synced(tmp_path / "raft.journal", entries(2))
    j._destroy()
    closed: list[int] = []
    monkeypatch.setattr(os, "close", closed.append)
    j._destroy()
    assert closed == []


def test_a_journal_on_file_descriptor_0_is_synced_and_closed(tmp_path: Path) -> None:
    # A daemon started with stdin closed gets descriptor 0 for the first file it opens.
    path = tmp_path / "raft.journal"
    j = DurableJournal(str(path))
    saved = os.dup(0)
    try:
        os.dup2(j._fd, 0)
        os.close(j._fd)
        j._fd = 0
        for e in entries(3):
            j.add(*e)
        j._destroy()
        with pytest.raises(OSError):
            os.fstat(0)
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert len(reopen(path)) == 3


def test_a_damaged_state_file_proves_nothing_so_a_cut_journal_abstains(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The commit index that would prove the cut entries unacknowledged is lost with the state
    # file: the node must assume they were acknowledged (a state file is replaced by a rename,
    # so a power loss alone never damages it).
    path = tmp_path / "raft.journal"
    j = DurableJournal(str(path))
    for e in entries(5):
        j.add(*e)
    j.setRaftCommitIndex(5)
    j._destroy()
    state = tmp_path / "raft.journal.state"
    state.write_bytes(state.read_bytes()[:-2])
    start, _ = bounds(entries(5))[2]
    flip(path, start + 12)
    j = open_logged(path, caplog)
    assert len(j) == 2 and not j.may_vote() and j.abstain_until == 5  # 2 kept + 3 dropped
    assert j.getVotedForNodeId() == UNKNOWN_VOTE
    [event] = events(caplog, "raft.journal_truncated")
    assert event.levelno == logging.ERROR
    assert fields(event)["lost_acknowledged"] is True
    assert fields(event)["stored_commit_index"] is None
    j._destroy()
    j = reopen(path)
    assert not j.may_vote() and j.abstain_until == 5  # stored with the rebuilt state
    j._destroy()
