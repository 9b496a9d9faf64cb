"""What a Raft group costs when nothing happens: CPU per second and wake-ups per second of each
node process of an idle cluster (no job, no worker, no client), one node and three nodes.

Every shard of a cluster is a Raft group with a process on every node, so this is the fixed
cost a node pays per shard, whatever the load.

    PYTHONPATH=. .venv/bin/python scripts/benchlib/idle_cost.py [--window S] [--windows N]

Each figure is the median over N windows of S seconds (defaults 30 and 3), taken after the
cluster formed and settled for 10 s: ``utime + stime`` from ``/proc/<pid>/stat`` (% of one
core) and the context switches of every thread of the process from ``/proc/<pid>/task/*/status``
(per second)."""

# A benchmark driver: blocking reads of /proc and sleeps are what it does.

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from scripts.benchlib.clusterops import cpu_seconds
from tests.cluster.harness import Cluster

SETTLE_S = 10.0


def switches(pid: int) -> int:
    """Voluntary and involuntary context switches of every thread of ``pid`` so far."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        for line in text.splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def measure(size: int, window: float, windows: int) -> dict[str, tuple[float, float]]:
    """``{"leader"|"follower": (% of a core, wake-ups a second)}``, medians over the windows
    (the followers' figures pooled)."""
    with tempfile.TemporaryDirectory(prefix="schedd-idle-") as tmp:
        cluster = Cluster(Path(tmp), size=size)
        cluster.start()
        try:
            leader = cluster.wait_formed(timeout=60)
            time.sleep(SETTLE_S)
            pids = {i: n.proc.pid for i, n in enumerate(cluster.nodes) if n.proc is not None}
            samples: dict[str, list[tuple[float, float]]] = {"leader": [], "follower": []}
            for _ in range(windows):
                t0 = time.monotonic()
                cpu0 = {i: cpu_seconds(p) for i, p in pids.items()}
                sw0 = {i: switches(p) for i, p in pids.items()}
                time.sleep(window)
                wall = time.monotonic() - t0
                for i, pid in pids.items():
                    cpu = 100 * (cpu_seconds(pid) - cpu0[i]) / wall
                    wake = (switches(pid) - sw0[i]) / wall
                    samples["leader" if i == leader else "follower"].append((cpu, wake))
        finally:
            cluster.stop()
    return {
        role: (statistics.median(c for c, _ in got), statistics.median(w for _, w in got))
        for role, got in samples.items()
        if got
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=30.0, help="seconds per window")
    parser.add_argument("--windows", type=int, default=3, help="windows per cluster")
    args = parser.parse_args()
    for size in (1, 3):
        for role, (cpu, wake) in measure(size, args.window, args.windows).items():
            print(
                f"{size} node{'s' if size > 1 else ''}: {role:8} {cpu:5.2f} % of a core, "
                f"{wake:6.0f} wake-ups/s",
                flush=True,
            )


if __name__ == "__main__":
    main()
