"""The API's reads of the state database (aiosqlite on a real file): a job's latest run, asked
for by many requests in the same turn of the event loop, in one query."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiosqlite
import pytest

from schedd.core import commands
from schedd.core.model import JobSort, JobSpec, RecurringOptions, RunState, Schedule, ScheduleKind
from schedd.storage.reader import LATEST_CHUNK, JobKey, JobOrder, Reader
from schedd.storage.schema import FIRST
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
    apply_all(st, entries)
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
        sql, params = JobOrder().page_sql(filters, (5,), None, 10)
        plan = " ".join(row[3] for row in st.db.execute(f"EXPLAIN QUERY PLAN {sql}", params))
        assert "USING INDEX jobs_status (status=? AND seq<?)" in plan, plan
        assert "TEMP B-TREE" not in plan, plan
    finally:
        st.close()


@pytest.mark.parametrize("sort", [JobSort.NEXT_FIRE, JobSort.LATEST_RUN])
@pytest.mark.parametrize("desc", [False, True])
@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({}, "jobs_next"),
        ({"status": "active"}, "jobs_next"),
        ({"task": "t", "last_run": "failed"}, "jobs_next"),
        ({"name": "nightly"}, "jobs_name"),
        ({"name": "nightly", "status": "done"}, "jobs_name"),
        ({"id_prefix": "01J"}, "PRIMARY KEY"),
    ],
)
def test_a_listing_sorted_by_a_time_reads_its_index_in_order_or_a_narrow_filters(
    tmp_path: Path, sort: JobSort, desc: bool, filters: dict[str, str], index: str
) -> None:
    # the order's own index, read in order from the cursor (no sort of every job), unless a
    # filter names few jobs: then those are read and sorted
    st = SqlState(tmp_path / "state.db")
    index = index.replace("jobs_next", "jobs_next" if sort is JobSort.NEXT_FIRE else "jobs_last")
    try:
        order = JobOrder(sort, desc)
        upto = (T0 + 9, 9) if order.bounded(filters) else None
        sql, params = order.page_sql(filters, (T0, 5), upto, 10)
        plan = " ".join(row[3] for row in st.db.execute(f"EXPLAIN QUERY PLAN {sql}", params))
        assert f"USING {'' if index == 'PRIMARY KEY' else 'INDEX '}{index}" in plan, plan
        if index.startswith(("jobs_next", "jobs_last")):
            assert "TEMP B-TREE" not in plan, plan
            assert f"({order.columns[0]}, seq)" in sql or "<" in plan or ">" in plan, plan
        window, wparams = order.window_sql((T0, 5))
        plan = " ".join(row[3] for row in st.db.execute(f"EXPLAIN QUERY PLAN {window}", wparams))
        assert "COVERING INDEX" in plan and "TEMP B-TREE" not in plan, plan
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


def apply_all(st: SqlState, entries: list[list[commands.Command]]) -> None:
    for cmds in entries:
        index = st.applied_index + 1
        assert apply_entry(st, commands.encode_entry(cmds), index) is not None


def named_and_failed(path: Path) -> SqlState:
    """Jobs n0..n5 (n0, n2, n4 named "nightly", the others "hourly"; n0..n3 on task x, the
    others y); n0, n1, n2 dead-lettered in that order, n3 succeeded, n4 and n5 queued."""
    st = SqlState(path)
    specs = tuple(
        (
            f"n{k}",
            JobSpec(task="x" if k < 4 else "y", name="nightly" if k % 2 == 0 else "hourly"),
        )
        for k in range(6)
    )
    apply_all(st, [[commands.Claim("claim", T0, "n1", 1)], [commands.Submit("s", T0, specs)]])
    runs = [f"n{k}@{T0}" for k in range(6)]
    apply_all(st, [[commands.Fire("f", T0, 1, tuple(runs))]])
    apply_all(st, [[commands.LeaseRuns("l", T0 + 1, 1, tuple((r, "w") for r in runs[:4]))]])
    for k, run_id in enumerate(runs[:4]):
        run = st.latest_run(f"n{k}")
        assert run is not None and run.id == run_id
        fence = run.attempts[-1].fence
        end: commands.Command = (
            commands.CompleteRun(f"c{k}", T0 + 10 + k, 1, run_id, fence, None)
            if k == 3
            else commands.FailRun(f"e{k}", T0 + 10 + k, 1, run_id, fence, f"boom {k}", False)
        )
        apply_all(st, [[end]])
    return st


async def test_jobs_are_found_by_name_by_id_prefix_and_by_their_latest_runs_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = named_and_failed(tmp_path / "state.db")
    reader = Reader(tmp_path / "state.db")
    await reader.open()

    async def ids(filters: dict[str, str], limit: int = 10) -> list[str]:
        jobs, _ = await reader.jobs_page(limit, filters)
        return [j.id for j in jobs]

    try:  # newest first
        assert await ids({"name": "nightly"}) == ["n4", "n2", "n0"]
        assert await ids({"name": "nightly", "task": "y"}) == ["n4"]
        assert await ids({"name": "weekly"}) == []
        assert await ids({"id_prefix": "n"}) == [f"n{k}" for k in range(5, -1, -1)]
        assert await ids({"id_prefix": "n3"}) == ["n3"]
        assert await ids({"last_run": "failed"}) == ["n2", "n1", "n0"]
        assert await ids({"last_run": "succeeded"}) == ["n3"]
        assert await ids({"last_run": "queued", "name": "nightly"}) == ["n4"]
        # a filter on the latest run reads a window of positions per page: pages can be short
        # (even empty) and still go on, and together they hold every match once
        monkeypatch.setattr("schedd.storage.reader.SCAN_WINDOW", 2)
        got, sizes = [], []
        cursor: JobKey | None = None
        for _ in range(10):
            jobs, after = await reader.jobs_page(10, {"last_run": "failed"}, JobOrder(), cursor)
            got += [j.id for j in jobs]
            sizes.append(len(jobs))
            if after is None:
                break
            cursor = JobOrder().parse_cursor(after)
        assert got == ["n2", "n1", "n0"]
        assert sizes == [0, 1, 2], sizes  # positions 5-4, 3-2, 1-0 (nothing after)
    finally:
        await reader.close()
        st.close()


async def test_a_jobs_runs_filter_by_state_and_time(tmp_path: Path) -> None:
    st = fill(tmp_path / "state.db")
    reader = Reader(tmp_path / "state.db")
    await reader.open()
    try:
        # b: its first run queued (1s), the 28 after it skipped (overlap), the next scheduled
        runs, _ = await reader.runs_page("b", FIRST, 100)
        assert len(runs) == 30
        queued, after = await reader.runs_page("b", FIRST, 100, RunState.QUEUED)
        assert [r.scheduled_ms for r in queued] == [T0 + 1_000] and after is None
        since = T0 + 25_000
        recent, _ = await reader.runs_page("b", FIRST, 100, None, since)
        assert [r.scheduled_ms for r in recent] == list(range(T0 + 30_000, since - 1, -1_000))
        page, after = await reader.runs_page("b", FIRST, 2, RunState.SKIPPED, since)
        assert [r.scheduled_ms for r in page] == [T0 + 29_000, T0 + 28_000]
        assert after == T0 + 28_000
        rest, end = await reader.runs_page("b", after, 10, RunState.SKIPPED, since)
        assert [r.scheduled_ms for r in rest] == [T0 + 27_000, T0 + 26_000, T0 + 25_000]
        assert end is None
    finally:
        await reader.close()
        st.close()


async def test_the_dead_letter_queue_filters_by_task_queue_namespace_and_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = named_and_failed(tmp_path / "state.db")
    reader = Reader(tmp_path / "state.db")
    await reader.open()

    async def dead(filters: dict[str, str | int], limit: int = 10) -> list[str]:
        runs, _ = await reader.dead_letters_page(FIRST, limit, filters)
        return [r.job_id for r in runs]

    try:
        assert await dead({}) == ["n2", "n1", "n0"]
        assert await dead({"task": "x"}) == ["n2", "n1", "n0"]
        assert await dead({"task": "y"}) == []
        assert await dead({"queue": "default", "namespace": "default"}) == ["n2", "n1", "n0"]
        assert await dead({"queue": "other"}) == []
        assert await dead({"since": T0 + 11}) == ["n2", "n1"]
        runs, after = await reader.dead_letters_page(FIRST, 1, {"task": "x"})
        assert [r.job_id for r in runs] == ["n2"] and after is not None
        runs, after = await reader.dead_letters_page(after, 5, {"task": "x"})
        assert [r.job_id for r in runs] == ["n1", "n0"] and after is None
        # a window of 2 positions per page: the pages go on below it until the bottom
        monkeypatch.setattr("schedd.storage.reader.SCAN_WINDOW", 2)
        got, before, sizes = [], FIRST, []
        for _ in range(10):
            runs, cursor = await reader.dead_letters_page(before, 10, {"since": T0 + 10})
            got += [r.job_id for r in runs]
            sizes.append(len(runs))
            if cursor is None:
                break
            before = cursor
        assert got == ["n2", "n1", "n0"] and sizes == [2, 1], sizes
    finally:
        await reader.close()
        st.close()


@asynccontextmanager
async def reading(st: SqlState) -> AsyncIterator[Reader]:
    """A reader of ``st``'s database, both closed on the way out."""
    reader = Reader(Path(str(st.path)))
    await reader.open()
    try:
        yield reader
    finally:
        await reader.close()
        st.close()


async def test_a_bulk_selection_of_the_dead_letter_queue_matches_like_its_listing_and_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # n0, n1, n2 dead ("boom 0", "boom 1", ...)
    async with reading(named_and_failed(tmp_path / "state.db")) as reader:

        async def matching(filters: dict[str, str | int], limit: int = 10) -> list[tuple[str, str]]:
            return await reader.dead_letters_matching(filters, limit)

        assert await matching({}) == [(f"n{k}@{T0}", "x") for k in (2, 1, 0)]
        assert await matching({"error": "BOOM 1"}) == [(f"n1@{T0}", "x")]  # either case
        assert await matching({"error": "boom", "since": T0 + 11}) == [
            (f"n2@{T0}", "x"),
            (f"n1@{T0}", "x"),
        ]
        assert await matching({"task": "y"}) == []
        assert await matching({"error": "boom"}, limit=2) == [(f"n2@{T0}", "x"), (f"n1@{T0}", "x")]
        # a window of one position per query: every position is still read, in order
        monkeypatch.setattr("schedd.storage.reader.SCAN_WINDOW", 1)
        assert [r for r, _ in await matching({"error": "boom"})] == [
            f"n{k}@{T0}" for k in (2, 1, 0)
        ]
        assert await reader.dead_letters_named([f"n0@{T0}", f"n3@{T0}", "nope@1"]) == {
            f"n0@{T0}": "x"  # n3 succeeded: not in the queue
        }


async def test_an_empty_dead_letter_queue_matches_nothing(tmp_path: Path) -> None:
    async with reading(fill(tmp_path / "state.db")) as reader:
        assert await reader.dead_letters_matching({}, 10) == []


async def test_due_but_not_leased_counts_the_queued_and_the_overdue_of_jobs_not_paused(
    tmp_path: Path,
) -> None:
    st = SqlState(tmp_path / "state.db")
    later = JobSpec(task="t", schedule=Schedule(kind=ScheduleKind.AT, at_ms=T0 + 60_000))
    apply_all(
        st,
        [
            [commands.Claim("claim", T0, "n1", 1)],
            [
                commands.Submit(
                    "s",
                    T0,
                    (("now", JobSpec(task="t")), ("soon", later), ("paused", later), ("q", later)),
                )
            ],
            [commands.UpdateJob("u", T0, "paused", paused=True)],
            [commands.Fire("f", T0, 1, (f"now@{T0}",))],
        ],
    )
    async with reading(st) as reader:
        assert await reader.due_not_leased(T0) == (1, 0)  # "now" is queued; the rest are later
        # a minute on, nothing fired them: soon and q are overdue, the paused job's run is not
        assert await reader.due_not_leased(T0 + 60_000) == (1, 2)


def sorted_jobs(path: Path) -> SqlState:
    """Jobs s0..s7: one-off jobs at scattered times (s0..s3; s2 cancelled before it ran), a
    recurring job that fired twice (s4), one whose schedule is over (s5: never ran), and two
    whose only runs fired at once (s6, s7: the same times, ties)."""
    st = SqlState(path)

    def at(ms: int) -> JobSpec:
        return JobSpec(task="t", schedule=Schedule(kind=ScheduleKind.AT, at_ms=ms))

    over = JobSpec(
        task="u",
        schedule=Schedule(
            kind=ScheduleKind.EVERY, every_ms=1_000, options=RecurringOptions(end_at_ms=T0 - 1)
        ),
    )
    specs = (
        ("s0", at(T0 + 50_000)),
        ("s1", at(T0 + 10_000)),
        ("s2", at(T0 + 30_000)),
        ("s3", at(T0 + 20_000)),
        ("s4", EVERY),
        ("s5", over),
        ("s6", at(T0 + 5_000)),
        ("s7", at(T0 + 5_000)),
    )
    apply_all(st, [[commands.Claim("claim", T0, "n1", 1)], [commands.Submit("s", T0, specs)]])
    apply_all(st, [[commands.CancelJob("c", T0 + 1, "s2")]])
    fires = (f"s4@{T0 + 1_000}", f"s6@{T0 + 5_000}", f"s7@{T0 + 5_000}")
    apply_all(st, [[commands.Fire("f1", T0 + 5_000, 1, fires)]])
    apply_all(st, [[commands.Fire("f2", T0 + 6_000, 1, (f"s4@{T0 + 2_000}",))]])
    return st


def expected_order(st: SqlState, sort: JobSort, desc: bool, keep: object = None) -> list[str]:
    """The ids of ``st``'s jobs in ``sort`` (ties by when added), from the state's own view."""
    ids = [j for j in st.jobs if keep is None or keep(st.jobs[j])]  # type: ignore[operator]
    never = 1 << 62

    def key(job_id: str) -> tuple[int, int]:
        seq = int(job_id[1:])
        job = st.jobs[job_id]
        if sort is JobSort.NEXT_FIRE:
            return (never if job.next_run_at_ms is None else job.next_run_at_ms, seq)
        if sort is JobSort.LATEST_RUN:
            run = st.latest_run(job_id)
            return (0 if run is None else run.scheduled_ms, seq)
        return (seq, seq)

    return sorted(ids, key=key, reverse=desc)


@pytest.mark.parametrize("sort", list(JobSort))
@pytest.mark.parametrize("desc", [None, False, True])
async def test_every_sort_pages_through_every_job_once_in_its_order(
    tmp_path: Path, sort: JobSort, desc: bool | None
) -> None:
    st = sorted_jobs(tmp_path / "state.db")
    order = JobOrder(sort, desc)
    want = expected_order(st, sort, order.desc)
    async with reading(st) as reader:
        whole, end = await reader.jobs_page(100, {}, order)
        assert [j.id for j in whole] == want and end is None
        got: list[str] = []
        cursor: JobKey | None = None
        for _ in range(10):
            page, after = await reader.jobs_page(3, {}, order, cursor)
            got += [j.id for j in page]
            if after is None:
                break
            cursor = order.parse_cursor(after)
            assert cursor is not None, after
        assert got == want


def test_the_default_orders_are_newest_first_soonest_first_and_latest_run_first(
    tmp_path: Path,
) -> None:
    st = sorted_jobs(tmp_path / "state.db")
    try:
        assert expected_order(st, JobSort.CREATED, JobOrder().desc)[0] == "s7"
        # s4's next fire (T0+3s) is soonest; s6 and s7 (due at T0+5s, not finished) in the
        # order they were added; jobs without a next fire (cancelled, over) last
        nexts = expected_order(st, JobSort.NEXT_FIRE, JobOrder(JobSort.NEXT_FIRE).desc)
        assert nexts == ["s4", "s6", "s7", "s1", "s3", "s0", "s2", "s5"], nexts
        # the latest run created last: s0's at T0+50s; s5 never ran: last
        latest = expected_order(st, JobSort.LATEST_RUN, JobOrder(JobSort.LATEST_RUN).desc)
        assert latest[0] == "s0" and latest[-1] == "s5", latest
    finally:
        st.close()


@pytest.mark.parametrize("sort", [JobSort.NEXT_FIRE, JobSort.LATEST_RUN])
async def test_a_sorted_listing_with_a_filter_reads_a_window_and_still_finds_every_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sort: JobSort
) -> None:
    st = sorted_jobs(tmp_path / "state.db")
    order = JobOrder(sort)
    want = expected_order(st, sort, order.desc, lambda j: j.status.value == "active")
    async with reading(st) as reader:
        monkeypatch.setattr("schedd.storage.reader.SCAN_WINDOW", 2)
        got: list[str] = []
        sizes: list[int] = []
        cursor: JobKey | None = None
        for _ in range(20):
            page, after = await reader.jobs_page(10, {"status": "active"}, order, cursor)
            got += [j.id for j in page]
            sizes.append(len(page))
            if after is None:
                break
            cursor = order.parse_cursor(after)
        assert got == want
        assert len(sizes) == 4 and max(sizes) <= 2, sizes  # 8 jobs, 2 read per page
        # a narrow filter is not windowed: one page
        page, after = await reader.jobs_page(10, {"id_prefix": "s", "status": "active"}, order)
        assert [j.id for j in page] == want and after is None


def test_a_cursor_of_another_sort_is_not_taken() -> None:
    assert JobOrder().parse_cursor("12") == (12,)
    assert JobOrder().parse_cursor("12.3") is None
    assert JobOrder(JobSort.NEXT_FIRE).parse_cursor("12") is None
    assert JobOrder(JobSort.NEXT_FIRE).parse_cursor("1800000000000.3") == (T0, 3)
    for bad in ("", "-1", "1.2.3", "x", "1." + "9" * 20, "\uff11.\uff12"):
        assert JobOrder(JobSort.LATEST_RUN).parse_cursor(bad) is None


def test_a_new_run_after_its_jobs_row_was_written_still_moves_the_jobs_latest_run(
    tmp_path: Path,
) -> None:
    # within one entry a job's row can be written (a read of the jobs table flushes it) before
    # its new run is made: the run's time must still reach jobs.last_ms, by a statement of
    # its own, or the job would sort by a run that is no longer its latest
    st = sorted_jobs(tmp_path / "state.db")
    try:
        job = st.jobs["s1"]
        before = st.latest_run("s1")
        assert before is not None
        later = dataclasses.replace(
            before, id=f"s1@{T0 + 90_000}", scheduled_ms=T0 + 90_000, due_ms=T0 + 90_000
        )
        st.begin()
        st.put_job(dataclasses.replace(job, updated_ms=T0 + 7))
        st._flush()  # the row written, as a read of the jobs table would
        st.add_run(later)
        st.commit()
        sql = "SELECT last_ms FROM jobs WHERE id = 's1'"
        assert st.db.execute(sql).fetchone() == (T0 + 90_000,)
        assert st._latest_sched == {}
    finally:
        st.close()


async def test_a_connection_that_reads_the_file_mid_install_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot installed by the Raft thread (through SQLite's backup) while the API's
    connections open can make one read the file mid-copy: it is opened again, a while; a file
    damaged for good still fails the open."""
    from schedd.storage import reader as reader_mod

    SqlState(tmp_path / "state.db").close()
    monkeypatch.setattr(reader_mod, "CONNECT_RETRY_S", 0.0)
    reader = Reader(tmp_path / "state.db")
    real = reader._connect_once
    failures = [sqlite3.DatabaseError("database disk image is malformed")] * 2

    async def flaky() -> list[aiosqlite.Connection]:
        if failures:
            raise failures.pop()
        return await real()

    monkeypatch.setattr(reader, "_connect_once", flaky)
    await reader.open()
    assert not failures  # opened on the third try
    await reader.close()

    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"SQLite format 3\0" + b"\xff" * 8192)
    with pytest.raises(sqlite3.DatabaseError):
        await Reader(damaged).open()
