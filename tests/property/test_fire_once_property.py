"""Whatever the sequence of leader changes, stale leaders and repeated fires, no
(job, scheduled time) is fired twice and occurrences are never lost."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedd.core import commands
from schedd.core.apply import apply_entry
from schedd.core.model import JobSpec, Overlap, RecurringOptions, RunState, Schedule, ScheduleKind
from schedd.core.state import MemoryState, Ok

T0 = 1_800_000_040_000 - 1_800_000_040_000 % 1000
SPEC = JobSpec(
    task="t",
    schedule=Schedule(
        kind=ScheduleKind.CRON, cron="* * * * * *", options=RecurringOptions(overlap=Overlap.ALLOW)
    ),
)

# Steps: ("claim",) a new leader; ("fire", leader_age, lag) the leader `leader_age` claims ago
# fires every scheduled run it knows that is due at the current time; ("tick", ms) time passes.
step = st.one_of(
    st.tuples(st.just("claim")),
    st.tuples(st.just("fire"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("tick"), st.integers(1, 2500)),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=60))
def test_no_occurrence_fires_twice_across_leader_changes(steps: list[tuple]) -> None:
    state = MemoryState()
    index = 0
    now = T0
    claims: list[int] = []
    fired: dict[str, int] = {}

    def entry(*cmds: commands.Command) -> list[object]:
        nonlocal index
        index += 1
        results, _ = apply_entry(state, commands.encode_entry(list(cmds)), index)
        return results

    entry(commands.Claim("c0", now, "n0", 1))
    claims.append(state.leader_fence)
    entry(commands.Submit("s", now, (("J", SPEC),)))
    term = 1
    for s in steps:
        if s[0] == "claim":
            term += 1
            entry(commands.Claim(f"c{term}", now, f"n{term}", term))
            claims.append(state.leader_fence)
        elif s[0] == "tick":
            now += s[1]
        else:
            lf = claims[max(0, len(claims) - 1 - s[1])]
            # a leader that rebuilt its wheel fires everything due, possibly twice (s[2])
            due = [r.id for r in state.runs.values() if r.due_ms <= now]
            for _ in range(2 if s[2] else 1):
                before = {r.id: r.state for r in state.runs.values()}
                [res] = entry(commands.Fire(f"f{index}", now, lf, tuple(due)))
                if isinstance(res, Ok):
                    for rid in due:
                        if (
                            before.get(rid) is RunState.SCHEDULED
                            and state.runs[rid].state is not RunState.SCHEDULED
                        ):
                            fired[rid] = fired.get(rid, 0) + 1
    assert all(n == 1 for n in fired.values()), fired
    # every occurrence up to the pending one exists exactly once, one second apart, no gaps
    scheduled = sorted(r.scheduled_ms for r in state.runs.values())
    assert scheduled == list(range(scheduled[0], scheduled[-1] + 1, 1000))
    pending = [r for r in state.runs.values() if r.state is RunState.SCHEDULED]
    assert len(pending) >= 1 and state.jobs["J"].next_run_id in {r.id for r in pending}
