"""Which queued run to lease next: fair across namespaces, weighted across priorities.

Pure code: no clock, no randomness.  Time comes in as integer milliseconds; everything is
deterministic given the same sequence of calls.

:class:`ReadyQueues` holds the queued runs of one queue name:

* **Namespaces** are served by deficit round robin.  Namespaces with queued runs form a ring; the
  one at the head gets ``quantum`` pops, then goes to the back.  Every run costs 1, so two busy
  namespaces get equal service however unequal their backlogs.  A namespace for which
  ``can_take(ns)`` is false (e.g. at its concurrency cap) is skipped: it loses the rest of its
  turn and goes to the back, and it is served again as soon as ``can_take`` says so.
* **Priorities** within a namespace are served by smooth weighted round robin (nginx's
  algorithm) over the non-empty lanes: each pop, every non-empty lane's *current weight* grows by
  its weight, the largest wins (ties to the higher priority) and loses the sum of the weights of
  the non-empty lanes.  With all lanes busy and the default weights, every 100 pops are exactly
  70 high, 25 normal and 5 low, spread out (low comes once every 20 pops), and an empty lane's
  share goes to the others in proportion to their weights.  An emptied lane keeps its current
  weight (as nginx keeps a down peer's): that is the service it is owed (or got ahead by), so a
  lane that empties and refills at every pop can neither jump the line nor be starved; the
  current weights of a namespace always sum to zero and stay within a few times the total
  weight.  A namespace that drains completely starts afresh.
* Runs are FIFO within a (namespace, priority) lane.  :meth:`ReadyQueues.remove` is O(1): the
  id is forgotten at once and its lane entry skipped when it reaches the front; a lane whose
  skipped entries outnumber its live ones is compacted, so removals cannot leak memory.

:class:`TaskLanes` holds one queue's runs as a :class:`ReadyQueues` per task, so that a worker
takes only the tasks it serves.

:class:`ConcurrencyCaps` counts runs in flight per namespace against a cap (its ``can_take`` is
what :meth:`ReadyQueues.pop` wants), and :class:`TokenBucket` rate-limits submissions, returning
the wait to put in ``Retry-After``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Mapping

from schedd.core.model import Priority
from schedd.errors import InvalidArgument, ResourceExhausted, SchedError

__all__ = ["DEFAULT_WEIGHTS", "ConcurrencyCaps", "ReadyQueues", "TaskLanes", "TokenBucket"]

DEFAULT_WEIGHTS: Mapping[Priority, int] = {Priority.HIGH: 70, Priority.NORMAL: 25, Priority.LOW: 5}

_PRIORITIES: tuple[Priority, ...] = (Priority.HIGH, Priority.NORMAL, Priority.LOW)
_INDEX: dict[Priority, int] = {p: i for i, p in enumerate(_PRIORITIES)}


class _Lane:
    """The FIFO of one (namespace, priority), with lazily deleted entries."""

    __slots__ = ("current", "ids", "live", "ns", "priority", "stale", "stale_total", "weight")

    def __init__(self, ns: _Namespace, priority: int, weight: int) -> None:
        self.ids: deque[str] = deque()
        self.live = 0  # ids in the lane that are still queued
        # Removed ids whose entries are still in ``ids``: id -> number of such entries.  An id's
        # stale entries always come before its live one (it can only be pushed again after it
        # was removed), so popping skips the first ``stale[id]`` occurrences.
        self.stale: dict[str, int] = {}
        self.stale_total = 0
        self.current = 0  # smooth weighted round robin's current weight
        self.weight = weight
        self.ns = ns
        self.priority = priority

    def pop_live(self) -> str:
        ids = self.ids
        if self.stale_total:
            stale = self.stale
            while True:
                run_id = ids.popleft()
                left = stale.get(run_id)
                if not left:
                    break
                self.stale_total -= 1
                if left == 1:
                    del stale[run_id]
                else:
                    stale[run_id] = left - 1
        else:
            run_id = ids.popleft()
        self.live -= 1
        if not self.live:
            self.clear()
        return run_id

    def forget(self, run_id: str) -> None:
        """``run_id`` (queued here) was removed."""
        self.live -= 1
        if not self.live:
            self.clear()
            return
        self.stale[run_id] = self.stale.get(run_id, 0) + 1
        self.stale_total += 1
        if self.stale_total > self.live:
            self.compact()

    def compact(self) -> None:
        stale = self.stale
        kept: deque[str] = deque()
        for run_id in self.ids:
            left = stale.get(run_id)
            if left:
                stale[run_id] = left - 1
            else:
                kept.append(run_id)
        self.ids = kept
        self.stale = {}
        self.stale_total = 0

    def clear(self) -> None:
        self.ids.clear()
        if self.stale_total:
            self.stale = {}
            self.stale_total = 0


class _Namespace:
    __slots__ = ("deficit", "in_ring", "lanes", "live", "name")

    def __init__(self, name: str, weights: tuple[int, ...]) -> None:
        self.name = name
        self.lanes = tuple(_Lane(self, i, w) for i, w in enumerate(weights))
        self.live = 0  # queued runs, all lanes
        self.deficit = 0  # pops left in the current turn
        self.in_ring = False

    def drained(self) -> None:
        """Nothing is queued any more: start afresh (the current weights sum to 0 anyway)."""
        self.deficit = 0
        for lane in self.lanes:
            lane.current = 0


def _name(ns: _Namespace) -> str:
    return ns.name


class ReadyQueues:
    """Queued runs of ONE queue name, organised by namespace and priority.

    Mutable, in-memory, owned by the leader; deterministic given the same calls.  ``push``,
    ``remove`` and ``pop`` are O(1) amortised (``pop`` also calls ``can_take`` once per
    namespace it skips).
    """

    __slots__ = (
        "_busy",
        "_by_priority",
        "_idle",
        "_namespaces",
        "_quantum",
        "_ring",
        "_weights",
        "_where",
    )

    def __init__(self, weights: Mapping[Priority, int] = DEFAULT_WEIGHTS, quantum: int = 1) -> None:
        missing = [p.value for p in _PRIORITIES if p not in weights]
        if missing:
            raise ValueError(f"weights: missing {', '.join(missing)}")
        if any(not isinstance(w, int) or isinstance(w, bool) or w < 1 for w in weights.values()):
            raise ValueError("weights: every weight must be an integer >= 1")
        if not isinstance(quantum, int) or isinstance(quantum, bool) or quantum < 1:
            raise ValueError("quantum: must be an integer >= 1")
        self._weights = tuple(weights[p] for p in _PRIORITIES)
        self._quantum = quantum
        # Every namespace in the ring, plus idle ones kept for reuse (a namespace that drains
        # and refills at every pop should not cost three allocations a time); idle ones are
        # swept once they outnumber the ones in the ring, so this stays O(busy namespaces).
        self._namespaces: dict[str, _Namespace] = {}
        # Namespaces taking turns: every namespace with queued runs, and possibly some emptied
        # by remove(); those are dropped when they reach the head.
        self._ring: deque[_Namespace] = deque()
        self._where: dict[str, _Lane] = {}  # queued run id -> its lane
        self._busy = 0  # namespaces with queued runs
        self._idle = 0  # namespaces in ``_namespaces`` but not in the ring
        self._by_priority = [0] * len(_PRIORITIES)  # queued runs per priority, high first

    def push(self, run_id: str, namespace: str, priority: Priority) -> None:
        """Queue ``run_id`` at the back of its (namespace, priority) lane; no-op if queued."""
        where = self._where
        if run_id in where:
            return
        ns = self._namespaces.get(namespace)
        if ns is None:
            ns = self._namespaces[namespace] = _Namespace(namespace, self._weights)
            self._idle += 1
        lane = ns.lanes[_INDEX[priority]]
        lane.ids.append(run_id)
        lane.live += 1
        where[run_id] = lane
        self._by_priority[lane.priority] += 1
        if not ns.live:
            self._busy += 1
            if not ns.in_ring:
                ns.in_ring = True
                self._idle -= 1
                self._ring.append(ns)
        ns.live += 1

    def remove(self, run_id: str) -> bool:
        """Forget a queued run (cancelled, paused, ...); False if it was not queued."""
        lane = self._where.pop(run_id, None)
        if lane is None:
            return False
        lane.forget(run_id)
        self._by_priority[lane.priority] -= 1
        ns = lane.ns
        ns.live -= 1
        if not ns.live:
            self._busy -= 1
            ns.drained()
        return True

    def pop(self, can_take: Callable[[str], bool] | None = None) -> str | None:
        """The next run to lease, or None when nothing queued may be taken now.

        ``can_take(namespace)`` (None: every namespace may) says whether a run of that namespace
        may be leased now.
        """
        ring = self._ring
        skipped = 0
        while ring:
            ns = ring[0]
            if not ns.live:  # emptied by remove()
                self._drop_head(ns)
                continue
            if can_take is not None:
                if skipped >= self._busy:  # every namespace with queued runs said no
                    return None
                if not can_take(ns.name):
                    ns.deficit = 0
                    ring.rotate(-1)
                    skipped += 1
                    continue
            # Smooth weighted round robin over the non-empty lanes.
            best: _Lane | None = None
            total = 0
            for lane in ns.lanes:
                if lane.live:
                    lane.current += lane.weight
                    total += lane.weight
                    if best is None or lane.current > best.current:
                        best = lane
            assert best is not None
            best.current -= total
            self._by_priority[best.priority] -= 1
            run_id = best.pop_live()
            del self._where[run_id]
            ns.live -= 1
            if not ns.live:
                self._busy -= 1
                ns.drained()
                self._drop_head(ns)
            else:
                if ns.deficit <= 0:
                    ns.deficit = self._quantum
                ns.deficit -= 1
                if not ns.deficit:
                    ring.rotate(-1)
            return run_id
        return None

    def top_priority(self) -> Priority | None:
        """The highest priority with a queued run (None: nothing queued)."""
        for i, n in enumerate(self._by_priority):
            if n:
                return _PRIORITIES[i]
        return None

    def weight_of(self, priority: Priority) -> int:
        return self._weights[_INDEX[priority]]

    def _drop_head(self, ns: _Namespace) -> None:
        self._ring.popleft()
        ns.in_ring = False
        self._idle += 1
        if self._idle > 64 and self._idle > len(self._ring):
            self._namespaces = {n: s for n, s in self._namespaces.items() if s.in_ring}
            self._idle = 0

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._where

    def __bool__(self) -> bool:
        return bool(self._where)

    def depth(self) -> dict[tuple[str, Priority], int]:
        """Queued runs per (namespace, priority), non-empty lanes only (for metrics), in the
        order of the namespaces' names, then from high to low priority."""
        busy = sorted((ns for ns in self._namespaces.values() if ns.live), key=_name)
        return {
            (ns.name, _PRIORITIES[lane.priority]): lane.live
            for ns in busy
            for lane in ns.lanes
            if lane.live
        }


class TaskLanes:
    """Queued runs of ONE queue name, a :class:`ReadyQueues` per task: a worker is given only runs
    of the tasks it serves (``pop(serves)``), and a run no connected worker serves waits without
    holding up the others.

    The tasks a worker may take share it by smooth weighted round robin (as priorities do within
    a :class:`ReadyQueues`), each task weighted by the priority of its most urgent queued run: a
    task with high-priority runs gets most turns, and none waits forever.  A queue with one task
    behaves exactly as its :class:`ReadyQueues` does.
    """

    __slots__ = ("_current", "_lanes", "_task_of")

    def __init__(self) -> None:
        self._lanes: dict[str, ReadyQueues] = {}  # task -> its queued runs (non-empty ones only)
        self._current: dict[str, int] = {}  # task -> its current weight
        self._task_of: dict[str, str] = {}  # queued run id -> its task

    def push(self, run_id: str, task: str, namespace: str, priority: Priority) -> None:
        """Queue ``run_id``; no-op if queued."""
        if run_id in self._task_of:
            return
        lanes = self._lanes.get(task)
        if lanes is None:
            lanes = self._lanes[task] = ReadyQueues()
            self._current[task] = 0
        lanes.push(run_id, namespace, priority)
        self._task_of[run_id] = task

    def remove(self, run_id: str) -> bool:
        """Forget a queued run; False if it was not queued."""
        task = self._task_of.pop(run_id, None)
        if task is None:
            return False
        lanes = self._lanes[task]
        lanes.remove(run_id)
        if not lanes:
            self._drop(task)
        return True

    def pop(
        self,
        serves: Collection[str] | None = None,
        can_take: Callable[[str], bool] | None = None,
    ) -> str | None:
        """The next run for a worker serving the tasks ``serves`` (None: any task), or None.
        ``can_take`` is :meth:`ReadyQueues.pop`'s."""
        tasks = [t for t in self._lanes if serves is None or t in serves]
        if not tasks:
            return None
        order, total, grown = tasks, 0, []
        if len(tasks) > 1:
            for t in tasks:
                lanes = self._lanes[t]
                top = lanes.top_priority()
                assert top is not None
                weight = lanes.weight_of(top)
                self._current[t] += weight
                total += weight
                grown.append((t, weight))
            order = sorted(tasks, key=lambda t: -self._current[t])  # stable: ties by age
        for t in order:
            lanes = self._lanes[t]
            run_id = lanes.pop(can_take)
            if run_id is None:
                continue
            if grown:
                self._current[t] -= total
            del self._task_of[run_id]
            if not lanes:
                self._drop(t)
            return run_id
        for t, weight in grown:  # nothing could be taken: no turn was used
            self._current[t] -= weight
        return None

    def _drop(self, task: str) -> None:
        del self._lanes[task]
        del self._current[task]

    def tasks(self) -> list[str]:
        """The tasks with queued runs."""
        return list(self._lanes)

    def __len__(self) -> int:
        return len(self._task_of)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._task_of

    def __bool__(self) -> bool:
        return bool(self._task_of)

    def depth(self) -> dict[tuple[str, Priority], int]:
        """Queued runs per (namespace, priority), all tasks together (for metrics)."""
        out: dict[tuple[str, Priority], int] = {}
        for lanes in self._lanes.values():
            for key, n in lanes.depth().items():
                out[key] = out.get(key, 0) + n
        return dict(sorted(out.items(), key=lambda kv: (kv[0][0], _INDEX[kv[0][1]])))


class ConcurrencyCaps:
    """Runs in flight per namespace against a cap; namespaces without a cap are unlimited.

    A cap of 0 holds a namespace's runs back entirely.  ``can_take`` is meant to be passed to
    :meth:`ReadyQueues.pop`; ``acquire`` when a run is leased, ``release`` when it ends.
    """

    __slots__ = ("_caps", "_in_use")

    def __init__(self, caps: Mapping[str, int]) -> None:
        self._in_use: dict[str, int] = {}
        self.update(caps)  # sets self._caps

    def update(self, caps: Mapping[str, int]) -> None:
        """Replace the caps (config reload); runs in flight are kept and count against them."""
        for ns, cap in caps.items():
            if not isinstance(cap, int) or cap < 0:
                raise ValueError(f"concurrency cap for {ns!r}: must be an integer >= 0")
        self._caps = dict(caps)

    def can_take(self, namespace: str) -> bool:
        cap = self._caps.get(namespace)
        return cap is None or self._in_use.get(namespace, 0) < cap

    def acquire(self, namespace: str) -> bool:
        """Count one more run in flight if under the cap; False (and no change) if at it."""
        if not self.can_take(namespace):
            return False
        self._in_use[namespace] = self._in_use.get(namespace, 0) + 1
        return True

    def release(self, namespace: str) -> None:
        """One run of ``namespace`` ended.  Releasing more than was acquired is a no-op."""
        n = self._in_use.get(namespace, 0)
        if n > 1:
            self._in_use[namespace] = n - 1
        elif n == 1:
            del self._in_use[namespace]

    def in_use(self, namespace: str) -> int:
        return self._in_use.get(namespace, 0)


class TokenBucket:
    """A token bucket: ``burst`` tokens, refilled at ``rate_per_s``; starts full.

    Time is passed in (``now_ms``); a clock going backwards refills nothing.
    """

    __slots__ = ("_burst", "_last_ms", "_rate", "_tokens")

    def __init__(self, rate_per_s: float, burst: int) -> None:
        if not math.isfinite(rate_per_s) or rate_per_s <= 0:
            raise ValueError("rate_per_s: must be a finite number > 0")
        if not isinstance(burst, int) or burst < 1:
            raise ValueError("burst: must be an integer >= 1")
        self._rate = float(rate_per_s)
        self._burst = burst
        self._tokens = float(burst)
        self._last_ms: int | None = None

    def _refill(self, now_ms: int) -> None:
        last = self._last_ms
        if last is None or now_ms > last:
            if last is not None:
                self._tokens = min(
                    float(self._burst), self._tokens + (now_ms - last) * self._rate / 1000.0
                )
            self._last_ms = now_ms

    def take(self, now_ms: int, n: int = 1) -> float:
        """Take ``n`` tokens: 0.0 if allowed, else the seconds to wait (nothing is taken then).

        A request for more than ``burst`` tokens can never be allowed: ``math.inf``.
        """
        if n < 0:
            raise ValueError("n: must be >= 0")
        self._refill(now_ms)
        if n > self._burst:
            return math.inf
        if self._tokens >= n:
            self._tokens -= n
            return 0.0
        return (n - self._tokens) / self._rate

    def available(self, now_ms: int) -> float:
        """Tokens available at ``now_ms`` (refills, takes nothing)."""
        self._refill(now_ms)
        return self._tokens


def take_submits(
    buckets: Mapping[str, TokenBucket], counts: Mapping[str, int], now_ms: int, burst: int
) -> SchedError | None:
    """Take each namespace's submits (``counts``) from its bucket (namespaces without one:
    no limit); the refusal to answer when one is over its rate (429, with the seconds to wait)
    or asks more at once than its burst (400), else None."""
    for ns, n in counts.items():
        bucket = buckets.get(ns)
        if bucket is None:
            continue
        wait = bucket.take(now_ms, n)
        if wait == math.inf:
            return InvalidArgument(
                f"namespace {ns}: {n} jobs at once is more than its burst ({burst}); "
                "expected smaller batches",
                field="jobs",
            )
        if wait > 0:
            return ResourceExhausted(
                f"namespace {ns} is over its submission rate; retry in {wait:.1f}s",
                retry_after=math.ceil(wait),
            )
    return None
