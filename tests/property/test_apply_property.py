"""apply is deterministic, total, and survives a snapshot round trip mid-stream."""

from __future__ import annotations

import pickle

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedd.core import commands
from schedd.core.apply import apply_entry
from schedd.core.model import JobSpec, RetryPolicy, Schedule, ScheduleKind
from schedd.core.state import MemoryState, State

T0 = 1_800_000_000_000
JOBS = ["J1", "J2", "J3"]


def _run_ids(job: str) -> list[str]:
    return [f"{job}@{T0 + d}" for d in (0, 10, 1000)]


run_ids = st.sampled_from([r for j in JOBS for r in _run_ids(j)])
now = st.integers(T0, T0 + 5000)
rid = st.text("abcdef", min_size=1, max_size=3)
fence = st.integers(0, 60)

spec = st.builds(
    JobSpec,
    task=st.just("t"),
    schedule=st.one_of(
        st.just(Schedule()),
        st.builds(
            Schedule, kind=st.just(ScheduleKind.AT), at_ms=st.sampled_from([T0 + 10, T0 + 1000])
        ),
    ),
    retry=st.builds(RetryPolicy, max_attempts=st.integers(1, 3), initial_ms=st.integers(1, 2000)),
    timeout_ms=st.one_of(st.none(), st.integers(1, 3000)),
    idempotency_key=st.one_of(st.none(), st.sampled_from(["k1", "k2"])),
)

command = st.one_of(
    st.builds(commands.Claim, rid, now, st.sampled_from(["n1", "n2"]), st.integers(1, 4)),
    st.builds(
        commands.Submit,
        rid,
        now,
        st.lists(st.tuples(st.sampled_from(JOBS), spec), min_size=1, max_size=2).map(tuple),
    ),
    st.builds(commands.CancelJob, rid, now, st.sampled_from([*JOBS, "nope"])),
    st.builds(commands.Fire, rid, now, fence, st.lists(run_ids, max_size=3).map(tuple)),
    st.builds(
        commands.LeaseRuns,
        rid,
        now,
        fence,
        st.lists(st.tuples(run_ids, st.sampled_from(["w1", "w2"])), max_size=2).map(tuple),
    ),
    st.builds(commands.CompleteRun, rid, now, fence, run_ids, fence, st.none()),
    st.builds(
        commands.FailRun,
        rid,
        now,
        fence,
        run_ids,
        fence,
        st.just("e"),
        st.booleans(),
        st.sampled_from(["failed", "lost", "timed_out"]),
        st.floats(0, 1),
    ),
    st.builds(commands.Barrier, rid, now),
)

entries = st.lists(st.lists(command, min_size=1, max_size=3), max_size=25)


def _replay(state: State, batches: list[list[commands.Command]], start: int = 1) -> list[object]:
    out = []
    for i, batch in enumerate(batches):
        results, events = apply_entry(state, commands.encode_entry(batch), start + i)
        out.append((results, events))
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries)
def test_apply_is_deterministic(batches: list[list[commands.Command]]) -> None:
    a, b = MemoryState(), MemoryState()
    ra, rb = _replay(a, batches), _replay(b, batches)
    assert ra == rb
    assert a.__dict__ == b.__dict__


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries, st.integers(0, 25))
def test_snapshot_round_trip_mid_stream(batches: list[list[commands.Command]], cut: int) -> None:
    straight = MemoryState()
    _replay(straight, batches)
    first = MemoryState()
    _replay(first, batches[:cut])
    restored: State = pickle.loads(pickle.dumps(first))
    _replay(restored, batches[cut:], start=cut + 1)
    assert restored.__dict__ == straight.__dict__


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(blob: bytes) -> None:
    results, _ = apply_entry(MemoryState(), blob, 1)
    assert results


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    ["t", "rid", "now", "lf", "jobs", "run_ids", "grants", "fence", "v", "c", "x"]
                ),
                inner,
                max_size=5,
            )
        ),
        max_leaves=15,
    )
)
def test_arbitrary_json_commands_never_raise(obj: object) -> None:
    import orjson

    blob = orjson.dumps({"v": 1, "c": [obj]})
    state = MemoryState()
    results, _ = apply_entry(state, blob, 1)
    assert len(results) == 1


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries)
def test_a_node_applying_the_commands_it_encoded_ends_where_decoding_ends(
    batches: list[list[commands.Command]],
) -> None:
    """The node that encoded an entry applies the commands it held (it does not decode its
    own entry again): they equal what every other node decodes, and give the same state."""
    held, decoded = MemoryState(), MemoryState()
    for i, batch in enumerate(batches, start=1):
        blob = commands.encode_entry(batch)
        assert commands.decode_entry(blob) == batch
        assert apply_entry(held, blob, i, batch) == apply_entry(decoded, blob, i)
    assert held.__dict__ == decoded.__dict__
