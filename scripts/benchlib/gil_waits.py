"""GIL waits of the leader's threads under S1's load (64 clients), by py-spy --idle --native.

    PYTHONPATH=TREE .venv/bin/python TREE/scripts/benchlib/gil_waits.py TREE OUT.txt [--again]

Starts a three-node cluster of TREE, loads its leader with single-job submits while py-spy
(``PY_SPY``, default ``py-spy`` on PATH) records it for 8 s at 50 Hz with idle and native
frames, then prints each thread's share of samples spent waiting for the GIL: CPython inlines
``take_gil``, so a wait is a ``pthread_cond_timedwait`` under a C function that released the
GIL (not under a lock's acquire).  ``--again`` only analyses OUT.txt."""

import asyncio
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

tree, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, tree)
import orjson

from scripts.bench import load
from scripts.benchlib.clusterops import leader_url, stop_cluster
from tests.cluster.harness import Cluster


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp) / "c")
        cluster.start()
        try:
            import aiohttp

            async with aiohttp.ClientSession() as http:
                await cluster.wait_serving(http)
            leader, url = await leader_url(cluster)
            pid = cluster.nodes[leader].proc.pid
            body = orjson.dumps({"task": "bench.noop", "schedule": {"in": "1h"}})
            await load(url + "/api/v1/jobs", cluster.headers(), 2000, 64, body)  # warm
            spy = subprocess.Popen(
                [
                    os.environ.get("PY_SPY", "py-spy"),
                    "record",
                    "--idle",
                    "--native",
                    "--threads",
                    "-r",
                    "50",
                    "-d",
                    "8",
                    "-f",
                    "raw",
                    "-p",
                    str(pid),
                    "-o",
                    out,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            t0 = time.monotonic()
            n = 0
            while spy.poll() is None and time.monotonic() - t0 < 20:
                _rate, _lat = await load(url + "/api/v1/jobs", cluster.headers(), 2000, 64, body)
                n += 2000
            spy.wait(30)
            print(f"load: {n} jobs in {time.monotonic() - t0:.1f}s")
        finally:
            stop_cluster(cluster)
    analyze(out)


def analyze(out):
    threads = collections.defaultdict(lambda: [0, 0])
    for line in Path(out).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        kind = (
            "tick"
            if any("_tick_loop" in f or "_loop_tick" in f for f in frames)
            else "loop"
            if any("uv_run" in f or "Loop__run" in f or "run_until_complete" in f for f in frames)
            else "other"
        )
        threads[kind][0] += int(count)
        # take_gil is inlined: a GIL wait is a pthread_cond_timedwait under a C function
        # that dropped the GIL (not under a lock's acquire)
        if any("pthread_cond_timedwait" in f for f in frames[-3:]) and not any(
            "acquire" in f for f in frames[-6:]
        ):
            threads[kind][1] += int(count)
    for kind, (total, waiting) in sorted(threads.items()):
        print(
            f"{kind}: {total} samples, waiting for the GIL in {waiting} ({100 * waiting / max(1, total):.0f} %)"
        )


if len(sys.argv) < 4:
    asyncio.run(main())
else:
    analyze(out)
