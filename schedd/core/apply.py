"""``apply``: one command against the state.  Deterministic (time comes in the command) and
total (a bad command is a :class:`Rejected` value; nothing escapes into Raft).
"""

from __future__ import annotations

from dataclasses import replace

from schedd.core import commands, history, members, runs
from schedd.core.events import next_stamp
from schedd.core.graph import find_cycle, format_cycle
from schedd.core.model import Job, JobSpec, JobStatus, Run, evolve
from schedd.core.state import (
    STALE_LEADER,
    CapsChanged,
    LeaderEvent,
    Ok,
    Rejected,
    Result,
    State,
)
from schedd.errors import Code

# Commands a client may repeat after a lost reply: their results are remembered by request id.
# Leader commands are not (they are fenced, and a repeat is judged on the run's state).
#: leader claims kept in ``state.leader_claims`` (for the term changes on a run's timeline)
MAX_CLAIMS = 100

CLIENT_COMMANDS = (
    commands.Submit,
    commands.CancelJob,
    commands.UpdateJob,
    commands.Trigger,
    commands.CancelRun,
    commands.Replay,
    commands.DropDead,
    commands.DeadLetters,
)
ClientCommand = (
    commands.Submit
    | commands.CancelJob
    | commands.UpdateJob
    | commands.Trigger
    | commands.CancelRun
    | commands.Replay
    | commands.DeadLetters
    | commands.DropDead
)


def apply_entry(
    state: State,
    blob: object,
    index: int,
    decoded: list[commands.Command] | None = None,
) -> tuple[list[Result], list[LeaderEvent]]:
    """Apply one Raft entry at log ``index``.  Total: never raises.  ``decoded``: the entry's
    commands as the node that encoded ``blob`` held them (equal to what decoding it gives),
    so that node does not decode its own entry again."""
    events: list[LeaderEvent] = []
    state.applied_index = index
    cmds = commands.decode_entry(blob) if decoded is None else decoded
    position = index
    if state.stamped:
        now = max((c.now for c in cmds if not isinstance(c, commands.Undecodable)), default=0)
        state.stamp = position = next_stamp(state.stamp, now)
    results = [apply(state, cmd, index, events) for cmd in cmds]
    if state.changes is not None:
        state.changes.end(position)
    return results, events


def apply(
    state: State,
    cmd: commands.Command | commands.Undecodable,
    index: int,
    events: list[LeaderEvent],
) -> Result:
    if isinstance(cmd, commands.Undecodable):
        return Rejected(Code.INVALID_ARGUMENT, f"undecodable command: {cmd.reason}")
    client = isinstance(cmd, CLIENT_COMMANDS)
    if client or isinstance(cmd, commands.Claim | commands.Barrier):
        state.make_visible()
    seen = state.recall(cmd.rid) if cmd.rid and client else None  # (only theirs are kept)
    if seen is not None:
        return _recalled(state, seen) if isinstance(cmd, commands.Submit) else seen
    mark = len(events)
    try:
        result = _dispatch(state, cmd, index, events)
    except Exception as exc:  # noqa: BLE001 - apply must be total: an exception would wedge Raft
        del events[mark:]
        result = Rejected(
            Code.INTERNAL, f"{type(cmd).__name__} failed: {type(exc).__name__}: {exc}"
        )
    if cmd.rid and client:
        state.remember(cmd.rid, cmd.now, _to_remember(cmd, result))
    return result


def _to_remember(cmd: commands.Command, result: Result) -> Result:
    """What is kept of ``result`` for a repeat of ``cmd``.  A submit's jobs are kept by id (with
    whether each was created): the jobs themselves are in the state, and a batch's full records
    would double what the node writes for it."""
    if isinstance(cmd, commands.Submit) and isinstance(result, Ok):
        return Ok([(job.id, created) for job, created, _ in result.value])
    return result


def _recalled(state: State, seen: Result) -> Result:
    """A repeated submit's answer: its jobs as they are now, each with its latest run.
    (Results remembered by an earlier version hold the jobs themselves, as they were.)"""
    if not isinstance(seen, Ok) or not isinstance(seen.value, list):
        return seen  # not a submit's (the only client answer that is a list): the request id
        # was used before for another command
    out: list[tuple[Job, bool, Run | None]] = []
    for ref, created in seen.value:
        job = ref if isinstance(ref, Job) else state.jobs.get(ref)
        if job is None:
            return Rejected(
                Code.NOT_FOUND,
                f"this request was applied, but its job {ref} has been "
                "forgotten since (history.retention)",
                "id",
            )
        out.append((job, created, state.latest_run(job.id)))
    return Ok(out)


def _dispatch(state: State, cmd: commands.Command, index: int, events: list[LeaderEvent]) -> Result:
    if isinstance(cmd, commands.Barrier):
        return Ok(index)
    if isinstance(cmd, commands.Claim):
        if cmd.term < state.leader_term:
            return Rejected(
                STALE_LEADER, f"claim for term {cmd.term} after term {state.leader_term}"
            )
        state.leader_fence, state.leader_node = index, cmd.node
        state.leader_http, state.leader_term = cmd.http, cmd.term
        claim = (cmd.term, cmd.node, index, cmd.now)
        state.leader_claims = (*state.leader_claims[-(MAX_CLAIMS - 1) :], claim)
        if state.changes is not None:
            state.changes.cluster(cmd.node, cmd.term, cmd.http)
        return Ok(index)
    if isinstance(cmd, CLIENT_COMMANDS):
        return _client(state, cmd, events)
    # Everything else is a leader command: fenced.
    if cmd.lf != state.leader_fence:
        return Rejected(
            STALE_LEADER,
            f"leader fence {cmd.lf} is not the current leader fence {state.leader_fence}",
        )
    if isinstance(cmd, commands.Fire):
        return Ok([runs.fire(state, rid, cmd.now, events) for rid in cmd.run_ids])
    if isinstance(cmd, commands.LeaseRuns):
        return Ok([runs.lease(state, rid, wid, cmd.now, index, events) for rid, wid in cmd.grants])
    if isinstance(cmd, commands.CompleteRun):
        return runs.complete(
            state, cmd.run_id, cmd.fence, cmd.result, cmd.now, events, cmd.progress
        )
    if isinstance(cmd, commands.Progress):
        return Ok(
            [
                runs.record_progress(state, rid, fence, value, cmd.now)
                for rid, fence, value in cmd.updates
            ]
        )
    if isinstance(cmd, commands.Heal):
        return runs.heal(state, cmd.job_id, cmd.now, events)
    if isinstance(cmd, commands.Purge):
        return history.purge(state, cmd.before_ms, cmd.keep, cmd.limit)
    if isinstance(cmd, commands.Members):  # (rare: after the commands of the hot path)
        return _members(state, cmd, index)
    if isinstance(cmd, commands.CapsGive | commands.CapsTake | commands.CapsDelivered):
        return _caps(state, cmd, index, events)
    return runs.fail(
        state,
        cmd.run_id,
        cmd.fence,
        cmd.error,
        cmd.retryable,
        cmd.outcome,
        cmd.rand,
        cmd.now,
        events,
        cmd.traceback,
        cmd.progress,
    )


def _caps(
    state: State,
    cmd: commands.CapsGive | commands.CapsTake | commands.CapsDelivered,
    index: int,
    events: list[LeaderEvent],
) -> Result:
    """A move of concurrency slots between shards (schedd.core.allowances)."""
    numbers = [getattr(cmd, f) for f in ("amount", "dest", "source", "seq") if hasattr(cmd, f)]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
        # (kept in the ledger and read back at every start: never anything but integers)
        return Rejected(Code.INVALID_ARGUMENT, "a transfer's shards, seq and amount are integers")
    ledger = state.caps
    if isinstance(cmd, commands.CapsDelivered):
        state.caps = ledger.delivered(cmd.dest, cmd.seq)
        if state.caps is not ledger:
            events.append(CapsChanged(state.caps))
        return Ok(cmd.seq)
    if cmd.amount <= 0 or not isinstance(cmd.namespace, str) or not cmd.namespace:
        return Rejected(Code.INVALID_ARGUMENT, "a transfer moves a positive number of slots")
    if isinstance(cmd, commands.CapsGive):
        state.caps = ledger.give(index, cmd.namespace, cmd.amount, cmd.dest)
        events.append(CapsChanged(state.caps))
        return Ok(index)
    taken = ledger.take(cmd.source, cmd.seq, cmd.namespace, cmd.amount)
    if taken is None:
        return Ok(False)  # credited before
    state.caps = taken
    events.append(CapsChanged(state.caps))
    return Ok(True)


def _members(state: State, cmd: commands.Members, index: int) -> Result:
    """A membership change: applied only on the membership it was computed from."""
    base = 0 if state.members is None else state.members.index
    if cmd.base != base:
        return Rejected(
            Code.CONFLICT,
            f"another membership change was applied first (at index {base}, this one was "
            f"made for {cmd.base}); look again (schedctl node list) and retry",
        )
    try:
        new = members.Membership.from_json(cmd.members)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        return Rejected(Code.INVALID_ARGUMENT, f"malformed membership: {exc}")
    problem = members.check(new, state.members)
    if problem is not None:
        return Rejected(Code.INVALID_ARGUMENT, problem)
    state.make_visible()  # read back at once (GET /cluster/nodes) on the leader
    state.members = replace(new, index=index)
    if state.changes is not None:
        state.changes.cluster(state.leader_node, state.leader_term, state.leader_http)
    return Ok(index)


def _client(state: State, cmd: ClientCommand, events: list[LeaderEvent]) -> Result:
    if isinstance(cmd, commands.Submit):
        return _submit(state, cmd, events)
    if isinstance(cmd, commands.CancelJob):
        return _cancel_job(state, cmd, events)
    if isinstance(cmd, commands.UpdateJob):
        return _update_job(state, cmd, events)
    if isinstance(cmd, commands.Trigger):
        return runs.trigger(state, cmd.job_id, cmd.now, cmd.override, events)
    if isinstance(cmd, commands.CancelRun):
        return runs.cancel_by_client(state, cmd.run_id, cmd.now, events)
    if isinstance(cmd, commands.Replay):
        return runs.replay(state, cmd.run_id, cmd.now, events)
    if isinstance(cmd, commands.DeadLetters):
        return _dead_letters(state, cmd, events)
    # DropDead, the last of CLIENT_COMMANDS (mypy checks that ClientCommand has no other)
    run = state.runs.get(cmd.run_id)
    if run is None or not state.in_dlq(cmd.run_id):
        return Rejected(
            Code.NOT_FOUND, f"run {cmd.run_id} is not in the dead-letter queue", "run_id"
        )
    state.dlq_remove(run)
    return Ok(cmd.run_id)


def _dead_letters(state: State, cmd: commands.DeadLetters, events: list[LeaderEvent]) -> Result:
    """Replay or drop each run of the list still in the dead-letter queue; the others are
    skipped (replayed or dropped since the list was made).  ``Ok((done, skipped, [[task,
    count], ...]))``, the tasks by name."""
    if cmd.action not in ("replay", "drop"):
        return Rejected(
            Code.INVALID_ARGUMENT, f"action: expected replay or drop, got {cmd.action!r}", "action"
        )
    done: list[str] = []
    skipped: list[str] = []
    tasks: dict[str, int] = {}
    for run_id in cmd.run_ids:
        run = state.runs.get(run_id)
        if run is None or not state.in_dlq(run_id):
            skipped.append(run_id)
            continue
        if cmd.action == "replay":
            if isinstance(runs.replay(state, run_id, cmd.now, events), Rejected):
                skipped.append(run_id)  # not replayed: not counted as done
                continue
        else:
            state.dlq_remove(run)
        done.append(run_id)
        job = state.jobs.get(run.job_id)
        task = "" if job is None else job.spec.task
        tasks[task] = tasks.get(task, 0) + 1
    return Ok((done, skipped, [[task, n] for task, n in sorted(tasks.items())]))


# -- submission, update, cancellation ---------------------------------------------------------


def _check_dependencies(state: State, cmd: commands.Submit) -> Rejected | None:
    batch = {job_id: spec for job_id, spec in cmd.jobs}
    for i, (_, spec) in enumerate(cmd.jobs):
        prefix = f"jobs[{i}]." if len(cmd.jobs) > 1 else ""
        for k, dep in enumerate(spec.depends_on):
            other = batch.get(dep) or (state.jobs[dep].spec if dep in state.jobs else None)
            if other is None:
                return Rejected(
                    Code.NOT_FOUND, f"depends_on: no job with id {dep}", f"{prefix}depends_on[{k}]"
                )
            if other.namespace != spec.namespace:
                return Rejected(
                    Code.INVALID_ARGUMENT,
                    f"depends_on: job {dep} is in namespace {other.namespace}, expected jobs of "
                    f"the same namespace ({spec.namespace})",
                    f"{prefix}depends_on[{k}]",
                )
    # A cycle lies within the batch: every dependency of a job already stored was stored before
    # it or in its own batch (an unknown one is refused above, depends_on cannot be updated and a
    # job that others depend on is never forgotten), so no path from a stored job leads back to
    # a job being submitted.  Only the batch's own edges are searched: no stored job is read.
    cycle = find_cycle(
        {}, {job_id: spec.depends_on for job_id, spec in cmd.jobs if spec.depends_on}
    )
    if cycle:
        return Rejected(Code.CONFLICT, f"dependency cycle: {format_cycle(cycle)}", "depends_on")
    return None


def _check_keys(state: State, cmd: commands.Submit) -> Rejected | None:
    """A repeated idempotency key returns the job it made, but only for the same request: a key
    reused with another task or payload is a conflict (as Stripe answers), not that job."""
    for i, (_, spec) in enumerate(cmd.jobs):
        key = spec.idempotency_key
        existing = None if key is None else state.job_by_key(spec.namespace, key)
        if existing is None:
            continue
        old = state.jobs[existing].spec
        differs = [
            what
            for what, same in (
                ("task", old.task == spec.task),
                ("payload", old.payload == spec.payload),
            )
            if not same
        ]
        if differs:
            prefix = f"jobs[{i}]." if len(cmd.jobs) > 1 else ""
            return Rejected(
                Code.CONFLICT,
                f"idempotency_key {key!r} was already used in namespace {spec.namespace!r} for "
                f"job {existing} with another {' and '.join(differs)}: repeat the same request "
                "to get that job, or use a new key",
                f"{prefix}idempotency_key",
            )
    return None


def _submit(state: State, cmd: commands.Submit, events: list[LeaderEvent]) -> Result:
    # Validate the whole batch first: all or nothing.  The ids are new by construction
    # (schedd.ids: monotonic in the process that made them, 80 random bits a millisecond
    # across processes), so they are not looked up; one batch naming one twice is refused.
    if len(cmd.jobs) > 1:
        batch_ids: set[str] = set()
        for i, (job_id, _) in enumerate(cmd.jobs):
            if job_id in batch_ids:
                return Rejected(Code.CONFLICT, f"job id {job_id} already exists", f"jobs[{i}].id")
            batch_ids.add(job_id)
    problem = _check_dependencies(state, cmd) or _check_keys(state, cmd)
    if problem is not None:
        return problem
    created: list[tuple[Job, bool]] = []
    for job_id, spec in cmd.jobs:
        if spec.idempotency_key is not None:
            existing = state.job_by_key(spec.namespace, spec.idempotency_key)
            if existing is not None:
                created.append((state.jobs[existing], False))
                continue
        created.append((_create_job(state, job_id, spec, cmd.now, events), True))
    return Ok([(state.jobs[job.id], new, state.latest_run(job.id)) for job, new in created])


def _create_job(
    state: State, job_id: str, spec: JobSpec, now: int, events: list[LeaderEvent]
) -> Job:
    job = Job(job_id, spec, JobStatus.ACTIVE, now, now)
    state.add_job(job)
    runs.schedule_first(state, job, now, events)
    return state.jobs[job_id]


def _cancel_job(state: State, cmd: commands.CancelJob, events: list[LeaderEvent]) -> Result:
    job = state.jobs.get(cmd.job_id)
    if job is None:
        return Rejected(Code.NOT_FOUND, f"no job with id {cmd.job_id}", "id")
    if job.status in (JobStatus.CANCELLED, JobStatus.DONE) and not state.has_unfinished(job.id):
        return Ok(job)
    state.put_job(
        evolve(
            job,
            status=JobStatus.CANCELLED,
            updated_ms=cmd.now,
            next_run_at_ms=None,
            next_run_id=None,
        )
    )
    for run in state.unfinished_runs(job.id):
        runs.cancel_run(state, run.id, cmd.now, "job cancelled", events)
    return Ok(state.jobs[job.id])


def _update_job(state: State, cmd: commands.UpdateJob, events: list[LeaderEvent]) -> Result:
    job = state.jobs.get(cmd.job_id)
    if job is None:
        return Rejected(Code.NOT_FOUND, f"no job with id {cmd.job_id}", "id")
    if job.status in (JobStatus.CANCELLED, JobStatus.DONE):
        return Rejected(Code.CONFLICT, f"job {job.id} is {job.status}: it can no longer be changed")
    if cmd.spec is not None and cmd.spec != job.spec:
        problem = runs.change_spec(state, job, cmd.spec, cmd.now, events)
        if problem is not None:
            return problem
        job = state.jobs[job.id]
    if cmd.paused is True and job.status is JobStatus.ACTIVE:
        state.put_job(evolve(job, status=JobStatus.PAUSED, updated_ms=cmd.now))
    elif cmd.paused is False and job.status is JobStatus.PAUSED:
        state.put_job(evolve(job, status=JobStatus.ACTIVE, updated_ms=cmd.now))
        runs.resume(state, state.jobs[job.id], cmd.now, events)
    return Ok(state.jobs[job.id])
