"""Promises users depend on that no other unit test held: a mutation test showed a one-line
bug in each slipping through.  Pure core, virtual time: every command carries its ``now``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from schedd.core import commands
from schedd.core.model import JobSpec, JobStatus, Overlap, RetryPolicy, RunState
from schedd.core.state import Ok
from tests.unit.test_runs import MIN, T0, Checked, cron, fire, lease, next_id, states
from tests.unit.test_state import Harness

SEC = 1_000


# -- request-id dedup: a client repeating a write (across an election) gets the first answer ---


@pytest.mark.parametrize(
    ("traffic_at", "repeat_at", "deduplicated"),
    [
        (30 * SEC, 60 * SEC, True),  # a retry across an election: well inside the window
        (15 * MIN + 1, 15 * MIN + SEC, False),  # after the 15-minute window: a new request
    ],
    ids=["within the window", "after the window"],
)
def test_a_repeated_request_id_gets_the_first_answer_for_fifteen_minutes(
    traffic_at: int, repeat_at: int, deduplicated: bool
) -> None:
    h = Checked()
    first = h.one(commands.Submit("R-submit", T0, (("J1", JobSpec(task="t")),)))
    assert isinstance(first, Ok)
    h.submit("J-other", now=T0 + traffic_at)  # another client's request in between
    # The repeat comes through another node, which picks another job id.
    again = h.one(commands.Submit("R-submit", T0 + repeat_at, (("J2", JobSpec(task="t")),)))
    if deduplicated:
        assert again == first
        assert sorted(h.state.jobs) == ["J-other", "J1"]
    else:
        assert again != first and isinstance(again, Ok)
        assert sorted(h.state.jobs) == ["J-other", "J1", "J2"]


# -- replay from the dead-letter queue: a fresh set of attempts -------------------------------


def test_a_replayed_run_retries_a_failure_and_dead_letters_only_after_max_attempts_more() -> None:
    h = Checked()
    lf = h.claim()
    h.submit(
        spec=JobSpec(task="t", retry=RetryPolicy(max_attempts=2, initial_ms=SEC, jitter=False))
    )
    rid = f"J1@{T0}"

    def lease_and_fail(now: int) -> None:
        h.one(commands.FailRun(h.rid(), now + 10, lf, rid, lease(h, lf, rid, now), "boom", True))

    for now in (T0, T0 + 2 * SEC):  # attempt 1 fails, is retried, attempt 2 fails
        fire(h, lf, rid, now)
        lease_and_fail(now)
    assert h.state.runs[rid].state is RunState.FAILED and h.state.in_dlq(rid)
    assert isinstance(h.one(commands.Replay(h.rid(), T0 + MIN, rid)), Ok)  # queued again
    lease_and_fail(T0 + MIN)
    run = h.state.runs[rid]
    assert run.state is RunState.RETRYING and not h.state.in_dlq(rid)  # one failure: retried
    fire(h, lf, rid, run.due_ms)
    lease_and_fail(run.due_ms)
    assert h.state.runs[rid].state is RunState.FAILED and h.state.in_dlq(rid)  # the second: DLQ
    assert len(h.state.runs[rid].attempts) == 4
    assert h.state.jobs["J1"].status is JobStatus.DONE


# -- overlap: judged on every live state of the previous run, not only running ----------------


def _queued(h: Harness, lf: int, run_id: str) -> None:
    """Fired, but not leased: every worker of the queue is busy."""


def _retrying(h: Harness, lf: int, run_id: str) -> None:
    """Failed once, waiting out its backoff (5 minutes, past the next occurrences)."""
    fence = lease(h, lf, run_id, T0 + MIN)
    h.one(commands.FailRun(h.rid(), T0 + MIN + 10, lf, run_id, fence, "boom", True))
    assert h.state.runs[run_id].state is RunState.RETRYING


PREV = "<previous, unchanged>"
REPLACED = "cancelled:replaced by a newer run (overlap)"


@pytest.mark.parametrize("previous", [_queued, _retrying], ids=["queued", "retrying"])
@pytest.mark.parametrize(
    ("policy", "expected"),
    [  # occurrences 1, 2, 3 (1 is still live when 2 and 3 fire)
        pytest.param(Overlap.SKIP, [PREV, "skipped:overlap", "skipped:overlap"], id="skip"),
        pytest.param(
            Overlap.BUFFER_ONE, [PREV, "blocked:overlap", "skipped:overlap"], id="buffer_one"
        ),
        pytest.param(Overlap.CANCEL_OTHER, [REPLACED, REPLACED, "queued"], id="cancel_other"),
        pytest.param(Overlap.ALLOW, [PREV, "queued", "queued"], id="allow"),
    ],
)
def test_overlap_counts_a_queued_or_retrying_previous_run_as_live(
    previous: Callable[[Harness, int, str], None], policy: Overlap, expected: list[str]
) -> None:
    h = Checked()
    lf = h.claim()
    h.submit(
        spec=JobSpec(
            task="t",
            schedule=cron(overlap=policy).schedule,
            retry=RetryPolicy(initial_ms=5 * MIN, jitter=False),
        ),
        now=T0,
    )
    first = next_id(h)
    fire(h, lf, first, T0 + MIN)
    previous(h, lf, first)
    before = h.state.runs[first].state.value
    fire(h, lf, next_id(h), T0 + 2 * MIN)
    fire(h, lf, next_id(h), T0 + 3 * MIN)
    got = [f"{s}:{r}" if r else s for _, s, r in states(h)][:3]
    assert got == [before if e == PREV else e for e in expected]
