"""Frozen samples of what a node writes to disk, so a change of format is an upgrade, not an
accident: a state database and a snapshot written at each schema version (``tests/data``,
``state-v<N>.sqlite`` and ``raft-dump-v<N>.sqlite``) open with this version and hold exactly
what the same entries give in memory.  When the schema changes, these files stay as they are
and the migrations must bring them up.

To write the samples of the current version (once, when the version is new; never over an old
one): ``python -m tests.unit.test_storage_formats``.
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from schedd.core import commands
from schedd.core.apply import apply_entry
from schedd.core.model import (
    AttemptOutcome,
    Job,
    JobSpec,
    JobStatus,
    Priority,
    RecurringOptions,
    RetryPolicy,
    Schedule,
    ScheduleKind,
)
from schedd.core.state import MemoryState
from schedd.storage import codec, snapshots
from schedd.storage.schema import NO_NEXT, SCHEMA_VERSION
from schedd.storage.sqlstate import SqlState
from schedd.storage.sqlstate import apply_entry as sql_apply_entry
from tests.property.test_sql_state_property import answers

DATA = Path(__file__).resolve().parents[1] / "data"
VERSIONS = range(1, SCHEMA_VERSION + 1)
DUMP_VERSIONS = range(1, 4)  # whole-copy snapshots, written up to schema version 3


def db_sample(version: int) -> Path:
    return DATA / f"state-v{version}.sqlite"


def dump_sample(version: int) -> Path:
    return DATA / f"raft-dump-v{version}.sqlite"


T0 = 1_800_000_000_000
RAFT = ((b"\x01last", 31, 2), (b"\x01prev", 30, 2), ["127.0.0.1:9001", "127.0.0.1:9002"])


def sample_entries() -> list[bytes]:
    """Every kind of record: jobs of each schedule kind and policy, runs in each state, attempts,
    a dead-lettered run, dependencies, an idempotency key, remembered requests, a purge."""
    cron = Schedule(
        kind=ScheduleKind.CRON,
        cron="*/5 * * * *",
        timezone="Europe/Berlin",
        options=RecurringOptions(overlap="buffer_one", misfire="run_all"),
    )
    every = Schedule(kind=ScheduleKind.EVERY, every_ms=60_000, options=RecurringOptions())
    jobs = (
        (
            "once",
            JobSpec(
                task="t",
                payload={"a": [1, 2.5, None, "é"]},
                priority=Priority.HIGH,
                idempotency_key="k1",
                timeout_ms=30_000,
            ),
        ),
        ("dead", JobSpec(task="t", retry=RetryPolicy(max_attempts=1))),
        ("cron", JobSpec(task="c", namespace="ns", queue="q", schedule=cron)),
        ("tick", JobSpec(task="e", schedule=every)),
        ("later", JobSpec(task="t", schedule=Schedule(kind=ScheduleKind.AT, at_ms=T0 + 3_600_000))),
    )
    cmds: list[list[commands.Command]] = [
        [commands.Claim("r0", T0, "n1", 1, "http://n1")],
        [commands.Submit("r1", T0, jobs)],
        [commands.Submit("r2", T0 + 1, (("after", JobSpec(task="t", depends_on=("once",))),))],
        [commands.Fire("r3", T0 + 2, 1, (f"once@{T0}", f"dead@{T0}"))],
        [commands.LeaseRuns("r4", T0 + 3, 1, ((f"once@{T0}", "w1"), (f"dead@{T0}", "w2")))],
        [commands.CompleteRun("r5", T0 + 4, 1, f"once@{T0}", 5, {"ok": True})],
        [
            commands.FailRun(
                "r6", T0 + 5, 1, f"dead@{T0}", 5, "ValueError: no", True, AttemptOutcome.FAILED, 0.5
            )
        ],
        [
            commands.Trigger("r7", T0 + 6, "tick", True),
            commands.UpdateJob("r8", T0 + 6, "cron", paused=True),
        ],
        [commands.CancelRun("r9", T0 + 7, f"later@{T0 + 3_600_000}")],
        [commands.Purge("r10", T0 + 8, 1, T0 - 1, 500, 100)],
    ]
    return [commands.encode_entry(batch) for batch in cmds]


def marker_sample(version: int = snapshots.MARKER_VERSION) -> Path:
    return DATA / f"snapshot-marker-v{version}.bin"


def image_sample(version: int = snapshots.IMAGE_VERSION) -> Path:
    return DATA / f"snapshot-image-v{version}.snap"


def opened_sample(tmp_path: Path, version: int) -> SqlState:
    """The state database sample of ``version``, copied and opened (migrated) by this schedd."""
    db = tmp_path / "state.db"
    shutil.copyfile(db_sample(version), db)
    return SqlState(db)


def write_samples(db: Path) -> None:
    """A state database of the sample entries (``raft-dump-v<N>.sqlite``, whole copies, are
    no longer written: schedd compacts with a marker since schema version 3)."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    state = SqlState(db)
    for i, blob in enumerate(sample_entries(), start=1):
        sql_apply_entry(state, blob, i)
    state.close()  # checkpoints the log into the file: one self-contained file


def write_snapshot_samples(tmp: Path) -> None:
    """A marker and an image of the sample entries, at the current formats."""
    db = tmp / "state.db"
    state = SqlState(db)
    for i, blob in enumerate(sample_entries(), start=1):
        sql_apply_entry(state, blob, i)
    n = len(sample_entries())
    snapshots.write_marker(marker_sample(), snapshots.Marker(RAFT, n, written_ms=T0))
    with snapshots.ImageSource(db, rate=1e12, raft=RAFT, term=2, node="n1") as source:
        snapshots.write_image(iter(source), image_sample())
    state.close()


def reference() -> MemoryState:
    mem = MemoryState()
    for i, blob in enumerate(sample_entries(), start=1):
        apply_entry(mem, blob, i)
    return mem


def without_claims(answer: dict[str, Any]) -> dict[str, Any]:
    """A state's answers but its leader history, which databases keep since after these
    samples were written (one without it starts the history at the next leader's claim)."""
    return {k: v for k, v in answer.items() if k != "claims"}


def test_the_leader_history_and_refused_results_outlive_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    state = SqlState(db)
    for i, blob in enumerate(sample_entries(), start=1):
        sql_apply_entry(state, blob, i)
    late = commands.CompleteRun("r-late", T0 + 9, 1, f"once@{T0}", 4, None)  # fence 4: stale
    sql_apply_entry(state, commands.encode_entry([late]), len(sample_entries()) + 1)
    claim = commands.Claim("r-claim", T0 + 10, "n2", 2, "http://n2")
    sql_apply_entry(state, commands.encode_entry([claim]), len(sample_entries()) + 2)
    before = answers(state)
    assert state.leader_claims == ((1, "n1", 1, T0), (2, "n2", len(sample_entries()) + 2, T0 + 10))
    assert [r.fence for r in state.runs[f"once@{T0}"].refused] == [4]
    state.close()
    again = SqlState(db)
    try:
        assert answers(again) == before
    finally:
        again.close()


def test_every_version_has_its_samples_of_the_version_they_are_named_after() -> None:
    for version in VERSIONS:
        for path in (db_sample(version), *([dump_sample(version)] * (version in DUMP_VERSIONS))):
            db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)  # writes nothing
            try:
                assert db.execute("PRAGMA user_version").fetchone() == (version,)
            finally:
                db.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_a_database_of_every_schema_version_opens_and_holds_what_its_entries_give(
    tmp_path: Path, version: int
) -> None:
    state = opened_sample(tmp_path, version)
    try:
        assert state.applied_index == len(sample_entries())
        assert without_claims(answers(state)) == without_claims(answers(reference()))
        assert state.db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        # migrated to the schema a new database has: the same tables and indexes
        assert schema_of(state.db) == schema_of(SqlState().db)
    finally:
        state.close()


@pytest.mark.parametrize("version", DUMP_VERSIONS)
def test_a_snapshot_of_every_schema_version_installs_and_holds_what_its_entries_give(
    tmp_path: Path, version: int
) -> None:
    dump = tmp_path / "raft.dump"
    shutil.copyfile(dump_sample(version), dump)
    info = snapshots.read_snapshot(dump)
    assert (info.applied_index, info.raft) == (len(sample_entries()), RAFT)
    state = SqlState(tmp_path / "state.db")
    try:
        state.install(dump)
        assert without_claims(answers(state)) == without_claims(answers(reference()))
        assert schema_of(state.db) == schema_of(SqlState().db)
    finally:
        state.close()


def test_the_marker_of_every_format_reads_as_written() -> None:
    for version in range(1, snapshots.MARKER_VERSION + 1):
        marker = snapshots.read_marker(marker_sample(version))
        assert (marker.raft, marker.applied_index, marker.written_ms) == (
            RAFT,
            len(sample_entries()),
            T0,
        )


@pytest.mark.parametrize("version", range(1, snapshots.IMAGE_VERSION + 1))
def test_an_image_of_every_format_installs_and_holds_what_its_entries_give(
    tmp_path: Path, version: int
) -> None:
    incoming = tmp_path / "state.db.incoming"
    checked = snapshots.verify_image(image_sample(version), incoming)
    h = checked.header
    assert (h.applied_index, h.raft, h.term, h.node) == (len(sample_entries()), RAFT, 2, "n1")
    assert snapshots.finalize_incoming(incoming) == len(sample_entries())
    state = SqlState(incoming)
    try:
        assert without_claims(answers(state)) == without_claims(answers(reference()))
        assert schema_of(state.db) == schema_of(SqlState().db)
    finally:
        state.close()


def test_the_names_of_jobs_written_before_version_3_are_found_after_the_upgrade(
    tmp_path: Path,
) -> None:
    db_path = tmp_path / "state.db"
    shutil.copyfile(db_sample(2), db_path)
    db = sqlite3.connect(db_path)
    named = Job("named", JobSpec(task="t", name="nightly report"), JobStatus.ACTIVE, T0, T0)
    db.execute(
        "INSERT INTO jobs (id, seq, namespace, queue, task, status, recurring, updated_ms, body) "
        "VALUES ('named', 1000, 'default', 'default', 't', 'active', 0, ?, ?)",
        (T0, codec.job_body(named)),
    )
    db.commit()
    db.close()
    state = SqlState(db_path)
    try:
        rows = state.db.execute("SELECT id, name FROM jobs WHERE name IS NOT NULL").fetchall()
        assert rows == [("named", "nightly report")]
        sql = "SELECT id FROM jobs WHERE name = ? ORDER BY seq"
        plan = str(state.db.execute(f"EXPLAIN QUERY PLAN {sql}", ("x",)).fetchall())
        assert "jobs_name" in plan, plan
    finally:
        state.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_the_sort_columns_of_an_upgraded_database_are_those_a_new_one_writes(
    tmp_path: Path, version: int
) -> None:
    # next_ms and last_ms (version 4) are computed by the migration from what a database
    # holds, and kept by every entry since: the two must agree, or a listing sorted by them
    # would differ from one node to the next
    upgraded, live = opened_sample(tmp_path, version), SqlState()
    for i, blob in enumerate(sample_entries(), start=1):
        sql_apply_entry(live, blob, i)
    sql = "SELECT id, next_ms, last_ms FROM jobs ORDER BY seq"
    try:
        got, want = upgraded.db.execute(sql).fetchall(), live.db.execute(sql).fetchall()
        assert got == want
        assert any(last > 0 for _, _, last in want)
        assert any(nxt < NO_NEXT for _, nxt, _ in want)
        assert any(nxt == NO_NEXT for _, nxt, _ in want)
    finally:
        upgraded.close()
        live.close()


def schema_of(db: sqlite3.Connection) -> list[tuple[str, str, str]]:
    return db.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
        "ORDER BY type, name"
    ).fetchall()


if __name__ == "__main__":
    import tempfile

    db_path = db_sample(SCHEMA_VERSION)
    if db_path.exists() and "--force" not in sys.argv:
        print(f"{db_path} exists: samples of a released version are never rewritten")
    else:
        write_samples(db_path)
        print(f"wrote {db_path}")
    if marker_sample().exists() or image_sample().exists():
        print(f"{marker_sample()} or {image_sample()} exists: never rewritten")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            write_snapshot_samples(Path(tmp))
        print(f"wrote {marker_sample()} and {image_sample()}")
