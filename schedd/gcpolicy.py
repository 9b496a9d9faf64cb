"""Garbage collection that does not stall Raft as the state grows.

CPython's cyclic collector scans every tracked object of the generation it collects, and a full
(generation 2) collection runs each time the long-lived objects grew by a quarter.  The
replicated state is several tracked objects per job, so at 300,000 pending jobs a full
collection holds the GIL for 0.3-0.5 s, and for seconds at a million: as long as
``raft.raft_min_timeout``, so followers stop hearing the leader and call an election (measured
by ``scripts/bench`` S4).

So every ``node.gc_freeze_interval`` the young generations are collected and everything still
alive is moved to the permanent generation (``gc.freeze``), which collections never scan.  A
full collection then only walks what was created since the last freeze, and its pause stays
proportional to the interval, not to the state.  The state's records form no reference cycles
(frozen dataclasses, tuples, dicts of them), so freezing them loses nothing: they are freed by
reference counting when a job is deleted.  What can leak is cyclic garbage whose objects were
alive at a freeze (a request in flight, say): measured under load (a three-node cluster, 540
jobs/s submitted and run for 70 s, a freeze every second) a full collection found 0-30 such
objects per 15 s.  To bound even that, every ``node.gc_thaw_interval`` (jittered) a node that is
not the leader unfreezes and collects everything once; a follower's pause is one its peers
hardly notice (schedd/raft/pauses.py).  Every collection's length goes to
``schedd_gc_pause_seconds``, the frozen count to ``schedd_gc_frozen_objects``.

The youngest generation is collected every :data:`YOUNG_THRESHOLD` allocations, not every 700
(CPython's default): a request in flight allocates a few hundred tracked objects, so at 700 the
collector ran every ~30 jobs and walked the requests in flight each time.  Young collections
stay short (they walk at most that many objects, a few milliseconds); BENCHMARKS.md has what it
was worth per job.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from schedd.logs import log_event

log = logging.getLogger(__name__)

#: allocations of tracked objects between two collections of the youngest generation
YOUNG_THRESHOLD = 100_000


class GcPolicy:
    def __init__(
        self,
        freeze_interval_s: float,
        thaw_interval_s: float,
        observe: Callable[[int, float, int], None] | None = None,
    ) -> None:
        self.freeze_interval_s = freeze_interval_s
        self.thaw_interval_s = thaw_interval_s
        self._observe = observe  # (generation, seconds, collected)
        self._t0 = 0.0
        self._thresholds: tuple[int, int, int] | None = None  # the ones install replaced
        self.thaws = 0
        self.last_thaw_collected = 0

    # -- timing ---------------------------------------------------------------------------
    def install(self) -> None:
        """Time every collection (``observe``); young collections every YOUNG_THRESHOLD."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        if self._thresholds is None:
            self._thresholds = gc.get_threshold()
            gc.set_threshold(YOUNG_THRESHOLD, *self._thresholds[1:])

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        pause = time.perf_counter() - self._t0
        if self._observe is not None:
            self._observe(int(info.get("generation", 0)), pause, int(info.get("collected", 0)))

    # -- freezing ---------------------------------------------------------------------------
    @staticmethod
    def freeze() -> None:
        gc.collect(1)
        gc.freeze()

    def thaw(self) -> int:
        """Unfreeze and collect everything once; the number of unreachable objects found."""
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        self.thaws += 1
        self.last_thaw_collected = found
        return found

    async def run(self, is_leader: Callable[[], bool]) -> None:
        """Freeze every ``freeze_interval_s``; thaw every ``thaw_interval_s`` when not leading."""
        if self.freeze_interval_s <= 0:
            return
        loop = asyncio.get_running_loop()

        def later() -> float:  # jittered, so that two followers seldom thaw at the same time
            return loop.time() + self.thaw_interval_s * random.uniform(0.75, 1.25)

        next_thaw = later()
        while True:
            await asyncio.sleep(self.freeze_interval_s)
            if self.thaw_interval_s > 0 and loop.time() >= next_thaw and not is_leader():
                t0 = time.perf_counter()
                found = self.thaw()
                log_event(
                    log,
                    "gc.thawed",
                    collected=found,
                    frozen=gc.get_freeze_count(),
                    seconds=round(time.perf_counter() - t0, 3),
                )
                next_thaw = later()
            else:
                self.freeze()
