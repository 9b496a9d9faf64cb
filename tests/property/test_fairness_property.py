"""Stateful property test: ReadyQueues against a plain model of FIFO lanes."""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from schedd.core.fairness import ReadyQueues
from schedd.core.model import Priority

IDS = [f"r{i}" for i in range(16)]
NAMESPACES = ["a", "b", "c"]
PRIORITIES = list(Priority)


class ReadyQueuesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.q = ReadyQueues()
        # (namespace, priority) -> queued ids, oldest first
        self.lanes: dict[tuple[str, Priority], list[str]] = {}
        self.where: dict[str, tuple[str, Priority]] = {}
        self.pushes: Counter[str] = Counter()  # how many times each id was (really) pushed
        self.pops: Counter[str] = Counter()

    @initialize(
        weights=st.tuples(st.integers(1, 100), st.integers(1, 100), st.integers(1, 100)),
        quantum=st.integers(1, 4),
    )
    def setup(self, weights: tuple[int, int, int], quantum: int) -> None:
        self.q = ReadyQueues(dict(zip(PRIORITIES, weights, strict=True)), quantum)

    @rule(
        run_id=st.sampled_from(IDS),
        ns=st.sampled_from(NAMESPACES),
        priority=st.sampled_from(PRIORITIES),
    )
    def push(self, run_id: str, ns: str, priority: Priority) -> None:
        self.q.push(run_id, ns, priority)
        if run_id in self.where:
            return  # a no-op
        self.where[run_id] = (ns, priority)
        self.lanes.setdefault((ns, priority), []).append(run_id)
        self.pushes[run_id] += 1

    @rule(run_id=st.sampled_from(IDS))
    def remove(self, run_id: str) -> None:
        assert self.q.remove(run_id) == (run_id in self.where)
        if run_id in self.where:
            self.lanes[self.where.pop(run_id)].remove(run_id)

    @rule(allowed=st.sets(st.sampled_from(NAMESPACES)) | st.just(set(NAMESPACES)))
    def pop(self, allowed: set[str]) -> None:
        asked: list[str] = []

        def can_take(ns: str) -> bool:
            asked.append(ns)
            return ns in allowed

        run_id = self.q.pop(can_take)
        takeable = [ids for (ns, _), ids in self.lanes.items() if ids and ns in allowed]
        if run_id is None:
            assert not takeable, "pop returned None although something could be taken"
            return
        assert run_id in self.where, f"popped {run_id}, which is not queued"
        lane = self.where.pop(run_id)
        assert lane[0] in allowed, "popped from a namespace that can_take refused"
        assert self.lanes[lane][0] == run_id, "not FIFO within its lane"
        self.lanes[lane].pop(0)
        self.pops[run_id] += 1
        assert len(asked) == len(set(asked)), "a namespace was asked twice in one pop"

    @invariant()
    def agrees_with_model(self) -> None:
        assert len(self.q) == len(self.where)
        for run_id in IDS:
            assert (run_id in self.q) == (run_id in self.where)
        expected = {lane: len(ids) for lane, ids in self.lanes.items() if ids}
        assert self.q.depth() == expected
        # White box: smooth weighted round robin's current weights sum to zero per namespace
        # and stay bounded, so no lane can bank an unbounded credit or debt.
        for ns in self.q._namespaces.values():
            total = sum(lane.weight for lane in ns.lanes)
            assert sum(lane.current for lane in ns.lanes) == 0
            assert all(abs(lane.current) <= 2 * total for lane in ns.lanes)
        # Each push is popped at most once: pops never outnumber pushes.
        for run_id, n in self.pops.items():
            assert n <= self.pushes[run_id] - (1 if run_id in self.where else 0)


ReadyQueuesMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None
)
TestReadyQueues = ReadyQueuesMachine.TestCase
