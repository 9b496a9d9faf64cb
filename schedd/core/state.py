"""The replicated state and ``apply``: deterministic and total.

``apply_entry(state, blob, index)`` is the only thing Raft calls.  It decodes the entry, applies
each command with the time the command carries, and returns one result per command plus the
events the leader needs to keep its in-memory indexes (timing wheel, ready queues, leases) in
step.  It never raises: anything unexpected becomes a :class:`Rejected` value.

:class:`State` is what the core reads and changes, with the indexes its decisions need (the
unfinished runs of a job, that overlap policies and dependencies are judged on, and more);
every change of a run goes through :meth:`State.put_run` or :meth:`State.add_run`.  Run-level transitions
and the recurring-job logic live in :mod:`schedd.core.runs`.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from schedd.core.allowances import EMPTY as EMPTY_LEDGER
from schedd.core.allowances import CapsLedger
from schedd.core.events import ChangeLog, job_differs, run_differs
from schedd.core.members import Membership
from schedd.core.model import (
    TERMINAL_RUN_STATES,
    Job,
    JobSpec,
    JobStatus,
    Priority,
    Run,
    RunState,
    ScheduleKind,
)
from schedd.errors import Code

DEDUP_WINDOW_MS = 15 * 60_000
#: every node keeps the runs due within this much decoded in memory, and the leader's wheel
#: holds them (``scheduler.hot_window``'s default)
HOT_WINDOW_MS = 600_000
DEFAULT_HISTORY_KEEP = 1_000  # finished runs kept per job until a leader's purge says otherwise
RECURRING_KINDS = frozenset({ScheduleKind.EVERY, ScheduleKind.CRON})
WAITING_STATES = frozenset({RunState.SCHEDULED, RunState.RETRYING})  # for their due time
LIVE_STATES = frozenset({RunState.QUEUED, RunState.RUNNING})  # with or for a worker


class Internal(StrEnum):
    """Rejections that stay inside the cluster (never an API error)."""

    STALE_LEADER = "stale_leader"  # a leader command from a deposed leader


STALE_LEADER = Internal.STALE_LEADER


@dataclass(frozen=True, slots=True)
class Ok:
    value: Any = None


@dataclass(frozen=True, slots=True)
class Rejected:
    code: Code | Internal
    message: str
    field: str | None = None


Result = Ok | Rejected


class Committed(NamedTuple):
    """A command's result, the index of the entry it was applied in, and that entry's
    position (what a client passes as ``min_index`` to read its own write on any node): the
    index, or in a cluster of several shards the entry's stamp."""

    result: Result
    entry: int
    position: int = 0


def reject_code(text: str) -> Code | Internal:
    """A rejection's code from its stored text (ValueError when it is neither kind)."""
    try:
        return Code(text)
    except ValueError:
        return Internal(text)


# -- counters: how many runs are in each state, skipped for each reason, attempts by outcome ----
class Counted(StrEnum):
    """What a counter of ``State.counts`` counts (its key is ``kind:label``, as stored)."""

    STATE = "state"  # runs in a state (label: the RunState)
    SKIPPED = "skipped"  # occurrences that did not run (label: the reason)
    ATTEMPT = "attempt"  # finished attempts (label: the AttemptOutcome)


def count_key(kind: Counted, label: str) -> str:
    """The key of the counter of ``kind`` for ``label`` in ``State.counts``."""
    return f"{kind.value}:{label}"


def counts_of(counts: Mapping[str, int], kind: Counted) -> dict[str, int]:
    """The counters of ``kind`` in ``counts`` (``State.counts``), by label."""
    prefix = f"{kind.value}:"
    return {key[len(prefix) :]: n for key, n in counts.items() if key.startswith(prefix)}


# -- leader events: what applying an entry changed that the leader keeps in memory ---------------
# (tuples, cheap to make; only ever consumed in-process, by schedd.leader.core's match)
class RunDue(NamedTuple):
    """The run waits in the timing wheel until ``due_ms`` (or up to dispatch-ahead before it
    when ``ahead``)."""

    run_id: str
    due_ms: int
    ahead: bool


class RunReady(NamedTuple):
    """The run is queued for a worker.  ``since_ms``: when it could first run, what its lease
    lag is counted from: its due time when it fired, the time of the change that queued it
    when it was replayed or unblocked (None: its due time)."""

    run_id: str
    queue: str
    priority: Priority
    namespace: str
    task: str
    since_ms: int | None = None


class RunLeased(NamedTuple):
    """The run was handed to a worker (the leader records the lease)."""

    run_id: str


class RunGone(NamedTuple):
    """The run left the wheel and the queues (finished, cancelled, blocked)."""

    run_id: str


class StopRun(NamedTuple):
    """Tell the worker holding the lease ``fence`` of the run to stop."""

    run_id: str
    fence: int


class CapsChanged(NamedTuple):
    """Slots of a concurrency cap moved to or from this shard: its ledger is now ``ledger``."""

    ledger: CapsLedger


LeaderEvent = RunDue | RunReady | RunLeased | RunGone | StopRun | CapsChanged


def backoff_ms(spec: JobSpec, attempt: int, rand: float) -> int:
    """Exponential backoff for the retry after ``attempt`` (1-based), with "equal jitter"."""
    r = spec.retry
    base = min(float(r.max_ms), r.initial_ms * (r.multiplier ** max(0, attempt - 1)))
    if r.jitter:
        base = base / 2 + base / 2 * min(max(rand, 0.0), 1.0)
    return int(base)


class State(ABC):
    """The replicated state as ``apply`` reads and changes it.

    The core decides every transition; a ``State`` only keeps the result, with the indexes the
    decisions need.  :class:`MemoryState` keeps it in dicts (the pure core's tests); the node
    keeps it in its SQLite database (``schedd.storage``).  Both must answer every question
    here identically for the same commands applied: the same log gives the same state on every
    node.  Orders are part of the answer: "in creation order" is the order runs were first
    stored (:meth:`add_run`), jobs the order they were added (:meth:`add_job`).
    """

    jobs: MutableMapping[str, Job]  # in the order they were added
    runs: Mapping[str, Run]  # in creation order; changed through put_run and add_run only
    leader_fence: int
    leader_node: str
    leader_http: str
    leader_term: int
    #: the latest leader claims, oldest first: (term, node, entry index, leader's clock ms)
    leader_claims: tuple[tuple[int, str, int, int], ...]
    #: the membership the log recorded last (None: never changed, the nodes' raft.peers)
    members: Membership | None
    #: the concurrency slots this shard moved to and from others (schedd.core.allowances)
    caps: CapsLedger
    applied_index: int
    #: a cluster of several shards: each entry is stamped (schedd.core.events.next_stamp),
    #: and the stamp of the latest is ``stamp`` (0 before any); the change feed's positions
    #: are stamps, not indexes. Set by the node from its configuration, the same on every node.
    stamped: bool = False
    stamp: int = 0
    #: Counters kept in step by :meth:`put_run`, for metrics: "state:<s>" (runs now in that
    #: state), "skipped:<reason>", "attempt:<outcome>" (totals since the beginning).
    counts: dict[str, int]
    #: finished runs kept per job (set by the leader's purge: schedd.core.history)
    history_keep: int
    #: notes what each entry changes, for clients that follow it (None: nobody needs it)
    changes: ChangeLog | None = None

    # -- jobs ----------------------------------------------------------------------------
    def add_job(self, job: Job) -> None:
        """A new job: stored last in the job order, as a dependant of each job it depends on,
        and under its idempotency key (if it has one)."""
        if self.changes is not None:
            self.changes.job(job)
        self._add_job(job)

    @abstractmethod
    def _add_job(self, job: Job) -> None: ...

    def put_job(self, job: Job) -> None:
        """Store a changed job (every change of a stored job goes through here)."""
        changes = self.changes
        if changes is not None:
            old = self.jobs.get(job.id)
            if old is None or job_differs(old, job):
                changes.job(job)
        self.jobs[job.id] = job

    @abstractmethod
    def job_by_key(self, namespace: str, key: str) -> str | None:
        """The id of the job submitted with this idempotency key in ``namespace``."""

    @abstractmethod
    def dependants_of(self, job_id: str) -> Sequence[str]:
        """The jobs that depend on ``job_id``, in the order they were added."""

    @abstractmethod
    def active_recurring_jobs(self) -> Iterator[Job]:
        """Every active recurring job (what a new leader checks for a missing occurrence)."""

    # -- runs ----------------------------------------------------------------------------
    @abstractmethod
    def _store_run(self, old: Run | None, run: Run) -> None:
        """Keep ``run`` (``old`` is what was kept under its id, None for a new run)."""

    def put_run(self, run: Run) -> None:
        """Store a changed ``run`` and keep the counters in step."""
        old = self.runs.get(run.id)
        self._count_change(old, run)
        if self.changes is not None and (old is None or run_differs(old, run)):
            self.changes.run(run)
        self._store_run(old, run)

    def add_run(self, run: Run) -> None:
        """A new run of its job (kept in the job's history)."""
        self._count_change(None, run)
        if self.changes is not None:
            self.changes.run(run)
        self._store_run(None, run)

    def _count_change(self, old: Run | None, run: Run) -> None:
        counts = self.counts
        if old is None or old.state is not run.state:
            if old is not None:
                key = count_key(Counted.STATE, old.state.value)
                counts[key] = counts.get(key, 0) - 1
            key = count_key(Counted.STATE, run.state.value)
            counts[key] = counts.get(key, 0) + 1
            if run.state is RunState.SKIPPED:
                key = count_key(Counted.SKIPPED, str(run.reason))
                counts[key] = counts.get(key, 0) + 1
        if (
            old is not None
            and old.attempts
            and old.attempts[-1].outcome is None
            and run.attempts
            and run.attempts[len(old.attempts) - 1].outcome is not None
        ):
            outcome = run.attempts[len(old.attempts) - 1].outcome
            key = count_key(Counted.ATTEMPT, str(outcome))
            counts[key] = counts.get(key, 0) + 1

    @abstractmethod
    def unfinished_runs(self, job_id: str) -> list[Run]:
        """The job's runs not in a terminal state, in creation order."""

    @abstractmethod
    def has_unfinished(self, job_id: str) -> bool: ...

    @abstractmethod
    def latest_run(self, job_id: str) -> Run | None:
        """The job's run created last."""

    @abstractmethod
    def latest_finished_run(self, job_id: str) -> Run | None:
        """The job's run created last among those in a terminal state."""

    @abstractmethod
    def runs_of(self, job_id: str) -> list[Run]:
        """Run history, newest scheduled time first (a job's runs have distinct scheduled
        times: see ``schedd.core.runs``)."""

    @abstractmethod
    def due_runs(self, start_ms: int, end_ms: int, limit: int | None = None) -> list[Run]:
        """Runs waiting for their time (scheduled or retrying) that are due in
        ``[start_ms, end_ms)``, by due time (ties: creation order), the first ``limit`` of them
        (None: all): the leader's next window."""

    @abstractmethod
    def live_runs(self) -> list[Run]:
        """Runs queued for a worker or running, in creation order."""

    # -- history -------------------------------------------------------------------------
    @abstractmethod
    def finished_runs_before(self, before_ms: int, limit: int) -> list[Run]:
        """Up to ``limit`` runs in a terminal state, not in the dead-letter queue, last changed
        before ``before_ms``: the oldest first (ties: creation order)."""

    @abstractmethod
    def finished_runs_beyond(self, job_id: str, keep: int) -> list[Run]:
        """The job's runs in a terminal state but its ``keep`` created last, less those in
        the dead-letter queue, in creation order."""

    @abstractmethod
    def forgettable_jobs(self, before_ms: int, limit: int) -> list[Job]:
        """Up to ``limit`` jobs done or cancelled, last changed before ``before_ms``, with no
        run and no job depending on them: the oldest first (ties: the order they were added)."""

    def delete_run(self, run: Run) -> None:
        """Forget a finished run."""
        self.counts[count_key(Counted.STATE, run.state.value)] -= 1  # counted when stored
        if self.changes is not None:
            self.changes.run(run, forgotten=True)
        self._delete_run(run)

    @abstractmethod
    def _delete_run(self, run: Run) -> None: ...

    def delete_job(self, job: Job) -> None:
        """Forget a job (with its idempotency key, and its links to the jobs it depends on)."""
        if self.changes is not None:
            self.changes.job(job, forgotten=True)
        self._delete_job(job)

    @abstractmethod
    def _delete_job(self, job: Job) -> None: ...

    # -- dead-letter queue ---------------------------------------------------------------
    def dlq_add(self, run: Run) -> None:
        """Put ``run`` last in the dead-letter queue (where it stays if already in it)."""
        if self.changes is not None:
            self.changes.dlq(run.id, run.job_id, run.namespace, True)
        self._dlq_add(run.id)

    def dlq_remove(self, run: Run) -> None:
        if self.changes is not None:
            self.changes.dlq(run.id, run.job_id, run.namespace, False)
        self._dlq_remove(run.id)

    @abstractmethod
    def _dlq_add(self, run_id: str) -> None: ...

    @abstractmethod
    def _dlq_remove(self, run_id: str) -> None: ...

    @abstractmethod
    def in_dlq(self, run_id: str) -> bool: ...

    @abstractmethod
    def dlq_size(self) -> int: ...

    @abstractmethod
    def dlq_newest_first(self) -> Iterator[str]: ...

    # -- request ids ---------------------------------------------------------------------
    @abstractmethod
    def recall(self, rid: str) -> Result | None:
        """The result of the client command with request id ``rid``, while remembered."""

    @abstractmethod
    def remember(self, rid: str, now: int, result: Result) -> None:
        """Keep ``result`` under ``rid``.  A request is remembered while it is at most
        ``DEDUP_WINDOW_MS`` older than the latest one remembered (the window ends at the
        latest ``now`` so far, which every node knows alike whenever it forgets)."""

    @abstractmethod
    def remembered(self) -> int:
        """How many request ids are remembered."""

    def make_visible(self) -> None:  # noqa: B027 - a hook, empty unless a store needs it
        """A command whose answer may be read back at once was applied (a client's command, a
        claim, a barrier).  A store that shows its changes to other readers later than it
        applies them (the node's database commits the leader's own commands, fires, leases and
        results, a little later) shows them before the answer is handed back."""


class MemoryState(State):
    """The state in plain dicts of frozen records: the pure core's tests run on it (a node
    keeps its state in SQLite, ``schedd.storage``)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.runs: dict[str, Run] = {}
        self.job_runs: dict[str, list[str]] = {}  # job id -> its run ids, in creation order
        self.job_order: list[str | None] = []  # None: a job forgotten since
        self.unfinished: dict[str, set[str]] = {}  # job id -> its unfinished run ids
        self.dependants: dict[str, list[str]] = {}  # job id -> jobs that depend on it
        self.idempotency: dict[str, str] = {}  # "<namespace>\0<key>" -> job id
        self.dlq: dict[str, None] = {}  # ordered set of dead-lettered run ids
        self.recent: dict[str, tuple[int, Result]] = {}  # request id -> (now, result)
        self.recent_by_time: list[tuple[int, str]] = []  # heap of (now, request id)
        self.recent_latest = 0  # the latest now remembered: the dedup window's end
        self.seq: dict[str, int] = {}  # run id -> its creation number
        self.created = 0  # runs created so far
        self.leader_fence = 0
        self.leader_node = ""
        self.leader_http = ""
        self.leader_term = 0
        self.leader_claims: tuple[tuple[int, str, int, int], ...] = ()
        self.members: Membership | None = None
        self.caps = EMPTY_LEDGER
        self.applied_index = 0
        self.stamp = 0
        self.counts: dict[str, int] = {}
        self.history_keep = DEFAULT_HISTORY_KEEP

    # -- jobs ----------------------------------------------------------------------------
    def _add_job(self, job: Job) -> None:
        self.jobs[job.id] = job
        self.job_order.append(job.id)
        self.job_runs[job.id] = []
        for dep in dict.fromkeys(job.spec.depends_on):
            self.dependants.setdefault(dep, []).append(job.id)
        if job.spec.idempotency_key is not None:
            self.idempotency[f"{job.spec.namespace}\0{job.spec.idempotency_key}"] = job.id

    def job_by_key(self, namespace: str, key: str) -> str | None:
        return self.idempotency.get(f"{namespace}\0{key}")

    def dependants_of(self, job_id: str) -> Sequence[str]:
        return self.dependants.get(job_id, ())

    def active_recurring_jobs(self) -> Iterator[Job]:
        for job in self.jobs.values():
            if job.status is JobStatus.ACTIVE and job.spec.schedule.kind in RECURRING_KINDS:
                yield job

    # -- runs ----------------------------------------------------------------------------
    def _store_run(self, old: Run | None, run: Run) -> None:
        self.runs[run.id] = run
        if old is None:
            self.job_runs.setdefault(run.job_id, []).append(run.id)
            self.seq[run.id] = self.created
            self.created += 1
        ids = self.unfinished.setdefault(run.job_id, set())
        if run.state in TERMINAL_RUN_STATES:
            ids.discard(run.id)
            if not ids:
                del self.unfinished[run.job_id]
        else:
            ids.add(run.id)

    def unfinished_runs(self, job_id: str) -> list[Run]:
        return [
            self.runs[r] for r in sorted(self.unfinished.get(job_id, ()), key=self.seq.__getitem__)
        ]

    def has_unfinished(self, job_id: str) -> bool:
        return bool(self.unfinished.get(job_id))

    def latest_run(self, job_id: str) -> Run | None:
        ids = self.job_runs.get(job_id)
        return self.runs[ids[-1]] if ids else None

    def latest_finished_run(self, job_id: str) -> Run | None:
        for rid in reversed(self.job_runs.get(job_id, ())):
            run = self.runs[rid]
            if run.state in TERMINAL_RUN_STATES:
                return run
        return None

    def runs_of(self, job_id: str) -> list[Run]:
        runs = [self.runs[r] for r in self.job_runs.get(job_id, ())]
        return sorted(runs, key=lambda r: r.scheduled_ms, reverse=True)

    def _unfinished(self) -> list[Run]:
        """Every unfinished run, in creation order."""
        ids = [r for job_ids in self.unfinished.values() for r in job_ids]
        return [self.runs[r] for r in sorted(ids, key=self.seq.__getitem__)]

    def due_runs(self, start_ms: int, end_ms: int, limit: int | None = None) -> list[Run]:
        runs = [
            r
            for r in self._unfinished()
            if r.state in WAITING_STATES and start_ms <= r.due_ms < end_ms
        ]
        return sorted(runs, key=lambda r: r.due_ms)[:limit]

    def live_runs(self) -> list[Run]:
        return [r for r in self._unfinished() if r.state in LIVE_STATES]

    # -- history -------------------------------------------------------------------------
    def finished_runs_before(self, before_ms: int, limit: int) -> list[Run]:
        runs = [self.runs[r] for r in self.seq]  # in creation order
        old = [
            r
            for r in runs
            if r.state in TERMINAL_RUN_STATES and r.updated_ms < before_ms and r.id not in self.dlq
        ]
        return sorted(old, key=lambda r: r.updated_ms)[:limit]

    def finished_runs_beyond(self, job_id: str, keep: int) -> list[Run]:
        done = [
            self.runs[r]
            for r in self.job_runs.get(job_id, ())
            if self.runs[r].state in TERMINAL_RUN_STATES
        ]
        return [r for r in done[: max(0, len(done) - keep)] if r.id not in self.dlq]

    def forgettable_jobs(self, before_ms: int, limit: int) -> list[Job]:
        jobs = [self.jobs[j] for j in self.job_order if j is not None]
        old = [
            j
            for j in jobs
            if j.status in (JobStatus.DONE, JobStatus.CANCELLED)
            and j.updated_ms < before_ms
            and not self.job_runs.get(j.id)
            and not self.dependants.get(j.id)
        ]
        return sorted(old, key=lambda j: j.updated_ms)[:limit]

    def _delete_run(self, run: Run) -> None:  # a finished run: not among the unfinished
        del self.runs[run.id]
        del self.seq[run.id]
        self.job_runs[run.job_id].remove(run.id)

    def _delete_job(self, job: Job) -> None:
        del self.jobs[job.id]
        self.job_order[self.job_order.index(job.id)] = None
        del self.job_runs[job.id]
        for dep in dict.fromkeys(job.spec.depends_on):  # an upstream outlives its dependants
            dependants = self.dependants[dep]
            dependants.remove(job.id)
            if not dependants:
                del self.dependants[dep]
        # Its key, if it is under it (an update may have given the spec another key).
        key = f"{job.spec.namespace}\0{job.spec.idempotency_key}"
        if self.idempotency.get(key) == job.id:
            del self.idempotency[key]

    # -- dead-letter queue ---------------------------------------------------------------
    def _dlq_add(self, run_id: str) -> None:
        self.dlq[run_id] = None

    def _dlq_remove(self, run_id: str) -> None:
        del self.dlq[run_id]

    def in_dlq(self, run_id: str) -> bool:
        return run_id in self.dlq

    def dlq_size(self) -> int:
        return len(self.dlq)

    def dlq_newest_first(self) -> Iterator[str]:
        return reversed(self.dlq)

    # -- request ids ---------------------------------------------------------------------
    def recall(self, rid: str) -> Result | None:
        seen = self.recent.get(rid)
        return None if seen is None else seen[1]

    def remember(self, rid: str, now: int, result: Result) -> None:
        recent, heap = self.recent, self.recent_by_time
        recent[rid] = (now, result)
        heapq.heappush(heap, (now, rid))
        self.recent_latest = latest = max(self.recent_latest, now)
        horizon = latest - DEDUP_WINDOW_MS
        while heap and heap[0][0] < horizon:
            at, old = heapq.heappop(heap)
            seen = recent.get(old)
            if seen is not None and seen[0] == at:
                del recent[old]

    def remembered(self) -> int:
        return len(self.recent)


ACTIVE_STATES = frozenset({RunState.QUEUED, RunState.RUNNING, RunState.RETRYING})
