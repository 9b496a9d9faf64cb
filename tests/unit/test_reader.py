"""The API's reads of the state database (aiosqlite on a real file): a job's latest run, asked
for by many requests in the same turn of the event loop, in one query."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import aiosqlite
import pytest

from schedd.core import commands
from schedd.core.model import JobSpec, RecurringOptions, Schedule, ScheduleKind
from schedd.storage.reader import LATEST_CHUNK, Reader, jobs_page_sql
from schedd.storage.sqlstate import SqlState, apply_entry

T0 = 1_800_000_000_000
EVERY = JobSpec(task="t", schedule=Schedule(kind=ScheduleKind.EVERY, every_ms=1_000))


def fill(path: Path) -> SqlState:
    """Jobs a0..a9 (one run each), b (a recurring job with many runs), c (no run: over)."""
    st = SqlState(path)
    over = JobSpec(
        task="t",
        schedule=Schedule(
            kind=ScheduleKind.EVERY, every_ms=1_000, options=RecurringOptions(end_at_ms=T0 - 1)
        ),
    )
    entries: list[list[commands.Command]] = [
        [commands.Claim("claim", T0, "n1", 1)],
        [
            commands.Submit(
                "s",
                T0,
                (*((f"a{k}", JobSpec(task="t")) for k in range(10)), ("b", EVERY), ("c", over)),
            )
        ],
    ]
    for k in range(30):  # b fires 30 times: each fire makes its next run
        entries.append([commands.Fire(f"f{k}", T0 + k * 1_000, 1, (f"b@{T0 + k * 1_000}",))])
    for i, cmds in enumerate(entries, start=1):
        assert apply_entry(st, commands.encode_entry(cmds), i) is not None
    return st


async def test_latest_runs_asked_in_one_turn_share_one_query(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = fill(tmp_path / "state.db")
    reader = Reader(tmp_path / "state.db")
    await reader.open()
    queries: list[int] = []
    real = reader.latest_runs

    async def counted(job_ids: list[str]) -> dict[str, object]:
        queries.append(len(job_ids))
        return await real(job_ids)

    monkeypatch.setattr(reader, "latest_runs", counted)
    try:
        asked = [f"a{k}" for k in range(10)] + ["b", "c", "nope", "a3"]
        got = await asyncio.gather(*(reader.latest_run(j) for j in asked))
        assert queries == [13]  # one query, each job once
        expected = [st.latest_run(j) for j in asked]
        assert got == expected
        assert got[10] is not None and got[10].scheduled_ms == T0 + 30_000  # b's newest
        assert got[11] is None and got[12] is None
        # a later turn makes its own query
        assert await reader.latest_run("a0") == st.latest_run("a0")
        assert queries == [13, 1]
    finally:
        await reader.close()
        st.close()


async def test_many_jobs_are_read_in_chunks_and_a_failure_reaches_every_caller(
    tmp_path: Path,
) -> None:
    st = fill(tmp_path / "state.db")
    reader = Reader(tmp_path / "state.db")
    await reader.open()
    try:
        ids = [f"a{k}" for k in range(10)] * (LATEST_CHUNK // 5)
        assert len(await reader.latest_runs(ids)) == 10
        await reader.close()
        reader._idle.put_nowait(await _closed(tmp_path))  # every statement now fails
        results = await asyncio.gather(
            reader.latest_run("a0"), reader.latest_run("a1"), return_exceptions=True
        )
        assert all(isinstance(r, Exception) for r in results), results
    finally:
        st.close()


async def _closed(tmp_path: Path) -> aiosqlite.Connection:
    db = await aiosqlite.connect(tmp_path / "state.db")
    await db.close()
    return db


@pytest.mark.parametrize(
    "filters",
    [
        {"status": "active"},
        {"status": "done", "task": "t"},
        {"status": "paused", "namespace": "n", "queue": "q"},
    ],
)
def test_a_listing_by_status_reads_the_jobs_of_that_status_only(
    tmp_path: Path, filters: dict[str, str]
) -> None:
    st = SqlState(tmp_path / "state.db")
    try:
        sql = jobs_page_sql(filters)
        params = (0, *filters.values(), 10)
        plan = " ".join(row[3] for row in st.db.execute(f"EXPLAIN QUERY PLAN {sql}", params))
        assert "USING INDEX jobs_status (status=? AND seq>?)" in plan, plan
    finally:
        st.close()


def test_the_purge_and_the_recurring_jobs_read_their_own_indexes(tmp_path: Path) -> None:
    # with jobs_status there, SQLite would pick it for both and read every job of the status
    st = fill(tmp_path / "state.db")
    plans: list[str] = []
    real = st.db

    class Explaining:
        def execute(self, sql: str, params: object = ()) -> sqlite3.Cursor:
            if sql.lstrip().startswith("SELECT id, body FROM jobs"):
                plans.append(
                    " ".join(r[3] for r in real.execute(f"EXPLAIN QUERY PLAN {sql}", params))
                )  # type: ignore[arg-type]
            return real.execute(sql, params)  # type: ignore[arg-type]

        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

    st.db = Explaining()  # type: ignore[assignment]
    try:
        assert [j.id for j in st.active_recurring_jobs()] == ["b"]
        st.forgettable_jobs(T0 + 10**9, 10)
    finally:
        st.db = real
        st.close()
    assert len(plans) == 2
    assert "USING INDEX jobs_recurring" in plans[0] and "TEMP B-TREE" not in plans[0]
    assert "USING INDEX jobs_finished" in plans[1] and "TEMP B-TREE" not in plans[1]
