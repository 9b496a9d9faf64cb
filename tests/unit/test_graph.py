"""Unit tests of job dependency graphs (schedd.core.graph)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping

import pytest

from schedd.core.graph import CycleError, find_cycle, format_cycle, topological_order

Graph = Mapping[str, Iterable[str]]

# (name, existing edges, new jobs, expected cycle or None)
CYCLE_CASES: list[tuple[str, Graph, Graph, list[str] | None]] = [
    ("no jobs", {}, {}, None),
    ("one job, no deps", {}, {"a": []}, None),
    ("self-loop", {}, {"a": ["a"]}, ["a", "a"]),
    ("self-loop among other deps", {"x": []}, {"a": ["x", "a"]}, ["a", "a"]),
    ("2-cycle within a batch", {}, {"a": ["b"], "b": ["a"]}, ["a", "b", "a"]),
    ("3-cycle within a batch", {}, {"a": ["b"], "b": ["c"], "c": ["a"]}, ["a", "b", "c", "a"]),
    (
        "3-cycle, found from the middle, still starts at the first new job",
        {},
        {"c": ["a"], "a": ["b"], "b": ["c"]},
        ["c", "a", "b", "c"],
    ),
    (
        "cycle through existing jobs",
        {"x": ["y"], "y": ["a"]},
        {"a": ["x"]},
        ["a", "x", "y", "a"],
    ),
    (
        "cycle through existing jobs entered at an existing job",
        {"x": ["y"], "y": ["b"]},
        {"a": ["x"], "b": ["a"]},
        ["a", "x", "y", "b", "a"],
    ),
    (
        "replacing an existing job's deps can close a cycle",
        {"a": [], "b": ["a"]},
        {"a": ["b"]},
        ["a", "b", "a"],
    ),
    (
        "replacing an existing job's deps can also open one",
        {"a": ["b"], "b": ["a"]},
        {"a": []},
        None,
    ),
    ("diamond is not a cycle", {}, {"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}, None),
    (
        "diamond over existing jobs is not a cycle",
        {"b": ["d"], "c": ["d"], "d": []},
        {"a": ["b", "c"]},
        None,
    ),
    ("unknown dependencies are leaves", {}, {"a": ["ghost"], "b": ["a", "ghost"]}, None),
    ("duplicate dependencies are not a cycle", {}, {"a": ["b", "b"], "b": []}, None),
    (
        "a cycle among existing jobs not reachable from the new ones is not reported",
        {"x": ["y"], "y": ["x"]},
        {"a": ["b"], "b": []},
        None,
    ),
    (
        "the cycle is only the loop, not the path leading into it",
        {},
        {"a": ["b"], "b": ["c"], "c": ["d"], "d": ["b"]},
        ["b", "c", "d", "b"],
    ),
]


@pytest.mark.parametrize(
    ("edges", "new", "expected"), [c[1:] for c in CYCLE_CASES], ids=[c[0] for c in CYCLE_CASES]
)
def test_find_cycle(edges: Graph, new: Graph, expected: list[str] | None) -> None:
    cycle = find_cycle(edges, new)
    assert cycle == expected
    if cycle is not None:
        assert_real_cycle(cycle, edges, new)


def assert_real_cycle(cycle: list[str], edges: Graph, new: Graph) -> None:
    assert len(cycle) >= 2 and cycle[0] == cycle[-1]
    assert len(set(cycle[:-1])) == len(cycle) - 1, "a simple cycle: no job twice"
    for a, b in itertools.pairwise(cycle):
        deps = new[a] if a in new else edges[a]
        assert b in list(deps), f"{a} does not depend on {b}"


def test_iterables_are_read_once() -> None:
    new = {"a": iter(["b"]), "b": iter(["a"])}
    assert find_cycle({}, new) == ["a", "b", "a"]
    assert find_cycle({}, {"a": (x for x in ["b"]), "b": (x for x in ["c"])}) is None


@pytest.mark.parametrize("n", [10_000, 100_000])
def test_long_chain_has_no_recursion_problem(n: int) -> None:
    # j0 depends on j1, which depends on j2, ... : depth n.
    existing = {f"j{i}": [f"j{i + 1}"] for i in range(1, n)}
    assert find_cycle(existing, {"j0": ["j1"]}) is None
    # Close it: the last job depends on the first.
    cycle = find_cycle(existing, {"j0": ["j1"], f"j{n}": ["j0"]})
    assert cycle is not None
    assert len(cycle) == n + 2 and cycle[0] == cycle[-1] == "j0" and cycle[-2] == f"j{n}"


def test_long_chain_in_one_batch() -> None:
    n = 10_000
    batch = {f"j{i}": [f"j{i + 1}"] for i in range(n)}
    batch[f"j{n}"] = []
    assert find_cycle({}, batch) is None
    order = topological_order(batch)
    assert order == [f"j{i}" for i in range(n, -1, -1)]


class ReadOnceGraph(Mapping[str, list[str]]):
    """Existing jobs whose dependencies may each be read once (fails at once on a second)."""

    def __init__(self, edges: dict[str, list[str]]) -> None:
        self.edges = edges
        self.read: set[str] = set()

    def __getitem__(self, job: str) -> list[str]:
        assert job not in self.read, f"the dependencies of {job} are read twice"
        self.read.add(job)
        return self.edges[job]

    def __iter__(self) -> Iterator[str]:
        return iter(self.edges)

    def __len__(self) -> int:
        return len(self.edges)


def test_each_existing_job_is_explored_once_even_through_many_diamonds() -> None:
    # A submission depending on a chain of 40 diamonds (d0 -> l0, r0 -> d1 -> ...) has 2**40
    # paths: exploring a job again on each path would stall apply, and with it the cluster.
    n = 40
    edges: dict[str, list[str]] = {}
    for i in range(n):
        edges[f"d{i}"] = [f"l{i}", f"r{i}"]
        edges[f"l{i}"] = [f"d{i + 1}"]
        edges[f"r{i}"] = [f"d{i + 1}"]
    edges[f"d{n}"] = []
    graph = ReadOnceGraph(edges)
    assert find_cycle(graph, {"new": ["d0"]}) is None
    assert graph.read == set(edges)


def test_message_friendly_path() -> None:
    cycle = find_cycle({"report": ["extract"]}, {"extract": ["load"], "load": ["report"]})
    assert cycle == ["extract", "load", "report", "extract"]
    assert format_cycle(cycle) == "extract -> load -> report -> extract"
    assert format_cycle(["a", "a"]) == "a -> a"


def test_deterministic() -> None:
    new = {"a": ["b", "c"], "b": ["a"], "c": ["a"]}
    assert all(find_cycle({}, new) == ["a", "b", "a"] for _ in range(5))


# (name, batch, expected order)
ORDER_CASES: list[tuple[str, Graph, list[str]]] = [
    ("empty", {}, []),
    ("already ordered stays as is", {"a": [], "b": ["a"], "c": ["b"]}, ["a", "b", "c"]),
    ("reversed chain", {"c": ["b"], "b": ["a"], "a": []}, ["a", "b", "c"]),
    ("independent jobs keep input order", {"z": [], "y": [], "x": []}, ["z", "y", "x"]),
    (
        "ties broken by input order",
        {"c": ["b"], "a": [], "b": []},
        ["a", "b", "c"],
    ),
    (
        "diamond",
        {"top": ["left", "right"], "left": ["bottom"], "right": ["bottom"], "bottom": []},
        ["bottom", "left", "right", "top"],
    ),
    ("dependencies outside the batch are ignored", {"b": ["x"], "a": ["b", "y"]}, ["b", "a"]),
    ("duplicate dependencies count once", {"b": ["a", "a"], "a": []}, ["a", "b"]),
]


@pytest.mark.parametrize(
    ("batch", "expected"), [c[1:] for c in ORDER_CASES], ids=[c[0] for c in ORDER_CASES]
)
def test_topological_order(batch: Graph, expected: list[str]) -> None:
    order = topological_order(batch)
    assert order == expected
    position = {job: i for i, job in enumerate(order)}
    for job, deps in batch.items():
        for dep in deps:
            if dep in position:
                assert position[dep] < position[job]


def test_topological_order_refuses_a_cycle() -> None:
    with pytest.raises(CycleError) as err:
        topological_order({"a": ["b"], "b": ["a"], "c": []})
    assert err.value.cycle == ["a", "b", "a"]
    assert "a -> b -> a" in str(err.value)
    with pytest.raises(ValueError):
        topological_order({"a": ["a"]})


def test_topological_order_names_the_cycle_of_a_batch_that_also_depends_on_existing_jobs() -> None:
    with pytest.raises(CycleError) as err:
        topological_order({"a": ["x", "b"], "b": ["y", "a"]})
    assert err.value.cycle == ["a", "b", "a"]
