"""``schedd inspect``: a node's data directory, read without changing it.

The data directory is made by the node's own classes: a Raft log of real commands (a leader's
claims, submitted jobs, one run dead-lettered) applied to a :class:`SqlState` database, the
same entries in a :class:`DurableJournal` with the term, vote and commit index it stores, two
entries after the applied index that were not applied yet, and a compaction marker
(:func:`write_marker`).  Each test inspects a copy, damaged or rearranged as the case needs, and
checks what inspect says against what those classes read from another copy.  (A real node's
directory is inspected by the real binary in tests/acceptance/test_inspect.py.)"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pysyncobj.journal import FileJournal

from schedd.cli.inspect import lock_holder
from schedd.cli.node import main
from schedd.core import commands
from schedd.core.members import Member, Membership
from schedd.core.model import JobSpec, RetryPolicy
from schedd.core.state import Ok
from schedd.raft.journal import (
    HEADER_SIZE,
    VERSION,
    DurableJournal,
    RaftState,
    encode_header,
)
from schedd.storage.snapshots import Marker, read_marker, write_marker
from schedd.storage.sqlstate import SqlState, apply_entry

T0 = 1_800_000_000_000
SELF = "127.0.0.1:7701"
PEER = "127.0.0.1:7703"
JOBS = 6  # one of them dead-lettered
MARKED = 5  # the entry the log was compacted up to


def _build_node_dir(data: Path) -> None:
    """A stopped node's ``node.data_dir``: entries 1-6 of term 1, 7-13 of term 2; 1-11 applied,
    the journal holds 4-13 (the marker's two entries, then the rest), commit index 11."""
    raft = data / "raft"
    raft.mkdir(parents=True)
    state = SqlState(raft / "state.db")
    log: list[tuple[bytes, int, int]] = []

    def entry(cmd: commands.Command, term: int, apply: bool = True) -> Any:
        blob = commands.encode_entry([cmd])
        log.append((blob, len(log) + 1, term))
        if not apply:
            return None
        out = apply_entry(state, blob, len(log))
        assert out is not None
        [result] = out[0]
        assert isinstance(result, Ok), result
        return result.value

    entry(commands.Claim("c1", T0, "n1", 1, "http://127.0.0.1:7700"), 1)
    for i in range(1, JOBS):
        entry(commands.Submit(f"s{i}", T0, ((f"J{i}", JobSpec(task="t")),)), 1)
    lf = entry(commands.Claim("c2", T0, "n2", 2, "http://127.0.0.1:7702"), 2)
    spec = JobSpec(task="t", retry=RetryPolicy(max_attempts=1))
    entry(commands.Submit("s6", T0, (("J6", spec),)), 2)
    run = f"J6@{T0}"
    entry(commands.Fire("f", T0, lf, (run,)), 2)
    [attempt] = entry(commands.LeaseRuns("l", T0, lf, ((run, "w1"),)), 2)
    entry(commands.FailRun("x", T0 + 1, lf, run, attempt.value.fence, "boom", False), 2)
    assert state.in_dlq(run) and state.applied_index == 11
    entry(commands.Barrier("b1", T0), 2, apply=False)
    entry(commands.Barrier("b2", T0), 2, apply=False)
    state.close()

    journal = DurableJournal(str(raft / "raft.journal"), snapshot_path=str(raft / "raft.dump"))
    for e in log[MARKED - 2 :]:
        journal.add(*e)
    journal.setCurrentTerm(2, PEER)
    journal.setRaftCommitIndex(11)
    journal.onOneSecondTimer()
    journal._destroy()
    last, prev = log[MARKED - 1], log[MARKED - 2]
    write_marker(raft / "raft.dump", Marker((last, prev, [SELF, PEER]), applied_index=MARKED))


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("inspect") / "n1"
    _build_node_dir(data)
    return data


@pytest.fixture
def data(template: Path, tmp_path: Path) -> Path:
    """A copy of the stopped node's ``node.data_dir``."""
    copy = tmp_path / "n1"
    shutil.copytree(template, copy)
    return copy


def inspect(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["inspect", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def as_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = inspect(capsys, *argv, "-o", "json")
    report: dict[str, Any] = orjson.loads(out)
    return code, report, err


def files_of(top: Path) -> dict[str, tuple[int, int, str]]:
    """Every file below ``top``: its size, modification time and SHA-256."""
    return {
        str(p.relative_to(top)): (
            p.stat().st_size,
            p.stat().st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(top.rglob("*"))
        if p.is_file()
    }


def expected(data: Path, tmp_path: Path) -> dict[str, Any]:
    """What the node's own classes read from a copy of ``data``."""
    copy = tmp_path / "expected"
    shutil.copytree(data, copy)
    raft = copy / "raft"
    db = sqlite3.connect(raft / "state.db")
    applied = int(db.execute("SELECT value FROM meta WHERE key = 'applied_index'").fetchone()[0])
    schema = int(db.execute("PRAGMA user_version").fetchone()[0])
    db.close()
    state = RaftState.decode((raft / "raft.journal.state").read_bytes())
    journal = DurableJournal(str(raft / "raft.journal"))
    entries = list(journal[:])
    journal._destroy()
    marker = read_marker(raft / "raft.dump")
    by_index = {e[1]: e[2] for e in entries}
    return {
        "applied": applied,
        "applied_term": by_index[applied],
        "schema": schema,
        "entries": entries,
        "state": state,
        "marker": marker,
    }


# -- a stopped node ----------------------------------------------------------------------------
def test_a_stopped_node_is_reported_as_its_own_classes_read_it(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    want = expected(data, tmp_path)
    before = files_of(data)
    code, report, err = as_json(capsys, "--data-dir", str(data))
    assert (code, err) == (0, "")
    assert files_of(data) == before  # not a byte, not a file more
    assert report["conclusion"] == f"applied index {want['applied']} (term {want['applied_term']})"
    assert report["applied"] == {
        "index": want["applied"],
        "term": want["applied_term"],
        "term_from": "journal",
    }
    assert (report["running"], report["running_pid"]) == (False, None)
    j, entries, state = report["journal"], want["entries"], want["state"]
    assert (want["applied"], want["applied_term"], entries[0][1], entries[-1][1]) == (11, 2, 4, 13)
    assert (state.commit_index, state.term, state.voted_for) == (11, 2, PEER)
    assert (j["first_index"], j["last_index"], j["last_term"], j["entries"]) == (
        entries[0][1],
        entries[-1][1],
        entries[-1][2],
        len(entries),
    )
    assert (j["commit_index"], j["current_term"], j["voted_for"]) == (
        state.commit_index,
        state.term,
        state.voted_for,
    )
    assert (j["damage"], j["state_file"], j["format"]) == (None, "ok", "schedd")
    m, marker = report["marker"], want["marker"]
    assert (m["index"], m["term"], m["applied_index"], m["schema"]) == (
        marker.index,
        marker.term,
        marker.applied_index,
        marker.schema,
    )
    assert (m["prev_index"], m["prev_term"]) == marker.raft[1][1:]
    assert m["cluster"] == marker.raft[2] and m["written_at"].endswith("Z")
    s = report["state"]
    assert s["schema"] == want["schema"]
    assert s["counts"] == {"jobs": JOBS, "runs": JOBS, "dead_letters": 1}
    assert s["leader"] == {"node": "n2", "term": 2, "http": "http://127.0.0.1:7702"}
    assert report["members"] is None and report["problems"] == []


def test_the_text_leads_with_the_applied_index_and_its_term(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    want = expected(data, tmp_path)
    code, out, err = inspect(capsys, "--data-dir", str(data))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    last = want["entries"][-1]
    assert lines[0] == (
        f"applied index {want['applied']} (term {want['applied_term']}); its journal reaches "
        f"index {last[1]} (term {last[2]})"
    )
    shown = dict(line.split(":", 1) for line in lines[1:])
    assert "the node is stopped" in shown["data directory"]
    assert shown["jobs"].strip() == str(JOBS)
    assert shown["dead letters"].strip() == "1"
    assert shown["last leader"].strip() == "n2 (term 2) http://127.0.0.1:7702"
    assert shown["applied index"].strip() == (
        f"{want['applied']} (term {want['applied_term']}, from the journal)"
    )
    assert f"index {want['marker'].index} (term {want['marker'].term})" in shown["marker"]
    assert f"current term {want['state'].term}" in shown["journal state"]
    assert "members" not in shown


def test_the_applied_term_when_the_journal_no_longer_holds_the_entry(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raft = data / "raft"
    (raft / "raft.journal").unlink()
    DurableJournal(str(raft / "raft.journal"))._destroy()  # an empty journal
    code, report, _ = as_json(capsys, "--data-dir", str(data))
    assert code == 0
    assert report["applied"] == {"index": 11, "term": 2, "term_from": "leader claim"}
    assert report["journal"]["entries"] == 0 and report["journal"]["last_index"] is None
    db = sqlite3.connect(raft / "state.db")
    db.execute("UPDATE meta SET value = ? WHERE key = 'applied_index'", (MARKED,))
    db.commit()
    db.close()
    code, out, _ = inspect(capsys, "--data-dir", str(data))
    assert code == 0
    assert out.splitlines()[0] == f"applied index {MARKED} (term 1)"
    assert f"{MARKED} (term 1, from the marker)" in out


def test_the_raft_directory_itself_may_be_given(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, by_node_dir, _ = as_json(capsys, "--data-dir", str(data))
    code2, by_raft_dir, _ = as_json(capsys, "--data-dir", str(data / "raft"))
    assert code == code2 == 0
    assert by_node_dir == by_raft_dir


def test_a_journal_in_its_own_directory(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, beside, _ = as_json(capsys, "--data-dir", str(data))
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    for name in ("raft.journal", "raft.journal.state"):
        (data / "raft" / name).rename(journal_dir / name)
    code, out, err = inspect(capsys, "--data-dir", str(data))
    assert (code, out) == (2, "")
    assert err == (
        f"schedd inspect: {data / 'raft'}: no Raft journal (raft.journal) beside the state: if "
        "the node has raft.journal_dir set, give that directory as --journal-dir\n"
    )
    code, report, err = as_json(capsys, "--data-dir", str(data), "--journal-dir", str(journal_dir))
    assert (code, err) == (0, "")
    assert report["journal"]["path"] == str(journal_dir / "raft.journal")
    assert report["journal"] == {**beside["journal"], "path": str(journal_dir / "raft.journal")}


def test_the_membership_is_shown_once_the_log_recorded_one(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = Membership(
        voters=(Member("10.0.0.1:7701", "n1"), Member("10.0.0.2:7701", "n2")),
        learner=Member("10.0.0.4:7701"),
        removed=("10.0.0.3:7701",),
        index=40,
    )
    db = sqlite3.connect(data / "raft" / "state.db")
    db.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('members', ?)",
        (orjson.dumps(m.to_json()).decode(),),
    )
    db.commit()
    db.close()
    _, report, _ = as_json(capsys, "--data-dir", str(data))
    assert report["members"] == [
        {"id": "n1", "address": "10.0.0.1:7701", "role": "voter"},
        {"id": "n2", "address": "10.0.0.2:7701", "role": "voter"},
        {"id": None, "address": "10.0.0.4:7701", "role": "learner"},
        {"id": None, "address": "10.0.0.3:7701", "role": "removed"},
    ]
    code, out, _ = inspect(capsys, "--data-dir", str(data))
    assert code == 0
    assert "members:        n1 10.0.0.1:7701 (voter); n2 10.0.0.2:7701 (voter); " in out


def test_a_damaged_membership_is_named(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = sqlite3.connect(data / "raft" / "state.db")
    db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('members', '{\"x\": 1}')")
    db.commit()
    db.close()
    code, _, err = inspect(capsys, "--data-dir", str(data))
    assert code == 1 and "a damaged or foreign state database" in err


def test_a_decided_install_is_what_is_reported(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raft = data / "raft"
    _, before, _ = as_json(capsys, "--data-dir", str(data))
    shutil.copyfile(raft / "state.db", raft / "state.db.install")
    db = sqlite3.connect(raft / "state.db.install")
    db.execute("UPDATE meta SET value = value + 1000 WHERE key = 'applied_index'")
    db.commit()
    db.close()
    code, report, _ = as_json(capsys, "--data-dir", str(data))
    assert code == 0
    assert report["applied"]["index"] == before["applied"]["index"] + 1000
    assert report["state"]["path"] == str(raft / "state.db.install")
    assert "replaces state.db when the node starts" in report["state"]["read"]


def test_a_journal_in_pysyncobjs_format_is_read_without_being_imported(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raft = data / "raft"
    for name in ("raft.journal", "raft.journal.state"):
        (raft / name).unlink()
    legacy = FileJournal(str(raft / "raft.journal"))
    for i in range(1, 6):
        legacy.add(b"cmd", i, 2)
    legacy.setCurrentTerm(3, "10.0.0.9:7701")
    legacy._destroy()
    before = files_of(data)
    code, report, err = as_json(capsys, "--data-dir", str(data))
    assert (code, err) == (0, "")
    assert files_of(data) == before
    j = report["journal"]
    assert (j["format"], j["first_index"], j["last_index"], j["last_term"]) == (
        "pysyncobj",
        1,
        5,
        2,
    )
    assert (j["current_term"], j["voted_for"]) == (3, "10.0.0.9:7701")


# -- a node that crashed, or runs --------------------------------------------------------------
def _crash_with_a_dead_letter(db_path: Path) -> None:
    """A process writes a row into the database's log and dies before any checkpoint: the
    log (and its -shm) stay beside the database, as after a crash."""
    script = (
        "import os, sqlite3, sys\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('PRAGMA wal_autocheckpoint = 0')\n"
        "db.execute(\"INSERT INTO dlq (seq, run_id) VALUES (99, 'x@1')\")\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(db_path)], check=True, timeout=30)


def test_a_crashed_node_is_read_with_its_write_ahead_log(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db_path = data / "raft" / "state.db"
    _crash_with_a_dead_letter(db_path)
    assert Path(f"{db_path}-wal").stat().st_size > 0
    before = files_of(data)
    code, report, _ = as_json(capsys, "--data-dir", str(data))
    assert code == 0
    assert report["state"]["counts"]["dead_letters"] == 2  # the second only in the log
    assert report["state"]["read"] == "read-only"
    assert files_of(data) == before


def test_a_write_ahead_log_without_its_shm_is_read_from_a_copy(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db_path = data / "raft" / "state.db"
    _crash_with_a_dead_letter(db_path)
    Path(f"{db_path}-shm").unlink()
    before = files_of(data)
    code, report, _ = as_json(capsys, "--data-dir", str(data))
    assert code == 0
    assert report["state"]["counts"]["dead_letters"] == 2
    assert report["state"]["read"].startswith("from a copy")
    assert files_of(data) == before


@pytest.fixture
def holder(data: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process with the node's state database open, as a running node has it."""
    script = (
        "import sqlite3, sys\n"
        "db = sqlite3.connect(sys.argv[1])\n"
        "db.execute('SELECT count(*) FROM meta').fetchone()\n"
        "print('open', flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script, str(data / "raft" / "state.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "open\n"
            yield proc
        finally:
            proc.kill()
            proc.wait(timeout=10)


def test_a_running_node_is_inspected_and_said_to_be_running(
    data: Path, holder: subprocess.Popen[str], capsys: pytest.CaptureFixture[str]
) -> None:
    if not Path("/proc/locks").exists():
        pytest.skip("no /proc/locks here")
    before = files_of(data)
    code, report, err = as_json(capsys, "--data-dir", str(data))
    assert (code, err) == (0, "")
    assert (report["running"], report["running_pid"]) == (True, holder.pid)
    assert report["applied"]["term_from"] == "journal"
    code, out, _ = inspect(capsys, "--data-dir", str(data))
    assert code == 0
    assert f"(RUNNING: process {holder.pid} has its state open;" in out.splitlines()[1]
    assert files_of(data) == before


def test_lock_holder_reads_the_kernels_list_of_locks(tmp_path: Path) -> None:
    target, other = tmp_path / "state.db-shm", tmp_path / "other"
    target.write_bytes(b"")
    other.write_bytes(b"")
    st = target.stat()
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    locks = tmp_path / "locks"
    locks.write_text(f"1: POSIX  ADVISORY  READ 4242 {key} 128 128\n")
    assert lock_holder([target], locks) == 4242
    locks.write_text(
        f"1: POSIX  ADVISORY  WRITE 7 00:00:1 0 EOF\n2: -> POSIX ADVISORY WRITE 99 {key} 0 0\n"
    )
    assert lock_holder([other, target], locks) == 99
    locks.write_text(f"1: OFDLCK ADVISORY  READ -1 {key} 0 EOF\n")
    assert lock_holder([target], locks) == -1
    assert lock_holder([other], locks) is None
    assert lock_holder([tmp_path / "missing"], locks) is None
    with pytest.raises(FileNotFoundError):
        lock_holder([target], tmp_path / "no-such-file")


def test_where_locks_cannot_be_listed_running_is_unknown(
    data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_proc_locks(paths: list[Path]) -> int | None:
        raise FileNotFoundError("/proc/locks")

    monkeypatch.setattr("schedd.cli.inspect.lock_holder", no_proc_locks)
    code, report, _ = as_json(capsys, "--data-dir", str(data))
    assert (code, report["running"], report["running_pid"]) == (0, None, None)
    _, out, _ = inspect(capsys, "--data-dir", str(data))
    assert "(whether a process has its state open cannot be told here)" in out


# -- bad input ---------------------------------------------------------------------------------
def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("schedd inspect: ") and "Traceback" not in err
    return lines[0]


def test_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = inspect(capsys, "--data-dir", str(tmp_path / "nope"))
    assert (code, out) == (2, "")
    assert one_line(err) == f"schedd inspect: --data-dir: {tmp_path / 'nope'}: no such directory"


def test_a_file_instead_of_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("x")
    code, out, err = inspect(capsys, "--data-dir", str(tmp_path / "f"))
    assert (code, out) == (2, "")
    assert one_line(err) == f"schedd inspect: --data-dir: {tmp_path / 'f'}: not a directory"


def test_a_directory_that_holds_no_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "raft").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    before = files_of(tmp_path)
    code, out, err = inspect(capsys, "--data-dir", str(tmp_path))
    assert (code, out) == (2, "")
    assert one_line(err) == (
        f"schedd inspect: --data-dir: {tmp_path}: not a schedd data directory (it holds no "
        "raft/state.db, nor a state.db)"
    )
    assert files_of(tmp_path) == before


def test_a_missing_journal_dir(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = inspect(capsys, "--data-dir", str(data), "--journal-dir", str(tmp_path / "j"))
    assert code == 2
    assert one_line(err) == f"schedd inspect: --journal-dir: {tmp_path / 'j'}: no such directory"
    (tmp_path / "j").mkdir()
    code, _, err = inspect(capsys, "--data-dir", str(data), "--journal-dir", str(tmp_path / "j"))
    assert code == 2
    assert one_line(err) == (
        f"schedd inspect: --journal-dir: {tmp_path / 'j'}: no Raft journal (raft.journal) in it"
    )


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (b"", "an empty file, not a schedd state database"),
        (b"not a database at all, but long enough" * 100, "not an SQLite database, not a schedd"),
        (b"SQLite format 3\0" + b"\xff" * 4000, "a damaged or foreign state database: "),
    ],
    ids=["empty", "garbage", "damaged-sqlite"],
)
def test_a_damaged_state_database(
    data: Path, content: bytes, what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db_path = data / "raft" / "state.db"
    db_path.write_bytes(content)
    code, out, err = inspect(capsys, "--data-dir", str(data))
    assert (code, out) == (1, "")
    assert one_line(err).startswith(f"schedd inspect: {db_path}: {what}")


def test_a_database_that_is_not_a_nodes_state(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db_path = data / "raft" / "state.db"
    db_path.unlink()
    db = sqlite3.connect(db_path)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    code, out, err = inspect(capsys, "--data-dir", str(data))
    assert (code, out) == (1, "")
    assert one_line(err) == (
        f"schedd inspect: {db_path}: a damaged or foreign state database: no such table: meta"
    )


def test_unreadable_files(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    db_path = data / "raft" / "state.db"
    db_path.chmod(0)
    code, _, err = inspect(capsys, "--data-dir", str(data))
    assert code == 1
    assert one_line(err) == f"schedd inspect: {db_path}: cannot read it: Permission denied"
    (data / "raft").chmod(0)
    try:
        code, _, err = inspect(capsys, "--data-dir", str(data))
    finally:
        (data / "raft").chmod(0o700)
    assert code == 1
    assert one_line(err) == f"schedd inspect: {data / 'raft'}: cannot read it: Permission denied"


def test_a_torn_journal_is_reported_with_what_is_intact(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    want = expected(data, tmp_path)
    journal = data / "raft" / "raft.journal"
    size = journal.stat().st_size
    os.truncate(journal, size - 3)
    code, report, err = as_json(capsys, "--data-dir", str(data))
    assert code == 1
    assert journal.stat().st_size == size - 3  # not cut
    damage = report["journal"]["damage"]
    assert damage["reason"] == "torn record (runs past the end of the file)"
    assert report["journal"]["last_index"] == want["entries"][-2][1]
    assert report["applied"]["index"] == want["applied"]  # the rest is still shown
    assert one_line(err) == (
        f"schedd inspect: {journal}: torn record (runs past the end of the file) at offset "
        f"{damage['offset']}: a node's start cuts the {damage['dropped_bytes']:,} bytes from "
        f"there (1 records) after index {want['entries'][-2][1]}"
    )


def test_a_flipped_byte_in_the_journal(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal = data / "raft" / "raft.journal"
    raw = bytearray(journal.read_bytes())
    raw[HEADER_SIZE + 20] ^= 0x01
    journal.write_bytes(bytes(raw))
    code, out, err = inspect(capsys, "--data-dir", str(data))
    assert code == 1
    assert out.startswith("applied index ")
    assert "damaged at offset 16: checksum mismatch" in out
    assert one_line(err).startswith(f"schedd inspect: {journal}: checksum mismatch at offset 16: ")
    assert journal.read_bytes() == bytes(raw)


def test_a_journal_of_a_newer_format(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal = data / "raft" / "raft.journal"
    journal.write_bytes(encode_header(VERSION + 1))
    code, out, err = inspect(capsys, "--data-dir", str(data))
    assert (code, out) == (1, "")
    assert one_line(err) == (
        f"schedd inspect: {journal} has journal format {VERSION + 1}, newer than this schedd "
        f"({VERSION}): upgrade schedd, do not delete it"
    )


def test_a_damaged_journal_state_file(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = data / "raft" / "raft.journal.state"
    state.write_bytes(state.read_bytes()[:-2])
    code, report, err = as_json(capsys, "--data-dir", str(data))
    assert code == 1
    assert report["journal"]["state_file"] == "damaged"
    assert report["journal"]["current_term"] is None
    assert one_line(err).startswith(f"schedd inspect: {state}: damaged (state file has ")


def test_a_damaged_marker(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = data / "raft" / "raft.dump"
    raw = bytearray(marker.read_bytes())
    raw[-3] ^= 0x01
    marker.write_bytes(bytes(raw))
    code, report, err = as_json(capsys, "--data-dir", str(data))
    assert code == 1
    assert report["marker"] is None
    assert one_line(err) == (
        f"schedd inspect: {marker}: a damaged snapshot marker (its header's checksum does not "
        "match)"
    )
