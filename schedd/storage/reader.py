"""Reads of the state database for the API: aiosqlite connections of their own.

The tick thread owns the writer connection (``SqlState``).  A client's command is committed
before it is answered on the leader and on the node that answers it, so a reader there sees
at least what that client was told; other changes show within ``LAZY_COMMIT_S``
(:mod:`schedd.raft.node`).  A reader
never takes the writer's lock and never runs SQL on the event loop: each aiosqlite connection
does its work in its own thread.  WAL readers never block the writer; a long read only keeps the
write-ahead log from being checkpointed while it lasts, so reads here are short (one record,
one page).  After a snapshot is installed into the database, readers see its content from their
next read on (the install is a write transaction like any other).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from schedd.core.model import Job, Run
from schedd.storage.codec import job_from_body, run_from_body, split_run_id
from schedd.storage.schema import (
    DLQ_BEFORE,
    JOB_BODY,
    LATEST_RUNS,
    PAGE_CACHE_KIB,
    RUN_BODY,
    RUNS_OF_JOB_BEFORE,
)

LATEST_CHUNK = 500  # job ids per query of latest_runs

#: the filters of a job listing, by the ``jobs`` column each one compares
JOB_FILTERS = ("namespace", "queue", "status", "task")


def jobs_page_sql(filters: Mapping[str, str]) -> str:
    """The query of a page of jobs (parameters: the first seq, each filter's value in
    JOB_FILTERS order, the page size).  With a status filter SQLite reads ``jobs_status``: the
    jobs of that status only."""
    where = "".join(f" AND {key} = ?" for key in JOB_FILTERS if key in filters)
    return f"SELECT seq, id, body FROM jobs WHERE seq >= ?{where} ORDER BY seq LIMIT ?"


class Reader:
    """A small pool of read-only connections to the node's database."""

    def __init__(self, path: Path, size: int = 2) -> None:
        self.path = path
        self.size = size
        self._idle: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()
        self._all: list[aiosqlite.Connection] = []
        self._wanted: dict[str, list[asyncio.Future[Run | None]]] = {}  # latest_run's callers
        self._fetching: set[asyncio.Task[dict[str, Run]]] = set()

    async def open(self) -> None:
        for _ in range(self.size):
            db = await aiosqlite.connect(
                f"file:{self.path}?mode=ro", uri=True, isolation_level=None
            )
            # A small cache each: the writer's is the big one, and pages are shared by the OS.
            await db.execute(f"PRAGMA cache_size = -{max(1024, PAGE_CACHE_KIB // 16)}")
            await db.execute("PRAGMA query_only = ON")
            self._all.append(db)
            self._idle.put_nowait(db)

    async def close(self) -> None:
        for db in self._all:
            await db.close()
        self._all.clear()

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[aiosqlite.Connection]:
        db = await self._idle.get()
        try:
            yield db
        finally:
            self._idle.put_nowait(db)

    async def _rows(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        async with self._conn() as db:
            return await _fetch(db, sql, params)

    # -- jobs ----------------------------------------------------------------------------
    async def job(self, job_id: str) -> Job | None:
        rows = await self._rows(JOB_BODY, (job_id,))
        return job_from_body(job_id, rows[0][0]) if rows else None

    async def jobs_page(
        self, cursor: int, limit: int, filters: Mapping[str, str]
    ) -> tuple[list[Job], int | None]:
        """Up to ``limit`` jobs matching ``filters`` (column = value) from position ``cursor`` on,
        in the order they were added; and the cursor of the next page (None: this is the last)."""
        params = (cursor, *(filters[key] for key in JOB_FILTERS if key in filters), limit)
        rows = await self._rows(jobs_page_sql(filters), params)
        jobs = [job_from_body(job_id, body) for _, job_id, body in rows]
        if len(rows) < limit:
            return jobs, None
        after = int(rows[-1][0]) + 1
        more = await self._rows("SELECT 1 FROM jobs WHERE seq >= ? LIMIT 1", (after,))
        return jobs, after if more else None

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

    async def runs_page(self, job_id: str, before: int, limit: int) -> tuple[list[Run], int | None]:
        """Up to ``limit`` of the job's runs scheduled before ``before`` (ms; ``schema.FIRST`` for
        the newest), newest first; and the cursor of the next page (None: this is the last)."""
        rows = await self._rows(RUNS_OF_JOB_BEFORE, (job_id, before, limit + 1))
        runs = [run_from_body(*row) for row in rows[:limit]]
        return runs, runs[-1].scheduled_ms if len(rows) > limit else None

    async def dead_letters_page(self, before: int, limit: int) -> tuple[list[Run], int | None]:
        """Up to ``limit`` runs of the dead-letter queue put there before position ``before``
        (``schema.FIRST`` for the newest), the last dead-lettered first; and the cursor of the next
        page (None: this is the last).  Two queries, whatever the page size."""
        async with self._conn() as db:
            rows = await _fetch(db, DLQ_BEFORE, (before, limit + 1))
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
        return runs, int(rows[limit - 1][0]) if len(rows) > limit else None


async def _fetch(db: aiosqlite.Connection, sql: str, params: tuple[Any, ...]) -> list[Any]:
    """All rows of one query, in one trip to the connection's thread (a cursor's execute,
    fetch and close would take three, each a wake-up of the event loop)."""
    return list(await db.execute_fetchall(sql, params))
