"""The state in SQLite answers exactly as the state in dicts, entry after entry, and a database
reopened mid-stream goes on as if it had never stopped (hypothesis, real SQLite files)."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedd.core import commands
from schedd.core.apply import apply_entry
from schedd.core.model import JobSpec, RecurringOptions, RetryPolicy, Schedule, ScheduleKind
from schedd.core.state import MemoryState, State
from schedd.storage.codec import (
    job_body,
    job_from_body,
    result_body,
    result_from_body,
    run_body,
    run_from_body,
)
from schedd.storage.sqlstate import SqlState
from schedd.storage.sqlstate import apply_entry as sql_apply_entry
from tests.property.test_apply_property import JOBS, T0

spec = st.builds(
    JobSpec,
    task=st.sampled_from(["t", "u"]),
    schedule=st.one_of(
        st.just(Schedule()),
        st.builds(
            Schedule, kind=st.just(ScheduleKind.AT), at_ms=st.sampled_from([T0 + 10, T0 + 1000])
        ),
        st.builds(
            Schedule,
            kind=st.just(ScheduleKind.EVERY),
            every_ms=st.sampled_from([5_000, 60_000]),
            options=st.builds(
                RecurringOptions,
                overlap=st.sampled_from(["skip", "allow", "buffer_one", "cancel_other"]),
            ),
        ),
    ),
    retry=st.builds(RetryPolicy, max_attempts=st.integers(1, 3), initial_ms=st.integers(1, 2000)),
    timeout_ms=st.one_of(st.none(), st.integers(1, 3000)),
    idempotency_key=st.one_of(st.none(), st.sampled_from(["k1", "k2"])),
)
KINDS = [
    "submit",
    "submit",
    "fire",
    "fire",
    "lease",
    "lease",
    "complete",
    "fail",
    "fail",
    "progress",
    "cancel_run",
    "replay",
    "drop",
    "update",
    "pause",
    "resume",
    "trigger",
    "cancel_job",
    "heal",
    "claim",
    "repeat",
    "purge",
]


def one_command(data: st.DataObject, state: MemoryState, t: int, n: int) -> commands.Command:
    """A command that makes sense against ``state`` (mostly: a stale fence, a wrong id or a
    repeated request id now and then, as in a real cluster)."""
    kind = data.draw(st.sampled_from(KINDS))
    r = f"r{n}"
    lf = state.leader_fence if data.draw(st.integers(0, 9)) else state.leader_fence - 1
    job_ids = list(state.jobs) or ["J1"]
    run_list = list(state.runs.values())

    def pick_run(*states: str) -> str:
        chosen = [x.id for x in run_list if x.state.value in states] or [x.id for x in run_list]
        return data.draw(st.sampled_from(chosen or ["J1@1"]))

    if kind == "submit":  # new jobs (one named twice now and then), depending on earlier ones
        ids = data.draw(st.lists(st.sampled_from([f"N{n}", f"M{n}"]), min_size=1, max_size=2))
        deps = st.lists(st.sampled_from(job_ids), max_size=2, unique=True).map(tuple)
        return commands.Submit(
            r, t, tuple((j, replace(data.draw(spec), depends_on=data.draw(deps))) for j in ids)
        )
    if kind == "fire":
        return commands.Fire(
            r,
            t,
            lf,
            tuple(
                data.draw(
                    st.lists(st.just(pick_run("scheduled", "retrying")), min_size=1, max_size=2)
                )
            ),
        )
    if kind == "lease":
        return commands.LeaseRuns(
            r, t, lf, ((pick_run("queued"), data.draw(st.sampled_from(["w1", "w2"]))),)
        )
    if kind in ("complete", "fail", "progress"):
        run_id = pick_run("running")
        current = state.runs[run_id].fence if run_id in state.runs else None
        f = (current or 0) - data.draw(st.sampled_from([0, 0, 0, 1]))
        progress = data.draw(st.sampled_from([None, None, 0, "half", {"n": [1, None]}]))
        if kind == "progress":
            return commands.Progress(r, t, lf, ((run_id, f, progress),))
        if kind == "complete":
            return commands.CompleteRun(
                r, t, lf, run_id, f, data.draw(st.sampled_from([None, {"n": 1}])), progress
            )
        return commands.FailRun(
            r,
            t,
            lf,
            run_id,
            f,
            "e",
            data.draw(st.booleans()),
            data.draw(st.sampled_from(["failed", "lost", "timed_out"])),
            data.draw(st.floats(0, 1)),
            data.draw(st.sampled_from([None, "Traceback …\nValueError: é"])),
            progress,
        )
    if kind == "purge":
        return commands.Purge(
            r,
            t,
            lf,
            t - data.draw(st.sampled_from([0, 1_000, 100_000])),
            data.draw(st.integers(1, 3)),
            data.draw(st.sampled_from([1, 3, 100])),
        )
    if kind == "cancel_run":
        return commands.CancelRun(
            r, t, pick_run("scheduled", "queued", "running", "retrying", "blocked")
        )
    if kind == "replay":
        return commands.Replay(r, t, pick_run("failed"))
    if kind == "drop":
        return commands.DropDead(r, t, pick_run("failed"))
    return _job_command(data, state, kind, r, t, lf, n, data.draw(st.sampled_from(job_ids)))


def _job_command(
    data: st.DataObject, state: MemoryState, kind: str, r: str, t: int, lf: int, n: int, job_id: str
) -> commands.Command:
    if kind == "update":
        return commands.UpdateJob(r, t, job_id, None, data.draw(spec))
    if kind in ("pause", "resume"):
        return commands.UpdateJob(r, t, job_id, kind == "pause")
    if kind == "trigger":
        return commands.Trigger(r, t, job_id, data.draw(st.booleans()))
    if kind == "cancel_job":
        return commands.CancelJob(r, t, job_id)
    if kind == "heal":
        return commands.Heal(r, t, lf, job_id)
    if kind == "claim":
        return commands.Claim(r, t, "n1", state.leader_term + data.draw(st.integers(0, 1)))
    return commands.CancelJob(
        f"r{data.draw(st.integers(0, n))}", t, job_id
    )  # a request id seen before


def draw_entries(
    data: st.DataObject, state: MemoryState, count: int
) -> list[list[commands.Command]]:
    """``count`` entries drawn against ``state`` as it becomes (applying them to it)."""
    batches = []
    t = T0 + state.applied_index * 500
    for _ in range(count):
        batch = []
        for _ in range(data.draw(st.integers(1, 3))):
            t += data.draw(st.sampled_from([0, 1, 10, 700, 1_000, 5_000, 130_000]))
            batch.append(
                one_command(data, state, t, len(batches) * 3 + len(batch) + state.applied_index * 3)
            )
        apply_entry(state, commands.encode_entry(batch), state.applied_index + 1)
        batches.append(batch)
    return batches


def answers(state: State) -> dict[str, Any]:
    """Everything the core, the leader and the API can ask a state."""
    job_ids = list(state.jobs)
    return {
        "jobs": [state.jobs[j] for j in job_ids],
        "runs": [state.runs[r] for r in state.runs],
        "len": (len(state.jobs), len(state.runs)),
        "per_job": {
            j: (
                state.unfinished_runs(j),
                state.has_unfinished(j),
                state.latest_run(j),
                state.latest_finished_run(j),
                state.runs_of(j),
                list(state.dependants_of(j)),
            )
            for j in JOBS
        },
        "due": [
            state.due_runs(T0, T0 + 1_000),
            state.due_runs(T0 + 1_000, 2 * T0),
            state.due_runs(0, 2 * T0, 1),
            state.due_runs(0, 2 * T0, 3),
        ],
        "live": state.live_runs(),
        "recurring": list(state.active_recurring_jobs()),
        "keys": [state.job_by_key("default", k) for k in ("k1", "k2")],
        "dlq": (list(state.dlq_newest_first()), state.dlq_size()),
        "remembered": state.remembered(),
        "counts": {k: v for k, v in state.counts.items() if v},
        "leader": (
            state.leader_fence,
            state.leader_node,
            state.leader_http,
            state.leader_term,
            state.applied_index,
            state.history_keep,
        ),
        "claims": state.leader_claims,
        "history": (
            state.finished_runs_before(2 * T0, 1000),
            state.forgettable_jobs(2 * T0, 1000),
            {j: state.finished_runs_beyond(j, 1) for j in list(state.jobs)},
        ),
    }


def replay_both(
    mem: MemoryState, sql: SqlState, batches: list[list[commands.Command]], start: int
) -> None:
    for i, batch in enumerate(batches):
        blob = commands.encode_entry(batch)
        expected = apply_entry(mem, blob, start + i)
        got = sql_apply_entry(sql, blob, start + i)
        assert got == expected, (batch, got, expected)
        for cmd in batch:
            assert sql.recall(cmd.rid) == mem.recall(cmd.rid)


def drawn(data: st.DataObject, count: int) -> list[list[commands.Command]]:
    model = MemoryState()
    apply_entry(model, commands.encode_entry([commands.Claim("r0", T0, "n1", 1)]), 1)
    return [[commands.Claim("r0", T0, "n1", 1)], *draw_entries(data, model, count)]


#: what the SQL state keeps in memory, from nothing (every read from the database) to everything
MEMORY = st.builds(
    dict, cache_max=st.sampled_from([1, 3, 10_000]), hot_ms=st.sampled_from([0, 1_000, 600_000])
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_sql_state_answers_as_the_memory_state(data: st.DataObject) -> None:
    batches = drawn(data, data.draw(st.integers(1, 40)))
    mem, sql = MemoryState(), SqlState(**data.draw(MEMORY))
    try:
        replay_both(mem, sql, batches, 1)
        assert answers(sql) == answers(mem)
    finally:
        sql.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_database_reopened_mid_stream_goes_on_as_if_it_never_stopped(data: st.DataObject) -> None:
    batches = drawn(data, data.draw(st.integers(1, 30)))
    cut = data.draw(st.integers(0, len(batches)))
    mem = MemoryState()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.db"
        memory = data.draw(MEMORY)
        sql = SqlState(path, **memory)
        replay_both(mem, sql, batches[:cut], 1)
        sql.close()
        sql = SqlState(path, **memory)  # a restart: only what was committed
        try:
            # The journal replays from before the database's applied index: skipped.
            for i, batch in enumerate(batches[:cut]):
                assert sql_apply_entry(sql, commands.encode_entry(batch), 1 + i) is None
            replay_both(mem, sql, batches[cut:], cut + 1)
            assert answers(sql) == answers(mem)
        finally:
            sql.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_job_run_and_result_reads_back_as_written(data: st.DataObject) -> None:
    mem = MemoryState()
    for i, batch in enumerate(drawn(data, data.draw(st.integers(1, 30)))):
        results, _ = apply_entry(mem, commands.encode_entry(batch), i + 1)
        for res in results:
            assert result_from_body("r", result_body(res)) == res
    for job in mem.jobs.values():
        assert job_from_body(job.id, job_body(job)) == job
    for run in mem.runs.values():
        assert run_from_body(run.job_id, run.scheduled_ms, run_body(run)) == run
