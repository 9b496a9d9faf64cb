"""CPU per submitted job of each process of a three-node cluster, with 1 and with N shards:
the same load (single-job submits, 64 at a time, spread over the three nodes as a load
balancer would) against each, and every process's CPU time from /proc/PID/stat.

Reported per run: the CPU per job of each shard's *leader process* (its CPU over the jobs its
shard took), of the processes that follow, and of the front doors (the supervisors, with
several shards); medians over RUNS runs, with 1 and N shards alternated.  Each process's idle
cost (its Raft ticks, measured for 5 s before the load) is taken out of its share; the idle
cost of all of them together is reported too (``idle_cores``).

    .venv/bin/python -m scripts.benchlib.shard_cpu [JOBS] [RUNS] [N,...]

With ``--runs``, the window is not the submits but the jobs' runs: JOBS one-off jobs of
``demo.echo`` due at one instant, fired, leased to three ``schedd-worker`` processes (one per
node, 64 slots each; with several shards each node's front door serves its worker from every
shard) and their results committed; the CPU per job is then per run. With ``--spread=S``
as well, the jobs fall due evenly over S seconds instead of at one instant, so the workers
are not kept full (each run is leased into a free slot as it falls due).

With ``--batch=B``, the submits are ``POST /jobs/batch`` of B jobs each (one Raft entry per
request). With ``--pin``, every job goes to shard 0 (``X-Schedd-Shard: 0`` on its submit):
with several shards, shard 0's leader then takes exactly the load one shard's took, in
entries as large, while the other shards only tick (and hear the workers' heartbeats and
offers); the per-job figures are shard 0's.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from schedd.core.durations import format_time
from schedd.ids import shard_of_id
from schedd.protocol.headers import SHARD_HEADER
from tests.cluster.harness import BIN, Cluster

TICK = os.sysconf("SC_CLK_TCK")
IDLE_S = 5.0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def children(pid: int) -> dict[int, int]:
    """{shard: pid} of a supervisor's shard processes."""
    out = {}
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if b"--shard" in argv:
            out[int(argv[argv.index(b"--shard") + 1])] = int(child)
    return out


async def leaders(http: aiohttp.ClientSession, cluster: Cluster, shards: int) -> list[str]:
    """Each shard's leader (a node id), once every shard has one."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            async with http.get(
                f"{cluster.urls[0]}/api/v1/cluster", headers=cluster.headers()
            ) as r:
                view = await r.json()
            named = [s["leader"] for s in view["shards"]] if shards > 1 else [view["leader"]]
            if all(n in ("n1", "n2", "n3") for n in named):
                return named
        except (aiohttp.ClientError, KeyError, ValueError):
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError("no leader for every shard")


async def commit_indexes(http: aiohttp.ClientSession, cluster: Cluster, shards: int) -> list[int]:
    async with http.get(f"{cluster.urls[0]}/api/v1/cluster", headers=cluster.headers()) as r:
        view = await r.json()
    if shards == 1:
        return [int(view["commit_index"])]
    return [int(s["commit_index"]) for s in view["shards"]]


async def submit_all(
    cluster: Cluster,
    jobs: int,
    due: float | None = None,
    clients: int = 64,
    spread: int = 0,
    batch: int = 0,
    pin: bool = False,
) -> list[str]:
    """``jobs`` one-hour no-op jobs (``due`` None), or ``demo.echo`` jobs due at ``due`` (Unix
    time), over ``spread`` whole seconds from then; ``batch`` at a time (0: one job a
    request), to shard 0 only when ``pin``."""

    def job(k: int) -> dict[str, Any]:
        if due is None:
            return {"task": "bench.noop", "schedule": {"in": "1h"}}
        at = format_time(int(due + (spread * k) // jobs) * 1000)
        return {"task": "demo.echo", "schedule": {"at": at}}

    path = "/api/v1/jobs/batch" if batch else "/api/v1/jobs"
    urls = itertools.cycle(cluster.urls)
    ids: list[str] = []
    left = iter(range(0, jobs, batch or 1))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as http:

        async def client() -> None:
            for k in left:
                headers = {**cluster.headers(), "X-Request-Id": f"bench-{os.getpid()}-{k:08d}"}
                if pin and cluster.shards > 1:
                    headers[SHARD_HEADER] = "0"
                if batch:
                    body = orjson.dumps({"jobs": [job(j) for j in range(k, min(jobs, k + batch))]})
                else:
                    body = orjson.dumps(job(k))
                for _ in range(20):
                    async with http.post(next(urls) + path, data=body, headers=headers) as r:
                        if r.status in (200, 201):
                            got = await r.json()
                            if batch:
                                ids.extend(j["id"] for j in got["jobs"])
                            else:
                                ids.append(got["id"])
                            break
                    await asyncio.sleep(0.2)
                else:
                    raise RuntimeError("a submit kept failing")

        await asyncio.gather(*(client() for _ in range(clients)))
    return ids


async def active(cluster: Cluster) -> bool:
    """Whether any job is still active (its run not done)."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{cluster.urls[0]}/api/v1/jobs?status=active&limit=1", headers=cluster.headers()
        ) as r,
    ):
        return bool((await r.json())["jobs"])


async def one(
    shards: int,
    jobs: int,
    runs: bool = False,
    scale: bool = False,
    spread: int = 0,
    batch: int = 0,
    pin: bool = False,
) -> dict[str, float]:
    # --scale: each shard gets the load one shard got (N times the jobs, clients and slots)
    factor = shards if scale and not pin else 1
    jobs *= factor
    with tempfile.TemporaryDirectory(prefix="shard-cpu-") as tmp:
        cluster = Cluster(Path(tmp) / "c", shards=shards)
        cluster.start()
        try:
            async with aiohttp.ClientSession() as http:
                named = await leaders(http, cluster, shards)
                await asyncio.sleep(10 if shards > 1 else 2)  # the leaders spread, then settle
                named = await leaders(http, cluster, shards)
            top = [n.proc.pid for n in cluster.nodes if n.proc is not None]
            procs: dict[str, int] = {}
            for i, pid in enumerate(top):
                if shards == 1:
                    procs[f"n{i + 1}/0"] = pid
                else:
                    procs[f"n{i + 1}/door"] = pid
                    for k, child in children(pid).items():
                        procs[f"n{i + 1}/{k}"] = child
            # each process's idle cost first (its Raft ticks), taken out of what the load used
            idle0 = {name: cpu_s(pid) for name, pid in procs.items()}
            await asyncio.sleep(IDLE_S)
            idle = {name: (cpu_s(pid) - idle0[name]) / IDLE_S for name, pid in procs.items()}
            if runs:
                # one worker per node (as many slots as the load's clients), the jobs due at
                # one instant once all are in: the window is their fire, lease and result
                for i, url in enumerate(cluster.urls):
                    cluster.spawn(
                        [
                            str(BIN / "schedd-worker"),
                            f"--token={cluster.token}",
                            f"--server={url}",
                            f"--concurrency={64 * factor}",
                            "--import=schedd.worker.demo_tasks",
                            "--log-level=warning",
                            f"--worker-id=bench-{i}",
                        ],
                        cluster.root / f"worker{i}.log",
                    )
                due = float(int(time.time() + jobs / 150 + 10))
                ids = await submit_all(cluster, jobs, due, 64 * factor, spread, batch, pin)
                await asyncio.sleep(max(0.0, due - time.time() - 0.5))
            async with aiohttp.ClientSession() as http:
                first = await commit_indexes(http, cluster, shards)
            before = {name: cpu_s(pid) for name, pid in procs.items()}
            t0 = time.perf_counter()
            if runs:
                while await active(cluster):
                    await asyncio.sleep(0.2)
            else:
                ids = await submit_all(cluster, jobs, None, 64 * factor, 0, batch, pin)
            elapsed = time.perf_counter() - t0
            async with aiohttp.ClientSession() as http:
                last = await commit_indexes(http, cluster, shards)
            raw = {name: cpu_s(pid) - before[name] for name, pid in procs.items()}
            used = {name: max(0.0, raw[name] - idle[name] * elapsed) for name in procs}
            frames = await capacity_frames(cluster) if runs and shards > 1 else None
        finally:
            cluster.stop()
    per_shard = [0] * shards
    for job_id in ids:
        per_shard[shard_of_id(job_id, shards) or 0] += 1
    out: dict[str, float] = {"jobs_per_s": len(ids) / elapsed}
    loaded = [k for k in range(shards) if per_shard[k]]  # (pinned: shard 0 only)
    lead = [used[f"{named[k]}/{k}"] * 1e6 / per_shard[k] for k in loaded]
    out["leader_us_per_job"] = statistics.mean(lead)
    processes = [name.split("/") for name in used if not name.endswith("/door")]
    follow = [
        used[f"{node}/{k}"] * 1e6 / per_shard[int(k)]
        for node, k in processes
        if int(k) in loaded and node != named[int(k)]
    ]
    if len(loaded) < shards:  # the shards without load: their leaders' CPU (s) over the window
        out["unloaded_leaders_cpu_s"] = sum(
            used[f"{named[k]}/{k}"] for k in range(shards) if k not in loaded
        )
    out["follower_us_per_job"] = statistics.mean(follow)
    doors = [v for name, v in used.items() if name.endswith("/door")]
    if doors:
        out["front_door_us_per_job"] = sum(doors) * 1e6 / len(ids)
    out["all_us_per_job"] = sum(used.values()) * 1e6 / len(ids)
    out["raw_all_us_per_job"] = sum(raw.values()) * 1e6 / len(ids)
    out["idle_cores"] = sum(idle.values())
    out["spread"] = min(per_shard[k] for k in loaded) / max(per_shard)
    out["jobs_per_entry"] = len(ids) / max(1, sum(b - a for a, b in zip(first, last, strict=True)))
    if frames is not None:
        out["capacity_frames_per_run"] = frames / len(ids)
    return out


async def capacity_frames(cluster: Cluster) -> int:
    """The ``capacity`` frames the front doors sent the shards' leaders for the workers: the
    workers stop, and each front door logs its count as the worker's session ends."""
    for proc in cluster.others:
        proc.terminate()
    for proc in cluster.others:
        await asyncio.to_thread(proc.wait, 10)  # (off the loop: the nodes' logs are read next)
    deadline = time.monotonic() + 10
    while True:
        found = [
            int(m)
            for node in cluster.nodes
            for m in re.findall(r'"?capacity_frames"?[=:] ?(\d+)', node.log.read_text())
        ]
        if len(found) >= len(cluster.others) or time.monotonic() > deadline:
            return sum(found)
        await asyncio.sleep(0.2)


async def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    runs_mode = "--runs" in sys.argv  # fire + lease + result, not submits
    spread = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--spread=")), 0)
    batch = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--batch=")), 0)
    jobs = int(args[0]) if args else 3000
    runs = int(args[1]) if len(args) > 1 else 3
    ns = [int(n) for n in args[2].split(",")] if len(args) > 2 else [3]
    # --no-base: only the shard counts named (no run with one shard to compare against)
    base = [] if "--no-base" in sys.argv else [1]
    results: dict[int, list[dict[str, float]]] = {n: [] for n in [*base, *ns]}
    for _ in range(runs):
        for shards in results:
            got = await one(
                shards, jobs, runs_mode, "--scale" in sys.argv, spread, batch, "--pin" in sys.argv
            )
            print(shards, orjson.dumps(got).decode(), flush=True)
            results[shards].append(got)
    for shards, rows in results.items():
        keys = rows[0].keys()
        med: dict[str, Any] = {k: round(statistics.median(r[k] for r in rows), 2) for k in keys}
        print(f"shards={shards} median of {runs}: {orjson.dumps(med).decode()}")


if __name__ == "__main__":
    asyncio.run(main())
