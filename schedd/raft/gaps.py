"""The intervals Raft's timers judge a node by, measured, so its election timeouts can be set
from them (``docs/operations.md``, Elections).

* ``tick``: from the start of one tick of the Raft thread to the start of the next.  A node
  reads messages and checks its timers only in a tick: a long gap (apply work, a garbage
  collection, the process starved of CPU) is as long a time during which it hears nothing.
* ``leader_contact``: on a follower, from one message of its leader (an append or a heartbeat)
  to the next.  A follower whose gap passes its election timeout starts a pre-vote round.
* ``follower_answer``: on the leader, from one answer of a follower to the next (per follower).
  A leader that hears from no majority for ``raft.leader_fallback_timeout`` steps down.

Written on the tick thread; read from any thread (a copy of plain numbers, possibly one
observation behind)."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Final

#: upper bounds (s), chosen around the election timeouts (raft.raft_min_timeout and
#: raft.raft_max_timeout) and the heartbeat period (raft.append_entries_period)
GAP_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.4, 2.0, 5.0,
)  # fmt: skip
KINDS: Final = ("tick", "leader_contact", "follower_answer")


@dataclass(frozen=True, slots=True)
class GapView:
    """One kind's histogram: per-bucket counts (not cumulative; the last is above every
    bound), their sum, and the longest gap seen."""

    counts: tuple[int, ...]
    total: float
    longest: float

    @property
    def count(self) -> int:
        return sum(self.counts)


class Gaps:
    """A histogram of the intervals between consecutive marks of one series per key."""

    def __init__(self) -> None:
        self._counts = [0] * (len(GAP_BUCKETS) + 1)
        self._total = 0.0
        self._longest = 0.0
        self._last: dict[object, float] = {}

    def mark(self, now: float, key: object = None) -> None:
        """An event of series ``key`` at ``now`` (monotonic seconds)."""
        last = self._last.get(key)
        self._last[key] = now
        if last is not None:
            self.observe(now - last)

    def forget(self, key: object = None) -> None:
        """Series ``key`` is broken (a new leader, say): its next mark starts it again."""
        self._last.pop(key, None)

    def forget_all(self) -> None:
        self._last.clear()

    def observe(self, seconds: float) -> None:
        self._counts[bisect_left(GAP_BUCKETS, seconds)] += 1
        self._total += seconds
        self._longest = max(self._longest, seconds)

    def view(self) -> GapView:
        return GapView(tuple(self._counts), self._total, self._longest)
