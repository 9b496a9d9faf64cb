"""What each applied Raft entry changed, as events a client can follow (``GET /events``).

Pure.  Every node applies the same entries to the same state, so what an entry changes is the
same on every node: :class:`ChangeLog`, kept by the state, notes the jobs and runs an entry
stores (``State.put_job``, ``State.put_run`` and their kin), the runs that enter or leave the
dead-letter queue and a new leader's claim, and hands them on at the end of the entry as
:class:`Change` s that carry the entry's index.  A client that read up to index ``N`` on one node
resumes after ``N`` on any other and misses nothing.

Only what a list page shows is noted: a run's state, attempt, fence, worker and due time (not a
progress report, not a heartbeat), a job's status, next fire time and spec; a change of nothing
of that is no change.  Two changes of one record in one entry are one (the latest).

:class:`EventRing` keeps the changes of the latest entries, at most ``size`` changes, and says
when a client's position is older than what it holds (the client then reads its pages again).
:class:`EventFilter` and :func:`coalesce` turn the changes a client has not seen into the few
events it is sent: one per record, with its latest state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, NamedTuple

from schedd.core.model import Job, Run
from schedd.errors import InvalidArgument

#: the kinds of change, in the order a batch of them is sent
KINDS: Final = ("cluster", "job", "run", "dlq")
MAX_INDEX: Final = (1 << 63) - 1  # the largest position a client may give
#: a stamp's low bits: entries within one millisecond (see :func:`next_stamp`)
STAMP_SHIFT: Final = 12
#: stamps count milliseconds from here (2025-01-01T00:00:00Z), so that they stay below 2**53
#: (exact in JSON for JavaScript) until about 2094
STAMP_EPOCH_MS: Final = 1_735_689_600_000


def stamp_of_ms(ms: int) -> int:
    """The lowest stamp of an entry made at ``ms`` (Unix time in milliseconds)."""
    return max(ms - STAMP_EPOCH_MS, 0) << STAMP_SHIFT


def ms_after(stamp: int) -> int:
    """The first millisecond whose entries are stamped after ``stamp`` (a barrier made then
    is stamped above it)."""
    return STAMP_EPOCH_MS + (stamp >> STAMP_SHIFT) + 1


def next_stamp(previous: int, now_ms: int) -> int:
    """The stamp of the entry after one stamped ``previous`` whose latest command time is
    ``now_ms``: the position of a shard's entries in a cluster of several shards.

    Each shard's log counts its own indexes, which do not compare with another's; a stamp
    does. It is chosen in ``apply`` from the entry alone (so every node gives an entry the
    same stamp): greater than the previous one, and at least the entry's time
    (:func:`stamp_of_ms`). So stamps grow with each shard's log and keep up with the clock:
    a shard idle for a while catches up with the others with one entry (a barrier), and a
    client's position (the stamps it has seen) holds for every shard."""
    return min(MAX_INDEX, max(previous + 1, stamp_of_ms(now_ms)))


class Change(NamedTuple):
    """One record as an entry left it.  ``fields`` by kind:

    * ``job``: status, next_run_at_ms, updated_ms, queue, task, name, forgotten
    * ``run``: state, attempt, fence, worker_id, due_ms, updated_ms, reason, forgotten
    * ``dlq``: in_dlq
    * ``cluster``: leader node, term, leader_http
    """

    entry: int  # the index of the entry that made it
    kind: str
    key: str  # the job id, run id, or "" (cluster)
    job_id: str  # the job it is about ("" for cluster)
    namespace: str  # ("" for cluster)
    fields: tuple[Any, ...]


def _job_fields(job: Job, forgotten: bool) -> tuple[Any, ...]:
    s = job.spec
    return (
        job.status.value,
        job.next_run_at_ms,
        job.updated_ms,
        s.queue,
        s.task,
        s.name,
        forgotten,
    )


def _run_fields(run: Run, forgotten: bool) -> tuple[Any, ...]:
    current = run.attempts[-1] if run.attempts else None
    return (
        run.state.value,
        len(run.attempts),
        None if current is None else current.fence,
        None if current is None else current.worker_id,
        run.due_ms,
        run.updated_ms,
        run.reason,
        forgotten,
    )


def run_differs(old: Run, new: Run) -> bool:
    """Whether a client following the run sees a change (not a progress report)."""
    return (
        old.state is not new.state
        or len(old.attempts) != len(new.attempts)
        or old.due_ms != new.due_ms
        or old.reason != new.reason
        or old.refused is not new.refused
    )


def job_differs(old: Job, new: Job) -> bool:
    return (
        old.status is not new.status
        or old.next_run_at_ms != new.next_run_at_ms
        or (old.spec is not new.spec and old.spec != new.spec)
    )


_new = tuple.__new__


class Noted:
    """One entry's changes as :class:`ChangeLog` noted them, each record's fields taken at the
    end of the entry (so that nothing holds a job's payload or a run's result), made into
    :class:`Change` s the first time a client pulls them (and kept for the next ones)."""

    __slots__ = ("_changes", "_noted", "index")

    def __init__(self, index: int, noted: list[tuple[str, str, str, str, tuple[Any, ...]]]) -> None:
        self.index = index
        self._noted: list[tuple[str, str, str, str, tuple[Any, ...]]] | None = noted
        self._changes: list[Change] = []

    def __len__(self) -> int:
        return len(self._changes) if self._noted is None else len(self._noted)

    def changes(self) -> list[Change]:
        """The :class:`Change` s, in the order each record was first changed in the entry."""
        if self._noted is not None:
            index, new = self.index, _new  # (a Change without NamedTuple.__new__'s keywords)
            self._changes = [new(Change, (index, *noted)) for noted in self._noted]
            self._noted = None
        return self._changes


#: an entry's changes: made by hand (tests), or as noted while it was applied
EntryChanges = list[Change] | Noted
Sink = Callable[[int, Noted], None]


def changes_of(entry: EntryChanges) -> list[Change]:
    return entry if isinstance(entry, list) else entry.changes()


class ChangeLog:
    """The changes of the entry being applied, handed to ``sink`` at its end (``end``).

    The state calls ``job``, ``run``, ``dlq`` and ``cluster`` as ``apply`` changes it; each
    record is kept as it is (frozen) until the end of the entry, when the fields a client is
    sent are taken from it, in the order each was first changed in it (:class:`Noted`)."""

    __slots__ = ("_pending", "sink")

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self._pending: dict[tuple[str, str], tuple[Any, ...]] = {}

    def job(self, job: Job, forgotten: bool = False) -> None:
        self._pending[("job", job.id)] = (job, forgotten)

    def run(self, run: Run, forgotten: bool = False) -> None:
        self._pending[("run", run.id)] = (run, forgotten)

    def dlq(self, run_id: str, job_id: str, namespace: str, in_dlq: bool) -> None:
        self._pending[("dlq", run_id)] = (job_id, namespace, in_dlq)

    def cluster(self, node: str, term: int, http: str) -> None:
        self._pending[("cluster", "")] = (node, term, http)

    def end(self, index: int) -> None:
        """Entry ``index`` is applied: hand its changes on (nothing when it changed nothing),
        each record's fields taken now; the :class:`Change` s are made when a client pulls."""
        pending = self._pending
        if not pending:
            return
        self._pending = {}
        noted: list[tuple[str, str, str, str, tuple[Any, ...]]] = []
        for (kind, key), value in pending.items():
            if kind == "run":
                run, forgotten = value
                noted.append((kind, key, run.job_id, run.namespace, _run_fields(run, forgotten)))
            elif kind == "job":
                job, forgotten = value
                fields = _job_fields(job, forgotten)
                noted.append((kind, key, key, job.spec.namespace, fields))
            elif kind == "dlq":
                job_id, namespace, in_dlq = value
                noted.append((kind, key, job_id, namespace, (in_dlq,)))
            else:
                noted.append((kind, key, "", "", value))
        self.sink(index, Noted(index, noted))

    def discard(self) -> None:
        """Forget what was noted (the entry's changes were not kept: a snapshot replaced them)."""
        self._pending = {}


# -- what a client is sent ----------------------------------------------------------------------


class EventFilter(NamedTuple):
    """What a client asked for: some kinds (all when empty), one job, one namespace."""

    kinds: frozenset[str] = frozenset()
    job_id: str | None = None
    namespace: str | None = None

    def wants(self, change: Change) -> bool:
        if self.kinds and change.kind not in self.kinds:
            return False
        if change.kind == "cluster":
            return True  # about no job: a job or namespace filter does not hold it back
        if self.job_id is not None and change.job_id != self.job_id:
            return False
        return self.namespace is None or change.namespace == self.namespace


def coalesce(changes: Iterable[Change], wanted: EventFilter) -> list[tuple[str, list[Change]]]:
    """The ``wanted`` changes as one event per kind (in :data:`KINDS` order), each with one
    change per record: its latest, in the order the records first changed."""
    latest: dict[tuple[str, str], Change] = {}
    for change in changes:
        if wanted.wants(change):
            key = (change.kind, change.key)
            latest.pop(key, None)  # the latest goes last: a record's order is its latest change
            latest[key] = change
    by_kind: dict[str, list[Change]] = {}
    for change in latest.values():
        by_kind.setdefault(change.kind, []).append(change)
    return [(kind, by_kind[kind]) for kind in KINDS if kind in by_kind]


# -- the ring -----------------------------------------------------------------------------------


class Pulled(NamedTuple):
    changes: list[Change]
    upto: int  # the index of the last entry pulled (the position to go on from)
    #: every entry up to this position was pulled (a stream that asked for it is there),
    #: when the pull was whole and bounded by the reads (None: not known)
    reached: int | None = None


class EventRing:
    """The changes of the latest entries, at most ``size`` of them (whole entries: the newest is
    kept even when it alone holds more).  Not thread-safe: the node's feed locks around it.

    ``horizon``: changes of entries at or before it may be missing (dropped to make room, or
    never seen: applied before this ring began, or replaced by a snapshot).  A position at or
    after it can be resumed: every change after it is here."""

    def __init__(self, size: int, horizon: int = 0) -> None:
        if size < 1:
            raise ValueError("size: expected at least 1")
        self.size = size
        self.horizon = horizon
        self._entries: deque[tuple[int, EntryChanges]] = deque()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def head(self) -> int:
        """The index of the newest entry held (the horizon when none is)."""
        return self._entries[-1][0] if self._entries else self.horizon

    def append(self, index: int, changes: EntryChanges) -> None:
        if index <= self.head:  # replayed, or older than the ring: never twice
            return
        self._entries.append((index, changes))
        self._count += len(changes)
        while self._count > self.size and len(self._entries) > 1:
            dropped, gone = self._entries.popleft()
            self._count -= len(gone)
            self.horizon = dropped

    def restart(self, horizon: int) -> None:
        """Forget everything: nothing at or before ``horizon`` is known (a snapshot installed)."""
        self._entries.clear()
        self._count = 0
        self.horizon = horizon

    def pull(self, after: int, limit: int, upto: int | None = None) -> Pulled | None:
        """The changes of the entries after index ``after`` (whole entries, the oldest first,
        until at least ``limit`` changes; none after ``upto`` when given), and the index of the
        last one pulled (``after`` when there is none yet); None when ``after`` is older than
        the horizon."""
        if after < self.horizon:
            return None
        newer: list[tuple[int, EntryChanges]] = []
        for entry in reversed(self._entries):
            if entry[0] <= after:
                break
            if upto is None or entry[0] <= upto:
                newer.append(entry)
        out: list[Change] = []
        last = after
        whole = True
        for index, changes in reversed(newer):
            if len(out) >= limit:
                whole = False
                break
            out.extend(changes_of(changes))
            last = index
        return Pulled(out, last, upto if whole and upto is not None else None)

    def __iter__(self) -> Iterator[Change]:
        for _, changes in self._entries:
            yield from changes_of(changes)


def resume_position(header: str | None, query: str | None) -> int | None:
    """Where a client of ``GET /events`` is: its ``Last-Event-ID`` header (what EventSource
    sends when it reconnects), else its ``last_event_id`` query parameter; None for a new
    client.  :class:`InvalidArgument` naming one given that is not an event's id (both are
    checked, though the header wins)."""
    found: int | None = None
    for name, raw in (("Last-Event-ID", header), ("last_event_id", query)):
        if raw is None or (name == "Last-Event-ID" and not raw.strip()):
            continue
        text = raw.strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 19 and int(text) <= MAX_INDEX):
            raise InvalidArgument(
                f"{name}: expected the id of an event of this API (a non-negative integer), "
                f"got {raw!r}",
                field=name,
            )
        found = int(text) if found is None else found
    return found


def parse_kinds(raw: str) -> frozenset[str]:
    """``"run,dlq"`` → the kinds; ValueError naming the first part that is not one."""
    parts = raw.split(",")
    for part in parts:
        if part not in KINDS:
            raise ValueError(repr(part))
    return frozenset(parts)
