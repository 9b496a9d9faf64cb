"""Stateful property test: the timing wheel against a plain dict-and-sort model."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from schedd.core.wheel import TimingWheel

KEYS = [f"k{i}" for i in range(12)]

# Due offsets from the model's current time: near (inside a tick or two), past, a few wheel
# spans, and far enough to land in the overflow of any wheel shape drawn below.
OFFSETS = st.one_of(
    st.integers(-25, 40),
    st.integers(-10_000, 10_000),
    st.integers(0, 10**7),
    st.integers(0, 10**12),
)
# Advance steps: backwards, small, medium and huge jumps.
STEPS = st.one_of(
    st.integers(-40, 40),
    st.integers(0, 3_000),
    st.integers(0, 10**7),
    st.integers(0, 10**12),
)


class WheelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.wheel: TimingWheel | None = None
        self.now = 0
        self.seq = 0
        self.model: dict[str, tuple[int, int]] = {}  # key -> (due, insertion seq)

    @initialize(
        start=st.one_of(st.sampled_from([0, -1, 1_700_000_000_000]), st.integers(-(10**6), 10**13)),
        tick=st.sampled_from([1, 2, 3, 10]),
        size=st.sampled_from([2, 3, 4, 8, 64]),
        levels=st.sampled_from([1, 2, 3, 5]),
    )
    def make(self, start: int, tick: int, size: int, levels: int) -> None:
        self.wheel = TimingWheel(start, tick_ms=tick, wheel_size=size, levels=levels)
        self.now = start

    @property
    def w(self) -> TimingWheel:
        assert self.wheel is not None
        return self.wheel

    @rule(key=st.sampled_from(KEYS), offset=OFFSETS)
    def add(self, key: str, offset: int) -> None:
        due = self.now + offset
        self.w.add(key, due)
        self.model[key] = (due, self.seq)
        self.seq += 1

    @rule(
        key=st.sampled_from(KEYS),
        offset=OFFSETS,
        times=st.integers(1, 80),
        stride=st.integers(-3, 3),
    )
    def churn(self, key: str, offset: int, times: int, stride: int) -> None:
        """Move one key many times in a row, leaving stale entries (bucket compaction)."""
        for i in range(times):
            self.add(key, offset + i * stride)

    @rule(key=st.sampled_from(KEYS))
    def remove(self, key: str) -> None:
        assert self.w.remove(key) == (self.model.pop(key, None) is not None)

    @rule(step=STEPS)
    def advance(self, step: int) -> None:
        got = self.w.advance(self.now + step)
        self.now = max(self.now, self.now + step)
        due = sorted((v, k) for k, v in self.model.items() if v[0] <= self.now)
        expected = [k for _, k in due]
        for k in expected:
            del self.model[k]
        assert got == expected

    @invariant()
    def agrees_with_model(self) -> None:
        if self.wheel is None:
            return
        wheel = self.wheel
        assert len(wheel) == len(self.model)
        for key in KEYS:
            entry = self.model.get(key)
            assert (key in wheel) == (entry is not None)
            assert wheel.due_of(key) == (None if entry is None else entry[0])
        assert wheel.next_due_ms() == min((d for d, _ in self.model.values()), default=None)


WheelMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
TestWheelMachine = WheelMachine.TestCase
