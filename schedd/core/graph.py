"""Dependencies between jobs (``depends_on``): cycle detection and batch ordering.

Pure code: plain mappings in, plain lists out.  Edges point from a job to the jobs it depends on
(``a -> b`` means "a runs after b").  Dependencies name jobs of the same namespace only, so the
caller passes the edges of one namespace; nothing here looks at namespaces.

Both functions are iterative (a 10,000-long chain is fine) and linear in the part of the graph
they look at.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

__all__ = ["CycleError", "find_cycle", "format_cycle", "topological_order"]

_DONE = -1  # in find_cycle's ``state``: fully explored, no cycle through it


class CycleError(ValueError):
    """A batch handed to :func:`topological_order` has a cycle; ``cycle`` is the path."""

    def __init__(self, cycle: list[str]) -> None:
        super().__init__(f"dependency cycle: {format_cycle(cycle)}")
        self.cycle = cycle


class Edges(Protocol):
    """What :func:`find_cycle` reads of the existing jobs: a job's ``depends_on`` (``default``
    for a job it does not know).  A ``dict`` of job id to dependencies is one."""

    def get(self, job_id: str, default: tuple[str, ...], /) -> Iterable[str]: ...


def find_cycle(edges: Edges, new: Mapping[str, Iterable[str]]) -> list[str] | None:
    """The cycle that adding ``new`` to ``edges`` would create, or ``None``.

    ``edges`` maps existing jobs to the jobs they depend on; ``new`` maps the jobs being
    submitted (one, or a whole batch) to their ``depends_on``.  A job in both is taken from
    ``new`` (its dependencies are being replaced).  A dependency that is in neither is a leaf:
    whether it exists is not this function's business.

    The cycle is returned as a path ``[a, b, c, a]`` where each job depends on the next, the
    first and last being the same job (a self-dependency is ``[a, a]``).  It starts at the
    earliest job of ``new`` (in ``new``'s order) that is on it, so it reads well in an error
    message: see :func:`format_cycle`.

    Only the part of the graph reachable from ``new`` is visited, each job and edge once: an
    iterative depth-first search in ``new``'s order, dependencies in their given order, so the
    answer is deterministic.
    """
    batch: dict[str, list[str]] = {job: list(deps) for job, deps in new.items()}
    # state[job] >= 0: on the current path, at that index; _DONE: explored; absent: unseen.
    state: dict[str, int] = {}
    for root in batch:
        if root in state:
            continue
        path = [root]
        state[root] = 0
        stack = [iter(batch[root])]
        while stack:
            for dep in stack[-1]:
                seen = state.get(dep)
                if seen is None:
                    state[dep] = len(path)
                    path.append(dep)
                    nxt = batch.get(dep)
                    stack.append(iter(nxt if nxt is not None else edges.get(dep, ())))
                    break
                if seen >= 0:  # on the path: the path from there back to it is a cycle
                    return _rotate_to_new(path[seen:], batch)
            else:
                state[path.pop()] = _DONE
                stack.pop()
    return None


def _rotate_to_new(loop: list[str], batch: Mapping[str, object]) -> list[str]:
    """``loop`` (without the closing repeat) rotated to start at its earliest new job, closed."""
    order = {job: i for i, job in enumerate(batch)}
    start = min(range(len(loop)), key=lambda i: order.get(loop[i], len(order)))
    rotated = loop[start:] + loop[:start]
    rotated.append(rotated[0])
    return rotated


def format_cycle(cycle: Sequence[str]) -> str:
    """``"a -> b -> c -> a"``: a cycle from :func:`find_cycle`, for an error message."""
    return " -> ".join(cycle)


def topological_order(new: Mapping[str, Iterable[str]]) -> list[str]:
    """The jobs of a batch ordered so that each comes after the batch jobs it depends on.

    Dependencies outside the batch are ignored (they already exist).  Among the jobs whose
    dependencies are all placed, the earliest in ``new``'s order goes first, so a batch that is
    already in a good order is returned unchanged.  Duplicate dependencies count once.

    The batch is expected to be acyclic (check with :func:`find_cycle` first); a cycle raises
    :class:`CycleError` rather than dropping jobs.  O((V + E) log V).
    """
    batch = {job: list(deps) for job, deps in new.items()}
    index = {job: i for i, job in enumerate(batch)}
    jobs = list(batch)
    waiting = [0] * len(jobs)  # number of unplaced batch dependencies
    dependents: list[list[int]] = [[] for _ in jobs]
    for i, job in enumerate(jobs):
        for dep in dict.fromkeys(batch[job]):
            j = index.get(dep)
            if j is not None:
                waiting[i] += 1
                dependents[j].append(i)
    ready = [i for i, n in enumerate(waiting) if n == 0]  # ascending, so already a heap
    order: list[str] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(jobs[i])
        for k in dependents[i]:
            waiting[k] -= 1
            if waiting[k] == 0:
                heapq.heappush(ready, k)
    if len(order) != len(jobs):
        cycle = find_cycle({}, batch)
        raise CycleError(cycle if cycle is not None else [])
    return order
