"""Recurring jobs, misfires, overlap, pause/resume, dependencies, trigger, replay, update —
on virtual time: every command carries its ``now``."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from schedd.core import commands
from schedd.core.model import (
    AttemptOutcome,
    JobSpec,
    JobStatus,
    Misfire,
    Overlap,
    RecurringOptions,
    RetryPolicy,
    Run,
    RunState,
    Schedule,
    ScheduleKind,
)
from schedd.core.runs import CATCHUP_SPACING_MS, MISFIRE_GRACE_MS, cancel_run
from schedd.core.state import (
    LeaderEvent,
    Ok,
    Rejected,
    RunDue,
    RunReady,
    StopRun,
)
from tests.unit.test_state import Harness, lease_one

MIN = 60_000
T0 = 1_800_000_000_000 - (1_800_000_000_000 % MIN)  # a whole minute
WAITING = (RunState.SCHEDULED, RunState.RETRYING)


class Checked(Harness):
    """A :class:`Harness` that holds, after every entry, what every command promises whatever
    it does:

    * it does not fail inside ``apply`` (a bug there is a 500, or a half-applied entry whose
      leader events are dropped);
    * what it changes carries its time: a new run or job is created at ``now``, a changed run or
      job is updated at ``now``, an attempt it ends ends at ``now`` (``created_at``,
      ``updated_at``, ``ended_at`` in the API: times, never null);
    * a job's ``next_run_at`` is its pending run's due time, and a finished job has none;
    * the leader's timing wheel and ready queues, rebuilt only from the events the way the leader
      does (``Leader.on_events``, ``Leader._fired``), agree with the state: a due or retrying
      run waits in the wheel at its due time, a queued run is in the ready queue of its queue,
      priority and namespace, and nothing else is in either.
    """

    def __init__(self) -> None:
        super().__init__()
        self.wheel: dict[str, int] = {}  # run id -> due ms, as the leader's timing wheel holds it
        self.ready: dict[str, tuple[str, str, str]] = {}  # run id -> (queue, priority, namespace)

    def apply(self, *cmds: commands.Command) -> list[Any]:
        runs, jobs, mark = dict(self.state.runs), dict(self.state.jobs), len(self.events)
        fired = cmds[0].run_ids if len(cmds) == 1 and isinstance(cmds[0], commands.Fire) else ()
        for rid in fired:  # the leader's wheel hands out what it fires
            self.wheel.pop(rid, None)
        results = super().apply(*cmds)
        for res in results:
            for one in res.value if isinstance(res, Ok) and isinstance(res.value, list) else [res]:
                assert not (isinstance(one, Rejected) and one.code == "internal"), one
        self._follow(self.events[mark:])
        for rid in fired:  # Leader._fired: what did not fire goes back, unless its job is paused
            run = self.state.runs.get(rid)
            if (
                run is not None
                and run.state in WAITING
                and not (
                    run.state is RunState.SCHEDULED
                    and self.state.jobs[run.job_id].status is JobStatus.PAUSED
                )
            ):
                self.wheel[rid] = run.due_ms
        if len(cmds) == 1:
            self._check_times(cmds[0].now, runs, jobs)
        self._check_next_run()
        self._check_leader_indexes()
        return results

    def lose_next_occurrence(self, job_id: str, now: int) -> str:
        """Cancel ``job_id``'s pending occurrence in the core, as a bug or an older version
        might have, without the next occurrence a client's cancel schedules: the job has no
        pending run until a leader heals it."""
        rid = self.state.jobs[job_id].next_run_id
        assert rid is not None
        events: list[Any] = []
        assert cancel_run(self.state, rid, now, "cancelled", events) == Ok(rid)
        self.events.extend(events)
        self._follow(events)
        return rid

    def _follow(self, events: list[LeaderEvent]) -> None:
        for ev in events:
            self.wheel.pop(ev.run_id, None)
            self.ready.pop(ev.run_id, None)
            match ev:
                case RunDue(rid, due_ms, _):
                    self.wheel[rid] = due_ms
                case RunReady(rid, queue, priority, namespace, _):
                    self.ready[rid] = (queue, priority, namespace)

    def _check_times(self, now: int, runs: dict[str, Run], jobs: dict[str, Any]) -> None:
        for rid, run in self.state.runs.items():
            old = runs.get(rid)
            if old is None:
                assert (run.created_ms, run.updated_ms) == (now, now), run
            elif run != old:
                assert run.updated_ms == now, run
            for i, a in enumerate(run.attempts):
                before = old.attempts[i] if old is not None and i < len(old.attempts) else None
                if a.outcome is not None and (before is None or before.outcome is None):
                    assert a.ended_ms == now, run
            times = (run.scheduled_ms, run.due_ms, run.created_ms, run.updated_ms)
            assert all(type(t) is int for t in times), run
        for job_id, job in self.state.jobs.items():
            old = jobs.get(job_id)
            if old is None:
                assert (job.created_ms, job.updated_ms) == (now, now), job
            elif job != old:
                assert job.updated_ms == now, job

    def _check_next_run(self) -> None:
        for job in self.state.jobs.values():
            if job.status in (JobStatus.DONE, JobStatus.CANCELLED):
                assert job.next_run_at_ms is None, job
            pending = self.state.runs.get(job.next_run_id) if job.next_run_id else None
            if pending is not None and pending.state in WAITING:
                assert job.next_run_at_ms == pending.due_ms, job

    def _check_leader_indexes(self) -> None:
        for rid, run in self.state.runs.items():
            job = self.state.jobs[run.job_id]
            spec = job.spec
            if run.state is RunState.QUEUED:
                assert self.ready.get(rid) == (spec.queue, spec.priority, spec.namespace), run
                assert rid not in self.wheel, run
            elif run.state in WAITING:
                assert rid not in self.ready, run
                if job.status is not JobStatus.PAUSED or run.state is RunState.RETRYING:
                    assert self.wheel.get(rid) == run.due_ms, run
            else:
                assert rid not in self.wheel and rid not in self.ready, run

    # -- steps -------------------------------------------------------------------------------
    def start(self, lf: int, run_id: str, now: int, worker: str = "w") -> int:
        """Fire and lease: the run is running."""
        return lease_one(self, lf, run_id, now, worker)

    def trigger(self, now: int, job_id: str = "J1", override: bool = False) -> Run:
        res = self.one(commands.Trigger(self.rid(), now, job_id, override))
        assert isinstance(res, Ok), res
        return self.state.runs[res.value.id]


def cron(expr: str = "* * * * *", **opts: Any) -> JobSpec:
    return JobSpec(
        task="t",
        schedule=Schedule(kind=ScheduleKind.CRON, cron=expr, options=RecurringOptions(**opts)),
    )


def every(ms: int, **opts: Any) -> JobSpec:
    return JobSpec(
        task="t",
        schedule=Schedule(kind=ScheduleKind.EVERY, every_ms=ms, options=RecurringOptions(**opts)),
    )


def states(h: Harness, job: str = "J1") -> list[tuple[int, str, str | None]]:
    """(scheduled offset from T0, state, reason), oldest first."""
    return sorted((r.scheduled_ms - T0, r.state.value, r.reason) for r in h.state.runs_of(job))


def next_id(h: Harness, job: str = "J1") -> str:
    nid = h.state.jobs[job].next_run_id
    assert nid is not None
    return nid


def fire(h: Harness, lf: int, run_id: str, now: int) -> Any:
    [res] = h.one(commands.Fire(h.rid(), now, lf, (run_id,))).value
    return res


def lease(h: Harness, lf: int, run_id: str, now: int, worker: str = "w") -> int:
    [res] = h.one(commands.LeaseRuns(h.rid(), now, lf, ((run_id, worker),))).value
    assert isinstance(res, Ok), res
    return int(res.value.fence)


def test_cron_materialises_only_the_next_occurrence_and_fire_creates_the_one_after() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=cron(), now=T0 + 5)
    assert states(h) == [(MIN, "scheduled", None)]
    assert next_id(h) == f"J1@{T0 + MIN}"
    assert isinstance(fire(h, lf, f"J1@{T0 + MIN}", T0 + MIN + 3), Ok)
    assert states(h) == [(MIN, "queued", None), (2 * MIN, "scheduled", None)]
    # Firing the same occurrence again (a new leader rebuilt its wheel) changes nothing.
    again = fire(h, lf, f"J1@{T0 + MIN}", T0 + MIN + 9)
    assert isinstance(again, Rejected)
    assert states(h) == [(MIN, "queued", None), (2 * MIN, "scheduled", None)]


def test_every_counts_from_submission_and_ignores_dst() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=every(90_000), now=T0)
    assert states(h) == [(90_000, "scheduled", None)]
    fire(h, lf, next_id(h), T0 + 90_000)
    assert states(h)[-1] == (180_000, "scheduled", None)


def test_jitter_spreads_due_times_stably_within_the_window() -> None:
    dues = []
    for i in range(40):
        h = Checked()
        h.submit(f"J{i}", cron(jitter_ms=30_000), now=T0)
        run = h.state.runs[next_id(h, f"J{i}")]
        assert 0 <= run.due_ms - run.scheduled_ms < 30_000
        dues.append(run.due_ms)
    assert len(set(dues)) > 30  # spread, not all on the same millisecond
    h1, h2 = Checked(), Checked()
    h1.submit("JX", cron(jitter_ms=30_000), now=T0)
    h2.submit("JX", cron(jitter_ms=30_000), now=T0 + 7)
    assert h1.state.runs[next_id(h1, "JX")].due_ms == h2.state.runs[next_id(h2, "JX")].due_ms


@pytest.mark.parametrize(
    ("policy", "window", "expected_run", "expected_skip"),
    [
        (Misfire.SKIP, None, [], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
        (Misfire.RUN_ONCE, None, [10], [1, 2, 3, 4, 5, 6, 7, 8, 9]),
        (Misfire.RUN_ALL, None, list(range(1, 11)), []),
        (Misfire.RUN_ALL, 3 * MIN + 30_000, [8, 9, 10], [1, 2, 3, 4, 5, 6, 7]),
    ],
)
def test_misfire_after_an_outage(
    policy: Misfire, window: int | None, expected_run: list[int], expected_skip: list[int]
) -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=cron(misfire=policy, catchup_window_ms=window, overlap=Overlap.ALLOW), now=T0)
    outage_end = T0 + 10 * MIN + 30_001  # the cluster was down; minute 1..10 passed unfired
    assert isinstance(fire(h, lf, next_id(h), outage_end), Ok)
    by_state: dict[str, list[int]] = {}
    for offset, state, reason in states(h):
        key = f"{state}:{reason}" if reason else state
        by_state.setdefault(key, []).append(offset // MIN)
    ran = by_state.get("queued", []) + by_state.get("scheduled", [])
    assert sorted(m for m in ran if m <= 10) == expected_run
    assert by_state.get("skipped:misfire", []) == expected_skip
    assert states(h)[-1] == (11 * MIN, "scheduled", None)  # the next regular occurrence
    catchups = sorted(r.due_ms for r in h.state.runs.values() if r.origin == "catchup")
    assert all(b - a == CATCHUP_SPACING_MS for a, b in itertools.pairwise(catchups))


def test_a_late_fire_within_grace_is_not_a_misfire() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=cron(misfire=Misfire.SKIP), now=T0)
    fire(h, lf, next_id(h), T0 + MIN + MISFIRE_GRACE_MS - 1)
    assert states(h) == [(MIN, "queued", None), (2 * MIN, "scheduled", None)]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (Overlap.ALLOW, ["running", "queued"]),
        (Overlap.SKIP, ["running", "skipped:overlap"]),
        (Overlap.BUFFER_ONE, ["running", "blocked:overlap"]),
        (Overlap.CANCEL_OTHER, ["cancelled:replaced by a newer run (overlap)", "queued"]),
    ],
)
def test_overlap_is_judged_on_live_runs(policy: Overlap, expected: list[str]) -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=cron(overlap=policy), now=T0)
    first = next_id(h)
    fire(h, lf, first, T0 + MIN)
    fence = lease(h, lf, first, T0 + MIN)
    second = next_id(h)
    assert fire(h, lf, second, T0 + 2 * MIN) == Ok(second)  # handled, whatever the policy
    got = [f"{s}:{r}" if r else s for _, s, r in states(h)][:2]
    assert got == expected
    if policy is Overlap.CANCEL_OTHER:
        assert StopRun(first, fence) in h.events
    if policy is Overlap.BUFFER_ONE:
        third = next_id(h)
        fire(h, lf, third, T0 + 3 * MIN)
        assert (
            h.state.runs[third].reason == "overlap"
            and h.state.runs[third].state is RunState.SKIPPED
        )
        h.one(commands.CompleteRun(h.rid(), T0 + 3 * MIN, lf, first, fence, None))
        assert h.state.runs[second].state is RunState.QUEUED  # the buffered one starts


def test_a_crashed_worker_does_not_block_the_job_forever() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=cron(overlap=Overlap.SKIP), now=T0)
    first = next_id(h)
    fire(h, lf, first, T0 + MIN)
    fence = lease(h, lf, first, T0 + MIN)
    # heartbeats stop: the leader expires the lease; no attempts left -> the run ends
    h.one(
        commands.FailRun(
            h.rid(), T0 + MIN + 5000, lf, first, fence, "lost", False, AttemptOutcome.LOST
        )
    )
    second = next_id(h)
    fire(h, lf, second, T0 + 2 * MIN)
    assert h.state.runs[second].state is RunState.QUEUED


def test_pause_then_resume_records_occurrences_missed_while_paused() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=cron(misfire=Misfire.RUN_ONCE), now=T0)
    assert isinstance(h.one(commands.UpdateJob(h.rid(), T0 + 1, "J1", paused=True)), Ok)
    assert h.state.jobs["J1"].status is JobStatus.PAUSED
    assert isinstance(fire(h, lf, next_id(h), T0 + MIN), Rejected)  # paused: not fired
    h.one(commands.UpdateJob(h.rid(), T0 + 5 * MIN + 31_000, "J1", paused=False))
    assert h.state.jobs["J1"].status is JobStatus.ACTIVE
    got = states(h)
    assert [g for g in got if g[1] == "skipped"] == [
        (m * MIN, "skipped", "paused") for m in (1, 2, 3, 4)
    ]
    # the most recent missed occurrence runs (as a catch-up, due right away), then the schedule
    assert got[-2:] == [(5 * MIN, "scheduled", None), (6 * MIN, "scheduled", None)]
    catchup = h.state.runs[f"J1@{T0 + 5 * MIN}"]
    assert (
        catchup.origin == "catchup" and catchup.due_ms == T0 + 5 * MIN + 31_000 + CATCHUP_SPACING_MS
    )


def test_one_off_pause_and_resume() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=JobSpec(task="t", schedule=Schedule(kind=ScheduleKind.AT, at_ms=T0 + 10)))
    h.one(commands.UpdateJob(h.rid(), T0, "J1", paused=True))
    run_id = f"J1@{T0 + 10}"
    assert isinstance(fire(h, lf, run_id, T0 + 20), Rejected)
    h.events.clear()
    h.one(commands.UpdateJob(h.rid(), T0 + 30, "J1", paused=False))
    assert RunDue(run_id, T0 + 10, True) in h.events
    assert isinstance(fire(h, lf, run_id, T0 + 40), Ok)


def test_dependency_chain_runs_in_order_and_failure_skips_dependants() -> None:
    h = Checked()
    lf = h.claim()
    res = h.one(
        commands.Submit(
            h.rid(),
            T0,
            (
                ("A", JobSpec(task="a", retry=RetryPolicy(max_attempts=1))),
                ("B", JobSpec(task="b", depends_on=("A",))),
                ("C", JobSpec(task="c", depends_on=("B",))),
            ),
        )
    )
    assert isinstance(res, Ok)
    a, b, cc = f"A@{T0}", f"B@{T0}", f"C@{T0}"
    for run_id in (a, b, cc):
        fire(h, lf, run_id, T0)
    assert [h.state.runs[r].state for r in (a, b, cc)] == [
        RunState.QUEUED,
        RunState.BLOCKED,
        RunState.BLOCKED,
    ]
    fence = lease(h, lf, a, T0)
    h.one(commands.CompleteRun(h.rid(), T0 + 1, lf, a, fence, None))
    assert h.state.runs[b].state is RunState.QUEUED and h.state.runs[cc].state is RunState.BLOCKED
    fence = lease(h, lf, b, T0 + 2)
    h.one(commands.FailRun(h.rid(), T0 + 3, lf, b, fence, "boom", False))
    assert h.state.runs[b].state is RunState.FAILED
    assert (
        h.state.runs[cc].state is RunState.SKIPPED and h.state.runs[cc].reason == "upstream_failed"
    )
    assert h.state.jobs["C"].status is JobStatus.DONE


@pytest.mark.parametrize(
    ("jobs", "cycle"),
    [
        ((("A", ("A",)),), "A -> A"),
        ((("A", ("B",)), ("B", ("A",))), "A -> B -> A"),
    ],
)
def test_cycles_are_rejected_naming_the_cycle(
    jobs: tuple[tuple[str, tuple[str, ...]], ...], cycle: str
) -> None:
    h = Checked()
    res = h.one(
        commands.Submit(h.rid(), T0, tuple((j, JobSpec(task="t", depends_on=d)) for j, d in jobs))
    )
    assert isinstance(res, Rejected) and res.code == "conflict" and cycle in res.message
    assert h.state.jobs == {}


def test_dependencies_must_exist_in_the_same_namespace() -> None:
    h = Checked()
    res = h.submit("B", JobSpec(task="t", depends_on=("nope",)))
    assert isinstance(res, Rejected) and res.code == "not_found" and res.field == "depends_on[0]"
    h.submit("A", JobSpec(task="t", namespace="other"))
    res = h.submit("B", JobSpec(task="t", depends_on=("A",)))
    assert isinstance(res, Rejected) and "namespace" in res.message


def test_trigger_respects_or_overrides_overlap() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=cron(overlap=Overlap.SKIP), now=T0)
    t1 = h.one(commands.Trigger(h.rid(), T0 + 10, "J1", override=False))
    assert isinstance(t1, Ok) and t1.value.state is RunState.QUEUED and t1.value.origin == "trigger"
    lease(h, lf, t1.value.id, T0 + 11)
    t2 = h.one(commands.Trigger(h.rid(), T0 + 12, "J1", override=False)).value
    assert h.state.runs[t2.id].state is RunState.SKIPPED and h.state.runs[t2.id].reason == "overlap"
    t3 = h.one(commands.Trigger(h.rid(), T0 + 12, "J1", override=True)).value
    assert h.state.runs[t3.id].state is RunState.QUEUED and t3.id != t2.id


def test_replay_from_the_dead_letter_queue_gets_fresh_attempts() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=JobSpec(task="t", retry=RetryPolicy(max_attempts=1)))
    rid = f"J1@{T0}"
    fire(h, lf, rid, T0)
    fence = lease(h, lf, rid, T0)
    h.one(commands.FailRun(h.rid(), T0, lf, rid, fence, "boom", True))
    assert h.state.in_dlq(rid) and h.state.jobs["J1"].status is JobStatus.DONE
    assert isinstance(h.one(commands.Replay(h.rid(), T0 + 5, rid)), Ok)
    assert not h.state.in_dlq(rid) and h.state.runs[rid].state is RunState.QUEUED
    fence2 = lease(h, lf, rid, T0 + 6)
    h.one(commands.CompleteRun(h.rid(), T0 + 7, lf, rid, fence2, "ok"))
    run = h.state.runs[rid]
    assert run.state is RunState.SUCCEEDED and [a.outcome for a in run.attempts] == [
        "failed",
        "succeeded",
    ]
    assert isinstance(h.one(commands.Replay(h.rid(), T0 + 8, rid)), Rejected)


def test_drop_from_the_dead_letter_queue_keeps_history() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=JobSpec(task="t", retry=RetryPolicy(max_attempts=1)))
    rid = f"J1@{T0}"
    fire(h, lf, rid, T0)
    h.one(commands.FailRun(h.rid(), T0, lf, rid, lease(h, lf, rid, T0), "boom", True))
    assert isinstance(h.one(commands.DropDead(h.rid(), T0, rid)), Ok)
    assert not h.state.in_dlq(rid) and h.state.runs[rid].state is RunState.FAILED


def test_update_reschedules_the_pending_occurrence() -> None:
    h = Checked()
    h.claim()
    h.submit(spec=cron("0 * * * *"), now=T0 + 1)
    old = next_id(h)
    new_spec = cron("*/5 * * * *")
    assert isinstance(h.one(commands.UpdateJob(h.rid(), T0 + 2, "J1", spec=new_spec)), Ok)
    assert (
        h.state.runs[old].state is RunState.CANCELLED and h.state.runs[old].reason == "rescheduled"
    )
    assert h.state.runs[next_id(h)].scheduled_ms == T0 + 5 * MIN


def test_update_of_a_started_one_off_run_is_a_conflict() -> None:
    h = Checked()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    fire(h, lf, rid, T0)
    lease(h, lf, rid, T0)
    res = h.one(commands.UpdateJob(h.rid(), T0, "J1", spec=JobSpec(task="t", payload=1)))
    assert isinstance(res, Rejected) and res.code == "conflict"


def test_heal_recreates_a_missing_next_occurrence() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=cron(), now=T0)
    h.lose_next_occurrence("J1", T0 + 1)
    res = h.one(commands.Heal(h.rid(), T0 + 2, lf, "J1"))
    # the cancelled occurrence stays cancelled (not run, nor twinned a millisecond later)
    assert res == Ok(f"J1@{T0 + 2 * MIN}") and next_id(h) == res.value
    assert states(h) == [(MIN, "cancelled", "cancelled"), (2 * MIN, "scheduled", None)]


# -- firing ahead (scheduler.dispatch_ahead) -------------------------------------------------------


def test_a_one_off_run_may_fire_and_lease_ahead_but_not_more_than_the_limit() -> None:
    from schedd.core.runs import FIRE_AHEAD_MAX_MS

    h = Checked()
    lf = h.claim()
    due = T0 + 10_000
    h.submit(
        spec=JobSpec(task="t", timeout_ms=5_000, schedule=Schedule(kind=ScheduleKind.AT, at_ms=due))
    )
    rid = f"J1@{due}"
    assert RunDue(rid, due, True) in h.events
    assert isinstance(fire(h, lf, rid, due - FIRE_AHEAD_MAX_MS - 1), Rejected)
    assert h.state.runs[rid].state is RunState.SCHEDULED
    assert fire(h, lf, rid, due - FIRE_AHEAD_MAX_MS) == Ok(rid)
    lease(h, lf, rid, due - 1_500)
    attempt = h.state.runs[rid].attempts[-1]
    assert attempt.leased_ms == due  # the attempt starts at the due time, on the worker
    assert attempt.deadline_ms == due + 5_000  # the timeout counts from the due time


@pytest.mark.parametrize(
    "spec",
    [
        every(MIN, overlap=Overlap.SKIP),
        cron(overlap=Overlap.BUFFER_ONE),
        JobSpec(
            task="t", depends_on=("J0",), schedule=Schedule(kind=ScheduleKind.AT, at_ms=T0 + 5000)
        ),
    ],
)
def test_runs_whose_fire_decides_on_live_state_never_fire_ahead(spec: JobSpec) -> None:
    h = Checked()
    lf = h.claim()
    h.submit("J0", JobSpec(task="t", schedule=Schedule(kind=ScheduleKind.AT, at_ms=T0 + MIN)))
    h.events.clear()
    h.submit("J1", spec)
    rid = (
        next_id(h)
        if spec.schedule.kind in (ScheduleKind.EVERY, ScheduleKind.CRON)
        else f"J1@{T0 + 5000}"
    )
    run = h.state.runs[rid]
    assert run.state is RunState.SCHEDULED
    assert RunDue(rid, run.due_ms, False) in h.events
    assert isinstance(fire(h, lf, rid, run.due_ms - 1), Rejected)
    assert h.state.runs[rid].state is RunState.SCHEDULED
    assert fire(h, lf, rid, run.due_ms) == Ok(rid)


def test_every_allow_fires_ahead_and_a_retry_waits_for_its_backoff_on_the_worker() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=every(MIN, overlap=Overlap.ALLOW))
    rid = next_id(h)
    due = h.state.runs[rid].due_ms
    assert fire(h, lf, rid, due - 1_000) == Ok(rid)
    fence = lease(h, lf, rid, due - 1_000)
    h.events.clear()
    assert h.one(commands.FailRun(h.rid(), due + 50, lf, rid, fence, "boom", True, rand=0.5)) == Ok(
        rid
    )
    retry_due = h.state.runs[rid].due_ms
    assert retry_due > due + 50
    assert RunDue(rid, retry_due, True) in h.events
