"""The replicated state in the node's SQLite database: :class:`SqlState`.

The core decides (``schedd.core``); this keeps what it decided.  :class:`SqlState` answers
every question of :class:`schedd.core.state.State` from the database, with the records it
needs most in memory, and keeps each change the core makes inside the transaction of the Raft
entries being applied (:func:`apply_entry`; the node keeps one open across ticks for up to
0.1 s, and commits it before a client's command is answered, see ``schedd.raft.node``): their
changes and the last one's index commit together, so a node that stops anywhere restarts at a
whole entry and replays the journal after it.  A record changed several times before the
commit is written once.  An entry at or below the applied index is
skipped: replaying is idempotent.

What is in RAM: the hot set, and a bounded cache.  A run queued for a worker or running, and a
run waiting for a time within the hot window (``hot_ms`` after the latest command's time, or
loaded by the leader's window), is kept decoded for as long as it is so, with its job: those
are the runs every fire, lease and result touches, and a burst of them must not go to disk
and back for each step.  Any other record read or written passes through a cache of at most
``cache_max`` of each (the oldest goes first).  Within an entry's transaction the rows it
changed are written at its end (or before the first query that reads their table), in one
statement per table: a job is added and then changed twice by the same submit, and a
fire or lease of thousands of runs is one ``executemany``.

Any SQLite error while applying is not a result: it could differ between nodes (a full disk, a
damaged file), so it is raised as :class:`StorageFailure`, a ``BaseException`` that the core's
"every exception becomes a rejected command" net does not catch, and the node stops.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from schedd.core import apply as core_apply
from schedd.core.allowances import EMPTY as EMPTY_LEDGER
from schedd.core.allowances import CapsLedger
from schedd.core.commands import Command
from schedd.core.members import Membership
from schedd.core.model import Job, JobSpec, Run
from schedd.core.state import (
    DEDUP_WINDOW_MS,
    DEFAULT_HISTORY_KEEP,
    HOT_WINDOW_MS,
    LIVE_STATES,
    RECURRING_KINDS,
    WAITING_STATES,
    LeaderEvent,
    Result,
    State,
)
from schedd.storage.checkpointer import Checkpointer
from schedd.storage.codec import (
    CorruptRow,
    job_body,
    job_from_body,
    result_body,
    result_from_body,
    run_body,
    run_from_body,
    spec_json,
    split_run_id,
)
from schedd.storage.schema import (
    DLQ_BEFORE,
    FINISHED,
    FIRST,
    JOB_BODY,
    LATEST_RUN,
    NO_NEXT,
    RUN_BODY,
    RUNS_OF_JOB_BEFORE,
    STATE_CODES,
    migrate,
    open_database,
)

CACHE_MAX = 10_000  # decoded jobs (and as many runs) kept in front of the database (~13 MB)
HOT_MS = HOT_WINDOW_MS  # the hot window's default (scheduler.hot_window)
_META = (
    "applied_index",
    "leader_fence",
    "leader_node",
    "leader_http",
    "leader_term",
    "runs_created",
    "jobs_added",
    "runs_kept",
    "jobs_kept",
    "history_keep",
    "stamp",
)


class StorageFailure(BaseException):  # it stops the node, like SystemExit
    """The database failed under ``apply``: the node must stop (see the module docstring)."""


class _Jobs(MutableMapping[str, Job]):
    """``state.jobs``: jobs by id, iterated in the order they were added."""

    __slots__ = ("_st",)

    def __init__(self, st: SqlState) -> None:
        self._st = st

    def get(self, key: str, default: None = None) -> Job | None:  # type: ignore[override]
        st = self._st
        job = st._job_in_memory(key)
        if job is None:
            row = st._one(JOB_BODY, (key,))
            if row is None:
                return None
            job = st._decode(key, row[0])
            st._keep_job(job)
        return job

    def __getitem__(self, key: str) -> Job:
        job = self.get(key)
        if job is None:
            raise KeyError(key)
        return job

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def __len__(self) -> int:
        return self._st.jobs_kept

    def __iter__(self) -> Iterator[str]:
        self._st._flush(runs=False)
        for (job_id,) in self._st._all("SELECT id FROM jobs ORDER BY seq"):
            yield str(job_id)

    def __delitem__(self, key: str) -> None:
        raise TypeError("jobs are not deleted one by one")

    def __setitem__(self, key: str, job: Job) -> None:
        st = self._st
        st._job_writes[key] = job  # (_write checks that it is in the database)
        st._keep_job(job)


class _Runs(Mapping[str, Run]):
    """``state.runs``: runs by id, iterated in creation order."""

    __slots__ = ("_st",)

    def __init__(self, st: SqlState) -> None:
        self._st = st

    def get(self, key: str, default: None = None) -> Run | None:  # type: ignore[override]
        st = self._st
        run = st._run_in_memory(key)
        if run is None:
            parts = split_run_id(key)
            if parts is None or parts[0] in st._job_inserts:  # a job new in this entry has
                return None  # no run but those written in it
            row = st._one(RUN_BODY, (parts[1], parts[0]))
            if row is None:
                return None
            run = st._decode_run(parts[0], parts[1], row[0])
        return run

    def __getitem__(self, key: str) -> Run:
        run = self.get(key)
        if run is None:
            raise KeyError(key)
        return run

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def __len__(self) -> int:
        return self._st.runs_kept

    def __iter__(self) -> Iterator[str]:
        self._st._flush(jobs=False)
        for job_id, sched_ms in self._st._all("SELECT job_id, sched_ms FROM runs ORDER BY seq"):
            yield f"{job_id}@{sched_ms}"


class SqlState(State):
    """The state in a SQLite database (a file, or ``":memory:"``)."""

    def __init__(
        self, path: Path | str = ":memory:", *, cache_max: int = CACHE_MAX, hot_ms: int = HOT_MS
    ) -> None:
        try:
            self.db = open_database(path)
        except sqlite3.Error as exc:
            raise StorageFailure(f"{path}: {exc}") from exc
        self.path = path
        self.cache_max = cache_max
        self.hot_ms = hot_ms
        self.checkpointer = None if str(path) == ":memory:" else Checkpointer(path)
        self.jobs = _Jobs(self)
        self.runs = _Runs(self)
        #: called with the committed index after each commit (the event feed releases what
        #: reads now see)
        self.on_commit: Callable[[int], None] | None = None
        self.stamped = False  # (the state's docstring)
        self._load()

    def _load(self) -> None:
        """Read what is kept in memory beside the database (and forget the caches)."""
        self._job_cache: OrderedDict[str, Job] = OrderedDict()
        self._run_cache: OrderedDict[str, Run] = OrderedDict()
        self._hot_runs: dict[str, Run] = {}  # the hot set (module docstring)
        self._hot_jobs: dict[str, Job] = {}  # their jobs, once read
        self._hot_refs: dict[str, int] = {}  # job id -> its runs in the hot set
        self._now = 0  # the latest time a stored run was changed at: the hot window's start
        # written in this entry, not yet in the database (_flush): new rows with their seq
        self._job_writes: dict[str, Job] = {}
        self._job_inserts: dict[str, int] = {}
        self._run_writes: dict[str, Run] = {}
        self._run_inserts: dict[str, int] = {}
        # job id -> how many runs it has in the database and its rows there that are
        # unfinished (seq, sched_ms, body), read once until the pending rows are written
        self._on_disk: dict[str, tuple[int, list[tuple[int, int, bytes]]]] = {}
        self._new_runs_of: dict[str, list[str]] = {}  # job id -> its runs in _run_inserts
        #: job id -> the scheduled time of its run created last in this entry (``jobs.last_ms``
        #: to write with the job's row, or alone if that was written before the run was made)
        self._latest_sched: dict[str, int] = {}
        self._reopened: set[str] = set()  # jobs with a pending run that was finished on disk
        # job id -> (its spec, encoded): kept for the jobs in the hot set, and until the commit
        # for those encoded in this transaction (a job row or a remembered result)
        self._specs: dict[str, tuple[JobSpec, orjson.Fragment]] = {}
        self._specs_new: list[str] = []
        self.applied_index = 0
        self.leader_fence = 0
        self.leader_node = ""
        self.leader_http = ""
        self.leader_term = 0
        self.runs_created = 0
        self.jobs_added = 0
        self.runs_kept = 0  # runs in the database (created less forgotten)
        self.jobs_kept = 0
        self.history_keep = DEFAULT_HISTORY_KEEP
        self.stamp = 0
        for key, value in self._all("SELECT key, value FROM meta"):
            if key in _META:
                setattr(self, key, value)
        #: the applied index other connections (the API's readers, a snapshot copy) see
        self.committed_index = self.applied_index
        self.committed_stamp = self.stamp
        #: a command whose answer may be read back was applied (see make_visible): the node
        #: commits it before answering the caller that waits for it, if there is one here
        self.visible_now = False
        self._meta_written = {key: getattr(self, key) for key in _META}
        claims = self._one("SELECT value FROM meta WHERE key = 'leader_claims'", ())
        self.leader_claims: tuple[tuple[int, str, int, int], ...] = (
            () if claims is None else tuple(tuple(c) for c in orjson.loads(claims[0]))
        )
        self._claims_written = self.leader_claims
        members = self._one("SELECT value FROM meta WHERE key = 'members'", ())
        self.members: Membership | None = (
            None if members is None else Membership.from_json(orjson.loads(members[0]))
        )
        self._members_written = self.members
        caps = self._one("SELECT value FROM meta WHERE key = 'caps'", ())
        self.caps = EMPTY_LEDGER if caps is None else CapsLedger.from_json(orjson.loads(caps[0]))
        self._caps_written = self.caps
        self.counts = {key: int(value) for key, value in self._all("SELECT key, value FROM counts")}
        self._counts_written = dict(self.counts)
        self._dlq_size = int(self._one("SELECT count(*) FROM dlq", ())[0])
        #: request ids remembered in the open transaction (rid -> (now, result body)), and the
        #: latest now remembered (the dedup window's end)
        self._recent_new: dict[str, tuple[int, bytes]] = {}
        self._recent_latest = int(self._one("SELECT max(at_ms) FROM recent", ())[0] or 0)
        # whether the deps table may have a row: most clusters have no dependencies, and every
        # result asks for the job's dependants
        self._any_deps = self._one("SELECT 1 FROM deps LIMIT 1", ()) is not None
        self.live_runs()  # into the hot set

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
        self.db.close()

    def reopen(self, replace: Callable[[], object] | None = None) -> None:
        """Close the database, call ``replace`` (which puts another file in its place: an
        installed snapshot), and open it again.  What was applied and not committed is
        committed first."""
        if self.in_transaction:
            self.commit()
        self.close()
        if replace is not None:
            replace()
        try:
            self.db = open_database(self.path)
        except sqlite3.Error as exc:
            raise StorageFailure(f"{self.path}: {exc}") from exc
        self.checkpointer = None if str(self.path) == ":memory:" else Checkpointer(self.path)
        self._load()

    def install(self, snapshot: Path) -> None:
        """Replace the whole content with the snapshot's (a node that fell behind).  One write
        transaction through SQLite's backup: a crash leaves the old content or the new, and
        other connections (API readers) see the new content from their next read on."""
        if self.in_transaction:  # the entries applied before it, not yet committed
            self.commit()
        try:
            src = sqlite3.connect(f"file:{snapshot}?mode=ro", uri=True)
            try:
                src.backup(self.db)
            finally:
                src.close()
            self.db.execute("DROP TABLE IF EXISTS snapshot")  # its Raft data: not state
            migrate(self.db, self.path)  # a snapshot from a node of an older version
        except sqlite3.Error as exc:
            raise StorageFailure(
                f"{self.path}: cannot install the snapshot {snapshot}: {exc}"
            ) from exc
        self._load()

    # -- SQL, failing the node on any error ----------------------------------------------
    def _x(
        self, sql: str, params: Sequence[Any], fetch: Callable[[sqlite3.Cursor], Any] | None = None
    ) -> Any:
        """Run ``sql`` (and ``fetch`` its rows); any SQLite error is a StorageFailure."""
        try:
            cur = self.db.execute(sql, params)
            return cur if fetch is None else fetch(cur)
        except sqlite3.Error as exc:
            raise StorageFailure(f"{self.path}: {exc} (in {sql.split()[0]})") from exc

    def _one(self, sql: str, params: Sequence[Any]) -> Any:
        return self._x(sql, params, sqlite3.Cursor.fetchone)

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._x(sql, params, sqlite3.Cursor.fetchall)  # type: ignore[no-any-return]

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """Run ``sql`` for each of ``rows``: how many rows it changed."""
        try:
            return self.db.executemany(sql, rows).rowcount
        except sqlite3.Error as exc:
            raise StorageFailure(f"{self.path}: {exc} (in {sql.split()[0]})") from exc

    def _decode(self, job_id: str, body: bytes) -> Job:
        try:
            return job_from_body(job_id, body)
        except CorruptRow as exc:
            raise StorageFailure(f"{self.path}: {exc}") from exc

    def _decode_run(self, job_id: str, sched_ms: int, body: bytes) -> Run:
        try:
            run = run_from_body(job_id, sched_ms, body)
        except CorruptRow as exc:
            raise StorageFailure(f"{self.path}: {exc}") from exc
        self._keep_run(run)
        return run

    # -- what stays in RAM ---------------------------------------------------------------
    def _keep_job(self, job: Job) -> None:
        if job.id in self._hot_refs:
            self._hot_jobs[job.id] = job
        else:
            _cache(self._job_cache, job.id, job, self.cache_max)

    def _keep_run(self, run: Run, *, hot: bool = False) -> None:
        """Hold ``run`` in the hot set while it is hot (or ``hot``: the leader loaded it), else
        in the cache."""
        rid = run.id
        state = run.state
        if (
            state in LIVE_STATES
            or hot
            or (state in WAITING_STATES and run.due_ms < self._now + self.hot_ms)
        ):
            if rid not in self._hot_runs:
                refs = self._hot_refs
                refs[run.job_id] = refs.get(run.job_id, 0) + 1
                self._run_cache.pop(rid, None)
            self._hot_runs[rid] = run
            return
        self._cool(rid, run.job_id)
        _cache(self._run_cache, rid, run, self.cache_max)

    def _cool(self, rid: str, job_id: str) -> None:
        """Take run ``rid`` out of the hot set (if it is there), and its job once it has no
        other run there."""
        if self._hot_runs.pop(rid, None) is None:
            return
        left = self._hot_refs[job_id] - 1
        if left:
            self._hot_refs[job_id] = left
            return
        del self._hot_refs[job_id]
        if job_id in self._specs:  # kept to the commit: the job often changes once more
            self._specs_new.append(job_id)
        job = self._hot_jobs.pop(job_id, None)
        if job is not None:
            _cache(self._job_cache, job_id, job, self.cache_max)

    def _spec_of(self, job: Job) -> orjson.Fragment:
        """``job``'s spec encoded (:func:`schedd.storage.codec.spec_json`), once while the job
        is hot or within one transaction."""
        hit = self._specs.get(job.id)
        if hit is not None and hit[0] is job.spec:
            return hit[1]
        encoded = spec_json(job.spec)
        self._specs[job.id] = (job.spec, encoded)
        self._specs_new.append(job.id)
        return encoded

    def hot_set(self) -> int:
        """How many runs the hot set holds."""
        return len(self._hot_runs)

    def _job_in_memory(self, job_id: str) -> Job | None:
        """The job as this entry left it, if it is in memory (else it is read from disk)."""
        return (
            self._job_writes.get(job_id)
            or self._hot_jobs.get(job_id)
            or self._job_cache.get(job_id)
        )

    def _run_in_memory(self, rid: str) -> Run | None:
        return self._run_writes.get(rid) or self._hot_runs.get(rid) or self._run_cache.get(rid)

    def _row_run(self, job_id: str, sched_ms: int, body: bytes) -> Run:
        """The run of a row read from disk: as it is in memory, if it is (a pending change is
        newer than the row), else decoded."""
        return self._run_in_memory(f"{job_id}@{sched_ms}") or self._decode_run(
            job_id, sched_ms, body
        )

    def _runs(self, sql: str, params: Sequence[Any], *, hot: bool = False) -> list[Run]:
        """Runs from rows of ``(job_id, sched_ms, body)`` (the pending rows written first);
        ``hot``: the leader's window, held in the hot set."""
        self._flush(jobs=False)
        out = [self._row_run(*row) for row in self._all(sql, params)]
        if hot:
            for run in out:
                if run.id not in self._hot_runs:
                    self._keep_run(run, hot=True)
        return out

    def _flush(self, *, jobs: bool = True, runs: bool = True) -> None:
        """Write the rows changed in this entry (before a query reads their table)."""
        if jobs and self._job_writes:
            self._write(
                self._job_writes, self._job_inserts, self._job_row, _JOB_INSERT, _JOB_UPDATE
            )
        if jobs and self._latest_sched:  # a new run of a job whose row was written before it
            self._many(_JOB_LATEST, [(ms, job_id) for job_id, ms in self._latest_sched.items()])
            self._latest_sched.clear()
        if runs and self._run_writes:
            self._write(self._run_writes, self._run_inserts, _run_row, _RUN_INSERT, _RUN_UPDATE)
            self._new_runs_of.clear()
            self._reopened.clear()
            self._on_disk.clear()

    def _write(
        self,
        writes: dict[str, Any],
        inserts: dict[str, int],
        row_of: Callable[[Any], tuple[Any, ...]],
        insert: str,
        update: str,
    ) -> None:
        """Insert (with their seq) or update the rows of ``writes``, one statement each, and
        forget them.  An update of a row that is not there is a damaged database."""
        new, changed = [], []
        for key, record in writes.items():
            seq = inserts.get(key)
            if seq is None:
                changed.append(row_of(record))
            else:
                new.append((*row_of(record), seq))
        writes.clear()
        inserts.clear()
        if new:
            self._many(insert, new)
        if changed and (done := self._many(update, changed)) != len(changed):
            raise StorageFailure(
                f"{self.path}: {len(changed) - done} of the {len(changed)} rows "
                f"this entry changed in {update.split()[1]} are not there"
            )

    # -- transactions --------------------------------------------------------------------
    @property
    def in_transaction(self) -> bool:
        return self.db.in_transaction

    def begin(self) -> None:
        self._x("BEGIN IMMEDIATE", ())

    def commit(self) -> None:
        self._flush()
        self._write_recent()
        self._on_disk.clear()
        for job_id in self._specs_new:  # the encodings of this transaction's jobs not hot
            if job_id not in self._hot_refs:
                self._specs.pop(job_id, None)
        self._specs_new.clear()
        meta = [
            (key, getattr(self, key))
            for key in _META
            if getattr(self, key) != self._meta_written[key]
        ]
        if meta:
            self._many("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", meta)
            self._meta_written.update(meta)
        if self.leader_claims is not self._claims_written:
            self._x(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('leader_claims', ?)",
                (orjson.dumps(self.leader_claims).decode(),),
            )
            self._claims_written = self.leader_claims
        if self.members is not self._members_written and self.members is not None:
            self._x(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('members', ?)",
                (orjson.dumps(self.members.to_json()).decode(),),
            )
            self._members_written = self.members
        if self.caps is not self._caps_written:
            self._x(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('caps', ?)",
                (orjson.dumps(self.caps.to_json()).decode(),),
            )
            self._caps_written = self.caps
        counts = [(k, v) for k, v in self.counts.items() if self._counts_written.get(k) != v]
        if counts:
            self._many("INSERT OR REPLACE INTO counts (key, value) VALUES (?, ?)", counts)
            self._counts_written.update(counts)
        self._x("COMMIT", ())
        self.committed_index = self.applied_index
        self.committed_stamp = self.stamp
        if self.on_commit is not None:
            self.on_commit(self.committed_position)

    @property
    def committed_position(self) -> int:
        """Where the API's reads are in the change feed: the committed stamp in a cluster of
        several shards, else the committed index."""
        return self.committed_stamp if self.stamped else self.committed_index

    def make_visible(self) -> None:
        self.visible_now = True

    # -- jobs ----------------------------------------------------------------------------
    def _add_job(self, job: Job) -> None:
        spec = job.spec
        seq = self.jobs_added
        self._job_writes[job.id] = job
        self._job_inserts[job.id] = seq
        self.jobs_added = seq + 1
        self.jobs_kept += 1
        for dep in spec.depends_on:
            self._x(
                "INSERT OR IGNORE INTO deps (upstream, seq, downstream) VALUES (?, ?, ?)",
                (dep, seq, job.id),
            )
            self._any_deps = True
        if spec.idempotency_key is not None:
            self._x(
                "INSERT OR REPLACE INTO idem (key, job_id) VALUES (?, ?)",
                (f"{spec.namespace}\0{spec.idempotency_key}", job.id),
            )
        self._keep_job(job)

    def job_by_key(self, namespace: str, key: str) -> str | None:
        row = self._one("SELECT job_id FROM idem WHERE key = ?", (f"{namespace}\0{key}",))
        return None if row is None else str(row[0])

    def dependants_of(self, job_id: str) -> Sequence[str]:
        if not self._any_deps:
            return []
        return [
            r[0]
            for r in self._all(
                "SELECT downstream FROM deps WHERE upstream = ? ORDER BY seq", (job_id,)
            )
        ]

    def active_recurring_jobs(self) -> Iterator[Job]:
        self._flush(runs=False)
        for job_id, body in self._all(
            "SELECT id, body FROM jobs INDEXED BY jobs_recurring "
            "WHERE recurring = 1 AND status = 'active' ORDER BY seq"
        ):
            yield self._job_in_memory(job_id) or self._decode(job_id, body)

    # -- runs ----------------------------------------------------------------------------
    def _store_run(self, old: Run | None, run: Run) -> None:
        rid = run.id
        job_id = run.job_id
        if old is None:
            self._run_inserts[rid] = self.runs_created
            self._new_runs_of.setdefault(job_id, []).append(rid)
            self._latest_sched[job_id] = run.scheduled_ms  # the job's latest run is this one
            self.runs_created += 1
            self.runs_kept += 1
        elif STATE_CODES[old.state] >= FINISHED > STATE_CODES[run.state]:
            self._reopened.add(job_id)  # see unfinished_runs
        self._run_writes[rid] = run
        if run.updated_ms > self._now:
            self._now = run.updated_ms
        self._keep_run(run)

    _COLS = "job_id, sched_ms, body"

    def _job_on_disk(self, job_id: str) -> tuple[int, list[tuple[int, int, bytes]]]:
        """How many runs the job has in the database, and its unfinished rows there (seq,
        sched_ms, body): one query, kept until the pending rows are written.  A result asks
        both (the history it keeps, whether its job is done) without writing what is pending
        first: a pending change of a run does not change how many runs the job has, and
        ``unfinished_runs`` reads each row's run as it is now."""
        got = self._on_disk.get(job_id)
        if got is None:
            count, rows = 0, []
            for sched_ms, body, seq in self._all(_JOB_ON_DISK, (job_id,)):
                if sched_ms is None:
                    count = seq
                else:
                    rows.append((seq, sched_ms, body))
            got = self._on_disk[job_id] = (count, rows)
        return got

    def unfinished_runs(self, job_id: str) -> list[Run]:
        # The job's unfinished rows in the database, each as it is now in this transaction,
        # and its new runs.  A run that was finished in the database and is not any more (a
        # replay) would be missed: then the pending rows are written first.
        if job_id in self._reopened:
            self._flush(jobs=False)
        found: list[tuple[int, Run]] = []
        for seq, sched_ms, body in self._job_on_disk(job_id)[1]:
            run = self._row_run(job_id, sched_ms, body)
            if STATE_CODES[run.state] < FINISHED:
                found.append((seq, run))
        for rid in self._new_runs_of.get(job_id, ()):
            run = self._run_writes[rid]
            if STATE_CODES[run.state] < FINISHED:
                found.append((self._run_inserts[rid], run))
        found.sort(key=lambda pair: pair[0])
        return [run for _, run in found]

    def has_unfinished(self, job_id: str) -> bool:
        return bool(self.unfinished_runs(job_id))

    def latest_run(self, job_id: str) -> Run | None:
        new = self._new_runs_of.get(job_id)
        if new:  # created since the last write: newer than every row of the job
            return self._run_writes[new[-1]]
        runs = self._runs(LATEST_RUN, (job_id,))
        return runs[0] if runs else None

    def latest_finished_run(self, job_id: str) -> Run | None:
        runs = self._runs(
            f"SELECT {self._COLS} FROM runs WHERE job_id = ? "
            f"AND state >= {FINISHED} ORDER BY seq DESC LIMIT 1",
            (job_id,),
        )
        return runs[0] if runs else None

    def runs_of(self, job_id: str) -> list[Run]:
        return self._runs(RUNS_OF_JOB_BEFORE, (job_id, FIRST, -1))

    def due_runs(self, start_ms: int, end_ms: int, limit: int | None = None) -> list[Run]:
        # the leader's next window: hot until they are done
        return self._runs(
            f"SELECT {self._COLS} FROM runs WHERE state IN (0, 4) "
            "AND due_ms >= ? AND due_ms < ? ORDER BY due_ms, seq LIMIT ?",
            (start_ms, end_ms, -1 if limit is None else limit),
            hot=True,
        )

    def live_runs(self) -> list[Run]:
        return self._runs(f"SELECT {self._COLS} FROM runs WHERE state IN (2, 3) ORDER BY seq", ())

    # -- history -------------------------------------------------------------------------
    def finished_runs_before(self, before_ms: int, limit: int) -> list[Run]:
        return self._runs(
            f"SELECT {self._COLS} FROM runs WHERE state >= {FINISHED} AND updated_ms < ? "
            "AND NOT EXISTS (SELECT 1 FROM dlq WHERE dlq.run_id = runs.job_id || '@' || "
            "runs.sched_ms) ORDER BY updated_ms, seq LIMIT ?",
            (before_ms, limit),
        )

    def finished_runs_beyond(self, job_id: str, keep: int) -> list[Run]:
        # Most jobs have fewer runs than are kept: counted without writing what is pending
        count = self._job_on_disk(job_id)[0]
        if count + len(self._new_runs_of.get(job_id, ())) <= keep:
            return []
        runs = self._runs(
            f"SELECT {self._COLS} FROM runs WHERE job_id = ? AND state >= {FINISHED} "
            "ORDER BY seq DESC LIMIT -1 OFFSET ?",
            (job_id, keep),
        )
        return [r for r in reversed(runs) if not self.in_dlq(r.id)]

    def forgettable_jobs(self, before_ms: int, limit: int) -> list[Job]:
        self._flush()
        rows = self._all(
            "SELECT id, body FROM jobs INDEXED BY jobs_finished "
            "WHERE status IN ('done', 'cancelled') AND updated_ms < ? "
            "AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.job_id = jobs.id) "
            "AND NOT EXISTS (SELECT 1 FROM deps WHERE deps.upstream = jobs.id) "
            "ORDER BY updated_ms, seq LIMIT ?",
            (before_ms, limit),
        )
        return [self._job_in_memory(job_id) or self._decode(job_id, body) for job_id, body in rows]

    def _delete_run(self, run: Run) -> None:
        self._flush(jobs=False)
        self._on_disk.pop(run.job_id, None)
        self._x(
            "DELETE FROM runs WHERE sched_ms = ? AND job_id = ?", (run.scheduled_ms, run.job_id)
        )
        self._cool(run.id, run.job_id)
        self._run_cache.pop(run.id, None)
        self.runs_kept -= 1

    def _delete_job(self, job: Job) -> None:
        spec = job.spec
        self._flush(runs=False)
        self._x("DELETE FROM jobs WHERE id = ?", (job.id,))
        for dep in spec.depends_on:
            self._x("DELETE FROM deps WHERE upstream = ? AND downstream = ?", (dep, job.id))
        if spec.idempotency_key is not None:  # its key, if it is under it (see MemoryState)
            self._x(
                "DELETE FROM idem WHERE key = ? AND job_id = ?",
                (f"{spec.namespace}\0{spec.idempotency_key}", job.id),
            )
        self._job_cache.pop(job.id, None)
        self._hot_jobs.pop(job.id, None)
        self._specs.pop(job.id, None)
        self.jobs_kept -= 1

    # -- dead-letter queue ---------------------------------------------------------------
    def _dlq_add(self, run_id: str) -> None:
        # seq: SQLite's next rowid, above every run in the queue (the order is all that counts)
        self._dlq_size += self._x(
            "INSERT OR IGNORE INTO dlq (run_id) VALUES (?)", (run_id,)
        ).rowcount

    def _dlq_remove(self, run_id: str) -> None:
        self._dlq_size -= self._x("DELETE FROM dlq WHERE run_id = ?", (run_id,)).rowcount

    def in_dlq(self, run_id: str) -> bool:
        return self._one("SELECT 1 FROM dlq WHERE run_id = ?", (run_id,)) is not None

    def dlq_size(self) -> int:
        return self._dlq_size

    def dlq_newest_first(self) -> Iterator[str]:
        for _, run_id in self._all(DLQ_BEFORE, (FIRST, -1)):
            yield str(run_id)

    # -- request ids ---------------------------------------------------------------------
    # One statement per command (the look-up): what a command remembers is written with the
    # transaction's other rows at its commit, and what fell out of the window is deleted then,
    # once.  A commit comes at another entry on each node, so a look-up skips what is out of
    # the window but not deleted yet: every node answers alike.
    def recall(self, rid: str) -> Result | None:
        pending = self._recent_new.get(rid)
        if pending is not None:
            body = pending[1]
        else:
            row = self._one(
                "SELECT result FROM recent WHERE rid = ? AND at_ms >= ?",
                (rid, self._recent_latest - DEDUP_WINDOW_MS),
            )
            if row is None:
                return None
            body = row[0]
        try:
            return result_from_body(rid, body)
        except CorruptRow as exc:
            raise StorageFailure(f"{self.path}: {exc}") from exc

    def remember(self, rid: str, now: int, result: Result) -> None:
        self._recent_new[rid] = (now, result_body(result, self._spec_of))
        if now > self._recent_latest:
            self._recent_latest = now

    def _write_recent(self) -> None:
        """Write the request ids this transaction remembered, and forget those out of the window."""
        if not self._recent_new:
            return
        rows = [(rid, at, body) for rid, (at, body) in self._recent_new.items()]
        self._recent_new.clear()
        self._many("INSERT OR REPLACE INTO recent (rid, at_ms, result) VALUES (?, ?, ?)", rows)
        self._x("DELETE FROM recent WHERE at_ms < ?", (self._recent_latest - DEDUP_WINDOW_MS,))

    def remembered(self) -> int:
        self._write_recent()
        return int(
            self._one(
                "SELECT count(*) FROM recent WHERE at_ms >= ?",
                (self._recent_latest - DEDUP_WINDOW_MS,),
            )[0]
        )

    # A job's and a run's row: the columns beside the body, then the key (then seq, when new)
    def _job_row(self, job: Job) -> tuple[Any, ...]:
        spec = job.spec
        return (
            spec.namespace,
            spec.queue,
            spec.task,
            spec.name,
            job.status.value,
            int(spec.schedule.kind in RECURRING_KINDS),
            job.updated_ms,
            NO_NEXT if job.next_run_at_ms is None else job.next_run_at_ms,
            self._latest_sched.pop(job.id, None),  # None: its latest run is as it was
            job_body(job, self._spec_of),
            job.id,
        )


def _run_row(run: Run) -> tuple[Any, ...]:
    return (
        STATE_CODES[run.state],
        run.due_ms,
        run.updated_ms,
        run_body(run),
        run.scheduled_ms,
        run.job_id,
    )


_JOB_INSERT = (
    "INSERT INTO jobs (namespace, queue, task, name, status, recurring, updated_ms, next_ms, "
    "last_ms, body, id, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, coalesce(?, 0), ?, ?, ?)"
)
_JOB_UPDATE = (
    "UPDATE jobs SET namespace = ?, queue = ?, task = ?, name = ?, status = ?, recurring = ?, "
    "updated_ms = ?, next_ms = ?, last_ms = coalesce(?, last_ms), body = ? WHERE id = ?"
)
_JOB_LATEST = "UPDATE jobs SET last_ms = ? WHERE id = ?"
_RUN_INSERT = (
    "INSERT INTO runs (state, due_ms, updated_ms, body, sched_ms, job_id, seq) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_RUN_UPDATE = (
    "UPDATE runs SET state = ?, due_ms = ?, updated_ms = ?, body = ? "
    "WHERE sched_ms = ? AND job_id = ?"
)


# A job's unfinished runs in the database, and (sched_ms NULL) how many runs it has there
_JOB_ON_DISK = (
    f"SELECT sched_ms, body, seq FROM runs WHERE job_id = ?1 AND state < {FINISHED} "
    "UNION ALL SELECT NULL, NULL, count(*) FROM runs WHERE job_id = ?1"
)


def _cache(cache: OrderedDict[str, Any], key: str, value: object, limit: int) -> None:
    """Put ``value`` last in ``cache``, making room by dropping the entry put there longest ago
    (an OrderedDict: a plain dict emptied from the front scans its dead slots to find the
    first live one)."""
    if cache.pop(key, None) is None and len(cache) >= limit:
        cache.popitem(last=False)
    cache[key] = value


def apply_entry(
    state: SqlState,
    blob: object,
    index: int,
    *,
    commit: bool = True,
    decoded: list[Command] | None = None,
) -> tuple[list[Result], list[LeaderEvent]] | None:
    """Apply the Raft entry at ``index`` in the open transaction (or a new one), committed
    with the index unless ``commit`` is false (the caller commits a batch of entries with the
    last one's index); None (nothing done) when the database already holds it.  Raises
    :class:`StorageFailure` (stop)."""
    if index <= state.applied_index:
        return None
    if not state.in_transaction:
        state.begin()
    out = core_apply.apply_entry(state, blob, index, decoded)
    if commit:
        state.commit()
    return out
