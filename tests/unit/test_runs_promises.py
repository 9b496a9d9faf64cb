"""The run lifecycle's promises that a mutation test found unheld, branch by branch: fire,
lease, results, retries, cancel, trigger, replay, heal, update, pause/resume, dependencies,
misfires and the end of a schedule.  Pure core, virtual time: every command carries its ``now``.
Every command goes through :class:`tests.unit.test_runs.Checked`, which also holds after each
entry the promises every command keeps (see its docstring).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from schedd.core import commands
from schedd.core.model import (
    TERMINAL_RUN_STATES,
    DstGap,
    JobSpec,
    JobStatus,
    Misfire,
    Overlap,
    Priority,
    RecurringOptions,
    RetryPolicy,
    RunState,
    Schedule,
    ScheduleKind,
)
from schedd.core.runs import CATCHUP_SPACING_MS, MISFIRE_GRACE_MS
from schedd.core.state import Ok, Rejected, RunDue, RunGone, RunLeased, RunReady
from tests.unit.test_runs import MIN, T0, Checked, cron, every, fire, lease, next_id, states
from tests.unit.test_state import Harness

HOUR = 60 * MIN


def at(ms: int, **kw: Any) -> JobSpec:
    return JobSpec(task="t", schedule=Schedule(kind=ScheduleKind.AT, at_ms=ms), **kw)


def utc(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def got(h: Harness, job: str = "J1") -> list[str]:
    """The job's runs oldest first, as "state" or "state:reason"."""
    return [f"{s}:{r}" if r else s for _, s, r in states(h, job)]


# -- what the leader is told ---------------------------------------------------------------------


def test_the_leader_is_told_where_each_run_waits_in_every_state() -> None:
    h = Checked()
    lf = h.claim()
    h.events.clear()
    h.submit(spec=JobSpec(task="t", namespace="ns", queue="q", priority=Priority.HIGH))
    rid = f"J1@{T0}"
    assert h.state.runs[rid].namespace == "ns"
    fire(h, lf, rid, T0)
    fence = lease(h, lf, rid, T0)
    h.one(commands.CompleteRun(h.rid(), T0 + 5, lf, rid, fence, None))
    assert h.events == [
        RunDue(rid, T0, True),
        RunReady(rid, "q", Priority.HIGH, "ns", "t"),
        RunLeased(rid),
        RunGone(rid),
    ]
    h.submit("A", at(T0 + HOUR), now=T0 + 6)
    h.submit("B", JobSpec(task="t", depends_on=("A",)), now=T0 + 6)
    h.events.clear()
    fire(h, lf, f"B@{T0 + 6}", T0 + 6)  # blocked on A: out of the wheel, not queued
    assert h.events == [RunGone(f"B@{T0 + 6}")]
    # A runs an hour later; B is released then, and its lease lag counts from its release,
    # not from its due time an hour before
    a = f"A@{T0 + HOUR}"
    fire(h, lf, a, T0 + HOUR)
    fence = lease(h, lf, a, T0 + HOUR)
    h.events.clear()
    h.one(commands.CompleteRun(h.rid(), T0 + HOUR + 9, lf, a, fence, None))
    [ready] = [e for e in h.events if isinstance(e, RunReady)]
    assert ready.run_id == f"B@{T0 + 6}" and ready.since_ms == T0 + HOUR + 9


def test_a_fire_batch_fires_every_run_it_can_whatever_the_others_are() -> None:
    h = Checked()
    lf = h.claim()
    h.submit("J1")
    h.submit("J2", at(T0 + HOUR))
    h.submit("J3")
    assert fire(h, lf, f"J1@{T0}", T0) == Ok(f"J1@{T0}")
    res = h.one(commands.Fire(h.rid(), T0, lf, ("J9@1", f"J1@{T0}", f"J2@{T0 + HOUR}", f"J3@{T0}")))
    assert [isinstance(r, Ok) for r in res.value] == [False, False, False, True]
    assert res.value[3] == Ok(f"J3@{T0}")
    assert [h.state.runs[r].state for r in (f"J1@{T0}", f"J2@{T0 + HOUR}", f"J3@{T0}")] == [
        RunState.QUEUED,
        RunState.SCHEDULED,
        RunState.QUEUED,
    ]


# -- lease ----------------------------------------------------------------------------------------


def test_a_lease_batch_leases_the_queued_runs_and_leaves_the_others_as_they_are() -> None:
    h = Checked()
    lf = h.claim()
    h.submit("J1")
    h.submit("J2")
    h.submit("J3", at(T0 + HOUR))
    running, queued, scheduled = f"J1@{T0}", f"J2@{T0}", f"J3@{T0 + HOUR}"
    h.start(lf, running, T0)
    fire(h, lf, queued, T0)
    before = {r: h.state.runs[r] for r in (running, scheduled)}
    res = h.one(
        commands.LeaseRuns(
            h.rid(),
            T0 + 1,
            lf,
            (("J9@1", "w2"), (running, "w2"), (scheduled, "w2"), (queued, "w2")),
        )
    )
    assert [isinstance(r, Ok) for r in res.value] == [False, False, False, True]
    assert {r: h.state.runs[r] for r in (running, scheduled)} == before
    run = h.state.runs[queued]
    assert run.state is RunState.RUNNING and run.current == res.value[3].value


def test_each_lease_of_a_retried_run_is_its_next_attempt_on_the_worker_that_took_it() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=JobSpec(task="t", retry=RetryPolicy(initial_ms=1000, jitter=False)))
    rid = f"J1@{T0}"
    fence = h.start(lf, rid, T0, worker="w1")
    h.one(commands.FailRun(h.rid(), T0 + 10, lf, rid, fence, "boom", True))
    h.start(lf, rid, T0 + 1010, worker="w2")
    assert [(a.number, a.worker_id) for a in h.state.runs[rid].attempts] == [(1, "w1"), (2, "w2")]


# -- worker results ---------------------------------------------------------------------------


def test_a_result_for_a_run_that_does_not_exist_is_refused_naming_the_run() -> None:
    h = Checked()
    lf = h.claim()
    assert h.one(commands.CompleteRun(h.rid(), T0, lf, "J9@1", 12, None)) == Rejected(
        "not_found", "no run J9@1"
    )


def test_a_result_of_an_older_lease_is_refused_naming_the_current_one() -> None:
    h = Checked()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    fence = h.start(lf, rid, T0)
    assert h.one(commands.FailRun(h.rid(), T0 + 1, lf, rid, fence - 1, "boom", True)) == Rejected(
        "stale_fence", f"fence {fence - 1} is not the current lease of {rid} ({fence})"
    )
    assert h.state.runs[rid].state is RunState.RUNNING


def test_the_result_of_a_run_cancelled_while_running_is_refused_and_it_stays_cancelled() -> None:
    h = Checked()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    fence = h.start(lf, rid, T0)
    assert h.one(commands.CancelRun(h.rid(), T0 + 1, rid)) == Ok(rid)
    assert [(a.outcome, a.error) for a in h.state.runs[rid].attempts] == [
        ("cancelled", "cancelled")
    ]
    # the worker finished before the stop reached it
    assert h.one(commands.CompleteRun(h.rid(), T0 + 2, lf, rid, fence, "done")) == Rejected(
        "stale_fence", f"run {rid} is cancelled, not running"
    )
    run = h.state.runs[rid]
    assert run.state is RunState.CANCELLED and run.result is None


def test_a_failure_re_sent_after_a_failover_is_acknowledged_again_and_changes_nothing() -> None:
    h = Checked()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    fence = h.start(lf, rid, T0)
    fail = commands.FailRun(h.rid(), T0 + 10, lf, rid, fence, "boom", True)
    assert h.one(fail) == Ok(rid)
    run = h.state.runs[rid]
    assert h.one(commands.FailRun(h.rid(), T0 + 20, lf, rid, fence, "boom", True)) == Ok(rid)
    assert h.state.runs[rid] == run


def test_a_run_shows_its_last_error_until_an_attempt_succeeds() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=JobSpec(task="t", retry=RetryPolicy(initial_ms=1000, jitter=False)))
    rid = f"J1@{T0}"
    now = T0
    for error in ("disk full", "oom"):
        fence = h.start(lf, rid, now)
        assert h.one(commands.FailRun(h.rid(), now + 10, lf, rid, fence, error, True)) == Ok(rid)
        run = h.state.runs[rid]
        assert (run.state, run.error) == (RunState.RETRYING, error)
        assert h.state.jobs["J1"].next_run_at_ms == run.due_ms  # the job shows when it retries
        now = run.due_ms
    fence = h.start(lf, rid, now)
    h.one(commands.CompleteRun(h.rid(), now + 10, lf, rid, fence, 42))
    run = h.state.runs[rid]
    assert (run.state, run.error, run.result) == (RunState.SUCCEEDED, None, 42)
    assert [(a.outcome, a.error) for a in run.attempts] == [
        ("failed", "disk full"),
        ("failed", "oom"),
        ("succeeded", None),
    ]


def test_a_run_that_fails_for_good_keeps_the_error_in_the_dead_letter_queue() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=JobSpec(task="t", retry=RetryPolicy(max_attempts=1)))
    rid = f"J1@{T0}"
    fence = h.start(lf, rid, T0)
    assert h.one(commands.FailRun(h.rid(), T0 + 10, lf, rid, fence, "ValueError: x", True)) == Ok(
        rid
    )
    run = h.state.runs[rid]
    assert (run.state, run.error, h.state.in_dlq(rid)) == (RunState.FAILED, "ValueError: x", True)
    assert [(a.outcome, a.error) for a in run.attempts] == [("failed", "ValueError: x")]


# -- cancel ---------------------------------------------------------------------------------------


def test_cancelling_a_finished_run_answers_its_id_and_changes_nothing() -> None:
    h = Checked()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    h.one(commands.CompleteRun(h.rid(), T0 + 1, lf, rid, h.start(lf, rid, T0), None))
    run = h.state.runs[rid]
    assert h.one(commands.CancelRun(h.rid(), T0 + 2, rid)) == Ok(rid)
    assert h.state.runs[rid] == run
    assert h.one(commands.CancelRun(h.rid(), T0 + 3, "J1@1")) == Rejected(
        "not_found", "no run with id J1@1", "run_id"
    )


def test_cancelling_a_run_waiting_for_its_retry_keeps_its_attempts_and_stops_no_worker() -> None:
    h = Checked()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    fence = h.start(lf, rid, T0)
    h.one(commands.FailRun(h.rid(), T0 + 10, lf, rid, fence, "boom", True))
    attempts = h.state.runs[rid].attempts
    h.events.clear()
    assert h.one(commands.CancelRun(h.rid(), T0 + 20, rid)) == Ok(rid)
    run = h.state.runs[rid]
    assert (run.state, run.reason, run.attempts) == (RunState.CANCELLED, "cancelled", attempts)
    assert h.events == [RunGone(rid)]


@pytest.mark.parametrize("paused", [False, True])
def test_cancelling_the_next_occurrence_of_a_recurring_job_schedules_the_one_after_it(
    paused: bool,
) -> None:
    h = Checked()
    h.claim()
    h.submit(spec=cron(), now=T0)
    if paused:
        h.one(commands.UpdateJob(h.rid(), T0, "J1", paused=True))
    rid = next_id(h)
    assert h.one(commands.CancelRun(h.rid(), T0 + 1, rid)) == Ok(rid)
    # that occurrence only: the schedule goes on (a paused job keeps its next one, unfired)
    assert states(h) == [(MIN, "cancelled", "cancelled"), (2 * MIN, "scheduled", None)]
    job = h.state.jobs["J1"]
    assert (job.next_run_id, job.next_run_at_ms) == (f"J1@{T0 + 2 * MIN}", T0 + 2 * MIN)
    assert job.status is (JobStatus.PAUSED if paused else JobStatus.ACTIVE)


def test_cancelling_a_recurring_job_s_fired_run_leaves_its_next_occurrence_alone() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=cron(), now=T0)
    fired = next_id(h)
    h.start(lf, fired, T0 + MIN)  # firing it materialised the next one
    pending = next_id(h)
    assert pending != fired
    assert h.one(commands.CancelRun(h.rid(), T0 + MIN + 1, fired)) == Ok(fired)
    assert next_id(h) == pending and h.state.runs[pending].state is RunState.SCHEDULED
    assert len(h.state.runs) == 2


# -- trigger --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job_id", "expected"),
    [
        ("J9", Rejected("not_found", "no job with id J9", "id")),
        ("J1", Rejected("conflict", "job J1 is cancelled")),
    ],
    ids=["unknown job", "cancelled job"],
)
def test_a_trigger_that_cannot_run_says_why(job_id: str, expected: Rejected) -> None:
    h = Checked()
    h.submit()
    h.one(commands.CancelJob(h.rid(), T0 + 1, "J1"))
    assert h.one(commands.Trigger(h.rid(), T0 + 2, job_id)) == expected
    assert len(h.state.runs) == 1


def test_two_triggers_in_one_millisecond_make_two_runs_a_millisecond_apart() -> None:
    h = Checked()
    h.claim()
    h.submit(spec=at(T0 + HOUR))
    first = h.trigger(T0 + 5)
    second = h.trigger(T0 + 5, override=True)
    assert (first.id, first.scheduled_ms) == (f"J1@{T0 + 5}", T0 + 5)
    assert (second.id, second.scheduled_ms) == (f"J1@{T0 + 6}", T0 + 6)
    assert second.state is RunState.QUEUED


def test_a_trigger_of_a_one_off_job_whose_run_is_live_is_skipped_unless_it_overrides() -> None:
    h = Checked()
    lf = h.claim()
    h.submit()
    h.start(lf, f"J1@{T0}", T0)
    respected = h.trigger(T0 + 5)
    assert (respected.state, respected.reason) == (RunState.SKIPPED, "overlap")
    assert h.trigger(T0 + 6, override=True).state is RunState.QUEUED


def test_a_triggered_run_retries_at_its_due_time_never_ahead_of_it() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=at(T0 + HOUR, retry=RetryPolicy(initial_ms=10_000, jitter=False)))
    rid = h.trigger(T0).id
    fence = lease(h, lf, rid, T0)
    h.events.clear()
    h.one(commands.FailRun(h.rid(), T0 + 10, lf, rid, fence, "boom", True))
    due = T0 + 10 + 10_000
    assert h.events == [RunDue(rid, due, False)]
    assert isinstance(fire(h, lf, rid, due - 1), Rejected)
    assert fire(h, lf, rid, due) == Ok(rid)


# -- replay ---------------------------------------------------------------------------------------


def test_only_a_run_in_the_dead_letter_queue_can_be_replayed() -> None:
    h = Checked()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    h.one(commands.CompleteRun(h.rid(), T0 + 1, lf, rid, h.start(lf, rid, T0), None))
    for run_id in (rid, "J9@1"):
        assert h.one(commands.Replay(h.rid(), T0 + 2, run_id)) == Rejected(
            "not_found", f"run {run_id} is not in the dead-letter queue", "run_id"
        )
    assert h.state.runs[rid].state is RunState.SUCCEEDED


def test_a_replayed_run_is_queued_without_its_old_error_and_its_job_is_active_again() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=JobSpec(task="t", retry=RetryPolicy(max_attempts=1)))
    rid = f"J1@{T0}"
    h.one(commands.FailRun(h.rid(), T0 + 1, lf, rid, h.start(lf, rid, T0), "boom", True))
    assert h.state.jobs["J1"].status is JobStatus.DONE
    res = h.one(commands.Replay(h.rid(), T0 + MIN, rid))
    run = h.state.runs[rid]
    assert res == Ok(run)
    assert (run.state, run.error) == (RunState.QUEUED, None)
    assert h.state.jobs["J1"].status is JobStatus.ACTIVE


def test_replaying_a_dead_run_of_a_paused_job_does_not_resume_the_job() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(
        spec=JobSpec(task="t", schedule=every(HOUR).schedule, retry=RetryPolicy(max_attempts=1))
    )
    rid = next_id(h)
    h.one(
        commands.FailRun(h.rid(), T0 + HOUR + 1, lf, rid, h.start(lf, rid, T0 + HOUR), "boom", True)
    )
    h.one(commands.UpdateJob(h.rid(), T0 + HOUR + 2, "J1", paused=True))
    assert isinstance(h.one(commands.Replay(h.rid(), T0 + HOUR + 3, rid)), Ok)
    assert h.state.runs[rid].state is RunState.QUEUED
    assert h.state.jobs["J1"].status is JobStatus.PAUSED


# -- heal -----------------------------------------------------------------------------------------


def test_healing_a_job_that_has_its_next_occurrence_changes_nothing() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=cron(), now=T0)
    # a leader that saw the job without it asks, and meanwhile it was created (or asks twice)
    assert h.one(commands.Heal(h.rid(), T0 + 5, lf, "J1")) == Ok(None)
    assert states(h) == [(MIN, "scheduled", None)]


@pytest.mark.parametrize("change", ["paused", "cancelled", "unknown"])
def test_only_an_active_recurring_job_is_healed(change: str) -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=cron(), now=T0)
    h.lose_next_occurrence("J1", T0 + 1)
    # the leader decided to heal it, then a client paused or cancelled it
    if change == "paused":
        h.one(commands.UpdateJob(h.rid(), T0 + 2, "J1", paused=True))
    elif change == "cancelled":
        h.one(commands.CancelJob(h.rid(), T0 + 2, "J1"))
    runs, jobs = dict(h.state.runs), dict(h.state.jobs)
    res = h.one(commands.Heal(h.rid(), T0 + 3, lf, "J9" if change == "unknown" else "J1"))
    assert isinstance(res, Rejected)
    assert (h.state.runs, h.state.jobs) == (runs, jobs)


def test_healing_a_job_whose_schedule_is_over_marks_it_done() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=every(MIN, end_at_ms=T0 + MIN + 1), now=T0)
    h.lose_next_occurrence("J1", T0 + 1)
    assert h.one(commands.Heal(h.rid(), T0 + 2 * MIN, lf, "J1")) == Ok(None)
    job = h.state.jobs["J1"]
    assert (job.status, job.next_run_id) == (JobStatus.DONE, None)


# -- the end of a schedule, DST -------------------------------------------------------------


def test_a_recurring_job_is_done_when_its_last_occurrence_fires() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=every(MIN, end_at_ms=T0 + 2 * MIN, overlap=Overlap.ALLOW), now=T0)
    fire(h, lf, next_id(h), T0 + MIN)
    last = next_id(h)
    assert last == f"J1@{T0 + 2 * MIN}"  # end_at is inclusive
    assert fire(h, lf, last, T0 + 2 * MIN) == Ok(last)
    job = h.state.jobs["J1"]
    assert (job.status, job.next_run_id, job.next_run_at_ms) == (JobStatus.DONE, None, None)
    assert job.updated_ms == T0 + 2 * MIN
    assert got(h) == ["queued", "queued"]  # the last run still runs


def test_an_occurrence_in_a_dst_gap_with_skip_is_recorded_skipped_and_the_next_one_waits() -> None:
    h = Checked()
    h.claim()
    spec = JobSpec(
        task="t",
        schedule=Schedule(
            kind=ScheduleKind.CRON,
            cron="30 2 * * *",
            timezone="Europe/Berlin",
            options=RecurringOptions(dst_gap=DstGap.SKIP),
        ),
    )
    now = utc("2026-03-28T02:00:00+00:00")  # 03:00 in Berlin; 02:30 does not exist tomorrow
    h.submit(spec=spec, now=now)
    gap, after = utc("2026-03-29T01:00:00+00:00"), utc("2026-03-30T00:30:00+00:00")
    runs = sorted(h.state.runs_of("J1"), key=lambda r: r.scheduled_ms)
    assert [(r.id, r.state, r.reason, r.due_ms) for r in runs] == [
        (f"J1@{gap}", RunState.SKIPPED, "dst_gap", gap),
        (f"J1@{after}", RunState.SCHEDULED, None, after),
    ]
    assert next_id(h) == f"J1@{after}"


def test_an_occurrence_already_taken_by_a_trigger_at_its_time_is_not_run_again() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=every(10_000, overlap=Overlap.ALLOW), now=T0)
    taken = h.trigger(T0 + 20_000)
    assert taken.id == f"J1@{T0 + 20_000}"
    fire(h, lf, f"J1@{T0 + 10_000}", T0 + 20_001)  # a little late, within the grace
    assert next_id(h) == f"J1@{T0 + 30_000}"
    assert [(o // 1000, s) for o, s, _ in states(h)] == [
        (10, "queued"),
        (20, "queued"),
        (30, "scheduled"),
    ]


# -- misfires -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("late", "expected"),
    [
        (MISFIRE_GRACE_MS, "queued"),
        (MISFIRE_GRACE_MS + 1, "skipped:misfire"),
    ],
)
def test_a_fire_is_a_misfire_only_when_more_than_the_grace_late(late: int, expected: str) -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=cron(misfire=Misfire.SKIP), now=T0)
    rid = next_id(h)
    assert fire(h, lf, rid, T0 + MIN + late) == Ok(rid)
    assert got(h) == [expected, "scheduled"]


def test_a_late_occurrence_run_by_the_misfire_policy_still_respects_overlap() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=every(HOUR, overlap=Overlap.SKIP), now=T0)
    h.start(lf, next_id(h), T0 + HOUR)  # still running an hour later
    late = next_id(h)
    assert fire(h, lf, late, T0 + 2 * HOUR + MISFIRE_GRACE_MS + 1) == Ok(late)
    assert got(h) == ["running", "skipped:overlap", "scheduled"]


def test_a_misfire_does_not_catch_up_an_occurrence_a_trigger_already_ran() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=every(10_000, overlap=Overlap.ALLOW, misfire=Misfire.RUN_ALL), now=T0)
    h.trigger(T0 + 20_000)
    now = T0 + 45_000  # 35 s late: 10, 20, 30, 40 s passed
    fire(h, lf, f"J1@{T0 + 10_000}", now)
    runs = {r.scheduled_ms - T0: r for r in h.state.runs_of("J1")}
    assert sorted(runs) == [10_000, 20_000, 30_000, 40_000, 50_000]
    assert [(runs[s].origin, runs[s].due_ms - now) for s in (20_000, 30_000, 40_000)] == [
        ("trigger", 20_000 - 45_000),
        ("catchup", CATCHUP_SPACING_MS),
        ("catchup", 2 * CATCHUP_SPACING_MS),
    ]


# -- pause and resume -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("late", "misfired"),
    [
        (MISFIRE_GRACE_MS, False),
        (MISFIRE_GRACE_MS + 1, True),
    ],
)
def test_a_resumed_job_misfires_its_pending_occurrence_only_when_more_than_the_grace_late(
    late: int, misfired: bool
) -> None:
    h = Checked()
    h.claim()
    h.submit(spec=cron(misfire=Misfire.SKIP), now=T0)
    rid = next_id(h)
    h.one(commands.UpdateJob(h.rid(), T0 + 1, "J1", paused=True))
    h.events.clear()
    h.one(commands.UpdateJob(h.rid(), T0 + MIN + late, "J1", paused=False))
    if misfired:
        assert got(h) == ["skipped:paused", "scheduled"]
    else:
        assert got(h) == ["scheduled"]
        assert h.events == [RunDue(rid, T0 + MIN, False)]


def test_a_resumed_one_off_job_runs_its_run_however_late() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=at(T0 + 10))
    h.one(commands.UpdateJob(h.rid(), T0, "J1", paused=True))
    h.events.clear()
    h.one(commands.UpdateJob(h.rid(), T0 + HOUR, "J1", paused=False))
    rid = f"J1@{T0 + 10}"
    assert h.events == [RunDue(rid, T0 + 10, True)]
    assert fire(h, lf, rid, T0 + HOUR) == Ok(rid)


def test_resuming_a_job_whose_run_already_fired_leaves_the_run_queued() -> None:
    h = Checked()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    fire(h, lf, rid, T0)
    h.one(commands.UpdateJob(h.rid(), T0 + 1, "J1", paused=True))  # a run already fired continues
    h.events.clear()
    h.one(commands.UpdateJob(h.rid(), T0 + 2, "J1", paused=False))
    assert h.events == []
    assert h.state.runs[rid].state is RunState.QUEUED


@pytest.mark.parametrize("then", ["resumed", "rescheduled"])
def test_a_paused_job_given_a_schedule_that_is_over_stays_paused_until_resumed_or_changed(
    then: str,
) -> None:
    h = Checked()
    h.claim()
    h.submit(spec=every(MIN), now=T0)
    h.one(commands.UpdateJob(h.rid(), T0 + 1, "J1", paused=True))
    assert isinstance(
        h.one(commands.UpdateJob(h.rid(), T0 + 2, "J1", spec=every(MIN, end_at_ms=T0 + 30_000))), Ok
    )
    job = h.state.jobs["J1"]
    assert (job.status, job.next_run_id, job.next_run_at_ms) == (JobStatus.PAUSED, None, None)
    if then == "resumed":
        h.one(commands.UpdateJob(h.rid(), T0 + 3, "J1", paused=False))
        assert h.state.jobs["J1"].status is JobStatus.DONE
    else:
        assert isinstance(h.one(commands.UpdateJob(h.rid(), T0 + 3, "J1", spec=every(MIN))), Ok)
        assert (h.state.jobs["J1"].status, next_id(h)) == (JobStatus.PAUSED, f"J1@{T0 + 3 + MIN}")


# -- update ---------------------------------------------------------------------------------------


def test_a_one_off_job_not_yet_started_takes_an_update() -> None:
    h = Checked()
    h.claim()
    h.submit(spec=at(T0 + HOUR))
    new = at(T0 + HOUR, payload={"n": 2})
    assert isinstance(h.one(commands.UpdateJob(h.rid(), T0 + 1, "J1", spec=new)), Ok)
    assert h.state.jobs["J1"].spec == new
    assert got(h) == ["scheduled"]


def test_an_update_of_a_one_off_job_whose_run_started_says_why_it_is_refused() -> None:
    h = Checked()
    lf = h.claim()
    h.submit()
    h.start(lf, f"J1@{T0}", T0)
    res = h.one(commands.UpdateJob(h.rid(), T0 + 1, "J1", spec=JobSpec(task="t", payload=1)))
    assert res == Rejected(
        "conflict",
        "job J1: its run already started; an update applies only to runs not yet started",
    )


def test_a_new_time_for_a_one_off_job_replaces_its_run_and_the_job_stays_active() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=at(T0 + HOUR))
    res = h.one(commands.UpdateJob(h.rid(), T0 + 1, "J1", spec=at(T0 + 2 * HOUR)))
    assert isinstance(res, Ok) and res.value.status is JobStatus.ACTIVE
    assert got(h) == ["cancelled:rescheduled", "scheduled"]
    assert next_id(h) == f"J1@{T0 + 2 * HOUR}"
    # it can be changed again, and is done once the new run finished
    assert isinstance(h.one(commands.UpdateJob(h.rid(), T0 + 2, "J1", spec=at(T0 + 3 * HOUR))), Ok)
    rid = next_id(h)
    h.one(
        commands.CompleteRun(
            h.rid(), T0 + 3 * HOUR + 1, lf, rid, h.start(lf, rid, T0 + 3 * HOUR), None
        )
    )
    assert h.state.jobs["J1"].status is JobStatus.DONE


def test_an_every_schedule_set_by_an_update_counts_from_the_update() -> None:
    h = Checked()
    h.claim()
    h.submit(spec=every(90_000), now=T0)
    h.one(commands.UpdateJob(h.rid(), T0 + 10_000, "J1", spec=every(MIN)))
    assert next_id(h) == f"J1@{T0 + 10_000 + MIN}"
    assert got(h) == ["scheduled", "cancelled:rescheduled"]  # at 70 s, and the one at 90 s


# -- dependencies ---------------------------------------------------------------------------------


def test_a_run_whose_upstream_already_failed_for_good_is_skipped() -> None:
    h = Checked()
    lf = h.claim()
    h.submit("A", JobSpec(task="t", retry=RetryPolicy(max_attempts=1)))
    h.one(
        commands.FailRun(h.rid(), T0 + 1, lf, f"A@{T0}", h.start(lf, f"A@{T0}", T0), "boom", True)
    )
    h.submit("B", JobSpec(task="t", depends_on=("A",)), now=T0 + 2)
    assert fire(h, lf, f"B@{T0 + 2}", T0 + 2) == Ok(f"B@{T0 + 2}")
    assert got(h, "B") == ["skipped:upstream_failed"]
    assert h.state.jobs["B"].status is JobStatus.DONE


def test_a_run_whose_upstream_job_was_cancelled_is_skipped_even_if_its_last_run_succeeded() -> None:
    h = Checked()
    lf = h.claim()
    h.submit("A", cron(), now=T0)
    ran = h.trigger(T0 + 1, "A").id
    h.one(commands.CompleteRun(h.rid(), T0 + 2, lf, ran, lease(h, lf, ran, T0 + 1), None))
    h.one(commands.CancelJob(h.rid(), T0 + 3, "A"))
    h.submit("B", JobSpec(task="t", depends_on=("A",)), now=T0 + 4)
    fire(h, lf, f"B@{T0 + 4}", T0 + 4)
    assert got(h, "B") == ["skipped:upstream_failed"]


def test_cancelling_one_waiting_run_of_a_dependant_leaves_the_others_waiting() -> None:
    h = Checked()
    lf = h.claim()
    h.submit("A", at(T0 + HOUR))
    h.submit("B", JobSpec(task="t", depends_on=("A",)))
    fire(h, lf, f"B@{T0}", T0)
    triggered = h.trigger(T0 + 1, "B").id
    assert got(h, "B") == ["blocked:dependencies", "blocked:dependencies"]
    h.one(commands.CancelRun(h.rid(), T0 + 2, triggered))
    assert h.state.runs[f"B@{T0}"].state is RunState.BLOCKED


def test_an_upstream_success_releases_every_dependant_waiting_for_it() -> None:
    h = Checked()
    lf = h.claim()
    h.submit("A")
    h.submit("B", at(T0 + HOUR, depends_on=("A",)))  # not due yet: nothing waits
    h.submit("C", JobSpec(task="t", depends_on=("A",)))
    fire(h, lf, f"C@{T0}", T0)
    h.one(commands.CompleteRun(h.rid(), T0 + 1, lf, f"A@{T0}", h.start(lf, f"A@{T0}", T0), None))
    assert got(h, "B") == ["scheduled"]
    assert got(h, "C") == ["queued"]


def test_an_upstream_success_does_not_release_a_run_buffered_behind_its_own_running_run() -> None:
    h = Checked()
    lf = h.claim()
    h.submit("A", now=T0)
    h.one(commands.CompleteRun(h.rid(), T0 + 1, lf, f"A@{T0}", h.start(lf, f"A@{T0}", T0), None))
    h.submit(
        "C",
        JobSpec(task="t", depends_on=("A",), schedule=cron(overlap=Overlap.BUFFER_ONE).schedule),
        now=T0,
    )
    h.start(lf, next_id(h, "C"), T0 + MIN)
    fire(h, lf, next_id(h, "C"), T0 + 2 * MIN)
    assert got(h, "C")[:2] == ["running", "blocked:overlap"]
    again = h.trigger(T0 + 2 * MIN + 1, "A").id
    h.one(
        commands.CompleteRun(
            h.rid(), T0 + 2 * MIN + 2, lf, again, lease(h, lf, again, T0 + 2 * MIN + 1), None
        )
    )
    assert got(h, "C")[:2] == ["running", "blocked:overlap"]


# -- one-off jobs ---------------------------------------------------------------------------------


def test_a_one_off_job_is_done_when_its_last_unfinished_run_finishes() -> None:
    h = Checked()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    fence = h.start(lf, rid, T0)
    extra = h.trigger(T0 + 1, override=True).id
    h.one(commands.CompleteRun(h.rid(), T0 + 2, lf, rid, fence, None))
    assert h.state.jobs["J1"].status is JobStatus.ACTIVE
    h.one(commands.CompleteRun(h.rid(), T0 + 4, lf, extra, lease(h, lf, extra, T0 + 3), None))
    job = h.state.jobs["J1"]
    assert (job.status, job.next_run_at_ms, job.updated_ms) == (JobStatus.DONE, None, T0 + 4)
    assert all(r.state in TERMINAL_RUN_STATES for r in h.state.runs.values())


@pytest.mark.parametrize("paused", [False, True])
def test_a_job_given_a_schedule_that_never_runs_shows_no_next_run(paused: bool) -> None:
    # The fifth Sunday of March is the last one, when Berlin's clocks skip 02:00-03:00.
    never = JobSpec(
        task="t",
        schedule=Schedule(
            kind=ScheduleKind.CRON,
            cron="30 2 * 3 sun#5",
            timezone="Europe/Berlin",
            options=RecurringOptions(dst_gap=DstGap.SKIP),
        ),
    )
    h = Checked()
    h.claim()
    h.submit(spec=cron(), now=T0)
    if paused:
        h.one(commands.UpdateJob(h.rid(), T0 + 1, "J1", paused=True))
    assert isinstance(h.one(commands.UpdateJob(h.rid(), T0 + 2, "J1", spec=never)), Ok)
    if paused:
        assert isinstance(h.one(commands.UpdateJob(h.rid(), T0 + 3, "J1", paused=False)), Ok)
    job = h.state.jobs["J1"]
    # no next run, not even the cancelled occurrence of the old schedule
    assert (job.status, job.next_run_at_ms, job.next_run_id) == (JobStatus.ACTIVE, None, None)
    assert not [r for r in h.state.runs.values() if r.state is RunState.SCHEDULED]


def test_an_occurrence_skipped_for_dst_is_recorded_once_when_the_job_is_healed() -> None:
    spec = JobSpec(
        task="t",
        schedule=Schedule(
            kind=ScheduleKind.CRON,
            cron="30 2 * * *",
            timezone="Europe/Berlin",
            options=RecurringOptions(dst_gap=DstGap.SKIP),
        ),
    )
    h = Checked()
    lf = h.claim()
    now = utc("2026-03-28T02:00:00+00:00")
    h.submit(spec=spec, now=now)  # records the skipped 29 March, schedules 30 March
    h.lose_next_occurrence("J1", now + 1)
    # a new leader heals the job before 29 March: it materialises from now again
    assert h.one(commands.Heal(h.rid(), now + 2, lf, "J1")) == Ok(
        f"J1@{utc('2026-03-31T00:30:00+00:00')}"
    )
    assert got(h) == ["skipped:dst_gap", "cancelled:cancelled", "scheduled"]
