"""S7: one node's CPU core held at 100 % by another process, under load.  Targets: no leader
election and no acknowledged job lost.  Its own three-node cluster, once per invocation, and only
when named in ``--only`` (it takes ``seconds``, 10 minutes by default).

Load, for the whole scenario, as S5's (scripts/benchlib/failover.py :func:`~failover.loaded`):
one ``schedd-worker`` process and an open-loop generator of run-now submits at ``rate``
requests/s, round robin over the three nodes (a follower hands the write to the leader).

Once steady (as before an S5 kill), a **hog** runs: exactly one ``python -c`` busy loop (one
process, one thread, so at most one core), at the nodes' nice level (not reniced).  A process
that is not tied to a node would only take one of the machine's cores away from all of them, so
the hog and every thread of one node are pinned to the same core (``sched_setaffinity``, what
``taskset -a`` does; the other processes stay free to use every core): the node has to share
that core with a process that never sleeps.  The first half of ``seconds`` the node is a
follower, the second half it is the leader (the leader when the half begins), so both roles are
measured; between the halves the hog is stopped, the node unpinned, and a new hog started for
the next one.  On a machine with one core nothing is pinned.

Reported: Raft elections over the hog halves (term increments, from ``/api/v1/cluster`` as the
other scenarios) and ``leader.elected`` lines in the node logs beyond the first (the whole run);
jobs acknowledged and started (every acknowledged job must start within ``bound`` of the load's
end, as in S5); submit latency (sent -> acknowledged) p50/p99 over both halves, p99 per half and
in the last seconds before the hog; the CPU share the hog and the pinned node actually got (their
``utime + stime`` from ``/proc/<pid>/stat`` over the half's wall time, % of one core), so the
report shows the hog really ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .clusterops import cpu_seconds, find_leader
from .common import pct, stop_pid
from .failover import Loaded, loaded, node_events, steady, term

HOG = "while True:\n    pass\n"
BASELINE = 5.0  # s of load before the hog whose submit latency is reported as the baseline


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` allowed only ``cpus`` (threads it starts later inherit
    their creator's)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that has just ended
            os.sched_setaffinity(int(tid), cpus)


@dataclass
class _Half:
    """One half of the run: the hog on the core of ``node`` (``role`` when the half began)."""

    role: str
    node: str
    began: float  # time.time()
    ended: float = math.nan
    core: int | None = None  # the core the hog and the node were pinned to (None: not pinned)
    hog_cpu: float = math.nan  # % of one core the hog got
    node_cpu: float = math.nan  # % of one core the node used


async def _half(run: Loaded, role: str, seconds: float) -> _Half:
    """The hog next to the leader (``role`` "leader") or a follower for ``seconds``."""
    cluster = run.cluster
    lead = await find_leader(run.http, cluster)
    k = lead if role == "leader" else next(j for j in range(len(cluster.nodes)) if j != lead)
    proc = cluster.nodes[k].proc
    assert proc is not None
    cpus = os.sched_getaffinity(proc.pid)
    half = _Half(role, cluster.nodes[k].node_id, time.time())
    node0 = cpu_seconds(proc.pid)
    t0 = time.monotonic()
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        if len(cpus) > 1:
            half.core = max(cpus)
            os.sched_setaffinity(hog.pid, {half.core})
            pin(proc.pid, {half.core})
        while time.monotonic() - t0 < seconds:
            await asyncio.sleep(0.5)
            run.starts.poll()
            run.check()
            if not cluster.nodes[k].alive or hog.poll() is not None:
                raise RuntimeError(
                    f"the {role} {half.node} exited"
                    if not cluster.nodes[k].alive
                    else f"the hog exited ({hog.returncode})"
                )
        wall = time.monotonic() - t0
        half.hog_cpu = 100 * cpu_seconds(hog.pid) / wall
        half.node_cpu = 100 * (cpu_seconds(proc.pid) - node0) / wall
    finally:
        half.ended = time.time()
        stop_pid(hog, grace=2)
        if cluster.nodes[k].alive:
            pin(proc.pid, cpus)
    print(
        f"    s7: {role} {half.node} with the hog on core {half.core} for {wall:.0f}s: hog "
        f"{half.hog_cpu:.0f}% of a core, node {half.node_cpu:.0f}%",
        file=sys.stderr,
        flush=True,
    )
    return half


async def s7(
    root: Path,
    seconds: float,
    rate: float,
    bound: float,
    steady_timeout: float = 30.0,
    detail: Path | None = None,
) -> dict[str, float]:
    """The scenario (see the module docstring); latencies in ms, CPU in % of one core.
    ``detail``: the halves, lost jobs and the slowest acknowledged -> started, as JSON."""
    halves: list[_Half] = []
    async with loaded(root, rate, "s7") as run:
        i = await steady(run.http, run.cluster, run.starts, run.name, steady_timeout)
        term0 = await term(run.http, run.cluster, i)
        for role in ("follower", "leader"):
            halves.append(await _half(run, role, seconds / 2))
        term1 = await term(run.http, run.cluster, await find_leader(run.http, run.cluster))
        await run.finish(bound)
    elected = sum(len(node_events(n.log, "leader.elected", 0.0)) for n in run.cluster.nodes)

    def latency(lo: float, hi: float) -> list[float]:
        return [
            1000 * (s.acked - s.sent)
            for s in run.load.subs
            if s.job is not None and lo <= s.sent < hi
        ]

    def p(values: list[float], q: float) -> float:
        return pct(values, q) if values else math.nan

    hogged = latency(halves[0].began, halves[-1].ended)
    out = {
        "s7_elections": float(term1 - term0),
        "s7_leader_changes": float(elected - 1),
        **run.figures("s7"),
        "s7_started": float(sum(1 for job in run.acked if job in run.starts.first)),
        "s7_submit_p50": p(hogged, 0.5),
        "s7_submit_p99": p(hogged, 0.99),
        "s7_base_submit_p99": p(latency(halves[0].began - BASELINE, halves[0].began), 0.99),
    }
    for half in halves:
        out[f"s7_{half.role}_submit_p99"] = p(latency(half.began, half.ended), 0.99)
        out[f"s7_{half.role}_hog_cpu"] = half.hog_cpu
        out[f"s7_{half.role}_node_cpu"] = half.node_cpu
    run.write_detail(detail, halves=[asdict(h) for h in halves], rate=rate, bound_s=bound)
    return out
