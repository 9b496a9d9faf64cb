"""Run-level transitions: fire, lease, complete, fail, cancel, trigger, replay; and recurring jobs.

Pure and deterministic: called from ``apply`` with the command's time.  Decisions that matter
to users, in one place:

* **Fire** (a run's due time reached): a paused job's scheduled runs do not fire (they wait for
  resume).  A recurring run more than :data:`MISFIRE_GRACE_MS` late is a *misfire*: it and the
  occurrences missed since are planned by the job's misfire policy (skip / run_once / run_all
  within ``catchup_window``); runs to catch up are spaced :data:`CATCHUP_SPACING_MS` apart so
  recovery does not flood workers; the others are recorded as skipped (``misfire``, or
  ``paused`` when the job was paused).  Otherwise the job's overlap policy is judged on its
  live runs (queued, running or retrying, i.e. holding or waiting for a lease that expires on
  its own): ``allow``, ``skip``, ``buffer_one`` (at most one waits, blocked), ``cancel_other``.
  A job with dependencies is queued only once each upstream job's latest finished run
  succeeded; it is blocked until then, and skipped (``upstream_failed``) when one failed.
  Firing a recurring run materialises the next occurrence in the same entry: only the next
  one exists, and a leader change can neither lose it nor fire it twice (its id is
  ``<job>@<scheduled ms>``).
* **Retries** count attempts since the last replay from the dead-letter queue.
"""

from __future__ import annotations

from schedd.core.history import trim
from schedd.core.lifecycle import BadTransition, Event, next_state
from schedd.core.model import (
    MAX_REFUSALS,
    TERMINAL_RUN_STATES,
    Attempt,
    AttemptOutcome,
    Job,
    JobSpec,
    JobStatus,
    Overlap,
    RecurringOptions,
    Refusal,
    Run,
    RunState,
    ScheduleKind,
    evolve,
    run_id_for,
)
from schedd.core.recurrence import (
    Occurrence,
    Recurrence,
    next_occurrence,
    occurrences,
    plan_misfire,
    recurrence_from,
)
from schedd.core.state import (
    ACTIVE_STATES,
    LeaderEvent,
    Ok,
    Rejected,
    Result,
    RunDue,
    RunGone,
    RunLeased,
    RunReady,
    State,
    StopRun,
    backoff_ms,
)
from schedd.errors import Code

MISFIRE_GRACE_MS = 30_000  # later than this, a recurring fire is a misfire
CATCHUP_SPACING_MS = 200  # catch-up runs are spread this far apart
MAX_CATCHUP = 1000  # occurrences considered in one misfire decision
MAX_SKIPPED_PER_STEP = 1000  # dst_gap-skipped occurrences recorded while materialising
#: A run may be fired (and leased) at most this long before it is due, when ``may_fire_ahead``
#: allows it: the worker holds the lease and starts the handler at the due time by its own clock
#: (``lease.not_before``), so the handler starts on time instead of after the fire and lease
#: round trips.  The leader's ``scheduler.dispatch_ahead`` is at most this.
FIRE_AHEAD_MAX_MS = 2_000
RECURRING = (ScheduleKind.EVERY, ScheduleKind.CRON)


def is_recurring(spec: JobSpec) -> bool:
    return spec.schedule.kind in RECURRING


def recurrence(job: Job) -> Recurrence:
    s = job.spec.schedule
    # recurrence_from anchors an `every` with a start_at there itself
    anchor = job.anchor_ms if job.anchor_ms is not None else job.created_ms
    return recurrence_from(s, s.options or RecurringOptions(), anchor)


def may_fire_ahead(spec: JobSpec, run: Run) -> bool:
    """Whether ``run`` may fire before it is due (up to ``FIRE_AHEAD_MAX_MS``).  Not when firing
    decides something that the intervening time could change: the overlap policy of a recurring
    job (unless ``allow``), a triggered run's overlap, dependencies."""
    if spec.depends_on or run.origin == "trigger":
        return False
    if is_recurring(spec):
        return (spec.schedule.options or RecurringOptions()).overlap is Overlap.ALLOW
    return True


def _event_for(run: Run, spec: JobSpec, since_ms: int | None = None) -> LeaderEvent | None:
    if run.state in (RunState.SCHEDULED, RunState.RETRYING):
        return RunDue(run.id, run.due_ms, may_fire_ahead(spec, run))
    if run.state is RunState.QUEUED:
        return RunReady(run.id, spec.queue, spec.priority, spec.namespace, spec.task, since_ms)
    if run.state in TERMINAL_RUN_STATES or run.state is RunState.BLOCKED:
        return RunGone(run.id)
    return None


def _store(
    state: State,
    run: Run,
    events: list[LeaderEvent],
    *,
    new: bool = False,
    since_ms: int | None = None,
) -> Run:
    (state.add_run if new else state.put_run)(run)
    ev = _event_for(run, state.jobs[run.job_id].spec, since_ms)
    if ev is not None:
        events.append(ev)
    return run


def _move(
    state: State, run: Run, event: Event, now: int, events: list[LeaderEvent], **changes: object
) -> Run | Rejected:
    target = next_state(run.state, event)
    if isinstance(target, BadTransition):
        return Rejected(Code.CONFLICT, f"run {run.id}: {target.message}")
    moved = evolve(run, state=target, updated_ms=now, **changes)
    # A replayed or unblocked run could run from now on, not from its old due time: its
    # lease lag is counted from here (a fired one's from its due time).
    since = max(run.due_ms, now) if event in (Event.REPLAY, Event.UNBLOCK) else None
    _store(state, moved, events, since_ms=since)
    if target in TERMINAL_RUN_STATES:
        settle(state, moved, now, events)
    return moved


def _unique_id(state: State, job_id: str, scheduled_ms: int) -> tuple[str, int]:
    while run_id_for(job_id, scheduled_ms) in state.runs:
        scheduled_ms += 1
    return run_id_for(job_id, scheduled_ms), scheduled_ms


def _new_run(
    state: State,
    job: Job,
    scheduled_ms: int,
    due_ms: int,
    now: int,
    events: list[LeaderEvent],
    *,
    run_state: RunState = RunState.SCHEDULED,
    origin: str = "schedule",
    reason: str | None = None,
) -> Run:
    run_id, scheduled_ms = _unique_id(state, job.id, scheduled_ms)
    run = Run(
        id=run_id,
        job_id=job.id,
        namespace=job.spec.namespace,
        scheduled_ms=scheduled_ms,
        due_ms=due_ms,
        state=run_state,
        created_ms=now,
        updated_ms=now,
        origin=origin,
        reason=reason,
    )
    state.put_job(evolve(state.jobs[job.id], updated_ms=now))
    return _store(state, run, events, new=True)


# -- creating runs ------------------------------------------------------------------------------


def schedule_first(state: State, job: Job, now: int, events: list[LeaderEvent]) -> None:
    """The first run of a new job: at its time (one-off) or its first occurrence (recurring)."""
    if is_recurring(job.spec):  # the first occurrence strictly after the submission
        materialize_next(state, job.id, now, now, events)
        return
    first = job.spec.schedule.at_ms if job.spec.schedule.at_ms is not None else now
    run = _new_run(state, job, first, first, now, events)
    state.put_job(evolve(state.jobs[job.id], next_run_at_ms=first, next_run_id=run.id))


def materialize_next(
    state: State, job_id: str, after_ms: int, now: int, events: list[LeaderEvent]
) -> Run | None:
    """Create the next occurrence of a recurring job after ``after_ms`` (recording occurrences
    that DST skips); the job is done when its schedule is over."""
    job = state.jobs[job_id]
    rec = recurrence(job)
    for _ in range(MAX_SKIPPED_PER_STEP):
        occ = next_occurrence(rec, after_ms, job_id)
        if occ is None:
            state.put_job(
                evolve(state.jobs[job_id], next_run_id=None, next_run_at_ms=None, updated_ms=now)
            )
            if job.status is JobStatus.ACTIVE:
                state.put_job(evolve(state.jobs[job_id], status=JobStatus.DONE))
            return None
        if run_id_for(job_id, occ.scheduled_ms) in state.runs:  # a trigger, or recorded before
            after_ms = occ.scheduled_ms
            continue
        if occ.skipped is not None:
            _new_run(
                state,
                job,
                occ.scheduled_ms,
                occ.scheduled_ms,
                now,
                events,
                run_state=RunState.SKIPPED,
                reason=occ.skipped,
            )
            after_ms = occ.scheduled_ms
            continue
        run = _new_run(state, job, occ.scheduled_ms, occ.due_ms, now, events)
        state.put_job(evolve(state.jobs[job_id], next_run_id=run.id, next_run_at_ms=occ.due_ms))
        return run
    return None


def heal(state: State, job_id: str, now: int, events: list[LeaderEvent]) -> Result:
    """A recurring active job without a pending next occurrence gets one."""
    job = state.jobs.get(job_id)
    if job is None or job.status is not JobStatus.ACTIVE or not is_recurring(job.spec):
        return Rejected(Code.CONFLICT, f"job {job_id} does not need healing")
    pending = state.runs.get(job.next_run_id) if job.next_run_id else None
    if pending is not None and pending.state not in TERMINAL_RUN_STATES:
        return Ok(None)
    run = materialize_next(state, job_id, now, now, events)
    return Ok(None if run is None else run.id)


# -- fire -----------------------------------------------------------------------------------------


def fire(state: State, run_id: str, now: int, events: list[LeaderEvent]) -> Result:
    run = state.runs.get(run_id)
    if run is None:
        return Rejected(Code.NOT_FOUND, f"no run {run_id}")
    if run.due_ms > now and (
        run.due_ms - now > FIRE_AHEAD_MAX_MS or not may_fire_ahead(state.jobs[run.job_id].spec, run)
    ):
        return Rejected(Code.CONFLICT, f"run {run_id} is not due before {run.due_ms}")
    if run.state is RunState.RETRYING:
        moved = _move(state, run, Event.FIRE, now, events)
        return moved if isinstance(moved, Rejected) else Ok(run_id)
    if run.state is not RunState.SCHEDULED:
        return Rejected(Code.CONFLICT, f"run {run_id} is {run.state}, not scheduled")
    job = state.jobs[run.job_id]
    if job.status is JobStatus.PAUSED:
        return Rejected(Code.CONFLICT, f"job {job.id} is paused; its runs fire after resume")
    late = now - run.scheduled_ms > MISFIRE_GRACE_MS
    if is_recurring(job.spec) and run.origin == "schedule" and late:
        return _misfire(state, job, run, now, "misfire", events)
    result = _start(state, job, run, now, events, respect_overlap=True)
    if is_recurring(job.spec) and run.origin == "schedule" and job.next_run_id == run.id:
        materialize_next(state, job.id, run.scheduled_ms, now, events)
    return result


def _misfire(
    state: State, job: Job, run: Run, now: int, reason: str, events: list[LeaderEvent]
) -> Result:
    rec = recurrence(job)
    opts = job.spec.schedule.options or RecurringOptions()
    own = Occurrence(run.scheduled_ms, run.due_ms)
    missed = [own, *occurrences(rec, run.scheduled_ms, now, job.id, MAX_CATCHUP)]
    plan = plan_misfire(opts.misfire, missed, now, opts.catchup_window_ms)
    to_run = {o.scheduled_ms for o in plan.run}
    if run.scheduled_ms in to_run:
        _start(state, job, run, now, events, respect_overlap=True)
    else:
        _move(state, run, Event.SKIP, now, events, reason=reason)
    spacing = 0
    for occ in missed[1:]:
        if run_id_for(job.id, occ.scheduled_ms) in state.runs:
            continue
        if occ.scheduled_ms in to_run:
            spacing += CATCHUP_SPACING_MS
            _new_run(state, job, occ.scheduled_ms, now + spacing, now, events, origin="catchup")
        else:
            _new_run(
                state,
                job,
                occ.scheduled_ms,
                occ.scheduled_ms,
                now,
                events,
                run_state=RunState.SKIPPED,
                reason=occ.skipped or reason,
            )
    materialize_next(state, job.id, now, now, events)  # every missed one is <= now
    return Ok(run.id)


def _start(
    state: State, job: Job, run: Run, now: int, events: list[LeaderEvent], *, respect_overlap: bool
) -> Result:
    """Queue ``run`` if its dependencies and the job's overlap policy allow it."""
    deps = dependency_status(state, job)
    if deps == "failed":
        _move(state, run, Event.SKIP, now, events, reason="upstream_failed")
        return Ok(run.id)
    if deps == "pending":
        _move(state, run, Event.BLOCK, now, events, reason="dependencies")
        return Ok(run.id)
    if respect_overlap and (is_recurring(job.spec) or run.origin == "trigger"):
        live = [
            r for r in state.unfinished_runs(job.id) if r.id != run.id and r.state in ACTIVE_STATES
        ]
        policy = (job.spec.schedule.options or RecurringOptions()).overlap
        if live and policy is not Overlap.ALLOW:
            if policy is Overlap.SKIP:
                _move(state, run, Event.SKIP, now, events, reason="overlap")
                return Ok(run.id)
            if policy is Overlap.BUFFER_ONE:
                buffered = [
                    r
                    for r in state.unfinished_runs(job.id)
                    if r.state is RunState.BLOCKED and r.reason == "overlap"
                ]
                if buffered:
                    _move(state, run, Event.SKIP, now, events, reason="overlap")
                else:
                    _move(state, run, Event.BLOCK, now, events, reason="overlap")
                return Ok(run.id)
            for other in live:  # cancel_other
                cancel_run(state, other.id, now, "replaced by a newer run (overlap)", events)
    moved = _move(state, run, Event.FIRE, now, events)
    return moved if isinstance(moved, Rejected) else Ok(run.id)


def dependency_status(state: State, job: Job) -> str:
    """``ok`` when every upstream job's latest finished run succeeded, ``failed`` when one
    failed for good (or was cancelled or skipped), else ``pending``."""
    status = "ok"
    for dep in job.spec.depends_on:
        upstream = state.jobs.get(dep)
        if upstream is None or upstream.status is JobStatus.CANCELLED:
            return "failed"
        latest = state.latest_finished_run(dep)
        if latest is None:
            status = "pending"
        elif latest.state is not RunState.SUCCEEDED:
            return "failed"
    return status


# -- lease and results --------------------------------------------------------------------------


def lease(
    state: State, run_id: str, worker_id: str, now: int, fence: int, events: list[LeaderEvent]
) -> Result:
    run = state.runs.get(run_id)
    if run is None:
        return Rejected(Code.NOT_FOUND, f"no run {run_id}")
    target = next_state(run.state, Event.LEASE)
    if isinstance(target, BadTransition):
        return Rejected(Code.CONFLICT, target.message)
    timeout = state.jobs[run.job_id].spec.timeout_ms
    start = max(now, run.due_ms)  # a run leased ahead starts when it is due (lease.not_before)
    attempt = Attempt(
        number=len(run.attempts) + 1,
        fence=fence,
        worker_id=worker_id,
        leased_ms=start,
        deadline_ms=start + timeout if timeout else None,
    )
    state.put_run(evolve(run, state=target, updated_ms=now, attempts=(*run.attempts, attempt)))
    events.append(RunLeased(run_id))
    return Ok(attempt)


def _already_ended(run: Run, fence: int, outcome: AttemptOutcome) -> bool:
    """A repeated result for an attempt that already ended that way (a worker re-sending after
    a failover, when the first ack was lost) is accepted again, changing nothing."""
    attempt = next((a for a in reversed(run.attempts) if a.fence == fence), None)
    return attempt is not None and attempt.outcome is outcome


def _running(state: State, run_id: str, fence: int, outcome: AttemptOutcome | None) -> Run | Result:
    """The run whose current attempt ``fence`` is running, or what to answer instead: a result
    repeated for an attempt that already ended with ``outcome`` is accepted (None: never)."""
    run = state.runs.get(run_id)
    if run is None:
        return Rejected(Code.NOT_FOUND, f"no run {run_id}")
    if run.state is RunState.RUNNING and run.current is not None and run.current.fence == fence:
        return run
    if outcome is not None and _already_ended(run, fence, outcome):
        return Ok(run_id)
    if run.current is None or run.current.fence != fence:
        return Rejected(
            Code.STALE_FENCE, f"fence {fence} is not the current lease of {run_id} ({run.fence})"
        )
    return Rejected(Code.STALE_FENCE, f"run {run_id} is {run.state}, not running")


def _refused(
    state: State, run_id: str, fence: int, outcome: AttemptOutcome, now: int, answer: Result
) -> Result:
    """``answer`` to a result for ``run_id``; a worker's result refused for its stale fence is
    kept with the run (its latest :data:`MAX_REFUSALS`), for the run's timeline."""
    if (
        not isinstance(answer, Rejected)
        or answer.code != "stale_fence"
        or outcome not in (AttemptOutcome.SUCCEEDED, AttemptOutcome.FAILED)
    ):
        return answer
    run = state.runs[run_id]
    worker = next((a.worker_id for a in run.attempts if a.fence == fence), "")
    refusal = Refusal(fence, worker, outcome, now, answer.message)
    kept = (*run.refused[-(MAX_REFUSALS - 1) :], refusal)
    state.put_run(evolve(run, refused=kept, updated_ms=now))
    return answer


def _with_current(run: Run, **changes: object) -> tuple[Attempt, ...]:
    """The run's attempts with ``changes`` made to the current one (the last)."""
    assert run.current is not None
    return (*run.attempts[:-1], evolve(run.current, **changes))


def _progress_changes(progress: object, now: int) -> dict[str, object]:
    """A reported progress recorded at ``now`` (None: nothing reported, the attempt keeps its
    own)."""
    return {} if progress is None else {"progress": progress, "progress_ms": now}


def _end_attempt(
    run: Run,
    now: int,
    outcome: AttemptOutcome,
    error: str | None,
    traceback: str | None = None,
    progress: object = None,
) -> tuple[Attempt, ...]:
    return _with_current(
        run,
        ended_ms=now,
        outcome=outcome,
        error=error,
        traceback=traceback,
        **_progress_changes(progress, now),
    )


def record_progress(state: State, run_id: str, fence: int, progress: object, now: int) -> Result:
    """A worker's progress for the running attempt ``fence`` (a stale fence is refused: the
    attempt ended meanwhile, and its end recorded the final progress)."""
    run = _running(state, run_id, fence, None)
    if not isinstance(run, Run):
        return run
    state.put_run(evolve(run, attempts=_with_current(run, **_progress_changes(progress, now))))
    return Ok(run_id)


def complete(
    state: State,
    run_id: str,
    fence: int,
    result: object,
    now: int,
    events: list[LeaderEvent],
    progress: object = None,
) -> Result:
    run = _running(state, run_id, fence, AttemptOutcome.SUCCEEDED)
    if not isinstance(run, Run):
        return _refused(state, run_id, fence, AttemptOutcome.SUCCEEDED, now, run)
    attempts = _end_attempt(run, now, AttemptOutcome.SUCCEEDED, None, progress=progress)
    _move(state, run, Event.SUCCEED, now, events, attempts=attempts, result=result, error=None)
    return Ok(run_id)


def fail(
    state: State,
    run_id: str,
    fence: int,
    error: str,
    retryable: bool,
    outcome: AttemptOutcome,
    rand: float,
    now: int,
    events: list[LeaderEvent],
    traceback: str | None = None,
    progress: object = None,
) -> Result:
    run = _running(state, run_id, fence, outcome)
    if not isinstance(run, Run):
        return _refused(state, run_id, fence, outcome, now, run)
    spec = state.jobs[run.job_id].spec
    attempts = _end_attempt(run, now, outcome, error, traceback, progress)
    used = run.attempts_used  # the attempt just ended counts (its length is unchanged)
    if retryable and used < spec.retry.max_attempts:
        due = now + backoff_ms(spec, used, rand)
        _move(state, run, Event.RETRY, now, events, attempts=attempts, due_ms=due, error=error)
        if state.jobs[run.job_id].next_run_id == run.id:
            state.put_job(evolve(state.jobs[run.job_id], next_run_at_ms=due, updated_ms=now))
        return Ok(run_id)
    state.dlq_add(run)
    _move(state, run, Event.GIVE_UP, now, events, attempts=attempts, error=error)
    return Ok(run_id)


# -- cancel, trigger, replay, change ------------------------------------------------------------


def cancel_run(
    state: State, run_id: str, now: int, reason: str, events: list[LeaderEvent]
) -> Result:
    run = state.runs.get(run_id)
    if run is None:
        return Rejected(Code.NOT_FOUND, f"no run with id {run_id}", "run_id")
    if run.state in TERMINAL_RUN_STATES:
        return Ok(run_id)
    attempts = run.attempts
    if run.state is RunState.RUNNING and run.current is not None:
        events.append(StopRun(run.id, run.current.fence))
        attempts = _end_attempt(run, now, AttemptOutcome.CANCELLED, reason)
    moved = _move(state, run, Event.CANCEL, now, events, attempts=attempts, reason=reason)
    return moved if isinstance(moved, Rejected) else Ok(run_id)


def cancel_by_client(state: State, run_id: str, now: int, events: list[LeaderEvent]) -> Result:
    """``POST /runs/{id}/cancel``: that run only.  When it is the pending occurrence of a
    recurring job that goes on, the job's next occurrence after it is created at once (a
    cancelled occurrence is skipped, not the rest of the schedule)."""
    run = state.runs.get(run_id)
    result = cancel_run(state, run_id, now, "cancelled", events)
    if run is None or run.state in TERMINAL_RUN_STATES or isinstance(result, Rejected):
        return result
    job = state.jobs[run.job_id]
    if (
        job.next_run_id == run_id
        and is_recurring(job.spec)
        and job.status in (JobStatus.ACTIVE, JobStatus.PAUSED)
    ):
        materialize_next(state, job.id, run.scheduled_ms, now, events)
    return result


def trigger(
    state: State, job_id: str, now: int, override: bool, events: list[LeaderEvent]
) -> Result:
    job = state.jobs.get(job_id)
    if job is None:
        return Rejected(Code.NOT_FOUND, f"no job with id {job_id}", "id")
    if job.status is JobStatus.CANCELLED:
        return Rejected(Code.CONFLICT, f"job {job_id} is cancelled")
    run = _new_run(state, job, now, now, now, events, origin="trigger")
    _start(state, state.jobs[job_id], run, now, events, respect_overlap=not override)
    return Ok(state.runs[run.id])


def replay(state: State, run_id: str, now: int, events: list[LeaderEvent]) -> Result:
    run = state.runs.get(run_id)
    if run is None or not state.in_dlq(run_id):
        return Rejected(Code.NOT_FOUND, f"run {run_id} is not in the dead-letter queue", "run_id")
    state.dlq_remove(run)
    job = state.jobs[run.job_id]
    if job.status is JobStatus.DONE:
        state.put_job(evolve(job, status=JobStatus.ACTIVE, updated_ms=now))
    moved = _move(state, run, Event.REPLAY, now, events, attempt_base=len(run.attempts), error=None)
    return moved if isinstance(moved, Rejected) else Ok(state.runs[run_id])


def change_spec(
    state: State, job: Job, spec: JobSpec, now: int, events: list[LeaderEvent]
) -> Rejected | None:
    """Apply a new spec: it governs runs not yet started; a new schedule replaces the pending
    occurrence.  A one-off job whose run already started cannot change (409)."""
    if not is_recurring(job.spec):
        first = state.runs.get(job.next_run_id) if job.next_run_id else None
        if first is None or first.state not in (RunState.SCHEDULED, RunState.BLOCKED):
            return Rejected(
                Code.CONFLICT,
                f"job {job.id}: its run already started; an update "
                "applies only to runs not yet started",
            )
    state.put_job(evolve(job, spec=spec, updated_ms=now))
    if spec.schedule == job.spec.schedule:
        return None
    pending = state.runs.get(job.next_run_id) if job.next_run_id else None
    if pending is not None and pending.state in (RunState.SCHEDULED, RunState.BLOCKED):
        cancel_run(state, pending.id, now, "rescheduled", events)
    # a one-off job whose only run was just cancelled is not done: its new run follows
    state.put_job(
        evolve(state.jobs[job.id], status=job.status, next_run_id=None, next_run_at_ms=None)
    )
    if is_recurring(spec):
        state.put_job(evolve(state.jobs[job.id], anchor_ms=now))  # re-anchor `every`
        materialize_next(state, job.id, now, now, events)
    else:
        schedule_first(state, state.jobs[job.id], now, events)
    return None


def resume(state: State, job: Job, now: int, events: list[LeaderEvent]) -> None:
    """A resumed job's pending occurrence fires again; occurrences missed while paused are
    planned by the misfire policy and recorded as skipped with reason ``paused``."""
    pending = state.runs.get(job.next_run_id) if job.next_run_id else None
    if pending is None or pending.state is not RunState.SCHEDULED:
        if is_recurring(job.spec) and job.status is JobStatus.ACTIVE and pending is None:
            materialize_next(state, job.id, now, now, events)
        return
    if is_recurring(job.spec) and now - pending.scheduled_ms > MISFIRE_GRACE_MS:
        _misfire(state, job, pending, now, "paused", events)
    else:
        events.append(RunDue(pending.id, pending.due_ms, may_fire_ahead(job.spec, pending)))


# -- after a run finished -------------------------------------------------------------------------


def settle(state: State, run: Run, now: int, events: list[LeaderEvent]) -> None:
    """Consequences of ``run`` finishing: the job may be done, a buffered run may start,
    dependants may unblock or be skipped.  Iterative, so long dependency chains are fine."""
    work = [run]
    while work:
        finished = work.pop()
        trim(state, finished)
        job = state.jobs[finished.job_id]
        if (
            not is_recurring(job.spec)
            and job.status is JobStatus.ACTIVE
            and not state.has_unfinished(job.id)
        ):
            state.put_job(evolve(job, status=JobStatus.DONE, updated_ms=now, next_run_at_ms=None))
        unfinished = state.unfinished_runs(job.id)
        if not any(r.state in ACTIVE_STATES for r in unfinished):
            buffered = [
                r for r in unfinished if r.state is RunState.BLOCKED and r.reason == "overlap"
            ]
            if buffered:
                _unblock(state, buffered[0], now, events)
        for dependant in state.dependants_of(job.id):
            djob = state.jobs[dependant]
            waiting = [
                r
                for r in state.unfinished_runs(dependant)
                if r.state is RunState.BLOCKED and r.reason == "dependencies"
            ]
            if not waiting:
                continue
            status = dependency_status(state, djob)
            for r in waiting:
                if status == "ok":
                    _unblock(state, r, now, events)
                elif status == "failed":
                    skipped = evolve(
                        r, state=RunState.SKIPPED, updated_ms=now, reason="upstream_failed"
                    )
                    _store(state, skipped, events)
                    work.append(skipped)


def _unblock(state: State, run: Run, now: int, events: list[LeaderEvent]) -> None:
    """Queue a blocked run (a move that is not allowed from its state does nothing); its lease
    lag counts from now, the release (``_move``)."""
    _move(state, run, Event.UNBLOCK, now, events, reason=None)
