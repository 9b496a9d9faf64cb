"""Reads of the state database for the API: aiosqlite connections of their own.

The tick thread owns the writer connection (``SqlState``).  A client's command is committed
before it is answered on the leader and on the node that answers it, so a reader there sees
at least what that client was told; other changes show within ``LAZY_COMMIT_S``
(:mod:`schedd.raft.node`).  A reader
never takes the writer's lock and never runs SQL on the event loop: each aiosqlite connection
does its work in its own thread.  WAL readers never block the writer; a long read only keeps the
write-ahead log from being checkpointed while it lasts, so reads here are short (one record,
one page).  After a snapshot from the leader is installed (another file renamed over the
database), :meth:`Reader.reopen` opens connections to it, and the old ones are closed as their
reads end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from schedd.core.model import Job, JobSort, Run, RunState
from schedd.logs import log_event
from schedd.storage.codec import job_from_body, run_from_body, split_run_id
from schedd.storage.schema import (
    DLQ_BEFORE,
    FIRST,
    JOB_BODY,
    LATEST_RUNS,
    PAGE_CACHE_KIB,
    RUN_BODY,
    RUNS_OF_JOB_BEFORE,
    STATE_CODES,
)

LATEST_CHUNK = 500  # job ids per query of latest_runs

#: the filters of a job listing that compare a ``jobs`` column with a value
JOB_FILTERS = ("namespace", "queue", "status", "task", "name")
MAX_IDS = 200  # ids one page of jobs may name (GET /jobs?ids=...: about 5.4 KB of address)
#: at most this many jobs (or dead-lettered runs) are read for one page when a filter has no
#: index (the latest run's state, a dead-lettered run's task or time): a page may then hold
#: fewer items than asked, or none, and still have a next_cursor (the listing goes on from there)
SCAN_WINDOW = 10_000
#: a job's latest run's state code (``schema.STATE_CODES``), from ``runs_job`` alone
_LAST_RUN_STATE = (
    "(SELECT state FROM runs WHERE runs.job_id = jobs.id ORDER BY runs.seq DESC LIMIT 1)"
)

log = logging.getLogger(__name__)

CONNECT_TRIES = 10  # a connection that reads a damaged file is opened again ...
CONNECT_RETRY_S = 0.2  # ... this long after (a snapshot's install takes well under 2 s)


def id_prefix_bounds(prefix: str) -> tuple[str, str]:
    """The ids from ``lo`` (included) to ``hi`` (excluded) that start with ``prefix``."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


#: each order's column (besides ``seq``, which breaks ties) and its index
_SORTS: dict[JobSort, tuple[str | None, str]] = {
    JobSort.CREATED: (None, "jobs_order"),
    JobSort.NEXT_FIRE: ("next_ms", "jobs_next"),
    JobSort.LATEST_RUN: ("last_ms", "jobs_last"),
}
#: filters that name few jobs, through an index of their own: a sorted listing with one of
#: them sorts what they name instead of reading the order's index
_NARROW = ("name", "id_prefix", "ids")


JobKey = tuple[int, ...]  # a job's place in a listing's order: (seq,) or (column, seq)


@dataclass(frozen=True, slots=True)
class JobOrder:
    """A job listing's order: a sort, and its direction (None: the sort's own)."""

    sort: JobSort = JobSort.CREATED
    descending: bool | None = None  # None: the sort's default

    @property
    def desc(self) -> bool:
        return self.sort.descending if self.descending is None else self.descending

    @property
    def columns(self) -> tuple[str, ...]:
        column = _SORTS[self.sort][0]
        return ("seq",) if column is None else (column, "seq")

    def _key(self) -> str:
        cols = self.columns
        return cols[0] if len(cols) == 1 else f"({', '.join(cols)})"

    def _marks(self) -> str:
        return "?" if len(self.columns) == 1 else "(?, ?)"

    def bounded(self, filters: Mapping[str, str]) -> bool:
        """Whether a page reads at most :data:`SCAN_WINDOW` jobs in this order: with a filter
        on the latest run (no index has it), and, sorted by a time, with any filter but a
        narrow one (the order's index is read, and the filter checked on each job)."""
        if "last_run" in filters:
            return True
        if self.sort is JobSort.CREATED or any(k in filters for k in _NARROW):
            return False
        return any(k in filters for k in JOB_FILTERS)

    def page_sql(
        self, filters: Mapping[str, str], after: JobKey | None, upto: JobKey | None, limit: int
    ) -> tuple[str, tuple[Any, ...]]:
        """The query of up to ``limit`` jobs matching ``filters``, in this order, after the
        place ``after`` (None: from the first) and up to ``upto`` (included; None: no end)."""
        cols, key, marks = self.columns, self._key(), self._marks()
        where: list[str] = []
        params: list[Any] = []
        if after is not None:
            where.append(f"{key} {'<' if self.desc else '>'} {marks}")
            params += after
        if upto is not None:
            where.append(f"{key} {'>=' if self.desc else '<='} {marks}")
            params += upto
        for name in JOB_FILTERS:
            if name in filters:
                where.append(f"{name} = ?")
                params.append(filters[name])
        if "id_prefix" in filters:
            where.append("id >= ? AND id < ?")
            params += id_prefix_bounds(filters["id_prefix"])
        if "ids" in filters:  # a JSON array of ids: one parameter however many
            where.append("id IN (SELECT value FROM json_each(?))")
            params.append(json.dumps(filters["ids"].split(",")))
        if "last_run" in filters:
            where.append(f"{_LAST_RUN_STATE} = ?")
            params.append(STATE_CODES[RunState(filters["last_run"])])
        hint = ""
        if self.sort is not JobSort.CREATED and not any(k in filters for k in _NARROW):
            hint = f" INDEXED BY {_SORTS[self.sort][1]}"
        order = ", ".join(f"{c} DESC" if self.desc else c for c in cols)
        sql = (
            f"SELECT {', '.join(cols)}, id, body FROM jobs{hint}"
            f"{' WHERE ' + ' AND '.join(where) if where else ''} ORDER BY {order} LIMIT ?"
        )
        return sql, (*params, limit)

    def window_sql(self, after: JobKey | None) -> tuple[str, tuple[Any, ...]]:
        """The places of the :data:`SCAN_WINDOW`-th job after ``after`` in this order, and of
        the one after it (whether there is more), whatever the filters."""
        cols = self.columns
        where = f" WHERE {self._key()} {'<' if self.desc else '>'} {self._marks()}" if after else ""
        order = ", ".join(f"{c} DESC" if self.desc else c for c in cols)
        index = _SORTS[self.sort][1]
        return (
            f"SELECT {', '.join(cols)} FROM jobs INDEXED BY {index}{where} ORDER BY {order} "
            f"LIMIT 2 OFFSET {SCAN_WINDOW - 1}",
            tuple(after or ()),
        )

    def parse_cursor(self, raw: str) -> JobKey | None:
        """A previous page's ``next_cursor`` in this order (None: it is not one)."""
        parts = raw.split(".")
        if len(parts) != len(self.columns) or not all(
            p.isascii() and p.isdigit() and len(p) <= 19 for p in parts
        ):
            return None
        key = tuple(int(p) for p in parts)
        return key if all(k <= FIRST for k in key) else None


def cursor_text(key: JobKey) -> str:
    return ".".join(str(k) for k in key)


class Reader:
    """A small pool of read-only connections to the node's database."""

    def __init__(self, path: Path, size: int = 2) -> None:
        self.path = path
        self.size = size
        self._idle: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()
        self._all: list[aiosqlite.Connection] = []
        self._lent: set[aiosqlite.Connection] = set()  # in use by a read now
        self._retired: set[aiosqlite.Connection] = set()  # to close when given back (reopen)
        self._wanted: dict[str, list[asyncio.Future[Run | None]]] = {}  # latest_run's callers
        self._fetching: set[asyncio.Task[dict[str, Run]]] = set()

    async def _connect(self) -> list[aiosqlite.Connection]:
        """The connections, opened; tried again for a while when the file reads as damaged:
        a snapshot being installed by the Raft thread at that moment (a copy written by an
        older schedd, through SQLite's backup) can make a connection opened meanwhile read
        the file mid-copy.  A damaged file is still one after every try."""
        for attempt in range(CONNECT_TRIES):
            try:
                return await self._connect_once()
            except sqlite3.DatabaseError as exc:
                if attempt + 1 == CONNECT_TRIES:
                    raise
                log_event(
                    log,
                    "reader.connect_retry",
                    logging.WARNING,
                    path=str(self.path),
                    error=str(exc),
                )
                await asyncio.sleep(CONNECT_RETRY_S)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connect_once(self) -> list[aiosqlite.Connection]:
        out = []
        try:
            for _ in range(self.size):
                db = await aiosqlite.connect(
                    f"file:{self.path}?mode=ro", uri=True, isolation_level=None
                )
                out.append(db)
                # A small cache each: the writer's is the big one, pages are shared by the OS.
                await db.execute(f"PRAGMA cache_size = -{max(1024, PAGE_CACHE_KIB // 16)}")
                await db.execute("PRAGMA query_only = ON")
        except BaseException:
            for db in out:
                await db.close()
            raise
        return out

    async def open(self) -> None:
        for db in await self._connect():
            self._all.append(db)
            self._idle.put_nowait(db)

    async def reopen(self) -> None:
        """Open new connections to the database file (another file was renamed into its
        place: a snapshot installed) and close the old ones once they are done with."""
        fresh = await self._connect()
        old, self._all = self._all, fresh
        self._idle = asyncio.Queue()
        for db in fresh:
            self._idle.put_nowait(db)
        self._retired.update(old)
        for db in old:
            if db in self._lent:
                continue  # closed when it comes back
            self._retired.discard(db)
            await db.close()

    async def close(self) -> None:
        for db in self._all:
            await db.close()
        self._all.clear()

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[aiosqlite.Connection]:
        db = await self._idle.get()
        self._lent.add(db)
        try:
            yield db
        finally:
            self._lent.discard(db)
            if db in self._retired:
                self._retired.discard(db)
                await db.close()
            else:
                self._idle.put_nowait(db)

    async def _rows(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        async with self._conn() as db:
            return await _fetch(db, sql, params)

    # -- jobs ----------------------------------------------------------------------------
    async def job(self, job_id: str) -> Job | None:
        rows = await self._rows(JOB_BODY, (job_id,))
        return job_from_body(job_id, rows[0][0]) if rows else None

    async def jobs_by_id(self, job_ids: list[str]) -> dict[str, Job]:
        """The jobs of ``job_ids`` that exist, by id (one query: the ids are one parameter)."""
        if not job_ids:
            return {}
        rows = await self._rows(
            "SELECT id, body FROM jobs WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(job_ids),),
        )
        return {str(job_id): job_from_body(str(job_id), body) for job_id, body in rows}

    async def jobs_page(
        self,
        limit: int,
        filters: Mapping[str, str],
        order: JobOrder = JobOrder(),
        after: JobKey | None = None,
        places: list[str] | None = None,
    ) -> tuple[list[Job], str | None]:
        """Up to ``limit`` jobs matching ``filters`` (a ``jobs`` column = value, ``id_prefix``,
        ``ids``, ``last_run``: the state of the job's latest run) in ``order``, after the place
        ``after`` (a previous page's cursor; None: from the first); and the cursor of the next
        page (None: this is the last).  A bounded listing (:meth:`JobOrder.bounded`) reads at
        most :data:`SCAN_WINDOW` jobs: its page may be short, or empty, and still go on.
        ``places``: filled with each job's own cursor (a page that goes on after that job)."""
        async with self._conn() as db:
            upto: JobKey | None = None
            more = False
            if order.bounded(filters):
                edge = await _fetch(db, *order.window_sql(after))
                if edge:
                    upto, more = tuple(edge[0]), len(edge) > 1
            sql, params = order.page_sql(filters, after, upto, limit + 1)
            rows = await _fetch(db, sql, params)
        width = len(order.columns)
        jobs = [job_from_body(row[width], row[width + 1]) for row in rows[:limit]]
        if places is not None:
            places.extend(cursor_text(tuple(row[:width])) for row in rows[:limit])
        if len(rows) > limit:
            return jobs, cursor_text(tuple(rows[limit - 1][:width]))
        if more and upto is not None:  # the window was read to its end
            return jobs, cursor_text(upto)
        return jobs, None

    # -- runs ----------------------------------------------------------------------------
    async def run(self, run_id: str) -> Run | None:
        parts = split_run_id(run_id)
        if parts is None:
            return None
        rows = await self._rows(RUN_BODY, (parts[1], parts[0]))
        return run_from_body(parts[0], parts[1], rows[0][0]) if rows else None

    async def latest_run(self, job_id: str) -> Run | None:
        """The job's run created last.  Calls made in the same turn of the event loop share one
        query (:meth:`latest_runs`): concurrent requests for jobs (a dashboard or a script
        reading many) cost one trip to the connection's thread.  (A submit's answer carries its
        jobs' latest runs and does not ask.)"""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Run | None] = loop.create_future()
        self._wanted.setdefault(job_id, []).append(fut)
        if len(self._wanted) == 1:
            loop.call_soon(self._fetch_wanted)
        return await fut

    def _fetch_wanted(self) -> None:
        wanted, self._wanted = self._wanted, {}
        task = asyncio.ensure_future(self.latest_runs(list(wanted)))
        self._fetching.add(task)  # the loop keeps only a weak reference to a task

        def done(task: asyncio.Task[dict[str, Run]]) -> None:
            self._fetching.discard(task)
            exc = None if task.cancelled() else task.exception()
            for job_id, futures in wanted.items():
                for fut in futures:
                    if fut.done():
                        continue
                    if task.cancelled():
                        fut.cancel()
                    elif exc is not None:
                        fut.set_exception(exc)
                    else:
                        fut.set_result(task.result().get(job_id))

        task.add_done_callback(done)

    async def latest_runs(self, job_ids: list[str]) -> dict[str, Run]:
        """The run created last of each of ``job_ids`` that has one (a query per 500 jobs)."""
        out: dict[str, Run] = {}
        for start in range(0, len(job_ids), LATEST_CHUNK):
            chunk = job_ids[start : start + LATEST_CHUNK]
            marks = ", ".join("?" for _ in chunk)
            for row in await self._rows(LATEST_RUNS.format(marks), tuple(chunk)):
                out[row[0]] = run_from_body(*row)
        return out

    async def runs_page(
        self,
        job_id: str,
        before: int,
        limit: int,
        state: RunState | None = None,
        since_ms: int | None = None,
    ) -> tuple[list[Run], int | None]:
        """Up to ``limit`` of the job's runs scheduled before ``before`` (ms; ``schema.FIRST`` for
        the newest), newest first, only those in ``state`` and scheduled at or after
        ``since_ms`` when given; and the cursor of the next page (None: this is the last)."""
        where, extra = "", []
        if state is not None:
            where, extra = " AND state = ?", [STATE_CODES[state]]
        if since_ms is not None:
            where, extra = f"{where} AND sched_ms >= ?", [*extra, since_ms]
        sql = RUNS_OF_JOB_BEFORE.replace(" ORDER BY", f"{where} ORDER BY")
        params = (job_id, before, *extra, limit + 1)
        rows = await self._rows(sql, params)
        runs = [run_from_body(*row) for row in rows[:limit]]
        return runs, runs[-1].scheduled_ms if len(rows) > limit else None

    async def dead_letters_page(
        self,
        before: int,
        limit: int,
        filters: Mapping[str, str | int] | None = None,
        places: list[int] | None = None,
    ) -> tuple[list[Run], int | None]:
        """Up to ``limit`` runs of the dead-letter queue put there before position ``before``
        (``schema.FIRST`` for the newest), the last dead-lettered first; and the cursor of the next
        page (None: this is the last).  Two queries, whatever the page size.

        ``filters``: the job's ``task``, ``queue``, ``namespace``, ``since`` (ms: failed at or
        after) and ``error`` (a text the run's error contains, either case).  With filters at
        most :data:`SCAN_WINDOW` positions are read for one page."""
        async with self._conn() as db:
            if filters:
                top = before
                if top >= FIRST:
                    top = int((await _fetch(db, "SELECT max(seq) FROM dlq", ()))[0][0] or 0) + 1
                low = top - SCAN_WINDOW
                rows = await _fetch(db, *dlq_filtered_sql(top, low, limit, filters))
                if "error" in filters:  # rows with each run's body, kept when its error has it
                    needle = str(filters["error"]).casefold()
                    kept = [r[:2] for r in rows if _error_has(r[4], r[2], r[3], needle)]
                    rows = kept[: limit + 1]
                if len(rows) > limit:
                    cursor: int | None = int(rows[limit - 1][0])
                else:  # the window was read to its end: the next page goes on below it
                    more = await _fetch(db, "SELECT 1 FROM dlq WHERE seq < ? LIMIT 1", (low,))
                    cursor = low if more else None
            else:
                rows = await _fetch(db, DLQ_BEFORE, (before, limit + 1))
                cursor = int(rows[limit - 1][0]) if len(rows) > limit else None
            keys = [
                parts for _, run_id in rows[:limit] if (parts := split_run_id(run_id)) is not None
            ]
            bodies: dict[tuple[str, int], bytes] = {}
            if keys:
                values = ", ".join("(?, ?)" for _ in keys)
                found = await _fetch(
                    db,
                    f"SELECT job_id, sched_ms, body FROM runs WHERE (sched_ms, job_id) IN "
                    f"(VALUES {values})",
                    tuple(x for job_id, ms in keys for x in (ms, job_id)),
                )
                bodies = {(job_id, ms): body for job_id, ms, body in found}
        runs = [
            run_from_body(job_id, ms, bodies[(job_id, ms)])
            for job_id, ms in keys
            if (job_id, ms) in bodies
        ]
        if places is not None:  # each run's own cursor: its position in the queue
            seqs = {run_id: int(seq) for seq, run_id, *_ in rows[:limit]}
            places.extend(seqs[run.id] for run in runs)
        return runs, cursor

    async def due_not_leased(self, now_ms: int) -> tuple[int, int]:
        """Runs due by ``now_ms`` and not leased: (queued for a worker, still waiting for a
        time already past: not fired yet, of a job that is not paused).  Two index reads."""
        queued, waiting = STATE_CODES[RunState.QUEUED], STATE_CODES[RunState.SCHEDULED]
        retrying = STATE_CODES[RunState.RETRYING]
        async with self._conn() as db:
            [(ready,)] = await _fetch(
                db,
                f"SELECT count(*) FROM runs INDEXED BY runs_live WHERE state IN ({queued}, "
                f"{STATE_CODES[RunState.RUNNING]}) AND state = {queued} AND due_ms <= ?",
                (now_ms,),
            )
            [(late,)] = await _fetch(
                db,
                f"SELECT count(*) FROM runs AS r INDEXED BY runs_due "
                f"JOIN jobs AS j ON j.id = r.job_id WHERE r.due_ms <= ? "
                f"AND r.state IN ({waiting}, {retrying}) AND j.status != 'paused'",
                (now_ms,),
            )
        return int(ready), int(late)

    async def dead_letters_matching(
        self, filters: Mapping[str, str | int], limit: int
    ) -> list[tuple[str, str]]:
        """(run id, task) of the runs of the dead-letter queue that match ``filters`` (those of
        :meth:`dead_letters_page`, and ``error``: a text the run's error contains, either
        case), the last dead-lettered first; at most ``limit`` of them (the caller asks for one
        more than it takes, to know there are more).  Read :data:`SCAN_WINDOW` positions of the
        queue per query, so no query is long."""
        where, params = _dlq_where(filters)
        needle = str(filters["error"]).casefold() if "error" in filters else None
        body = ", r.job_id, r.sched_ms, r.body" if needle is not None else ""
        sql = (
            f"SELECT d.seq, d.run_id, j.task{body} {_DLQ_FROM} "
            f"WHERE d.seq < ? AND d.seq >= ?{where} ORDER BY d.seq DESC"
        )
        out: list[tuple[str, str]] = []
        async with self._conn() as db:
            low_high = (await _fetch(db, "SELECT min(seq), max(seq) FROM dlq", ()))[0]
            if low_high[0] is None:
                return out
            bottom, top = int(low_high[0]), int(low_high[1]) + 1
            while top > bottom and len(out) < limit:
                low = top - SCAN_WINDOW
                for row in await _fetch(db, sql, (top, low, *params)):
                    if needle is None or _error_has(row[5], row[3], row[4], needle):
                        out.append((str(row[1]), str(row[2])))
                top = low
        return out[:limit]

    async def dead_letters_named(self, run_ids: list[str]) -> dict[str, str]:
        """The runs of ``run_ids`` that are in the dead-letter queue: run id -> its task."""
        out: dict[str, str] = {}
        async with self._conn() as db:
            for start in range(0, len(run_ids), LATEST_CHUNK):
                chunk = run_ids[start : start + LATEST_CHUNK]
                marks = ", ".join("?" for _ in chunk)
                sql = f"SELECT d.run_id, j.task {_DLQ_FROM} WHERE d.run_id IN ({marks})"
                for run_id, task in await _fetch(db, sql, tuple(chunk)):
                    out[str(run_id)] = str(task)
        return out


#: the dead-letter queue joined with each run and its job (a run id is ``<job_id>@<sched_ms>``)
_DLQ_FROM = (
    "FROM dlq AS d "
    "JOIN runs AS r ON r.sched_ms = CAST(substr(d.run_id, instr(d.run_id, '@') + 1) AS INTEGER) "
    "AND r.job_id = substr(d.run_id, 1, instr(d.run_id, '@') - 1) "
    "JOIN jobs AS j ON j.id = r.job_id"
)
_DLQ_JOINED = f"SELECT d.seq, d.run_id {_DLQ_FROM} WHERE d.seq < ?"
DLQ_FILTERS = ("task", "queue", "namespace")


def _dlq_where(filters: Mapping[str, str | int]) -> tuple[str, list[Any]]:
    """The conditions of ``filters`` on the joined queue (``error`` is not one: it is in the
    run's body)."""
    where = "".join(f" AND j.{key} = ?" for key in DLQ_FILTERS if key in filters)
    params: list[Any] = [filters[key] for key in DLQ_FILTERS if key in filters]
    if "since" in filters:
        where += " AND r.updated_ms >= ?"
        params.append(filters["since"])
    return where, params


def dlq_filtered_sql(
    top: int, low: int, limit: int, filters: Mapping[str, str | int]
) -> tuple[str, tuple[Any, ...]]:
    """A page of the dead-letter queue with filters, among the positions from ``low`` up to
    ``top`` (excluded).  With an ``error`` filter, every row of the window that the others
    match, with the run's job id, scheduled time and body: the error is in the body."""
    where, params = _dlq_where(filters)
    if "error" in filters:
        return (
            f"SELECT d.seq, d.run_id, r.job_id, r.sched_ms, r.body {_DLQ_FROM} "
            f"WHERE d.seq < ? AND d.seq >= ?{where} ORDER BY d.seq DESC",
            (top, low, *params),
        )
    return (
        f"{_DLQ_JOINED} AND d.seq >= ?{where} ORDER BY d.seq DESC LIMIT ?",
        (top, low, *params, limit + 1),
    )


def _error_has(body: bytes, job_id: str, sched_ms: int, needle: str) -> bool:
    error = run_from_body(job_id, sched_ms, body).error
    return error is not None and needle in error.casefold()


async def _fetch(db: aiosqlite.Connection, sql: str, params: tuple[Any, ...]) -> list[Any]:
    """All rows of one query, in one trip to the connection's thread (a cursor's execute,
    fetch and close would take three, each a wake-up of the event loop)."""
    return list(await db.execute_fetchall(sql, params))
