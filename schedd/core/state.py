"""The replicated state and ``apply``: deterministic and total.

``apply_entry(state, blob, index)`` is the only thing Raft calls.  It decodes the entry, applies
each command with the time the command carries, and returns one result per command plus the
events the leader needs to keep its in-memory indexes (timing wheel, ready queues, leases) in
step.  It never raises: anything unexpected becomes a :class:`Rejected` value.

Every change of a run goes through :func:`put_run`, which keeps the per-job index of
unfinished runs that overlap policies and dependencies are judged on.  Run-level transitions
and the recurring-job logic live in :mod:`schedd.core.runs`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from schedd.core.model import TERMINAL_RUN_STATES, Job, JobSpec, Run, RunState

DEDUP_WINDOW_MS = 15 * 60_000
STALE_LEADER = "stale_leader"  # a leader command from a deposed leader (internal, never on the API)


@dataclass(frozen=True, slots=True)
class Ok:
    value: Any = None


@dataclass(frozen=True, slots=True)
class Rejected:
    code: str
    message: str
    field: str | None = None


Result = Ok | Rejected

# Leader events (plain tuples: cheap, and only ever consumed in-process):
#   ("due", run_id, due_ms, ahead)        the run waits in the timing wheel until due_ms (or up
#                                         to dispatch_ahead before it when `ahead`)
#   ("ready", run_id, queue, priority, namespace)   the run is queued for a worker
#   ("leased", run_id)                    handed to a worker (the leader records the lease)
#   ("gone", run_id)                      left the wheel/queue (finished, cancelled, blocked)
#   ("stop", run_id, fence)               tell the worker holding this lease to stop
LeaderEvent = tuple[Any, ...]


def backoff_ms(spec: JobSpec, attempt: int, rand: float) -> int:
    """Exponential backoff for the retry after ``attempt`` (1-based), with "equal jitter"."""
    r = spec.retry
    base = min(float(r.max_ms), r.initial_ms * (r.multiplier ** max(0, attempt - 1)))
    if r.jitter:
        base = base / 2 + base / 2 * min(max(rand, 0.0), 1.0)
    return int(base)


class State:
    """Plain builtins and frozen records only: it is pickled into Raft snapshots."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.runs: dict[str, Run] = {}
        self.job_runs: dict[str, list[str]] = {}
        self.job_order: list[str] = []
        self.unfinished: dict[str, dict[str, None]] = {}  # job id -> its unfinished run ids
        self.dependants: dict[str, list[str]] = {}  # job id -> jobs that depend on it
        self.idempotency: dict[str, str] = {}  # "<namespace>\0<key>" -> job id
        self.dlq: dict[str, None] = {}  # ordered set of dead-lettered run ids
        self.recent: dict[str, tuple[int, Result]] = {}  # request id -> (now, result)
        self.leader_fence = 0
        self.leader_node = ""
        self.leader_http = ""
        self.leader_term = 0
        self.applied_index = 0
        # Counters kept in step by put_run, for metrics: "state:<s>" (runs now in that state),
        # "skipped:<reason>", "attempt:<outcome>" (totals since the beginning).
        self.counts: dict[str, int] = {}

    # -- reads ---------------------------------------------------------------------------
    def latest_run(self, job_id: str) -> Run | None:
        ids = self.job_runs.get(job_id)
        return self.runs.get(ids[-1]) if ids else None

    def runs_of(self, job_id: str) -> list[Run]:
        """Run history, newest scheduled time first."""
        runs = [self.runs[r] for r in self.job_runs.get(job_id, ()) if r in self.runs]
        return sorted(runs, key=lambda r: (r.scheduled_ms, r.created_ms), reverse=True)

    def unfinished_runs(self, job_id: str) -> list[Run]:
        return [self.runs[r] for r in self.unfinished.get(job_id, ())]

    def pending_runs(self) -> Iterator[Run]:
        """Runs the leader must track: waiting, queued or running."""
        for ids in self.unfinished.values():
            for run_id in ids:
                yield self.runs[run_id]

    def depends_on_view(self) -> Mapping[str, tuple[str, ...]]:
        return _DependsOn(self.jobs)


class _DependsOn(Mapping[str, tuple[str, ...]]):
    """``job id -> depends_on`` over the jobs, without copying them (for cycle detection)."""

    def __init__(self, jobs: dict[str, Job]) -> None:
        self._jobs = jobs

    def __getitem__(self, key: str) -> tuple[str, ...]:
        return self._jobs[key].spec.depends_on

    def __iter__(self) -> Iterator[str]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)


def _count(state: State, key: str, delta: int) -> None:
    state.counts[key] = state.counts.get(key, 0) + delta


def put_run(state: State, run: Run) -> None:
    """Store ``run`` and keep the unfinished-runs index and the counters in step."""
    old = state.runs.get(run.id)
    if old is None or old.state is not run.state:
        if old is not None:
            _count(state, f"state:{old.state.value}", -1)
        _count(state, f"state:{run.state.value}", 1)
        if run.state is RunState.SKIPPED:
            _count(state, f"skipped:{run.reason}", 1)
    if old is not None and old.attempts and old.attempts[-1].outcome is None \
            and run.attempts and run.attempts[len(old.attempts) - 1].outcome is not None:
        _count(state, f"attempt:{run.attempts[len(old.attempts) - 1].outcome}", 1)
    state.runs[run.id] = run
    ids = state.unfinished.get(run.job_id)
    if run.state in TERMINAL_RUN_STATES:
        if ids is not None:
            ids.pop(run.id, None)
            if not ids:
                del state.unfinished[run.job_id]
    else:
        if ids is None:
            state.unfinished[run.job_id] = ids = {}
        ids[run.id] = None


def add_run(state: State, run: Run) -> None:
    """A new run of its job (kept in the job's history)."""
    put_run(state, run)
    state.job_runs.setdefault(run.job_id, []).append(run.id)


def remember(state: State, rid: str, now: int, result: Result) -> None:
    recent = state.recent
    recent[rid] = (now, result)
    horizon = now - DEDUP_WINDOW_MS
    while recent:
        first = next(iter(recent))
        if recent[first][0] >= horizon:
            break
        del recent[first]


ACTIVE_STATES = frozenset({RunState.QUEUED, RunState.RUNNING, RunState.RETRYING})
