"""The leader core's tick with many connected workers and nothing queued: what every idle tick
(at least four a second, and one per wake) costs the leader per connected worker.

    .venv/bin/python -m scripts.benchlib.idle_tick [WORKERS] [PASSES]
"""

from __future__ import annotations

import statistics
import sys
import time

from tests.unit.test_leader_core import Sim

TICKS = 200


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    passes = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    sim = Sim()
    for i in range(workers):
        sim.connect(f"w{i}")
    times = []
    for _ in range(passes):
        began = time.perf_counter()
        for _ in range(TICKS):
            sim.leader.tick(sim.now)
        times.append((time.perf_counter() - began) / TICKS * 1e6)
    print(
        f"{workers} idle workers: tick {statistics.median(times):.1f} us median of {passes} "
        f"passes ({', '.join(f'{t:.1f}' for t in times)})"
    )


if __name__ == "__main__":
    main()
