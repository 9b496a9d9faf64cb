"""Property tests of job dependency graphs: DAGs never report a cycle; back edges always do."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from schedd.core.graph import find_cycle, topological_order


@st.composite
def dags(draw: st.DrawFn) -> dict[str, list[str]]:
    """A random DAG: node i depends only on nodes j < i."""
    n = draw(st.integers(1, 30))
    graph: dict[str, list[str]] = {}
    for i in range(n):
        deps = draw(st.lists(st.integers(0, i - 1), max_size=4)) if i else []
        graph[f"n{i}"] = [f"n{j}" for j in deps]
    return graph


def split(
    graph: dict[str, list[str]], cut: int
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Existing jobs (the first ``cut``) and a new batch (the rest), in a shuffled-ish order."""
    items = list(graph.items())
    return dict(items[:cut]), dict(reversed(items[cut:]))


def is_path(cycle: list[str], edges: dict[str, list[str]], new: dict[str, list[str]]) -> bool:
    return all(
        b in (new[a] if a in new else edges.get(a, [])) for a, b in itertools.pairwise(cycle)
    )


@given(dags(), st.data())
def test_dags_never_report_a_cycle(graph: dict[str, list[str]], data: st.DataObject) -> None:
    edges, new = split(graph, data.draw(st.integers(0, len(graph))))
    assert find_cycle(edges, new) is None
    order = topological_order(new)
    assert sorted(order) == sorted(new)
    position = {job: i for i, job in enumerate(order)}
    for job, deps in new.items():
        assert all(position[d] < position[job] for d in deps if d in position)


@given(dags(), st.data())
def test_a_back_edge_always_reports_a_real_cycle(
    graph: dict[str, list[str]], data: st.DataObject
) -> None:
    # Pick a path src -> ... -> dst along existing edges (possibly of length 0), then make dst
    # depend on src: that closes a cycle.
    src = data.draw(st.sampled_from(sorted(graph)))
    path = [src]
    while graph[path[-1]]:
        go_on: bool = data.draw(st.booleans())
        if not go_on:
            break
        path.append(data.draw(st.sampled_from(graph[path[-1]])))
    dst = path[-1]
    cut = data.draw(st.integers(0, len(graph)))
    edges, new = split(graph, cut)
    # The new edge belongs to whichever side dst is on; if dst exists, it is being updated.
    new[dst] = [*(new[dst] if dst in new else edges[dst]), src]
    cycle = find_cycle(edges, new)
    assert cycle is not None
    assert cycle[0] == cycle[-1] and len(cycle) >= 2
    assert len(set(cycle[:-1])) == len(cycle) - 1
    assert is_path(cycle, edges, new), cycle
    # The graph was acyclic before, so the cycle uses the new edge, and it reads from a new job.
    assert any(a == dst and b == src for a, b in itertools.pairwise(cycle))
    assert cycle[0] in new
