"""The replicated state and ``apply``: deterministic and total.

``apply_entry(state, blob, index)`` is the only thing Raft calls.  It decodes the entry, applies
each command with the time the command carries, and returns one result per command plus the
events the leader needs to keep its in-memory indexes (timing wheel, ready queue, leases) in
step.  It never raises: anything unexpected becomes a :class:`Rejected` value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from schedd.core import commands as c
from schedd.core.lifecycle import BadTransition, Event, next_state
from schedd.core.model import (
    TERMINAL_RUN_STATES,
    Attempt,
    AttemptOutcome,
    Job,
    JobSpec,
    JobStatus,
    Run,
    RunState,
    ScheduleKind,
    run_id_for,
)

DEDUP_WINDOW_MS = 15 * 60_000
# Commands a client may repeat after a lost reply: their results are remembered by request id.
# Leader commands are not (they are fenced, and a repeat is judged on the run's state).
CLIENT_COMMANDS = (c.Submit, c.CancelJob)
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
#   ("due", run_id, due_ms)   the run waits in the timing wheel until due_ms
#   ("ready", run_id, queue, priority)   the run is queued for a worker
#   ("leased", run_id)        the run was handed to a worker (the leader records the lease)
#   ("gone", run_id)          the run left the wheel/queue (leased, finished, cancelled)
#   ("stop", run_id, fence)   tell the worker holding this lease to stop
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
        self.idempotency: dict[str, str] = {}  # "<namespace>\0<key>" -> job id
        self.dlq: dict[str, None] = {}  # ordered set of dead-lettered run ids
        self.recent: dict[str, tuple[int, Result]] = {}  # request id -> (now, result)
        self.leader_fence = 0
        self.leader_node = ""
        self.leader_http = ""
        self.leader_term = 0
        self.applied_index = 0

    # -- reads ---------------------------------------------------------------------------
    def latest_run(self, job_id: str) -> Run | None:
        ids = self.job_runs.get(job_id)
        return self.runs.get(ids[-1]) if ids else None

    def runs_of(self, job_id: str) -> list[Run]:
        return [self.runs[r] for r in reversed(self.job_runs.get(job_id, ())) if r in self.runs]

    def pending_runs(self) -> list[Run]:
        """Runs the leader must track: waiting, queued or running."""
        return [r for r in self.runs.values() if r.state not in TERMINAL_RUN_STATES]


def apply_entry(state: State, blob: object, index: int) -> tuple[list[Result], list[LeaderEvent]]:
    """Apply one Raft entry at log ``index``.  Total: never raises."""
    events: list[LeaderEvent] = []
    results: list[Result] = []
    state.applied_index = index
    for cmd in c.decode_entry(blob):
        results.append(apply(state, cmd, index, events))
    return results, events


def apply(state: State, cmd: c.Command | c.Undecodable, index: int, events: list[LeaderEvent]) -> Result:
    if isinstance(cmd, c.Undecodable):
        return Rejected("invalid_argument", f"undecodable command: {cmd.reason}")
    seen = state.recent.get(cmd.rid) if cmd.rid else None
    if seen is not None:
        return seen[1]
    try:
        result = _dispatch(state, cmd, index, events)
    except Exception as exc:  # noqa: BLE001 - apply must be total (raft-notes #1)
        result = Rejected("internal", f"{type(cmd).__name__} failed: {type(exc).__name__}: {exc}")
    if cmd.rid and isinstance(cmd, CLIENT_COMMANDS):
        _remember(state, cmd.rid, cmd.now, result)
    return result


def _remember(state: State, rid: str, now: int, result: Result) -> None:
    recent = state.recent
    recent[rid] = (now, result)
    horizon = now - DEDUP_WINDOW_MS
    while recent:
        first = next(iter(recent))
        if recent[first][0] >= horizon:
            break
        del recent[first]


def _dispatch(state: State, cmd: c.Command, index: int, events: list[LeaderEvent]) -> Result:
    if isinstance(cmd, c.Barrier):
        return Ok(index)
    if isinstance(cmd, c.Claim):
        if cmd.term < state.leader_term:
            return Rejected(STALE_LEADER, f"claim for term {cmd.term} after term {state.leader_term}")
        state.leader_fence, state.leader_node = index, cmd.node
        state.leader_http, state.leader_term = cmd.http, cmd.term
        return Ok(index)
    if isinstance(cmd, c.Submit):
        return _submit(state, cmd, events)
    if isinstance(cmd, c.CancelJob):
        return _cancel_job(state, cmd, events)
    # Everything below is a leader command: fenced.
    if cmd.lf != state.leader_fence:
        return Rejected(
            STALE_LEADER,
            f"leader fence {cmd.lf} is not the current leader fence {state.leader_fence}",
        )
    if isinstance(cmd, c.Fire):
        return Ok([_fire(state, rid, cmd.now, events) for rid in cmd.run_ids])
    if isinstance(cmd, c.Lease):
        return Ok([_lease(state, rid, wid, cmd.now, index, events) for rid, wid in cmd.grants])
    if isinstance(cmd, c.Complete):
        return _complete(state, cmd, events)
    return _fail(state, cmd, events)


# -- submission and cancellation --------------------------------------------------------------

def _submit(state: State, cmd: c.Submit, events: list[LeaderEvent]) -> Result:
    # Validate the whole batch first: all or nothing.
    created: list[tuple[Job, bool]] = []
    batch_ids: set[str] = set()
    for i, (job_id, spec) in enumerate(cmd.jobs):
        prefix = f"jobs[{i}]." if len(cmd.jobs) > 1 else ""
        if job_id in state.jobs or job_id in batch_ids:
            return Rejected("conflict", f"job id {job_id} already exists", f"{prefix}id")
        batch_ids.add(job_id)
        if spec.schedule.kind in (ScheduleKind.EVERY, ScheduleKind.CRON):
            return Rejected(
                "invalid_argument",
                "recurring schedules (every, cron) are not supported by this version yet; "
                "expected one of: none (run now), at, in",
                f"{prefix}schedule",
            )
        if spec.depends_on:
            return Rejected(
                "invalid_argument",
                "depends_on is not supported by this version yet; expected an empty list",
                f"{prefix}depends_on",
            )
    for job_id, spec in cmd.jobs:
        if spec.idempotency_key is not None:
            existing = state.idempotency.get(f"{spec.namespace}\0{spec.idempotency_key}")
            if existing is not None:
                created.append((state.jobs[existing], False))
                continue
        job = _create_job(state, job_id, spec, cmd.now, events)
        created.append((job, True))
    return Ok(created)


def _create_job(state: State, job_id: str, spec: JobSpec, now: int, events: list[LeaderEvent]) -> Job:
    first = spec.schedule.at_ms if spec.schedule.at_ms is not None else now
    run = Run(
        id=run_id_for(job_id, first),
        job_id=job_id,
        namespace=spec.namespace,
        scheduled_ms=first,
        due_ms=first,
        state=RunState.SCHEDULED,
        created_ms=now,
        updated_ms=now,
    )
    job = Job(job_id, spec, JobStatus.ACTIVE, now, now, next_run_at_ms=first, last_run_id=run.id)
    state.jobs[job_id] = job
    state.job_order.append(job_id)
    state.runs[run.id] = run
    state.job_runs[job_id] = [run.id]
    if spec.idempotency_key is not None:
        state.idempotency[f"{spec.namespace}\0{spec.idempotency_key}"] = job_id
    events.append(("due", run.id, first))
    return job


def _cancel_job(state: State, cmd: c.CancelJob, events: list[LeaderEvent]) -> Result:
    job = state.jobs.get(cmd.job_id)
    if job is None:
        return Rejected("not_found", f"no job with id {cmd.job_id}", "id")
    if job.status in (JobStatus.CANCELLED, JobStatus.DONE):
        return Ok(job)
    for run_id in state.job_runs.get(job.id, ()):
        run = state.runs[run_id]
        target = next_state(run.state, Event.CANCEL)
        if isinstance(target, BadTransition):
            continue
        attempts = run.attempts
        if run.state is RunState.RUNNING and run.current is not None:
            events.append(("stop", run.id, run.current.fence))
            attempts = attempts[:-1] + (
                replace(run.current, ended_ms=cmd.now, outcome=AttemptOutcome.CANCELLED),
            )
        state.runs[run_id] = replace(
            run, state=target, updated_ms=cmd.now, attempts=attempts, reason="job cancelled"
        )
        events.append(("gone", run_id))
    job = replace(job, status=JobStatus.CANCELLED, updated_ms=cmd.now, next_run_at_ms=None)
    state.jobs[job.id] = job
    return Ok(job)


# -- the leader's commands ---------------------------------------------------------------------

def _fire(state: State, run_id: str, now: int, events: list[LeaderEvent]) -> Result:
    run = state.runs.get(run_id)
    if run is None:
        return Rejected("not_found", f"no run {run_id}")
    if run.due_ms > now:
        return Rejected("conflict", f"run {run_id} is not due before {run.due_ms}")
    target = next_state(run.state, Event.FIRE)
    if isinstance(target, BadTransition):
        return Rejected("conflict", target.message)
    state.runs[run_id] = replace(run, state=target, updated_ms=now)
    spec = state.jobs[run.job_id].spec
    events.append(("ready", run_id, spec.queue, spec.priority))
    return Ok(run_id)


def _lease(
    state: State, run_id: str, worker_id: str, now: int, fence: int, events: list[LeaderEvent]
) -> Result:
    run = state.runs.get(run_id)
    if run is None:
        return Rejected("not_found", f"no run {run_id}")
    target = next_state(run.state, Event.LEASE)
    if isinstance(target, BadTransition):
        return Rejected("conflict", target.message)
    job = state.jobs[run.job_id]
    timeout = job.spec.timeout_ms
    attempt = Attempt(
        number=len(run.attempts) + 1,
        fence=fence,
        worker_id=worker_id,
        leased_ms=now,
        deadline_ms=now + timeout if timeout else None,
    )
    state.runs[run_id] = replace(run, state=target, updated_ms=now, attempts=run.attempts + (attempt,))
    events.append(("leased", run_id))
    return Ok(attempt)


def _already_ended(run: Run, fence: int, outcomes: tuple[AttemptOutcome, ...]) -> bool:
    """A repeated result for an attempt that already ended that way (a worker re-sending after
    a failover, when the first ack was lost) is accepted again, changing nothing."""
    attempt = next((a for a in reversed(run.attempts) if a.fence == fence), None)
    return attempt is not None and attempt.outcome in outcomes


def _running(state: State, run_id: str, fence: int) -> Run | Rejected:
    run = state.runs.get(run_id)
    if run is None:
        return Rejected("not_found", f"no run {run_id}")
    if run.current is None or run.current.fence != fence:
        return Rejected("stale_fence", f"fence {fence} is not the current lease of {run_id} ({run.fence})")
    if run.state is not RunState.RUNNING:
        return Rejected("stale_fence", f"run {run_id} is {run.state}, not running")
    return run


def _end_attempt(run: Run, now: int, outcome: AttemptOutcome, error: str | None) -> tuple[Attempt, ...]:
    assert run.current is not None
    ended = replace(run.current, ended_ms=now, outcome=outcome, error=error)
    return run.attempts[:-1] + (ended,)


def _complete(state: State, cmd: c.Complete, events: list[LeaderEvent]) -> Result:
    run = _running(state, cmd.run_id, cmd.fence)
    if isinstance(run, Rejected):
        done = state.runs.get(cmd.run_id)
        if done is not None and _already_ended(done, cmd.fence, (AttemptOutcome.SUCCEEDED,)):
            return Ok(cmd.run_id)
        return run
    attempts = _end_attempt(run, cmd.now, AttemptOutcome.SUCCEEDED, None)
    state.runs[run.id] = replace(
        run, state=RunState.SUCCEEDED, updated_ms=cmd.now, attempts=attempts, result=cmd.result,
        error=None,
    )
    _finish_job(state, run.job_id, cmd.now)
    events.append(("gone", run.id))
    return Ok(run.id)


def _fail(state: State, cmd: c.Fail, events: list[LeaderEvent]) -> Result:
    run = _running(state, cmd.run_id, cmd.fence)
    if isinstance(run, Rejected):
        done = state.runs.get(cmd.run_id)
        outcomes = tuple(o for o in AttemptOutcome if o.value == cmd.outcome)
        if done is not None and _already_ended(done, cmd.fence, outcomes):
            return Ok(cmd.run_id)
        return run
    try:
        outcome = AttemptOutcome(cmd.outcome)
    except ValueError:
        return Rejected("invalid_argument", f"unknown attempt outcome {cmd.outcome!r}")
    job = state.jobs[run.job_id]
    attempts = _end_attempt(run, cmd.now, outcome, cmd.error)
    if cmd.retryable and len(attempts) < job.spec.retry.max_attempts:
        due = cmd.now + backoff_ms(job.spec, len(attempts), cmd.rand)
        state.runs[run.id] = replace(
            run, state=RunState.RETRYING, updated_ms=cmd.now, attempts=attempts,
            due_ms=due, error=cmd.error,
        )
        state.jobs[job.id] = replace(job, next_run_at_ms=due, updated_ms=cmd.now)
        events.append(("due", run.id, due))
        return Ok(run.id)
    state.runs[run.id] = replace(
        run, state=RunState.FAILED, updated_ms=cmd.now, attempts=attempts, error=cmd.error
    )
    state.dlq[run.id] = None
    _finish_job(state, run.job_id, cmd.now)
    events.append(("gone", run.id))
    return Ok(run.id)


def _finish_job(state: State, job_id: str, now: int) -> None:
    job = state.jobs[job_id]
    if job.status is JobStatus.ACTIVE:
        state.jobs[job_id] = replace(job, status=JobStatus.DONE, updated_ms=now, next_run_at_ms=None)
