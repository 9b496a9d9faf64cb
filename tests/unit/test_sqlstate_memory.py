"""What the SQL state keeps in memory and when it writes: the hot set, the bounded cache, the
rows an entry changed written once at its end, and the log checkpointed off the writer's thread
(real SQLite files)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from schedd.core import commands
from schedd.core.apply import apply as core_apply
from schedd.core.model import (
    Job,
    JobSpec,
    JobStatus,
    Run,
    RunState,
    Schedule,
    ScheduleKind,
    evolve,
)
from schedd.storage.checkpointer import Checkpointer
from schedd.storage.schema import WAL_SIZE_LIMIT
from schedd.storage.sqlstate import SqlState, StorageFailure, apply_entry

T0 = 1_800_000_000_000


class Node:
    """A state on a file with the entries applied one after the other."""

    def __init__(self, path: Path, **memory: int) -> None:
        self.state = SqlState(path, **memory)
        self.index = 0
        self.apply([commands.Claim("claim", T0, "n1", 1)])

    def apply(self, cmds: list[commands.Command]) -> list[object]:
        self.index += 1
        out = apply_entry(self.state, commands.encode_entry(cmds), self.index)
        assert out is not None
        return out[0]


def at(ms: int) -> JobSpec:
    return JobSpec(task="t", schedule=Schedule(kind=ScheduleKind.AT, at_ms=ms))


def test_live_runs_and_runs_due_within_the_hot_window_stay_in_memory_until_done(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path / "state.db", cache_max=1, hot_ms=60_000)
    st = node.state
    try:
        node.apply(
            [commands.Submit("s", T0, (("soon", at(T0 + 1_000)), ("later", at(T0 + 3_600_000))))]
        )
        soon, later = f"soon@{T0 + 1_000}", f"later@{T0 + 3_600_000}"
        assert st.hot_set() == 1  # the run due in an hour waits on disk
        assert st.runs[soon] is st.runs[soon]  # the same record: never read back from disk
        node.apply([commands.Fire("f", T0 + 1_000, node.index - 1, (soon,))])
        assert st.runs[soon].state is RunState.QUEUED and st.hot_set() == 1
        node.apply([commands.LeaseRuns("l", T0 + 1_001, 1, ((soon, "w1"),))])
        fence = node.index
        node.apply([commands.CompleteRun("d", T0 + 1_002, 1, soon, fence)])
        assert st.runs[soon].state is RunState.SUCCEEDED and st.hot_set() == 0
        # the leader loading its next window takes the later run into the hot set
        assert [r.id for r in st.due_runs(T0, T0 + 7_200_000)] == [later]
        assert st.hot_set() == 1
    finally:
        st.close()
    reopened = SqlState(tmp_path / "state.db")
    try:  # and what was kept in memory is exactly what is on disk
        assert reopened.runs[soon].state is RunState.SUCCEEDED
        assert reopened.hot_set() == 0  # a restart holds the live runs only (none here)
    finally:
        reopened.close()


def test_a_run_pushed_out_of_the_cache_within_its_entry_reads_back_as_written(
    tmp_path: Path,
) -> None:
    # cache of one, nothing hot: each new run pushes the previous one out before the entry
    # has written anything to the database
    node = Node(tmp_path / "state.db", cache_max=1, hot_ms=-(1 << 62))
    st = node.state
    try:
        jobs = tuple((f"j{k}", at(T0 + 10 + k)) for k in range(5))
        st.begin()
        for job_id, spec in jobs:
            st.add_job(_job(job_id, spec))
        st.jobs["j0"] = _evolved(st.jobs["j0"])
        assert [st.jobs[j].updated_ms for j, _ in jobs] == [T0 + 1, T0, T0, T0, T0]
        st.commit()
        assert st.jobs["j0"].updated_ms == T0 + 1
        assert [j for j in st.jobs] == ["j0", "j1", "j2", "j3", "j4"]
        # the same for runs, of jobs already in the database
        runs = [
            Run(f"j{k}@{T0}", f"j{k}", "default", T0, T0 + 10, RunState.SCHEDULED, T0, T0)
            for k in range(5)
        ]
        st.begin()
        for run in runs:
            st.add_run(run)
        st.put_run(evolve(runs[0], state=RunState.QUEUED, updated_ms=T0 + 2))
        assert [st.runs[r.id].state for r in runs] == [RunState.QUEUED] + [RunState.SCHEDULED] * 4
        assert [r.id for r in st.unfinished_runs("j0")] == [runs[0].id]  # read from SQL
        st.commit()
        assert st.runs[runs[0].id].updated_ms == T0 + 2
    finally:
        st.close()


def test_unfinished_runs_read_before_the_entry_is_written_are_as_after(tmp_path: Path) -> None:
    # a job's unfinished runs are read without writing the entry's pending rows first: rows
    # the database has (each as it is now), the job's new runs, in creation order; and a run
    # that was finished on disk and is not any more (a replay) is not missed
    st = SqlState(tmp_path / "state.db", cache_max=1, hot_ms=-(1 << 62))
    try:
        runs = [
            Run(f"j@{T0 + k}", "j", "default", T0 + k, T0 + k, RunState.SCHEDULED, T0, T0)
            for k in range(3)
        ]
        st.begin()
        st.add_job(_job("j", at(T0)))
        for run in runs:
            st.add_run(run)
        st.put_run(evolve(runs[2], state=RunState.FAILED))
        st.commit()
        st.begin()
        done = evolve(runs[0], state=RunState.SUCCEEDED, updated_ms=T0 + 5)
        st.put_run(done)
        new = Run(f"j@{T0 - 1}", "j", "default", T0 - 1, T0, RunState.SCHEDULED, T0, T0)
        st.add_run(new)  # created last, scheduled first: creation order is not time order
        replayed = evolve(runs[2], state=RunState.SCHEDULED, updated_ms=T0 + 6)
        before = [r.id for r in st.unfinished_runs("j")]
        assert before == [runs[1].id, new.id]
        assert st.finished_runs_beyond("j", 0) == [done, st.runs[runs[2].id]]
        st.put_run(replayed)
        assert [r.id for r in st.unfinished_runs("j")] == [runs[1].id, runs[2].id, new.id]
        assert st.has_unfinished("j")
        assert st.finished_runs_beyond("j", 1) == []  # 4 runs, 1 finished
        st.commit()
        assert [r.id for r in st.unfinished_runs("j")] == [runs[1].id, runs[2].id, new.id]
        # a job with as many runs on disk as are kept, and a new one finished already (a
        # skipped occurrence): the new one counts
        st.begin()
        st.add_job(_job("k", at(T0)))
        first = Run(f"k@{T0}", "k", "default", T0, T0, RunState.SUCCEEDED, T0, T0)
        st.add_run(first)
        st.commit()
        st.begin()
        st.add_run(Run(f"k@{T0 + 1}", "k", "default", T0 + 1, T0 + 1, RunState.SKIPPED, T0, T0))
        assert st.finished_runs_beyond("k", 1) == [first]
        st.commit()
    finally:
        st.close()


def _job(job_id: str, spec: JobSpec) -> Job:
    return Job(job_id, spec, JobStatus.ACTIVE, T0, T0)


def _evolved(job: Job) -> Job:
    return evolve(job, updated_ms=T0 + 1)


class Counting:
    """The writer's connection, counting its statements by their first three words."""

    def __init__(self, db: sqlite3.Connection, seen: Counter[str]) -> None:
        self.db, self.seen = db, seen

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        self.seen.update([" ".join(sql.split()[:3])])
        return self.db.execute(sql, *args)

    def executemany(self, sql: str, rows: object) -> sqlite3.Cursor:
        self.seen.update([" ".join(sql.split()[:3])])
        return self.db.executemany(sql, rows)  # type: ignore[arg-type]

    @property
    def in_transaction(self) -> bool:
        return self.db.in_transaction

    def close(self) -> None:
        self.db.close()


def test_an_entry_writes_each_row_it_changed_once_at_its_end(tmp_path: Path) -> None:
    node = Node(tmp_path / "state.db")
    st = node.state
    statements: Counter[str] = Counter()
    st.db = Counting(st.db, statements)  # type: ignore[assignment]
    try:
        # a submit adds each job, then sets its next run: one insert per table for 100 jobs
        node.apply([commands.Submit("s", T0, tuple((f"j{k}", at(T0 + 5)) for k in range(100)))])
        assert statements["INSERT INTO jobs"] == 1
        assert statements["INSERT INTO runs"] == 1
        assert statements["UPDATE jobs SET"] == 0
        statements.clear()
        node.apply([commands.Fire("f", T0 + 5, 1, tuple(f"j{k}@{T0 + 5}" for k in range(100)))])
        assert statements["UPDATE runs SET"] == 1
        assert "SELECT body FROM" not in statements  # every run came from memory
    finally:
        st.close()
    reopened = SqlState(tmp_path / "state.db")
    try:
        assert {reopened.runs[f"j{k}@{T0 + 5}"].state for k in range(100)} == {RunState.QUEUED}
        # the job's row holds its last change in the submit (the run it made), not the first
        assert [reopened.jobs[f"j{k}"].next_run_id for k in range(100)] == [
            f"j{k}@{T0 + 5}" for k in range(100)
        ]
    finally:
        reopened.close()


def test_a_change_to_a_job_that_is_not_in_the_database_stops_the_node(tmp_path: Path) -> None:
    node = Node(tmp_path / "state.db")
    st = node.state
    try:
        node.apply([commands.Submit("s", T0, (("j", at(T0 + 5)),))])
        st.db.execute("DELETE FROM jobs")  # damaged behind schedd's back
        st.begin()
        st.jobs["j"] = _evolved(st.jobs["j"])
        with pytest.raises(StorageFailure, match="1 of the 1 rows this entry changed in jobs"):
            st.commit()
    finally:
        st.close()


def test_the_writer_leaves_checkpoints_to_the_checkpointer_thread(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    node = Node(path)
    st = node.state
    try:
        assert st.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0  # never
        assert st.db.execute("PRAGMA journal_size_limit").fetchone()[0] == WAL_SIZE_LIMIT
        assert st.checkpointer is not None
        for k in range(20):
            node.apply(
                [commands.Submit(f"s{k}", T0, tuple((f"j{k}-{i}", at(T0 + 5)) for i in range(200)))]
            )
        assert st.checkpointer.copied.wait(10), "no checkpoint by the thread within 10 s"
        assert st.checkpointer.checkpoints > 0
        # what it copied is in the database file itself: a reader without the log sees it
        st.checkpointer.checkpoint()
        copy = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        try:
            assert copy.execute("SELECT count(*) FROM jobs").fetchone()[0] == 4000
        finally:
            copy.close()
    finally:
        st.close()
    assert not st.checkpointer._thread.is_alive()  # closing the state stops it


def test_a_failing_checkpoint_is_counted_and_does_not_stop_the_thread(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    sqlite3.connect(path).close()
    cp = Checkpointer(path, period_s=3600)
    try:
        cp._db.close()  # every statement now fails
        assert cp.checkpoint() == (0, 0)
        assert cp.failures == 1
    finally:
        cp.close()


def test_a_backlog_held_by_a_long_reader_is_copied_back_in_bounded_steps(tmp_path: Path) -> None:
    """A reader holds an old view (a whole copy being sent) while megabytes are committed; once
    it lets go, no checkpoint copies more than a step of the log (plus one commit), each step
    at its own checkpoint, instead of the whole backlog at once."""
    path = tmp_path / "state.db"
    st = SqlState(path)
    assert st.checkpointer is not None
    st.checkpointer.close()  # driven by hand below
    step = 256 << 10
    cp = Checkpointer(path, period_s=3600, step_bytes=step)
    reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM jobs").fetchone()  # the long view, taken now
        commit_bytes = 0
        for k in range(40):  # about 2.5 MB of log behind the view
            before = cp.checkpoint()[0]
            jobs = tuple((f"j{k}-{i}", JobSpec(task="t", payload="x" * 200)) for i in range(50))
            assert apply_entry(
                st, commands.encode_entry([commands.Submit(f"s{k}", T0, jobs)]), k + 1
            )
            commit_bytes = max(commit_bytes, (cp.checkpoint()[0] - before) * cp.frame_bytes)
            cp.step()
        assert cp.pins == 3  # the views it took to cut the backlog
        frames, copied = cp.checkpoint()
        assert (frames - copied) * cp.frame_bytes > 3 * step  # all of it held back
        reader.execute("COMMIT")  # the long view goes
        steps = []
        while True:
            frames, now = cp.step()
            steps.append((now - copied) * cp.frame_bytes)
            copied = now
            if now == frames and cp.pins == 0:
                break
            assert len(steps) < 20
        assert cp.steps == 3 and len(steps) >= 4
        assert all(s <= step + commit_bytes for s in steps[:3]), (steps, step, commit_bytes)
        assert copied == frames  # and all of it copied in the end
    finally:
        reader.close()
        cp.close()
        st.close()


def _remember_batches(path: Path, with_ids: bool, batches: int = 60, warm: int = 20) -> int:
    """Python's allocations gained over ``batches - warm`` submits of 100 far-future jobs, each
    with a request id or not, counted after ``warm`` submits filled the caches that are paid
    once, garbage collected before each reading (in a process of its own: the test below)."""
    import gc
    import tracemalloc

    node = Node(path, cache_max=1)
    try:
        tracemalloc.start()
        base = 0
        for k in range(batches):
            if k == warm:
                gc.collect()
                base = tracemalloc.get_traced_memory()[0]
            jobs = tuple((f"j{k}-{i}", at(T0 + 86_400_000)) for i in range(100))
            node.apply([commands.Submit(f"tok:req-{k}:abc" if with_ids else "", T0 + k, jobs)])
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        if with_ids:
            assert node.state.remembered() == batches
        return held
    finally:
        node.state.close()


def test_request_ids_are_remembered_on_disk_not_in_memory(tmp_path: Path) -> None:
    """The dedup window (a submit's request id and the ids of its jobs, 15 minutes) lives in the
    database: remembering 4,000 jobs' ids holds no more Python memory than not remembering them,
    a reopened database still answers a repeat, and the window is purged by time."""
    # measured in a process of its own: tracemalloc sees every thread, and a suite leaves
    # threads behind that allocate meanwhile (they failed this check in full runs)
    script = (
        "import sys, pathlib\n"
        "from tests.unit.test_sqlstate_memory import _remember_batches\n"
        "d = pathlib.Path(sys.argv[1])\n"
        "_remember_batches(d / 'warm.db', True)  # first calls allocate caches of their own\n"
        "print(_remember_batches(d / 'a.db', True), _remember_batches(d / 'b.db', False))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    with_ids, without = (int(v) for v in done.stdout.split())
    assert with_ids - without < 4_000 * 8, (with_ids, without)  # under 8 bytes a job
    st = SqlState(tmp_path / "a.db")
    try:
        seen = st.recall("tok:req-7:abc")
        assert seen is not None and len(seen.value) == 100  # type: ignore[union-attr]
        rows = st.db.execute("SELECT count(*), sum(length(result)) FROM recent").fetchone()
        assert rows[0] == 60 and rows[1] / 6_000 < 64  # bytes a job, on disk
        st.begin()
        st.remember("later", T0 + 16 * 60_000, seen)  # 16 minutes on: the window moved past
        st.commit()
        assert st.remembered() == 1 and st.recall("tok:req-7:abc") is None
    finally:
        st.close()


def _statements(st: SqlState) -> list[str]:
    """The SQL statements ``st`` runs from now on (sqlite3's trace callback)."""
    seen: list[str] = []
    st.db.set_trace_callback(seen.append)
    return seen


def test_new_jobs_are_stored_without_looking_their_ids_up(tmp_path: Path) -> None:
    """Job ids are new by construction (schedd.ids), so a batch of them reads nothing from the
    jobs table; one batch naming an id twice is still refused."""
    node = Node(tmp_path / "state.db")
    try:
        node.apply([commands.Submit("warm", T0, (("w", at(T0 + 3_600_000)),))])
        seen = _statements(node.state)
        jobs = tuple((f"J{i:04}", at(T0 + 3_600_000)) for i in range(1000))
        [result] = node.apply([commands.Submit("batch", T0 + 1, jobs)])
        assert len(result.value) == 1000  # type: ignore[union-attr]
        assert any(s.startswith("INSERT INTO jobs") for s in seen)  # the trace sees them
        looks = [s for s in seen if s.startswith("SELECT") and "FROM jobs" in s]
        assert looks == []
        twice = (("K1", at(T0 + 5)), ("K1", at(T0 + 5)))
        [dup] = node.apply([commands.Submit("again", T0 + 2, twice)])
        assert dup.code == "conflict" and dup.field == "jobs[1].id"  # type: ignore[union-attr]
    finally:
        node.state.close()


def test_a_client_command_costs_a_look_up_and_a_row_and_the_window_is_purged_per_commit(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path / "state.db")
    st = node.state
    try:
        seen = _statements(st)
        for i in range(10):
            node.apply([commands.CancelJob(f"r{i}", T0 + i, "nope")])
        recent = [s for s in seen if "recent" in s]
        reads = [s for s in recent if s.startswith("SELECT")]
        writes = [s for s in recent if not s.startswith("SELECT")]
        assert len(reads) == 10  # one look-up a command
        assert len(writes) == 2 * 10  # each entry commits here: its row, then the purge
        seen.clear()
        st.begin()  # ten commands in one transaction: one write of them all, one purge
        for i in range(10, 20):
            core_apply(st, commands.CancelJob(f"r{i}", T0 + i, "nope"), 100 + i, [])
        st.commit()
        writes = [s for s in seen if "recent" in s and not s.startswith("SELECT")]
        assert [w.split()[0] for w in writes] == ["INSERT"] * 10 + ["DELETE"]  # purged once
    finally:
        st.close()


def test_nodes_that_commit_at_other_entries_answer_a_repeat_alike(tmp_path: Path) -> None:
    """A node purges the dedup window at its commits, which fall at other entries on each
    node: a request out of the window is not answered from a row still there."""
    window = 15 * 60_000
    answers = []
    for name, commit_each in (("a.db", True), ("b.db", False)):
        node = Node(tmp_path / name)
        st = node.state
        try:
            node.apply([commands.CancelJob("old", T0, "nope")])
            if not commit_each:
                st.begin()  # b: one transaction from here on, nothing purged yet
            out = []
            for i, now in enumerate((T0 + window - 1, T0 + window + 1)):
                if commit_each:
                    st.begin()
                core_apply(st, commands.CancelJob(f"new{i}", now, "nope"), 10 + i, [])
                if commit_each:
                    st.commit()
                out.append(st.recall("old") is not None)
            if not commit_each:
                st.commit()
            answers.append((out, st.remembered()))
        finally:
            st.close()
    assert answers[0] == answers[1] == ([True, False], 2)
