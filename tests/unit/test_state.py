"""The pure core: apply, fences, retries, dead-lettering, dedup.  Time is passed in."""

from __future__ import annotations

import os
import pickle
from collections import Counter
from typing import Any

import pytest

from schedd.core import commands
from schedd.core.apply import MAX_CLAIMS, apply_entry
from schedd.core.model import (
    AttemptOutcome,
    JobSpec,
    JobStatus,
    RecurringOptions,
    RetryPolicy,
    RunState,
    Schedule,
    ScheduleKind,
    evolve,
)
from schedd.core.state import (
    DEDUP_WINDOW_MS,
    Counted,
    LeaderEvent,
    MemoryState,
    Ok,
    Rejected,
    RunDue,
    State,
    StopRun,
    backoff_ms,
    counts_of,
)
from schedd.storage.sqlstate import SqlState
from schedd.storage.sqlstate import apply_entry as sql_apply_entry

T0 = 1_800_000_000_000


def make_state() -> State:
    """The state the core's tests run on: in dicts, or with ``SCHEDD_TEST_STATE=sql`` in an
    in-memory SQLite database the way a node keeps it (both must behave the same)."""
    if os.environ.get("SCHEDD_TEST_STATE") == "sql":
        return SqlState()
    return MemoryState()


class Harness:
    """Applies commands one entry at a time, like Raft would, with growing indexes."""

    def __init__(self) -> None:
        self.state = make_state()
        self.index = 10
        self.events: list[LeaderEvent] = []
        self.n = 0

    def rid(self) -> str:
        self.n += 1
        return f"r{self.n}"

    def apply(self, *cmds: commands.Command) -> list[Any]:
        self.index += 1
        blob = commands.encode_entry(list(cmds))
        if isinstance(self.state, SqlState):
            applied = sql_apply_entry(self.state, blob, self.index)
            assert applied is not None
            results, events = applied
        else:
            results, events = apply_entry(self.state, blob, self.index)
        self.events.extend(events)
        return results

    def one(self, cmd: commands.Command) -> Any:
        return self.apply(cmd)[0]

    def claim(self, node: str = "n1", term: int = 1) -> int:
        res = self.one(commands.Claim(self.rid(), T0, node, term))
        assert isinstance(res, Ok)
        return int(res.value)

    def submit(self, job_id: str = "J1", spec: JobSpec | None = None, now: int = T0) -> Any:
        return self.one(commands.Submit(self.rid(), now, ((job_id, spec or JobSpec(task="t")),)))


def lease_one(h: Harness, lf: int, run_id: str, now: int = T0, worker: str = "w1") -> int:
    assert h.one(commands.Fire(h.rid(), now, lf, (run_id,))) == Ok([Ok(run_id)])
    res = h.one(commands.LeaseRuns(h.rid(), now, lf, ((run_id, worker),)))
    assert isinstance(res, Ok)
    [attempt] = res.value
    assert isinstance(attempt, Ok)
    return int(attempt.value.fence)


def test_submit_creates_job_and_scheduled_run_with_due_event() -> None:
    h = Harness()
    res = h.submit()
    assert isinstance(res, Ok)
    [(job, created, latest)] = res.value
    assert created and job.status is JobStatus.ACTIVE
    assert latest == h.state.runs[f"J1@{T0}"]  # its first run, as the answer shows it
    assert (job.created_ms, job.updated_ms) == (T0, T0)  # both the submit's time
    assert h.state.jobs["J1"] == job
    run = h.state.latest_run("J1")
    assert run is not None and run.id == f"J1@{T0}" and run.state is RunState.SCHEDULED
    assert RunDue(run.id, T0, True) in h.events


def test_at_schedule_uses_its_time_for_the_run_id() -> None:
    h = Harness()
    spec = JobSpec(task="t", schedule=Schedule(kind=ScheduleKind.AT, at_ms=T0 + 5000))
    h.submit(spec=spec)
    run = h.state.latest_run("J1")
    assert run is not None and run.id == f"J1@{T0 + 5000}" and run.due_ms == T0 + 5000


def test_fire_before_due_is_refused() -> None:
    h = Harness()
    lf = h.claim()
    h.submit(spec=JobSpec(task="t", schedule=Schedule(kind=ScheduleKind.AT, at_ms=T0 + 5000)))
    [res] = h.one(commands.Fire(h.rid(), T0, lf, (f"J1@{T0 + 5000}",))).value
    assert isinstance(res, Rejected) and res.code == "conflict"


def test_full_lifecycle_success_and_fence_is_the_lease_index() -> None:
    h = Harness()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    fence = lease_one(h, lf, rid)
    assert fence == h.index  # the Raft log index of the lease entry
    res = h.one(commands.CompleteRun(h.rid(), T0 + 10, lf, rid, fence, {"ok": True}))
    assert res == Ok(rid)
    run = h.state.runs[rid]
    assert run.state is RunState.SUCCEEDED and run.result == {"ok": True}
    assert run.attempts[0].outcome == "succeeded" and run.attempts[0].ended_ms == T0 + 10
    assert h.state.jobs["J1"].status is JobStatus.DONE


def test_stale_fence_is_refused_noted_with_the_run_and_changes_nothing_else() -> None:
    h = Harness()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    fence = lease_one(h, lf, rid)
    before = h.state.runs[rid]
    res = h.one(commands.CompleteRun(h.rid(), T0 + 7, lf, rid, fence - 1, None))
    assert isinstance(res, Rejected) and res.code == "stale_fence"
    after = h.state.runs[rid]
    [refusal] = after.refused
    assert (refusal.fence, refusal.worker_id, refusal.at_ms) == (fence - 1, "", T0 + 7)
    assert refusal.outcome is AttemptOutcome.SUCCEEDED and refusal.reason == res.message
    assert pickle.dumps(evolve(after, refused=(), updated_ms=before.updated_ms)) == pickle.dumps(
        before
    )
    assert after.updated_ms == T0 + 7


def test_a_late_result_of_a_lost_attempt_is_refused_and_names_its_worker() -> None:
    h = Harness()
    lf = h.claim()
    h.submit(spec=JobSpec(task="t", retry=RetryPolicy(max_attempts=3, jitter=False)))
    rid = f"J1@{T0}"
    fence = lease_one(h, lf, rid, worker="w7")
    lost = commands.FailRun(h.rid(), T0 + 5, lf, rid, fence, "lost", True, AttemptOutcome.LOST, 0.5)
    assert h.one(lost) == Ok(rid)
    assert h.state.runs[rid].refused == ()  # the leader's own end is no refusal
    for i in range(12):  # the worker's result, then repeated: only the latest ten are kept
        late = commands.FailRun(
            h.rid(), T0 + 10 + i, lf, rid, fence, "boom", True, AttemptOutcome.FAILED, 0.5
        )
        res = h.one(late)
        assert isinstance(res, Rejected) and res.code == "stale_fence"
    refused = h.state.runs[rid].refused
    assert len(refused) == 10 and [r.at_ms for r in refused] == list(range(T0 + 12, T0 + 22))
    assert {(r.worker_id, r.outcome) for r in refused} == {("w7", AttemptOutcome.FAILED)}
    # a progress report for the lost attempt is refused too, and not noted
    res = h.one(commands.Progress(h.rid(), T0 + 30, lf, ((rid, fence, {"done": 1}),)))
    assert res == Ok([Rejected("stale_fence", res.value[0].message)])
    assert h.state.runs[rid].refused == refused


def test_each_claim_is_kept_in_the_leader_history_up_to_a_limit() -> None:
    h = Harness()
    first = h.claim("n1", 1)
    assert h.state.leader_claims == ((1, "n1", first, T0),)
    for term in range(2, 110):
        h.claim(f"n{term % 3 + 1}", term)
    claims = h.state.leader_claims
    assert len(claims) == MAX_CLAIMS and [c[0] for c in claims] == list(range(10, 110))
    assert claims[-1] == (109, "n2", h.index, T0)


def test_commands_from_a_deposed_leader_are_rejected() -> None:
    h = Harness()
    old = h.claim("n1", 1)
    h.submit()
    new = h.claim("n2", 2)
    assert new > old
    res = h.one(commands.Fire(h.rid(), T0, old, (f"J1@{T0}",)))
    assert isinstance(res, Rejected) and res.code == "stale_leader"
    assert h.state.runs[f"J1@{T0}"].state is RunState.SCHEDULED
    assert isinstance(h.one(commands.Fire(h.rid(), T0, new, (f"J1@{T0}",))), Ok)


def test_claim_for_an_older_term_is_rejected() -> None:
    h = Harness()
    h.claim("n1", 5)
    res = h.one(commands.Claim(h.rid(), T0, "n2", 4))
    assert isinstance(res, Rejected) and res.code == "stale_leader"
    assert h.state.leader_node == "n1"


def test_a_fresh_state_names_no_leader() -> None:
    # /cluster (the leader's id) and the leader URL a follower forwards to are read from these
    # when their term is the node's current term: before any claim, no elected term (>= 1) is.
    state = MemoryState()
    assert (state.leader_node, state.leader_http, state.leader_term) == ("", "", 0)


def test_failure_retries_with_backoff_then_dead_letters() -> None:
    h = Harness()
    lf = h.claim()
    spec = JobSpec(task="t", retry=RetryPolicy(max_attempts=2, initial_ms=1000, jitter=False))
    h.submit(spec=spec)
    rid = f"J1@{T0}"
    fence = lease_one(h, lf, rid)
    assert h.one(commands.FailRun(h.rid(), T0 + 100, lf, rid, fence, "boom", True)) == Ok(rid)
    run = h.state.runs[rid]
    assert run.state is RunState.RETRYING and run.due_ms == T0 + 100 + 1000
    assert RunDue(rid, T0 + 1100, True) in h.events
    fence2 = lease_one(h, lf, rid, now=T0 + 1100)
    assert fence2 > fence
    h.one(
        commands.FailRun(
            h.rid(), T0 + 1200, lf, rid, fence2, "boom again", True, AttemptOutcome.LOST
        )
    )
    run = h.state.runs[rid]
    assert run.state is RunState.FAILED and h.state.in_dlq(rid)
    assert [a.outcome for a in run.attempts] == ["failed", "lost"]
    assert [a.fence for a in run.attempts] == [fence, fence2]


def test_non_retryable_failure_goes_straight_to_the_dead_letter_queue() -> None:
    h = Harness()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    fence = lease_one(h, lf, rid)
    h.one(commands.FailRun(h.rid(), T0, lf, rid, fence, "bad input", False))
    assert h.state.runs[rid].state is RunState.FAILED and len(h.state.runs[rid].attempts) == 1


@pytest.mark.parametrize(
    ("attempt", "rand", "jitter", "expected"),
    [
        (1, 0.0, False, 1000),
        (2, 0.0, False, 2000),
        (3, 0.9, False, 4000),
        (30, 0.0, False, 600_000),  # capped at max
        (1, 0.0, True, 500),  # equal jitter: between half and the full delay
        (1, 1.0, True, 1000),
        (2, 0.5, True, 1500),
        (1, 1.5, True, 1000),  # a jitter draw outside [0, 1] never stretches the delay ...
        (1, -0.5, True, 500),  # ... nor shortens it below half
    ],
)
def test_backoff(attempt: int, rand: float, jitter: bool, expected: int) -> None:
    spec = JobSpec(
        task="t", retry=RetryPolicy(initial_ms=1000, max_ms=600_000, multiplier=2, jitter=jitter)
    )
    assert backoff_ms(spec, attempt, rand) == expected


def test_request_ids_are_deduplicated() -> None:
    h = Harness()
    cmd = commands.Submit("same", T0, (("J1", JobSpec(task="t")),))
    first = h.one(cmd)
    again = h.one(commands.Submit("same", T0, (("J2", JobSpec(task="t")),)))
    assert again == first
    assert list(h.state.jobs) == ["J1"]


def test_a_repeated_submit_gets_its_jobs_as_they_are_now_and_only_their_ids_are_kept() -> None:
    h = Harness()
    lf = h.claim()
    batch = (("J1", JobSpec(task="t")), ("J2", JobSpec(task="t", idempotency_key="k")))
    first = h.one(commands.Submit("R1", T0, batch))
    assert [(job.id, created, run.id) for job, created, run in first.value] == [
        ("J1", True, f"J1@{T0}"),
        ("J2", True, f"J2@{T0}"),
    ]
    # what is kept for a repeat: the ids and whether each was created, not the records
    assert h.state.recall("R1") == Ok([("J1", True), ("J2", True)])
    assert isinstance(h.one(commands.CancelJob(h.rid(), T0 + 1, "J1")), Ok)
    again = h.one(
        commands.Submit("R1", T0 + 2, (("J3", JobSpec(task="t")), ("J4", JobSpec(task="t"))))
    )
    assert [(job.id, job.status, created, run.state) for job, created, run in again.value] == [
        ("J1", JobStatus.CANCELLED, True, RunState.CANCELLED),
        ("J2", JobStatus.ACTIVE, True, RunState.SCHEDULED),
    ]
    assert again.value[0][:1] == (h.state.jobs["J1"],)
    assert sorted(h.state.jobs) == ["J1", "J2"]
    # a job forgotten meanwhile (history retention) cannot be shown again: a clear not_found
    assert h.one(commands.Purge(h.rid(), T0 + 10, lf, T0 + 5, 1000, 100)) == Ok([1, 1])
    gone = h.one(commands.Submit("R1", T0 + 20, (("J5", JobSpec(task="t")),)))
    assert gone == Rejected(
        "not_found",
        "this request was applied, but its job J1 has been forgotten since (history.retention)",
        "id",
    )
    assert "J5" not in h.state.jobs
    # a result remembered by an earlier version holds the jobs themselves, as they were
    h.state.remember("R-old", T0 + 20, Ok([(first.value[1][0], True)]))
    assert h.one(commands.Submit("R-old", T0 + 30, (("J6", JobSpec(task="t")),))) == Ok(
        [(first.value[1][0], True, h.state.runs[f"J2@{T0}"])]
    )


def test_a_submit_repeating_the_request_id_of_another_command_gets_that_answer() -> None:
    # The API scopes a request id to its method, path and body, but apply is total: a submit
    # under the request id of an earlier update gets the update's answer, creating nothing.
    h = Harness()
    h.submit("J1")
    updated = h.one(commands.UpdateJob("R-upd", T0 + 1, "J1", paused=True))
    assert isinstance(updated, Ok)
    assert h.one(commands.Submit("R-upd", T0 + 2, (("J2", JobSpec(task="t")),))) == updated
    assert sorted(h.state.jobs) == ["J1"]


def test_a_request_id_is_remembered_for_the_whole_window() -> None:
    # The API promises: a repeated X-Request-Id is answered from the first request for at
    # least 15 minutes.  Exactly 15 minutes later still counts.
    h = Harness()
    first = h.one(commands.Submit("R1", T0, (("J1", JobSpec(task="t")),)))
    h.submit("J-other", now=T0 + DEDUP_WINDOW_MS)  # other traffic, when old entries are dropped
    assert h.one(commands.Submit("R1", T0 + DEDUP_WINDOW_MS, (("J2", JobSpec(task="t")),))) == first
    assert sorted(h.state.jobs) == ["J-other", "J1"]


def test_idempotency_key_returns_the_existing_job() -> None:
    h = Harness()
    h.submit("J1", JobSpec(task="t", idempotency_key="k"))
    res = h.submit("J2", JobSpec(task="t", idempotency_key="k"))
    [(job, created, latest)] = res.value
    assert job.id == "J1" and not created and "J2" not in h.state.jobs
    assert latest == h.state.latest_run("J1")


def test_batch_submit_is_all_or_nothing() -> None:
    h = Harness()
    h.submit("J1")
    twice = (("J2", JobSpec(task="t")), ("J3", JobSpec(task="t")), ("J2", JobSpec(task="t")))
    res = h.one(commands.Submit(h.rid(), T0, twice))
    assert isinstance(res, Rejected) and res.code == "conflict" and res.field == "jobs[2].id"
    assert "J2" not in h.state.jobs and "J3" not in h.state.jobs


def test_cancel_stops_a_running_attempt() -> None:
    h = Harness()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    fence = lease_one(h, lf, rid)
    assert isinstance(h.one(commands.CancelJob(h.rid(), T0, "J1")), Ok)
    assert h.state.runs[rid].state is RunState.CANCELLED
    assert StopRun(rid, fence) in h.events
    late = h.one(commands.CompleteRun(h.rid(), T0, lf, rid, fence, None))
    assert isinstance(late, Rejected)


def test_cancel_unknown_job_is_not_found() -> None:
    res = Harness().one(commands.CancelJob("x", T0, "nope"))
    assert isinstance(res, Rejected) and res.code == "not_found"


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"garbage",
        b"[]",
        b'{"v": 99, "c": []}',
        b'{"v": 1, "c": [1, {"t": "nope"}]}',
        b'{"v": 1, "c": [{"t": "fire", "rid": "x"}]}',
        b'{"v": 1, "c": [{"t": "submit", "rid": "x", "now": 1, "jobs": [[1]]}]}',
    ],
)
def test_garbage_entries_are_rejected_as_values(blob: bytes) -> None:
    state = MemoryState()
    results, events = apply_entry(state, blob, 5)
    assert results and all(isinstance(r, Rejected) for r in results)
    assert events == [] and state.jobs == {}


def test_codec_round_trip() -> None:
    cmds: list[commands.Command] = [
        commands.Claim("a", T0, "n1", 3, "http://x"),
        commands.Submit("b", T0, (("J1", JobSpec(task="t", payload={"k": [1, 2]})),)),
        commands.Fire("c", T0, 7, ("J1@1",)),
        commands.LeaseRuns("d", T0, 7, (("J1@1", "w"),)),
        commands.CompleteRun("e", T0, 7, "J1@1", 9, {"r": 1}),
        commands.FailRun("f", T0, 7, "J1@1", 9, "err", False, AttemptOutcome.LOST, 0.25),
        commands.CancelJob("g", T0, "J1"),
        commands.Barrier("h", T0),
    ]
    assert commands.decode_entry(commands.encode_entry(cmds)) == cmds


def test_a_repeated_result_for_the_same_fence_is_accepted_and_changes_nothing() -> None:
    h = Harness()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    fence = lease_one(h, lf, rid)
    assert h.one(commands.CompleteRun(h.rid(), T0 + 5, lf, rid, fence, 1)) == Ok(rid)
    before = h.state.runs[rid]
    assert h.one(commands.CompleteRun(h.rid(), T0 + 9, lf, rid, fence, 2)) == Ok(
        rid
    )  # re-sent after failover
    assert h.state.runs[rid] == before
    assert isinstance(h.one(commands.CompleteRun(h.rid(), T0, lf, rid, fence + 1, 3)), Rejected)


def test_leader_commands_are_not_kept_in_the_dedup_table() -> None:
    h = Harness()
    lf = h.claim()
    h.submit()
    h.one(commands.Fire("fire-1", T0, lf, (f"J1@{T0}",)))
    assert h.state.recall("fire-1") is None and h.state.remembered() == 1  # only the submit


# -- evolve: the fast dataclasses.replace used by apply ----------------------------------------


def test_evolve_matches_dataclasses_replace_on_every_record() -> None:
    import dataclasses

    from schedd.core.model import Attempt, Run, RunState, evolve

    run = Run(
        id="j@1",
        job_id="j",
        namespace="default",
        scheduled_ms=1,
        due_ms=2,
        state=RunState.SCHEDULED,
        created_ms=1,
        updated_ms=1,
    )
    for changes in ({}, {"state": RunState.QUEUED, "updated_ms": 5}, {"reason": "x", "due_ms": 9}):
        got = evolve(run, **changes)
        assert got == dataclasses.replace(run, **changes)  # type: ignore[arg-type]
        assert got is not run
    att = Attempt(number=1, fence=7, worker_id="w", leased_ms=3)
    assert evolve(att, ended_ms=4) == dataclasses.replace(att, ended_ms=4)
    assert run.state is RunState.SCHEDULED  # the original is untouched


def test_evolve_refuses_an_unknown_field() -> None:
    import pytest

    from schedd.core.model import Run, RunState, evolve

    run = Run(
        id="j@1",
        job_id="j",
        namespace="default",
        scheduled_ms=1,
        due_ms=2,
        state=RunState.SCHEDULED,
        created_ms=1,
        updated_ms=1,
    )
    with pytest.raises(TypeError, match=r"^Run has no field\(s\) stat, stats$"):
        evolve(run, stat=RunState.QUEUED, stats=1, state=RunState.QUEUED)


# -- reads and counters --------------------------------------------------------------------------

MIN = 60_000


def every_minute(**opts: Any) -> JobSpec:
    return JobSpec(
        task="t",
        schedule=Schedule(kind=ScheduleKind.EVERY, every_ms=MIN, options=RecurringOptions(**opts)),
    )


def test_a_recurring_job_whose_schedule_is_already_over_is_done_without_runs() -> None:
    # GET /jobs/J1 shows it with "latest_run": null; GET /jobs/J1/runs is empty.
    h = Harness()
    h.submit(spec=every_minute(end_at_ms=T0 - MIN), now=T0)
    job = h.state.jobs["J1"]
    assert job.status is JobStatus.DONE and job.next_run_id is None
    assert h.state.latest_run("J1") is None
    assert h.state.runs_of("J1") == []


def test_a_jobs_run_history_is_newest_first() -> None:
    h = Harness()
    lf = h.claim()
    h.submit(spec=every_minute(), now=T0)
    for minute in (1, 2, 3):
        h.one(commands.Fire(h.rid(), T0 + minute * MIN, lf, (f"J1@{T0 + minute * MIN}",)))
    assert [r.id for r in h.state.runs_of("J1")] == [f"J1@{T0 + m * MIN}" for m in (4, 3, 2, 1)]
    latest = h.state.latest_run("J1")
    assert latest is not None and latest.id == f"J1@{T0 + 4 * MIN}"


def test_a_jobs_unfinished_runs_come_in_creation_order_not_id_order() -> None:
    # Run ids sort by scheduled time; creation order is what buffered runs and dependants are
    # released in.  The next occurrence (a minute on) is created before a trigger's run (now).
    h = Harness()
    h.claim()
    h.submit(spec=every_minute(), now=T0)
    assert isinstance(h.one(commands.Trigger(h.rid(), T0 + 5, "J1")), Ok)
    ids = [r.id for r in h.state.unfinished_runs("J1")]
    assert len(ids) == 2 and ids[0] == f"J1@{T0 + MIN}" and ids[1] != ids[0]
    assert ids != sorted(ids)  # the two orders differ here


def recount(state: State) -> dict[str, int]:
    """What the metrics' counters must say, counted from the runs themselves."""
    counts: Counter[str] = Counter()
    for run in state.runs.values():
        counts[f"state:{run.state}"] += 1
        if run.state is RunState.SKIPPED:
            counts[f"skipped:{run.reason}"] += 1
        counts.update(f"attempt:{a.outcome}" for a in run.attempts if a.outcome is not None)
    return dict(counts)


def test_the_metrics_counters_stay_in_step_with_the_runs() -> None:
    # schedd_runs{state}, schedd_runs_skipped{reason} and schedd_attempts{outcome} are read
    # from state.counts, which put_run keeps in step without a recount.
    h = Harness()
    lf = h.claim()
    retry = RetryPolicy(max_attempts=2, initial_ms=1000, jitter=False)
    h.submit("A", JobSpec(task="t", retry=retry))  # fails once, then succeeds
    h.submit("B", JobSpec(task="t", retry=retry))  # fails for good
    h.submit("C", JobSpec(task="t"))  # cancelled while running
    h.submit("R", every_minute(), now=T0)  # misfires while its previous run still runs
    a, b, cc, r1 = f"A@{T0}", f"B@{T0}", f"C@{T0}", f"R@{T0 + MIN}"
    steps = [
        lambda: lease_one(h, lf, a),
        lambda: h.one(
            commands.FailRun(h.rid(), T0 + 1, lf, a, h.state.runs[a].fence, "boom", True)
        ),
        lambda: lease_one(h, lf, a, now=T0 + 1001),
        lambda: h.one(commands.CompleteRun(h.rid(), T0 + 1002, lf, a, h.state.runs[a].fence, None)),
        lambda: lease_one(h, lf, b),
        lambda: h.one(
            commands.FailRun(h.rid(), T0 + 2, lf, b, h.state.runs[b].fence, "bad", False)
        ),
        lambda: lease_one(h, lf, cc),
        lambda: h.one(commands.CancelRun(h.rid(), T0 + 3, cc)),
        lambda: lease_one(h, lf, r1, now=T0 + MIN),
        # the next occurrence fires 4 minutes late: it and the ones missed since are skipped
        # but the latest, while the first run still holds its lease
        lambda: h.one(commands.Fire(h.rid(), T0 + 6 * MIN, lf, (f"R@{T0 + 2 * MIN}",))),
        lambda: h.one(
            commands.CompleteRun(h.rid(), T0 + 6 * MIN, lf, r1, h.state.runs[r1].fence, None)
        ),
    ]
    for step in steps:
        step()
        assert {k: v for k, v in h.state.counts.items() if v} == recount(h.state)
    assert recount(h.state) == {
        "state:succeeded": 2,
        "state:failed": 1,
        "state:cancelled": 1,
        "state:skipped": 4,
        "state:scheduled": 2,
        "skipped:misfire": 4,
        "attempt:failed": 2,
        "attempt:succeeded": 2,
        "attempt:cancelled": 1,
    }
    # read back by kind, as the metrics and the scheduling-lag view do
    assert counts_of(h.state.counts, Counted.SKIPPED) == {"misfire": 4}
    assert counts_of(h.state.counts, Counted.ATTEMPT) == {
        "failed": 2,
        "succeeded": 2,
        "cancelled": 1,
    }


def test_the_harness_runs_on_the_state_asked_for() -> None:
    # scripts/test runs these tests a second time with SCHEDD_TEST_STATE=sql: make sure it does.
    wanted = SqlState if os.environ.get("SCHEDD_TEST_STATE") == "sql" else MemoryState
    assert type(Harness().state) is wanted
