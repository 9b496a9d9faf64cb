"""History retention (schedd.core.history): what a purge forgets and what it must keep.  Pure
core, virtual time; every command goes through :class:`tests.unit.test_runs.Checked`."""

from __future__ import annotations

from schedd.core import commands
from schedd.core.model import JobSpec, JobStatus, RetryPolicy, RunState
from schedd.core.state import Ok, Rejected
from tests.unit.test_runs import MIN, T0, Checked, every, fire
from tests.unit.test_state import Harness

DAY = 1440 * MIN


def finish(h: Checked, lf: int, run_id: str, now: int, ok: bool = True) -> None:
    fence = h.start(lf, run_id, now)
    if ok:
        assert h.one(commands.CompleteRun(h.rid(), now + 1, lf, run_id, fence, None)) == Ok(run_id)
    else:
        h.one(commands.FailRun(h.rid(), now + 1, lf, run_id, fence, "boom", False))


def purge(
    h: Harness, lf: int, now: int, before: int, keep: int = 1000, limit: int = 1000
) -> object:
    return h.one(commands.Purge(h.rid(), now, lf, before, keep, limit))


def test_a_finished_one_off_job_and_its_run_are_forgotten_after_the_retention() -> None:
    h = Checked()
    lf = h.claim()
    h.submit("J1", JobSpec(task="t", idempotency_key="k"))
    finish(h, lf, f"J1@{T0}", T0)
    assert h.state.jobs["J1"].status is JobStatus.DONE
    assert purge(h, lf, T0 + DAY, before=T0) == Ok([0, 0])  # changed at T0 + 1: not before T0
    assert "J1" in h.state.jobs
    assert purge(h, lf, T0 + DAY, before=T0 + 2) == Ok([1, 1])
    assert "J1" not in h.state.jobs and f"J1@{T0}" not in h.state.runs
    assert h.state.counts.get("state:succeeded") == 0
    # its idempotency key went with it: the same key now makes a new job
    res = h.one(
        commands.Submit(h.rid(), T0 + DAY, (("J9", JobSpec(task="t", idempotency_key="k")),))
    )
    assert isinstance(res, Ok) and res.value[0][1] is True


def test_a_purge_forgets_the_oldest_first_and_no_more_than_its_limit() -> None:
    h = Checked()
    lf = h.claim()
    for i in range(3):
        h.submit(f"J{i}", now=T0 + i)
        finish(h, lf, f"J{i}@{T0 + i}", T0 + 10 * i)
    assert purge(h, lf, T0 + DAY, before=T0 + DAY, limit=2) == Ok([2, 2])
    assert list(h.state.jobs) == ["J2"]
    assert purge(h, lf, T0 + DAY, before=T0 + DAY, limit=2) == Ok([1, 1])
    assert len(h.state.jobs) == 0 and len(h.state.runs) == 0


def test_what_is_unfinished_dead_lettered_or_depended_on_is_kept() -> None:
    h = Checked()
    lf = h.claim()
    h.submit("live")  # queued, never finished
    fire(h, lf, f"live@{T0}", T0)
    h.submit("dead", JobSpec(task="t", retry=RetryPolicy(max_attempts=1)))
    finish(h, lf, f"dead@{T0}", T0, ok=False)
    assert h.state.in_dlq(f"dead@{T0}")
    h.submit("up")
    finish(h, lf, f"up@{T0}", T0)
    h.submit("down", JobSpec(task="t", depends_on=("up",)))
    assert purge(h, lf, T0 + DAY, before=T0 + DAY) == Ok([1, 0])  # only up's run
    assert set(h.state.jobs) == {"live", "dead", "up", "down"}
    assert set(h.state.runs) == {f"live@{T0}", f"dead@{T0}", f"down@{T0}"}
    # dropped from the dead-letter queue, the run (and its job) can go
    assert h.one(commands.DropDead(h.rid(), T0 + DAY, f"dead@{T0}")) == Ok(f"dead@{T0}")
    assert purge(h, lf, T0 + 2 * DAY, before=T0 + 2 * DAY) == Ok([1, 1])
    assert "dead" not in h.state.jobs


def test_a_job_keeps_only_its_newest_finished_runs_once_a_leader_set_the_limit() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=every(MIN), now=T0)
    assert purge(h, lf, T0, before=T0 - DAY, keep=2) == Ok([0, 0])
    assert h.state.history_keep == 2
    done = []
    for i in range(1, 6):
        rid = f"J1@{T0 + i * MIN}"
        finish(h, lf, rid, T0 + i * MIN)
        done.append(rid)
    finished = sorted(r.id for r in h.state.runs.values() if r.state is RunState.SUCCEEDED)
    assert finished == sorted(done[-2:])
    assert h.state.counts["state:succeeded"] == 2


def test_a_purge_with_bad_limits_is_refused_and_changes_nothing() -> None:
    h = Checked()
    lf = h.claim()
    h.submit()
    finish(h, lf, f"J1@{T0}", T0)
    for keep, limit in ((0, 10), (10, 0)):
        res = purge(h, lf, T0 + DAY, before=T0 + DAY, keep=keep, limit=limit)
        assert isinstance(res, Rejected) and res.code == "invalid_argument"
    assert "J1" in h.state.jobs and h.state.history_keep == 1000


def test_a_purge_from_a_deposed_leader_is_refused() -> None:
    h = Checked()
    lf = h.claim()
    h.submit()
    finish(h, lf, f"J1@{T0}", T0)
    h.claim("n2", term=2)
    res = purge(h, lf, T0 + DAY, before=T0 + DAY)
    assert isinstance(res, Rejected) and res.code == "stale_leader"
    assert "J1" in h.state.jobs


def test_the_smallest_keep_and_limit_are_taken_and_anything_else_is_refused_saying_why() -> None:
    h = Checked()
    lf = h.claim()
    for i in range(2):
        h.submit(f"J{i}")
        finish(h, lf, f"J{i}@{T0}", T0)
    assert purge(h, lf, T0 + DAY, before=T0 + DAY, keep=1, limit=1) == Ok([1, 1])
    assert h.state.history_keep == 1
    refused = Rejected("invalid_argument", "purge: expected integers, keep and limit >= 1")
    for keep, limit, before in ((0, 1, T0), (1, 0, T0), ("2", 1, T0), (1, 1.0, T0), (1, 1, None)):
        assert h.one(commands.Purge(h.rid(), T0 + DAY, lf, before, keep, limit)) == refused  # type: ignore[arg-type]
    assert h.state.history_keep == 1 and list(h.state.jobs) == ["J1"]


def test_a_run_or_job_is_forgotten_only_once_it_last_changed_strictly_before_the_cutoff() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(spec=every(MIN), now=T0)
    finish(h, lf, f"J1@{T0 + MIN}", T0 + MIN)  # changed last at T0 + MIN + 1
    h.one(commands.UpdateJob(h.rid(), T0 + 2 * MIN, "J1", paused=True))
    h.one(
        commands.UpdateJob(h.rid(), T0 + 3 * MIN, "J1", spec=every(MIN, end_at_ms=T0))
    )  # schedule over
    h.one(
        commands.CancelJob(h.rid(), T0 + 10 * MIN, "J1")
    )  # cancelled later than its last run changed
    assert h.state.jobs["J1"].status is JobStatus.CANCELLED
    assert max(r.updated_ms for r in h.state.runs.values()) < T0 + 10 * MIN
    assert purge(h, lf, T0 + DAY, before=T0 + MIN + 1) == Ok([0, 0])  # not strictly before
    assert len(h.state.runs) == 2
    assert purge(h, lf, T0 + DAY, before=T0 + 10 * MIN) == Ok([2, 0])
    assert len(h.state.runs) == 0 and "J1" in h.state.jobs  # changed at the cutoff: kept
    assert purge(h, lf, T0 + DAY, before=T0 + 10 * MIN + 1) == Ok([0, 1])
    assert "J1" not in h.state.jobs


def test_an_upstream_is_kept_while_any_dependant_remains() -> None:
    h = Checked()
    lf = h.claim()
    h.submit("up")
    finish(h, lf, f"up@{T0}", T0)
    for name in ("a", "b"):
        h.submit(name, JobSpec(task="t", depends_on=("up",)), now=T0 + 2)
        finish(h, lf, f"{name}@{T0 + 2}", T0 + 2)
    h.one(commands.Trigger(h.rid(), T0 + 3, "b", False))  # b has a run that is not finished
    assert purge(h, lf, T0 + DAY, before=T0 + DAY) == Ok([3, 1])  # a goes; up and b stay
    assert set(h.state.jobs) == {"up", "b"} and list(h.state.dependants_of("up")) == ["b"]
    assert purge(h, lf, T0 + DAY, before=T0 + DAY) == Ok([0, 0])
