"""The node's SQLite database: schema, numbered migrations and the PRAGMAs, pinned here.

The schema version is SQLite's ``user_version``.  :func:`open_database` creates a new database
at :data:`SCHEMA_VERSION`, migrates an older one in place (each step in its own transaction) and
refuses one written by a newer schedd with :class:`NewerSchema`, which says what to do.

Determinism: every node applies the same log into its own database, and the fault suite
compares their logical content.  So no statement here or in :mod:`schedd.storage.sqlstate`
depends on anything but the commands: no ``random()``, no clock, every multi-row read that
decides something has a total ``ORDER BY``, and ``ANALYZE`` is never run (another plan could
give rows in another order where no order is asked for).

Layout (``WITHOUT ROWID`` tables, keyed for the way they are read):

* ``runs`` is keyed ``(sched_ms, job_id)`` -- a run's id is ``<job_id>@<sched_ms>`` -- so runs
  due together share pages.  ``seq`` numbers runs in creation order; ``state`` is the run
  state's small number (:data:`STATE_CODES`: the unfinished states below 5).  The partial
  index ``runs_due`` on ``(due_ms, state)`` is the timer store: what waits for its time, in
  time order, answered from the index alone (``state`` among its keys, or every row would be
  read again to check it); ``runs_live`` holds the queued and running runs, and
  ``runs_unfinished`` a job's unfinished runs.
* ``jobs`` is keyed by id; ``seq`` is the order jobs were added (the API's list order);
  ``jobs_status`` (version 2) lists the jobs of one status in that order, so that listing the
  few active jobs among millions done does not read them all.  The history purge and a new
  leader's look at the recurring jobs name their partial indexes (``INDEXED BY``): with
  ``jobs_status`` there, SQLite would otherwise pick it and read every job of the status.
  ``name`` (version 3) is the job's name, also in its body; ``jobs_name`` lists the named jobs
  by name, in the order they were added.  ``next_ms`` and ``last_ms`` (version 4) are the job's
  next fire time (:data:`NO_NEXT` when it has none) and the scheduled time of its latest run
  (the run created last; 0 before its first): ``jobs_next`` and ``jobs_last`` list the jobs in
  those orders, so a listing sorted by either reads one page of its index.
* ``deps`` (who depends on whom), ``idem`` (idempotency keys), ``dlq`` (the dead-letter queue,
  in order), ``recent`` (results by request id, for the dedup window), ``counts`` (metrics
  counters) and ``meta`` (applied index, leader fence, counters of the sequences).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from schedd.core.model import RunState

SCHEMA_VERSION = 4

#: run state -> the small number stored in ``runs.state`` (unfinished states are < 5)
STATE_CODES: dict[RunState, int] = {
    RunState.SCHEDULED: 0,
    RunState.BLOCKED: 1,
    RunState.QUEUED: 2,
    RunState.RUNNING: 3,
    RunState.RETRYING: 4,
    RunState.SUCCEEDED: 5,
    RunState.FAILED: 6,
    RunState.CANCELLED: 7,
    RunState.SKIPPED: 8,
}
FINISHED = 5  # runs.state >= FINISHED: a terminal state

# Reads that both the writer (SqlState) and the API's readers (Reader) make: one definition,
# so the two never disagree on what a job's latest run is or in what order runs come.
JOB_BODY = "SELECT body FROM jobs WHERE id = ?"
RUN_BODY = "SELECT body FROM runs WHERE sched_ms = ? AND job_id = ?"  # a run id, split
LATEST_RUN = "SELECT job_id, sched_ms, body FROM runs WHERE job_id = ? ORDER BY seq DESC LIMIT 1"
#: LATEST_RUN of several jobs at once (``{}``: as many ``?`` as job ids)
LATEST_RUNS = (
    "SELECT r.job_id, r.sched_ms, r.body FROM (SELECT job_id, max(seq) AS seq FROM runs "
    "WHERE job_id IN ({}) GROUP BY job_id) AS l JOIN runs AS r "
    "ON r.job_id = l.job_id AND r.seq = l.seq"
)
# Newest first, from a cursor on (``?`` after it: the page size; -1, every row): a job's runs
# scheduled before a time, and the dead-letter queue before a position.
RUNS_OF_JOB_BEFORE = (
    "SELECT job_id, sched_ms, body FROM runs WHERE job_id = ? AND sched_ms < ? "
    "ORDER BY sched_ms DESC LIMIT ?"
)
DLQ_BEFORE = "SELECT seq, run_id FROM dlq WHERE seq < ? ORDER BY seq DESC LIMIT ?"
#: a cursor before every time and position: the first page
FIRST = 1 << 62
#: ``jobs.next_ms`` of a job with no next fire time: after every time
NO_NEXT = FIRST

PAGE_CACHE_KIB = 65_536  # SQLite's page cache per connection (``cache_size``), in KiB
#: the write-ahead log is cut back to this size whenever a checkpoint has emptied it.  It grows
#: beyond it while a reader holds an old snapshot of the database (a snapshot copy pins one for
#: as long as it writes): without a limit the file would keep its largest size for good.  (It
#: is not a size at which the writer checkpoints: once a 10 M-job snapshot copy let go, the
#: writer's own checkpoint of the hundreds of megabytes piled up meanwhile stopped the Raft
#: tick thread for over a second, and the node lost its leadership.)
WAL_SIZE_LIMIT = 64 << 20

_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    namespace TEXT NOT NULL,
    queue TEXT NOT NULL,
    task TEXT NOT NULL,
    status TEXT NOT NULL,
    recurring INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    body BLOB NOT NULL
) WITHOUT ROWID;
CREATE UNIQUE INDEX jobs_order ON jobs (seq);
CREATE INDEX jobs_recurring ON jobs (seq) WHERE recurring = 1 AND status = 'active';
CREATE INDEX jobs_finished ON jobs (updated_ms, seq) WHERE status IN ('done', 'cancelled');
CREATE TABLE runs (
    sched_ms INTEGER NOT NULL,
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    state INTEGER NOT NULL,
    due_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (sched_ms, job_id)
) WITHOUT ROWID;
CREATE INDEX runs_job ON runs (job_id, seq, state);
CREATE INDEX runs_unfinished ON runs (job_id, seq) WHERE state < 5;
CREATE INDEX runs_due ON runs (due_ms, state, seq) WHERE state IN (0, 4);
CREATE INDEX runs_live ON runs (seq) WHERE state IN (2, 3);
CREATE INDEX runs_finished ON runs (updated_ms, seq) WHERE state >= 5;
CREATE TABLE deps (upstream TEXT NOT NULL, seq INTEGER NOT NULL, downstream TEXT NOT NULL,
                   PRIMARY KEY (upstream, seq, downstream)) WITHOUT ROWID;
CREATE TABLE idem (key TEXT PRIMARY KEY, job_id TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE dlq (seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL UNIQUE);
CREATE TABLE recent (rid TEXT PRIMARY KEY, at_ms INTEGER NOT NULL, result BLOB NOT NULL)
    WITHOUT ROWID;
CREATE INDEX recent_at ON recent (at_ms, rid);
CREATE TABLE counts (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
"""


def _create(db: sqlite3.Connection) -> None:
    db.executescript(f"BEGIN IMMEDIATE; {_V1}")


def _jobs_by_status(db: sqlite3.Connection) -> None:
    """Version 2: the jobs of one status in the order they were added (the API's listings)."""
    db.executescript("BEGIN IMMEDIATE; CREATE INDEX jobs_status ON jobs (status, seq);")


#: MIGRATIONS[n] takes a database at version n to n + 1, in a transaction it begins (the
#: caller sets ``user_version`` and commits).
def _jobs_by_name(db: sqlite3.Connection) -> None:
    """Version 3: a job's name in a column of its own, and the named jobs by name in the order
    they were added (a job addressed by its name; ``schedctl apply`` finding what it manages).
    The names come from the jobs' bodies (JSON: the spec under ``s``, its name under ``name``
    when it has one), read by SQLite itself."""
    db.executescript(
        "BEGIN IMMEDIATE; ALTER TABLE jobs ADD COLUMN name TEXT; "
        "UPDATE jobs SET name = json_extract(CAST(body AS TEXT), '$.s.name'); "
        "CREATE INDEX jobs_name ON jobs (name, seq) WHERE name IS NOT NULL;"
    )


def _jobs_by_time(db: sqlite3.Connection) -> None:
    """Version 4: a job's next fire time (its body's ``n``) and its latest run's scheduled time
    in columns of their own, each indexed with the order jobs were added: the listings sorted
    by next fire or by latest run."""
    db.executescript(
        "BEGIN IMMEDIATE; "
        f"ALTER TABLE jobs ADD COLUMN next_ms INTEGER NOT NULL DEFAULT {NO_NEXT}; "
        "ALTER TABLE jobs ADD COLUMN last_ms INTEGER NOT NULL DEFAULT 0; "
        "UPDATE jobs SET "
        f"next_ms = coalesce(json_extract(CAST(body AS TEXT), '$.n'), {NO_NEXT}), "
        "last_ms = coalesce((SELECT sched_ms FROM runs WHERE runs.job_id = jobs.id "
        "ORDER BY runs.seq DESC LIMIT 1), 0); "
        "CREATE INDEX jobs_next ON jobs (next_ms, seq); "
        "CREATE INDEX jobs_last ON jobs (last_ms, seq);"
    )


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    0: _create,
    1: _jobs_by_status,
    2: _jobs_by_name,
    3: _jobs_by_time,
}


class NewerSchema(Exception):
    """The database was written by a newer schedd."""


def pin_pragmas(db: sqlite3.Connection, *, readonly: bool = False) -> None:
    """The settings every connection to a node's database runs with.

    WAL, so readers (the API, a snapshot copy) never block the writer; ``synchronous=NORMAL``:
    the Raft journal is what is synced before a write is acknowledged, and a database that lost
    its last transactions in a power cut is consistent and replays them from the journal
    (``OFF`` could leave a torn database after a checkpoint).  Only the node's own thread
    checkpoints the log into the database (:mod:`schedd.storage.checkpointer`), never the
    writer; the writer cuts the file back to :data:`WAL_SIZE_LIMIT` when it starts the log
    again from its beginning.
    """
    db.execute(f"PRAGMA cache_size = -{PAGE_CACHE_KIB}")
    db.execute("PRAGMA foreign_keys = OFF")
    if readonly:
        db.execute("PRAGMA query_only = ON")
        return
    mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if mode not in ("wal", "memory"):
        raise sqlite3.OperationalError(f"cannot use write-ahead logging (journal_mode {mode})")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
    db.execute("PRAGMA wal_autocheckpoint = 0")


def schema_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def migrate(db: sqlite3.Connection, path: Path | str) -> None:
    """Bring ``db`` to :data:`SCHEMA_VERSION` (refuse a newer one)."""
    version = schema_version(db)
    if version > SCHEMA_VERSION:
        raise NewerSchema(
            f"{path}: the database has schema version {version}, and this schedd knows up to "
            f"{SCHEMA_VERSION}: it was written by a newer schedd. Run that version (or newer), "
            "or remove the database to rebuild it from the cluster."
        )
    while version < SCHEMA_VERSION:
        MIGRATIONS[version](db)
        version += 1
        db.execute(f"PRAGMA user_version = {version}")
        db.execute("COMMIT")


def open_database(path: Path | str) -> sqlite3.Connection:
    """The writer's connection to the database at ``path`` (``":memory:"`` for one in RAM),
    created or migrated to the current schema.  Autocommit mode: transactions are explicit."""
    db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    try:
        pin_pragmas(db)
        migrate(db, path)
    except BaseException:
        db.close()
        raise
    return db
