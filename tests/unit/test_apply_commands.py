"""``apply``, command by command: what each command answers (the code, message and field a
client gets back as a 404/409/400 body) and what it changes.  Pure core, virtual time: every
command carries its ``now``."""

from __future__ import annotations

from typing import Any

import pytest

from schedd.core import commands, runs
from schedd.core.apply import apply_entry
from schedd.core.model import (
    JobSpec,
    JobStatus,
    Priority,
    RetryPolicy,
    RunState,
    Schedule,
    ScheduleKind,
)
from schedd.core.state import (
    MemoryState,
    Ok,
    Rejected,
    RunDue,
    RunGone,
    RunLeased,
    RunReady,
    State,
    StopRun,
)
from tests.unit.test_state import T0, Harness, lease_one

MIN = 60_000


def later(at_ms: int = T0 + MIN, **kw: Any) -> JobSpec:
    """A one-off job due at ``at_ms``: its run waits, scheduled."""
    return JobSpec(task="t", schedule=Schedule(kind=ScheduleKind.AT, at_ms=at_ms), **kw)


def running(h: Harness, spec: JobSpec | None = None) -> tuple[int, str, int]:
    """A leader's claim, a job submitted now and its run leased: (leader fence, run id, lease
    fence)."""
    lf = h.claim()
    h.submit(spec=spec)
    rid = f"J1@{T0}"
    return lf, rid, lease_one(h, lf, rid)


def dead_lettered(h: Harness, lf: int) -> str:
    h.submit(spec=JobSpec(task="t", retry=RetryPolicy(max_attempts=1)))
    rid = f"J1@{T0}"
    h.one(commands.FailRun(h.rid(), T0 + 1, lf, rid, lease_one(h, lf, rid), "boom", False))
    assert h.state.in_dlq(rid)
    return rid


# -- entries ----------------------------------------------------------------------------------


class Watched(MemoryState):
    """Counts the calls of the store's visibility hook."""

    def __init__(self) -> None:
        super().__init__()
        self.visible = 0

    def make_visible(self) -> None:
        self.visible += 1


def test_a_command_whose_answer_is_read_back_asks_the_store_to_show_it_at_once() -> None:
    # The node's database keeps the leader's own commands uncommitted for a moment; a client's
    # command, a claim and a barrier must be visible to other readers when they are answered.
    state = Watched()
    index = 0

    def asks(cmd: commands.Command) -> int:
        nonlocal index
        index += 1
        before = state.visible
        apply_entry(state, commands.encode_entry([cmd]), index)
        return state.visible - before

    assert asks(commands.Claim("r0", T0, "n1", 1)) == 1
    lf, rid = 1, f"J1@{T0}"
    assert asks(commands.Submit("r1", T0, (("J1", JobSpec(task="t")),))) == 1
    assert asks(commands.Fire("r2", T0, lf, (rid,))) == 0
    assert asks(commands.LeaseRuns("r3", T0, lf, ((rid, "w1"),))) == 0
    assert asks(commands.CompleteRun("r4", T0, lf, rid, 4)) == 0
    assert state.runs[rid].state is RunState.SUCCEEDED
    assert asks(commands.Barrier("r5", T0)) == 1
    assert asks(commands.CancelJob("r6", T0, "J1")) == 1
    assert asks(commands.Submit("r1", T0, (("J1", JobSpec(task="t")),))) == 1  # a recalled one too


def test_an_entry_records_its_log_index_for_the_leaders_rebuild() -> None:
    # The leader rebuilds its wheel and queues from the state, then ignores the events of
    # entries up to the state's applied index: they are already in what it rebuilt.
    state = MemoryState()
    apply_entry(
        state, commands.encode_entry([commands.Submit("r1", T0, (("J1", JobSpec(task="t")),))]), 42
    )
    assert state.applied_index == 42
    apply_entry(state, b"garbage", 43)
    assert state.applied_index == 43


def test_an_undecodable_command_is_an_invalid_argument_naming_why() -> None:
    blob = b'{"v": 1, "c": [{"t": "nope", "rid": "x", "now": 1}]}'
    [undecodable] = commands.decode_entry(blob)
    assert isinstance(undecodable, commands.Undecodable)
    results, _ = apply_entry(MemoryState(), blob, 5)
    assert results == [Rejected("invalid_argument", f"undecodable command: {undecodable.reason}")]


def test_a_command_that_fails_unexpectedly_is_an_internal_rejection_and_its_events_are_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # apply must never raise (an exception would wedge Raft): a bug in one command becomes a
    # 500 for that command only; the leader never hears of its half-made events, and the other
    # commands of the same entry keep theirs.
    def broken(state: State, job_id: str, now: int, override: bool, events: list[Any]) -> Any:
        events.append(RunReady("half-made", "default", Priority.NORMAL, "default", "t"))
        raise RuntimeError("boom")

    monkeypatch.setattr(runs, "trigger", broken)
    h = Harness()
    submitted, triggered = h.apply(
        commands.Submit(h.rid(), T0, (("J1", JobSpec(task="t")),)),
        commands.Trigger(h.rid(), T0, "J1"),
    )
    assert isinstance(submitted, Ok)
    assert triggered == Rejected("internal", "Trigger failed: RuntimeError: boom")
    assert h.events == [RunDue(f"J1@{T0}", T0, True)]


# -- leadership -------------------------------------------------------------------------------


def test_a_leader_repeating_its_claim_in_the_same_term_gets_a_new_fence() -> None:
    # The reply to a claim can be lost (a timeout): the leader claims again in its term.
    h = Harness()
    first = h.claim("n1", 3)
    second = h.claim("n1", 3)
    assert second > first
    assert (h.state.leader_fence, h.state.leader_node, h.state.leader_term) == (second, "n1", 3)


def test_a_lease_names_the_worker_that_holds_it() -> None:
    # The new leader rebuilds its lease table (and the run view shows it) from this.
    h = Harness()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    fence = lease_one(h, lf, rid, worker="w-7")
    current = h.state.runs[rid].current
    assert current is not None and (current.worker_id, current.fence) == ("w-7", fence)
    assert RunLeased(rid) in h.events


def test_a_failed_attempt_keeps_the_workers_error() -> None:
    h = Harness()
    lf, rid, fence = running(h, JobSpec(task="t", retry=RetryPolicy(max_attempts=2, jitter=False)))
    assert h.one(commands.FailRun(h.rid(), T0 + 5, lf, rid, fence, "disk full", True)) == Ok(rid)
    run = h.state.runs[rid]
    assert run.state is RunState.RETRYING and run.error == "disk full"
    assert [(a.outcome, a.error, a.ended_ms) for a in run.attempts] == [
        ("failed", "disk full", T0 + 5)
    ]


def test_a_failed_attempt_keeps_the_tail_of_the_traceback_and_its_final_progress() -> None:
    h = Harness()
    lf, rid, fence = running(h, JobSpec(task="t", retry=RetryPolicy(max_attempts=2, jitter=False)))
    tb = 'Traceback (most recent call last):\n  File "t.py", line 3, in load\nOSError: disk full'
    fail = commands.FailRun(
        h.rid(), T0 + 5, lf, rid, fence, "OSError: disk full", True, traceback=tb, progress=7
    )
    assert h.one(fail) == Ok(rid)
    [attempt] = h.state.runs[rid].attempts
    assert (attempt.error, attempt.traceback) == ("OSError: disk full", tb)
    assert (attempt.progress, attempt.progress_ms) == (7, T0 + 5)
    assert h.state.runs[rid].error == "OSError: disk full"  # the run's one line, as before


def test_progress_is_recorded_on_the_running_attempt_only() -> None:
    h = Harness()
    lf, rid, fence = running(h)
    before = h.state.runs[rid]
    h.events.clear()
    res = h.one(commands.Progress(h.rid(), T0 + 3, lf, ((rid, fence, {"pct": 40}),)))
    assert res == Ok([Ok(rid)])
    run = h.state.runs[rid]
    assert (run.current.progress, run.current.progress_ms) == ({"pct": 40}, T0 + 3)
    assert (run.state, run.updated_ms) == (before.state, before.updated_ms)  # nothing else
    assert h.events == []  # nothing for the leader's indexes
    # one of another lease (stale) or of a run that is gone does not spoil the others
    [stale, gone, ok] = h.one(
        commands.Progress(
            h.rid(), T0 + 4, lf, ((rid, fence - 1, "x"), ("J9@1", 1, "x"), (rid, fence, 50))
        )
    ).value
    assert isinstance(stale, Rejected) and stale.code == "stale_fence"
    assert isinstance(gone, Rejected) and gone.code == "not_found"
    assert ok == Ok(rid) and h.state.runs[rid].current.progress == 50
    # the end without progress keeps the one recorded; after it, none is taken
    assert h.one(commands.CompleteRun(h.rid(), T0 + 6, lf, rid, fence, "done")) == Ok(rid)
    late = h.one(commands.Progress(h.rid(), T0 + 7, lf, ((rid, fence, 99),))).value
    assert isinstance(late[0], Rejected) and late[0].code == "stale_fence"
    [attempt] = h.state.runs[rid].attempts
    assert (attempt.progress, attempt.progress_ms, attempt.outcome) == (50, T0 + 4, "succeeded")


def test_a_completed_attempt_records_the_progress_its_result_carries() -> None:
    h = Harness()
    lf, rid, fence = running(h)
    h.one(commands.Progress(h.rid(), T0 + 1, lf, ((rid, fence, "half"),)))
    assert h.one(commands.CompleteRun(h.rid(), T0 + 2, lf, rid, fence, 1, "all")) == Ok(rid)
    [attempt] = h.state.runs[rid].attempts
    assert (attempt.progress, attempt.progress_ms, attempt.traceback) == ("all", T0 + 2, None)


# -- runs: cancel, replay, drop from the dead-letter queue -----------------------------------


def test_cancelling_a_running_run_stops_its_worker_and_records_when_and_why() -> None:
    h = Harness()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    fence = lease_one(h, lf, rid)
    h.events.clear()
    assert h.one(commands.CancelRun(h.rid(), T0 + 5, rid)) == Ok(rid)
    run = h.state.runs[rid]
    assert (run.state, run.reason, run.updated_ms) == (RunState.CANCELLED, "cancelled", T0 + 5)
    assert [(a.outcome, a.error, a.ended_ms) for a in run.attempts] == [
        ("cancelled", "cancelled", T0 + 5)
    ]
    assert h.events == [StopRun(rid, fence), RunGone(rid)]


def test_cancelling_an_unknown_run_is_not_found() -> None:
    res = Harness().one(commands.CancelRun("x", T0, "J1@1"))
    assert res == Rejected("not_found", "no run with id J1@1", "run_id")


def test_a_replayed_run_is_queued_again_at_the_time_of_the_replay() -> None:
    h = Harness()
    rid = dead_lettered(h, h.claim())
    res = h.one(commands.Replay(h.rid(), T0 + MIN, rid))
    run = h.state.runs[rid]
    assert res == Ok(run)
    assert (run.state, run.updated_ms) == (RunState.QUEUED, T0 + MIN)


def test_dropping_a_run_from_the_dead_letter_queue_answers_its_id() -> None:
    h = Harness()
    rid = dead_lettered(h, h.claim())
    assert h.one(commands.DropDead(h.rid(), T0 + MIN, rid)) == Ok(rid)
    assert not h.state.in_dlq(rid)
    again = h.one(commands.DropDead(h.rid(), T0 + MIN, rid))
    assert again == Rejected("not_found", f"run {rid} is not in the dead-letter queue", "run_id")


# -- submit: all or nothing, each refusal naming the field -------------------------------------


def spec(*depends_on: str, namespace: str = "default") -> JobSpec:
    return JobSpec(task="t", namespace=namespace, depends_on=depends_on)


# (name, jobs already submitted, the batch, the refusal)
SUBMIT_REFUSALS: list[
    tuple[str, list[tuple[str, JobSpec]], list[tuple[str, JobSpec]], Rejected]
] = [
    (
        "an id twice in one batch",
        [],
        [("J1", spec()), ("J1", spec())],
        Rejected("conflict", "job id J1 already exists", "jobs[1].id"),
    ),
    (
        "an unknown dependency",
        [],
        [("J1", spec("nope"))],
        Rejected("not_found", "depends_on: no job with id nope", "depends_on[0]"),
    ),
    (
        "an unknown dependency in a batch",
        [("A", spec())],
        [("J1", spec()), ("J2", spec("A", "nope"))],
        Rejected("not_found", "depends_on: no job with id nope", "jobs[1].depends_on[1]"),
    ),
    (
        "a dependency in another namespace",
        [("A", spec(namespace="other"))],
        [("J1", spec("A"))],
        Rejected(
            "invalid_argument",
            "depends_on: job A is in namespace other, expected jobs of the "
            "same namespace (default)",
            "depends_on[0]",
        ),
    ),
    (
        "a dependency in another namespace in a batch",
        [],
        [("A", spec(namespace="other")), ("J1", spec("A"))],
        Rejected(
            "invalid_argument",
            "depends_on: job A is in namespace other, expected jobs of the "
            "same namespace (default)",
            "jobs[1].depends_on[0]",
        ),
    ),
    (
        "a cycle in a batch",
        [],
        [("A", spec("B")), ("B", spec("A"))],
        Rejected("conflict", "dependency cycle: A -> B -> A", "depends_on"),
    ),
]


@pytest.mark.parametrize(
    ("existing", "batch", "refusal"),
    [x[1:] for x in SUBMIT_REFUSALS],
    ids=[x[0] for x in SUBMIT_REFUSALS],
)
def test_a_refused_submission_names_the_field_and_creates_nothing(
    existing: list[tuple[str, JobSpec]], batch: list[tuple[str, JobSpec]], refusal: Rejected
) -> None:
    h = Harness()
    for job_id, s in existing:
        assert isinstance(h.submit(job_id, s), Ok)
    before = dict(h.state.jobs)
    assert h.one(commands.Submit(h.rid(), T0 + 1, tuple(batch))) == refusal
    assert h.state.jobs == before


def test_a_batch_with_a_known_idempotency_key_still_creates_its_other_jobs() -> None:
    h = Harness()
    h.submit("J1", JobSpec(task="t", idempotency_key="k"))
    res = h.one(
        commands.Submit(
            h.rid(),
            T0 + 1,
            (("J2", JobSpec(task="t", idempotency_key="k")), ("J3", JobSpec(task="t"))),
        )
    )
    st = h.state
    assert res == Ok(
        [
            (st.jobs["J1"], False, st.runs[f"J1@{T0}"]),
            (st.jobs["J3"], True, st.runs[f"J3@{T0 + 1}"]),
        ]
    )
    assert sorted(h.state.jobs) == ["J1", "J3"]


def test_an_idempotency_key_reused_with_another_task_or_payload_is_a_conflict() -> None:
    h = Harness()
    h.submit("J1", JobSpec(task="t", payload={"n": 1, "m": [2]}, idempotency_key="k"))
    # the same request (any schedule): the job it made
    same = JobSpec(
        task="t", payload={"m": [2], "n": 1}, idempotency_key="k", priority=Priority.HIGH
    )
    assert isinstance(h.submit("J2", same), Ok)
    for other, what in (
        (JobSpec(task="u", payload={"n": 1, "m": [2]}, idempotency_key="k"), "task"),
        (JobSpec(task="t", payload={"n": 2}, idempotency_key="k"), "payload"),
        (JobSpec(task="u", idempotency_key="k"), "task and payload"),
    ):
        res = h.submit("J3", other)
        assert isinstance(res, Rejected) and (res.code, res.field) == (
            "conflict",
            "idempotency_key",
        )
        assert f"'k' was already used in namespace 'default' for job J1 with another {what}" in (
            res.message
        )
    # in another namespace the key is another key
    assert isinstance(h.submit("J4", JobSpec(task="u", namespace="b", idempotency_key="k")), Ok)
    # a batch with one such item is refused whole
    before = dict(h.state.jobs)
    batch = (("J5", JobSpec(task="t")), ("J6", JobSpec(task="x", idempotency_key="k")))
    res = h.one(commands.Submit(h.rid(), T0 + 1, batch))
    assert isinstance(res, Rejected) and res.field == "jobs[1].idempotency_key"
    assert h.state.jobs == before


def test_jobs_are_listed_in_submission_order() -> None:
    # GET /jobs pages through this order.
    h = Harness()
    h.submit("J2")
    h.submit("J1")
    h.one(commands.Submit(h.rid(), T0, (("J4", JobSpec(task="t")), ("J3", JobSpec(task="t")))))
    assert list(h.state.jobs) == ["J2", "J1", "J4", "J3"]


# -- cancel a job ------------------------------------------------------------------------------


def test_cancelling_a_job_cancels_its_pending_run_and_clears_its_next_run() -> None:
    h = Harness()
    h.submit(spec=later())
    assert h.state.jobs["J1"].next_run_at_ms == T0 + MIN
    res = h.one(commands.CancelJob(h.rid(), T0 + 5, "J1"))
    job = h.state.jobs["J1"]
    assert res == Ok(job)
    assert (job.status, job.updated_ms, job.next_run_at_ms, job.next_run_id) == (
        JobStatus.CANCELLED,
        T0 + 5,
        None,
        None,
    )
    run = h.state.runs[f"J1@{T0 + MIN}"]
    assert (run.state, run.reason, run.updated_ms) == (RunState.CANCELLED, "job cancelled", T0 + 5)
    # Cancelling it again changes nothing and answers the job.
    assert h.one(commands.CancelJob(h.rid(), T0 + 9, "J1")) == Ok(job)
    assert h.state.jobs["J1"] == job


def test_cancelling_a_finished_job_leaves_it_done() -> None:
    h = Harness()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    h.one(commands.CompleteRun(h.rid(), T0 + 1, lf, rid, lease_one(h, lf, rid), None))
    done = h.state.jobs["J1"]
    assert done.status is JobStatus.DONE
    assert h.one(commands.CancelJob(h.rid(), T0 + 5, "J1")) == Ok(done)
    assert h.state.jobs["J1"] == done


def test_cancelling_a_finished_job_with_a_triggered_run_in_flight_cancels_that_run() -> None:
    h = Harness()
    lf = h.claim()
    h.submit()
    rid = f"J1@{T0}"
    h.one(commands.CompleteRun(h.rid(), T0 + 1, lf, rid, lease_one(h, lf, rid), None))
    triggered = h.one(commands.Trigger(h.rid(), T0 + 2, "J1")).value
    assert h.state.jobs["J1"].status is JobStatus.DONE and triggered.state is RunState.QUEUED
    res = h.one(commands.CancelJob(h.rid(), T0 + 5, "J1"))
    assert res == Ok(h.state.jobs["J1"]) and res.value.status is JobStatus.CANCELLED
    assert h.state.runs[triggered.id].state is RunState.CANCELLED


@pytest.mark.parametrize("command", [commands.CancelJob, commands.UpdateJob])
def test_cancelling_or_updating_an_unknown_job_is_not_found(command: Any) -> None:
    assert Harness().one(command("x", T0, "nope")) == Rejected(
        "not_found", "no job with id nope", "id"
    )


# -- update a job: pause and resume ------------------------------------------------------------


@pytest.mark.parametrize(
    ("paused_before", "paused", "paused_after"),
    [
        (False, True, True),
        (True, False, False),
        (True, True, True),  # pausing a paused job changes nothing
        (False, False, False),  # resuming an active job changes nothing
        (False, None, False),  # an update that says nothing about pausing does not pause ...
        (True, None, True),  # ... nor resume
    ],
)
def test_pause_and_resume(paused_before: bool, paused: bool | None, paused_after: bool) -> None:
    h = Harness()
    h.submit(spec=later())
    if paused_before:
        h.one(commands.UpdateJob(h.rid(), T0 + 1, "J1", paused=True))
    before = h.state.jobs["J1"]
    res = h.one(commands.UpdateJob(h.rid(), T0 + 7, "J1", paused=paused))
    job = h.state.jobs["J1"]
    assert res == Ok(job)
    assert job.status is (JobStatus.PAUSED if paused_after else JobStatus.ACTIVE)
    assert job.updated_ms == (T0 + 7 if paused_after != paused_before else before.updated_ms)


@pytest.mark.parametrize("status", ["cancelled", "done"])
def test_a_finished_job_can_no_longer_be_changed(status: str) -> None:
    h = Harness()
    lf = h.claim()
    h.submit()
    if status == "cancelled":
        h.one(commands.CancelJob(h.rid(), T0, "J1"))
    else:
        rid = f"J1@{T0}"
        h.one(commands.CompleteRun(h.rid(), T0 + 1, lf, rid, lease_one(h, lf, rid), None))
    before = h.state.jobs["J1"]
    res = h.one(commands.UpdateJob(h.rid(), T0 + 5, "J1", paused=True))
    assert res == Rejected("conflict", f"job J1 is {status}: it can no longer be changed")
    assert h.state.jobs["J1"] == before


# -- many dead-lettered runs at once ------------------------------------------------------------


def test_dead_letters_replays_or_drops_those_of_the_list_still_in_the_queue() -> None:
    h = Harness()
    lf = h.claim()
    dead = []
    for k, task in enumerate(("mail", "mail", "sms")):
        job_id = f"J{k}"
        h.submit(job_id, JobSpec(task=task, retry=RetryPolicy(max_attempts=1)))
        rid = f"{job_id}@{T0}"
        h.one(commands.FailRun(h.rid(), T0 + 1, lf, rid, lease_one(h, lf, rid), "boom", False))
        dead.append(rid)
    res = h.one(commands.DeadLetters(h.rid(), T0 + 2, "replay", (dead[0], dead[1], "J9@1")))
    assert res == Ok(([dead[0], dead[1]], ["J9@1"], [["mail", 2]]))  # counted by task
    assert h.state.runs[dead[0]].state is RunState.QUEUED and not h.state.in_dlq(dead[0])
    res = h.one(commands.DeadLetters(h.rid(), T0 + 3, "drop", tuple(dead)))
    assert res == Ok(([dead[2]], [dead[0], dead[1]], [["sms", 1]]))
    assert h.state.dlq_size() == 0 and h.state.runs[dead[2]].state is RunState.FAILED
    refused = h.one(commands.DeadLetters(h.rid(), T0 + 4, "explode", ()))
    assert isinstance(refused, Rejected) and refused.field == "action"


def test_dead_letters_repeated_with_its_request_id_answers_the_first_result() -> None:
    h = Harness()
    lf = h.claim()
    h.submit(spec=JobSpec(task="t", retry=RetryPolicy(max_attempts=1)))
    rid = f"J1@{T0}"
    h.one(commands.FailRun(h.rid(), T0 + 1, lf, rid, lease_one(h, lf, rid), "boom", False))
    first = h.one(commands.DeadLetters("bulk-1", T0 + 2, "drop", (rid,)))
    assert first == Ok(([rid], [], [["t", 1]]))
    h.state.dlq_add(h.state.runs[rid])  # back in the queue: a repeat must not drop it again
    assert h.one(commands.DeadLetters("bulk-1", T0 + 3, "drop", (rid,))) == first
    assert h.state.in_dlq(rid)
