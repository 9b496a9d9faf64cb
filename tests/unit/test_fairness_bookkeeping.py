"""ReadyQueues promises that rest on its lazy bookkeeping (schedd.core.fairness).

Removed runs stay in their lane until they reach the front or the lane is compacted, emptied
namespaces stay in the ring until their turn, and turns are counted per namespace.  Whatever
that bookkeeping does, a removed run is never leased, a queued one is never lost, the order is
the documented one, and removals cannot pile up memory.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from schedd.core.fairness import ReadyQueues
from schedd.core.model import Priority

N = Priority.NORMAL

# An op is ("push", run_id) (namespace "ns", normal priority), ("remove", run_id) or ("pop",).
Op = tuple[str, ...]

LANE_CASES: list[tuple[str, list[Op], list[str | None]]] = [
    (
        "an id removed twice and queued again pops once, at its last place",
        [
            ("push", "a"),
            ("push", "b"),
            ("push", "c"),
            ("remove", "a"),
            ("push", "a"),
            ("remove", "a"),
            ("push", "d"),
            ("push", "a"),
            ("push", "e"),
        ],
        ["b", "c", "d", "a", "e", None],
    ),
    (
        "an id removed and queued again survives the compaction of its lane",
        [("push", "a"), ("push", "b"), ("remove", "a"), ("push", "a"), ("remove", "b")],
        ["a", None],
    ),
    (
        "a lane emptied while it holds removed entries is as good as new",
        [
            ("push", "a"),
            ("push", "b"),
            ("remove", "b"),
            ("pop",),
            ("push", "b"),
            ("push", "c"),
            ("remove", "c"),
            ("push", "d"),
        ],
        ["b", "d", None],
    ),
    (
        "a lane emptied by removals is as good as new",
        [
            ("push", "a"),
            ("push", "b"),
            ("remove", "a"),
            ("remove", "b"),
            ("push", "a"),
            ("push", "c"),
            ("remove", "c"),
            ("push", "b"),
        ],
        ["a", "b", None],
    ),
]


@pytest.mark.parametrize(
    ("ops", "expected"), [c[1:] for c in LANE_CASES], ids=[c[0] for c in LANE_CASES]
)
def test_removed_runs_are_never_leased_and_queued_ones_never_lost(
    ops: list[Op], expected: list[str | None]
) -> None:
    q = ReadyQueues()
    for op in ops:
        if op[0] == "push":
            q.push(op[1], "ns", N)
        elif op[0] == "remove":
            assert q.remove(op[1])
        else:
            q.pop()
    assert [q.pop() for _ in expected] == expected


def test_removals_between_pops_do_not_pile_up() -> None:
    # Every queued run has removed ones around it, and each lease walks past some of them: the
    # lane must still be compacted once its removed entries outnumber its queued runs.
    q = ReadyQueues()
    live, extra = 20, 10
    for r in range(live):
        q.push(f"y{r}", "ns", N)
        q.push(f"run{r}", "ns", N)
        q.remove(f"y{r}")
    for r in range(live, 1_000):
        assert q.pop() == f"run{r - live}"
        q.push(f"y{r}", "ns", N)
        q.push(f"run{r}", "ns", N)
        for j in range(extra):
            q.push(f"z{r}.{j}", "ns", N)
        q.remove(f"y{r}")
        for j in range(extra):
            q.remove(f"z{r}.{j}")
        lane = q._namespaces["ns"].lanes[1]  # white-box: memory is bounded
        assert len(lane.ids) <= 3 * len(q), f"{len(lane.ids)} entries for {len(q)} runs"
    assert len(q) == live


def test_a_queue_with_runs_is_truthy() -> None:
    q = ReadyQueues()
    assert not q
    q.push("r", "ns", N)
    assert q and len(q) == 1
    q.remove("r")
    assert not q


# --- turns between namespaces -----------------------------------------------------------------


def namespaces_of(q: ReadyQueues, pops: int, can_take: Callable[[str], bool] | None = None) -> str:
    out = []
    for _ in range(pops):
        run_id = q.pop(can_take)
        assert run_id is not None
        out.append(run_id.split("/")[0])
    return "".join(out)


def fill(q: ReadyQueues, namespace: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        q.push(f"{namespace}/{i}", namespace, N)


def test_a_namespace_emptied_by_remove_and_refilled_keeps_one_place_in_the_ring() -> None:
    q = ReadyQueues()
    q.push("a/0", "a", N)
    fill(q, "b", 3)
    assert q.remove("a/0")  # a is empty but still in the ring
    fill(q, "a", 3, start=1)
    assert namespaces_of(q, 6) == "ababab"


def test_a_refused_namespace_goes_to_the_back_of_the_ring() -> None:
    q = ReadyQueues()
    for ns in "abc":
        fill(q, ns, 3)
    assert q.pop(lambda ns: ns != "a") == "b/0"
    assert namespaces_of(q, 5) == "cabca"


def test_a_refused_namespace_gets_a_full_quantum_on_its_next_turn() -> None:
    q = ReadyQueues(quantum=3)
    fill(q, "a", 10)
    fill(q, "b", 10)
    assert q.pop(lambda ns: ns != "a") == "b/0"
    assert namespaces_of(q, 11) == "bbaaabbbaaa"


def test_a_namespace_that_drains_and_refills_gets_a_full_quantum() -> None:
    q = ReadyQueues(quantum=3)
    fill(q, "a", 2)
    fill(q, "b", 10)
    assert namespaces_of(q, 5) == "aabbb"  # a drained before the end of its turn
    fill(q, "a", 6, start=2)
    assert namespaces_of(q, 10) == "bbbaaabbba"


def empty_c_by_remove(q: ReadyQueues) -> None:
    assert q.remove("c/0") and q.remove("c/1")


def empty_c_by_pop(q: ReadyQueues) -> None:
    assert [q.pop(), q.pop(), q.pop()] == ["a/0", "b/0", "c/0"]
    assert q.pop(lambda ns: ns == "c") == "c/1"


@pytest.mark.parametrize("empty_c", [empty_c_by_remove, empty_c_by_pop], ids=["remove", "pop"])
def test_an_emptied_namespace_no_longer_counts_as_waiting(
    empty_c: Callable[[ReadyQueues], None],
) -> None:
    q = ReadyQueues()
    for ns in "abc":
        fill(q, ns, 2 if ns == "c" else 4)
    empty_c(q)
    assert "c/0" not in q and "c/1" not in q
    asked: list[str] = []

    def only_b(ns: str) -> bool:
        asked.append(ns)
        return ns == "b"

    # Refusing a does not make pop give up before it asked b.
    got = q.pop(only_b)
    assert got is not None and got.startswith("b/")
    asked.clear()

    def never(ns: str) -> bool:
        asked.append(ns)
        return False

    # When nobody can take, each namespace still waiting is asked exactly once.
    assert q.pop(never) is None
    assert sorted(asked) == ["a", "b"]
