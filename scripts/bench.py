"""schedd benchmarks against a real local three-node cluster, with the machine's ceilings and the
peers measured in the same run.

    scripts/bench [--runs N] [--quick] [--no-peers] [--json FILE] [--only S5,S3,...]
                  [--s3b-jobs N] [--s4-jobs N] [--s4-wipe-timeout S] [--s4-skip-wipe]
                  [--s4-add S]
                  [--s5-kills N] [--s5-terms N] [--s5-rate R]
                  [--s6-jobs N] [--s6-seconds S] [--s7-seconds S] [--s7-rate R]

Each scenario runs under its own timeout; a failure or timeout is reported, the rest still run,
and the exit status is non-zero.  Figures are medians of --runs with min–max.
  ceiling  bare aiohttp POST, 64 concurrent clients (requests/s)
  ceiling  bare pysyncobj three-process cluster, batched no-op entries: entries/s (1 op/entry)
           and ops/s (100 ops/entry)  (scripts/benchlib/syncobj_node.py)
  S1       submit, 64 concurrent clients, each job committed on a majority before the reply
  S1b      batch submit (POST /api/v1/jobs/batch), 4 concurrent clients, batches of 1,000 and of
           5,000 one-hour-delayed no-op jobs, each batch committed on a majority before the reply
           (jobs/s; the 1,000 figure is the main one)  (scripts/benchlib/scale.py)
  S1c      one client submitting sequentially (p50/p99 latency)
  S1d      64 coroutines each calling `await client.submit(...)` one job at a time through
           schedd.client.AsyncClient, batching on (the client coalesces them into batch
           requests) and off: jobs/s and p99 submit latency
  S2       dispatch + completion of no-op jobs by one, then by two schedd-worker processes
  S3       2,000 delayed jobs due at the same instant, one worker with room for all: start lag
           (scheduled time -> handler start, worker's clock) p50/p99/max; none early, none missing
  peers    Huey (SqliteStorage) and Celery 5 + Redis (own redis-server on loopback), each in its
           own venv under bench-results/envs/: enqueue in a tight loop (S1's work) and drain by
           one consumer process (S2's work)  (scripts/benchlib/peers.py)
Once per invocation (not per --runs), each on a fresh cluster (scripts/benchlib/scale.py):
  S3b      100,000 one-off jobs due at instants spread over one second, submitted in batches
           before it, two workers: fire lag p50/p99 from the leader's schedd_fire_lag_seconds
           histogram, start lag p50/p99/max from the workers' records, early (must be 0),
           missing, drain rate
  S4       2,000,000 pending delayed jobs: leader memory per job (VmRSS), bytes each node
           wrote per job (/proc/<pid>/io write_bytes), latency of a probe submit every 50 ms
           during the load and during a quiet period with snapshots, the longest snapshot;
           a backup saved (schedctl snapshot save: GET /api/v1/snapshot, checked as it
           arrives, then deleted) from the leader, then from a follower, under the probe:
           seconds, bytes, MiB/s, probe p99/max, the node's WAL at its largest;
           follower SIGKILL + restart -> caught up (s); then a follower SIGKILLed, its data
           directory's raft/ emptied and restarted under a probe and a few batches -> caught up
           (s), probe p99/max meanwhile (not with --s4-skip-wipe); with --s4-add, before
           that, a fourth node added by raft.join: seconds until it is a learner and a voter,
           probe p50/p99/max meanwhile.  Targets (a miss is a
           failure): 0 elections, at most 100 bytes of leader RSS per pending job, quiet probe
           p99 at most 100 ms, probe p99 at most 100 ms while the leader streams a backup,
           the restarted follower answering within 5 s and caught up
           within 30 s, the wiped follower caught up within --s4-wipe-timeout
  S5       the leader SIGKILLed under load (a worker connected, ~200 run-now submits/s spread
           over the nodes that are up), 10 times, each time restarted and caught up: kill ->
           first handler start of a run leased by the new leader (its lease fence is above the
           new leader's claim index) p50/p99/max, kill -> first ack of a submit sent after the
           kill; then 3 times SIGTERM instead (the leader hands over before it exits): SIGTERM
           -> the same first dispatch p50/max; acknowledged jobs never started, over all of it
           (must be 0)  (scripts/benchlib/failover.py)
  S6       every-second jobs and a stream of one-off jobs with one worker, on a cluster that
           forgets finished runs after a minute and on one that keeps them all: runs/s, growth
           of the leader's VmRSS and of its state database (KiB/min, least squares after a
           warm-up of 90 s) (scripts/benchlib/retention.py)
Only when named in --only (it takes 10 minutes):
  S7       one node's CPU core held at 100% by one busy-loop process (the hog and the node
           pinned to the same core) for 600 s under S5's load at ~100 submits/s: the first half
           next to a follower, the second half next to the leader.  Elections (term increments;
           leader.elected lines beyond the first), acknowledged jobs never started, submit
           latency p50/p99, the CPU share the hog got.  Targets (a miss is a failure): 0
           elections, 0 lost  (scripts/benchlib/cpuhog.py)
--quick: S3b 10,000 jobs, S4 20,000 (its targets not checked), S5 1 kill and 1 SIGTERM, S6 30 s,
S7 30 s.
--only: scenarios to run, comma-separated: ceiling, syncobj, S1, S1c, S1d, S2, S3, S1b, peers, S3b,
S4, S5, S6, S7 (default: all but S7).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.benchlib import cpuhog, failover, peers, retention, scale
from scripts.benchlib.clusterops import (
    CpuMeter,
    leader_url,
    start_lag_worker,
    stop_cluster,
    wait_worker,
)
from scripts.benchlib.common import pct, stop_pid, summary
from scripts.benchlib.syncobj_ceiling import syncobj_ceiling
from tests.cluster.harness import Cluster
from tests.conftest import free_port

BARE = r"""
import sys
from aiohttp import web
import orjson
async def post(request):
    body = orjson.loads(await request.read())
    return web.Response(body=orjson.dumps({"id": "x", "task": body["task"]}), status=201,
                        content_type="application/json")
app = web.Application()
app.router.add_post("/api/v1/jobs", post)
import uvloop
uvloop.install() if sys.version_info < (3, 12) else None
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""


async def load(
    url: str, headers: dict[str, str], total: int, concurrency: int, body: bytes
) -> tuple[float, list[float]]:
    """POST ``total`` requests with ``concurrency`` clients; (requests/s, latencies)."""
    latencies: list[float] = []
    sent = 0
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as http:

        async def client() -> None:
            nonlocal sent
            while sent < total:
                sent += 1
                t0 = time.perf_counter()
                async with http.post(url, data=body, headers=headers) as r:
                    await r.read()
                    if r.status not in (200, 201):
                        raise RuntimeError(f"{r.status}: {await r.text()}")
                latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return total / elapsed, latencies


async def ceiling(n: int) -> float:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", BARE, str(port)])
    try:
        url = f"http://127.0.0.1:{port}/api/v1/jobs"
        for _ in range(100):
            try:
                await load(url, {}, 1, 1, b'{"task": "t"}')
                break
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)
        rate, _ = await load(url, {}, n, 64, b'{"task": "t"}')
        return rate
    finally:
        stop_pid(proc)


async def s1(cluster: Cluster, n: int) -> dict[str, float]:
    leader, url = await leader_url(cluster)
    body = orjson.dumps({"task": "bench.noop", "schedule": {"in": "1h"}})
    cpu = CpuMeter(cluster)
    cpu.start()
    rate, latencies = await load(url + "/api/v1/jobs", cluster.headers(), n, 64, body)
    return {"s1": rate, "s1_p50": pct(latencies, 0.5) * 1000, **cpu.stop("s1", n, leader)}


async def s1d(cluster: Cluster, n: int, batching: bool) -> dict[str, float]:
    """``n`` one-hour-delayed no-op jobs, each its own ``await client.submit(...)``, from 64
    coroutines through one AsyncClient (all the cluster's nodes as its servers)."""
    from schedd.client import AsyncClient

    latencies: list[float] = []
    key = "s1d" if batching else "s1d_nobatch"
    async with AsyncClient(cluster.urls, token=cluster.token, batching=batching) as client:
        left = iter(range(n))

        async def one_client() -> None:
            for _ in left:
                t0 = time.perf_counter()
                await client.submit("bench.noop", in_="1h")
                latencies.append(time.perf_counter() - t0)

        began = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(64)))
        elapsed = time.perf_counter() - began
    return {key: n / elapsed, f"{key}_p99": pct(latencies, 0.99) * 1000}


async def s1c(cluster: Cluster, n: int) -> tuple[float, float]:
    _, url = await leader_url(cluster)
    body = orjson.dumps({"task": "bench.noop", "schedule": {"in": "1h"}})
    _, lat = await load(url + "/api/v1/jobs", cluster.headers(), n, 1, body)
    return pct(lat, 0.5) * 1000, pct(lat, 0.99) * 1000


# S2's worker takes up to this many leases at once: a no-op handler finishes in microseconds, so
# the window only has to cover the lease and completion round trips through Raft.
S2_CONCURRENCY = 512
MAX_WORKER_CAPACITY = 10_000  # schedd.protocol.messages.MAX_CAPACITY


async def s2(cluster: Cluster, n: int, workers: int = 1) -> dict[str, float]:
    """``n`` no-op jobs (``demo.echo``) submitted to run now with no worker connected, so they
    wait queued; then ``workers`` schedd-worker processes (``--concurrency`` S2_CONCURRENCY each)
    are started: jobs/s from the first worker's connection (as the leader lists it) until no
    job is active.  A backlog, not jobs due in the future: with ``scheduler.dispatch_ahead`` a
    connected worker would be leased up to its concurrency before the due time, and that work
    would not be timed.  With the nodes' CPU per run over the same window."""
    leader, url = await leader_url(cluster)
    key = "s2" if workers == 1 else f"s2_{workers}w"
    cpu = CpuMeter(cluster)
    names = [f"bench-{k}-{time.monotonic_ns()}" for k in range(workers)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        async with aiohttp.ClientSession() as http:

            async def active() -> int:
                async with http.get(
                    url + "/api/v1/jobs?status=active&task=demo.echo&limit=1",
                    headers=cluster.headers(),
                ) as r:
                    return len((await r.json())["jobs"])

            async def connected() -> set[str]:
                async with http.get(url + "/api/v1/workers", headers=cluster.headers()) as r:
                    listed = (await r.json())["workers"] if r.status == 200 else []
                return {w.get("worker_id") for w in listed} & set(names)

            jobs = [{"task": "demo.echo", "payload": i} for i in range(n)]
            for start in range(0, n, 1000):
                async with http.post(
                    url + "/api/v1/jobs/batch",
                    data=orjson.dumps({"jobs": jobs[start : start + 1000]}),
                    headers=cluster.headers(),
                ) as r:
                    assert r.status == 201, await r.text()
            await asyncio.sleep(0.3)  # every run fired and queued
            procs = [
                cluster.start_worker(
                    "--import",
                    "schedd.worker.demo_tasks",
                    "--concurrency",
                    str(S2_CONCURRENCY),
                    name=name,
                )
                for name in names
            ]
            while not await connected():
                await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            cpu.start()
            while await active():
                await asyncio.sleep(0.02)
            return {key: n / (time.perf_counter() - t0), **cpu.stop(key, n, leader)}
    finally:
        for proc in procs:
            stop_pid(proc, grace=20)


async def s3(cluster: Cluster, root: Path, n: int, lead: float) -> dict[str, float]:
    """``n`` delayed jobs due at the same instant, one worker with room for all of them: start lag
    (scheduled time -> handler start, on the worker's clock), p50/p99/max in ms; early/missing."""
    _, url = await leader_url(cluster)
    record = root / f"s3-{time.monotonic_ns()}.lag"
    name = f"bench-s3-{time.monotonic_ns()}"
    worker = start_lag_worker(cluster, name, record, n)
    try:
        async with aiohttp.ClientSession() as http:
            await wait_worker(http, url, cluster, name)
            due = datetime.now(UTC) + timedelta(seconds=lead)
            at = due.isoformat(timespec="milliseconds").replace("+00:00", "Z")
            jobs = [{"task": "bench.lag", "payload": i, "schedule": {"at": at}} for i in range(n)]
            for start in range(0, n, 1000):
                async with http.post(
                    url + "/api/v1/jobs/batch",
                    data=orjson.dumps({"jobs": jobs[start : start + 1000]}),
                    headers=cluster.headers(),
                ) as r:
                    assert r.status == 201, await r.text()
            if datetime.now(UTC) >= due:
                raise RuntimeError(f"submitting {n} jobs took longer than the {lead}s lead")
            settle = due.timestamp() + 30
            lines: list[str] = []
            while time.time() < settle:
                await asyncio.sleep(0.2)
                lines = record.read_text().splitlines() if record.exists() else []
                if len(lines) >= n:
                    break
        lags = []
        for ln in lines:
            started, sched = ln.split(" ")[:2]
            lags.append(float(started) - datetime.fromisoformat(sched).timestamp())
        if not lags:
            raise RuntimeError("no bench.lag job started")
        early = sum(1 for x in lags if x < 0)
        return {
            "s3_p50": pct(lags, 0.5) * 1000,
            "s3_p99": pct(lags, 0.99) * 1000,
            "s3_max": max(lags) * 1000,
            "s3_early": float(early),
            "s3_missing": float(n - len(lags)),
        }
    finally:
        stop_pid(worker, grace=20)


class Runner:
    """Runs each scenario under its own timeout; a failure or a timeout is recorded, not fatal."""

    def __init__(self) -> None:
        self.results: dict[str, list[float]] = {}
        self.failures: list[str] = []

    async def run(self, name: str, timeout: float, fn: Any) -> bool:
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                value = await fn()
            if not isinstance(value, dict):
                value = {name: value}
            # a figure that could not be measured (NaN) is left out of the results
            value = {k: float(v) for k, v in value.items() if float(v) == float(v)}
        except TimeoutError:
            self.failures.append(f"{name}: timed out after {timeout:.0f}s")
        except Exception as exc:  # noqa: BLE001 - any scenario failure is reported
            self.failures.append(f"{name}: {type(exc).__name__}: {str(exc)[:2000]}")
        else:
            for k, v in value.items():
                self.results.setdefault(k, []).append(float(v))
            shown = ", ".join(f"{k}={v:.4g}" for k, v in value.items())
            print(f"  {name}: {shown} ({time.perf_counter() - t0:.1f}s)", file=sys.stderr)
            return True
        print(f"  {name}: FAILED: {self.failures[-1]}", file=sys.stderr)
        return False


def _gap_rows(scenario: str, prefix: str) -> list[tuple[str, str, str]]:
    """The rows of clusterops.raft_gaps' figures for one scenario."""
    what = {
        "tick": "Raft tick gap (all nodes)",
        "contact": "follower <- leader gap",
        "answer": "leader <- follower gap",
    }
    return [
        (f"{scenario} {text} {q}", "s", f"{prefix}_gap_{kind}_{q}")
        for kind, text in what.items()
        for q in ("p99", "p999", "max")
    ] + [
        (
            f"{scenario} election timers fired, leader alive (pre-vote lost)",
            "count",
            f"{prefix}_prevote_rounds_lost",
        )
    ]


ROWS: list[tuple[str, str, str]] = [
    ("ceiling: bare aiohttp POST, 64 clients", "req/s", "ceiling"),
    ("ceiling: bare pysyncobj 3 nodes, 1 op/entry", "entries/s", "syncobj_entries"),
    ("ceiling: bare pysyncobj 3 nodes, 100 ops/entry", "ops/s", "syncobj_ops"),
    ("S1 submit, 64 clients, majority commit", "jobs/s", "s1"),
    ("S1 / aiohttp ceiling", "ratio", "s1_vs_ceiling"),
    ("S1 / pysyncobj entries/s", "ratio", "s1_vs_syncobj"),
    ("S1 / Huey enqueue", "ratio", "s1_vs_huey"),
    ("S1 / Celery enqueue", "ratio", "s1_vs_celery"),
    ("S1 submit latency p50, 64 clients", "ms", "s1_p50"),
    ("S1 leader CPU per job", "us", "s1_leader_us"),
    ("S1 follower CPU per job (median)", "us", "s1_follower_us"),
    ("S1b batch submit, 4 clients x 1,000/batch (main)", "jobs/s", "s1b"),
    ("S1b x1,000 leader CPU per job", "us", "s1b_leader_us"),
    ("S1b x1,000 follower CPU per job (median)", "us", "s1b_follower_us"),
    ("S1b batch submit, 4 clients x 5,000/batch", "jobs/s", "s1b_5000"),
    ("S1b x1,000: elections (Raft term increments)", "count", "s1b_elections"),
    ("S1b x5,000: elections (Raft term increments)", "count", "s1b_5000_elections"),
    *_gap_rows("S1 to S1b x5,000, since the cluster started:", "s1b_5000"),
    ("S1b (x1,000) / pysyncobj ops/s", "ratio", "s1b_vs_syncobj_ops"),
    ("S1b (x1,000) / Huey enqueue", "ratio", "s1b_vs_huey"),
    ("S1b (x1,000) / Celery enqueue", "ratio", "s1b_vs_celery"),
    ("S1d client.submit, 64 coroutines, batching on", "jobs/s", "s1d"),
    ("S1d batching on: submit p99", "ms", "s1d_p99"),
    ("S1d client.submit, 64 coroutines, batching off", "jobs/s", "s1d_nobatch"),
    ("S1d batching off: submit p99", "ms", "s1d_nobatch_p99"),
    ("S1d (batching) / S1b (x1,000)", "ratio", "s1d_vs_s1b"),
    ("S1d (batching) / Huey enqueue", "ratio", "s1d_vs_huey"),
    ("S1d (no batching) / S1", "ratio", "s1d_nobatch_vs_s1"),
    ("S1c sequential submit p50", "ms", "s1c_p50"),
    ("S1c sequential submit p99", "ms", "s1c_p99"),
    ("S2 dispatch+complete, 1 worker process", "jobs/s", "s2"),
    ("S2 dispatch+complete, 2 worker processes", "jobs/s", "s2_2w"),
    ("S2 (1 worker) leader CPU per run", "us", "s2_leader_us"),
    ("S2 (1 worker) follower CPU per run (median)", "us", "s2_follower_us"),
    ("S2 2 workers / 1 worker", "ratio", "s2_2w_vs_s2"),
    ("S2 / Huey drain", "ratio", "s2_vs_huey"),
    ("S2 / Celery drain", "ratio", "s2_vs_celery"),
    ("S3 2,000 due at once: start lag p50", "ms", "s3_p50"),
    ("S3 start lag p99", "ms", "s3_p99"),
    ("S3 start lag max", "ms", "s3_max"),
    ("S3 started early / missing", "jobs", "s3_bad"),
    ("S3b {s3b_n} due within 1 s, 2 workers: fire lag p50", "ms", "s3b_fire_p50"),
    ("S3b fire lag p99 (due -> fire committed)", "ms", "s3b_fire_p99"),
    ("S3b start lag p50", "ms", "s3b_p50"),
    ("S3b start lag p99", "ms", "s3b_p99"),
    ("S3b start lag max", "ms", "s3b_max"),
    ("S3b started early / missing", "jobs", "s3b_bad"),
    ("S3b drain: jobs / (last start - due second)", "jobs/s", "s3b_drain"),
    ("S3b drain / S2 2 workers", "ratio", "s3b_drain_vs_s2"),
    ("S3b batch submit of all jobs", "jobs/s", "s3b_submit_rate"),
    ("S3b submit done before the due second by", "s", "s3b_submit_margin"),
    ("S3b elections (Raft term increments)", "count", "s3b_elections"),
    *_gap_rows("S3b", "s3b"),
    ("S4 {s4_n} pending: batch submit (x1,000)", "jobs/s", "s4_submit_rate"),
    ("S4 jobs submitted within the load cap", "jobs", "s4_jobs"),
    ("S4 elections during load + quiet (term increments)", "count", "s4_elections"),
    ("S4 looks for the leader that found none in 30 s", "count", "s4_leaderless_30s"),
    *_gap_rows("S4 (load + quiet)", "s4"),
    ("S4 leader memory per pending job (VmRSS)", "bytes", "s4_bytes_per_job"),
    ("S4 follower memory per pending job (max)", "bytes", "s4_follower_bytes_per_job"),
    ("S4 leader bytes written per pending job (/proc io)", "bytes", "s4_write_bytes_per_job"),
    ("S4 follower bytes written per pending job (max)", "bytes", "s4_follower_write_bytes_per_job"),
    ("S4 written, load + quiet: leader", "MiB", "s4_write_mib_leader"),
    ("S4 written, load + quiet: follower 1", "MiB", "s4_write_mib_follower_1"),
    ("S4 written, load + quiet: follower 2", "MiB", "s4_write_mib_follower_2"),
    ("S4 probe submit every 50 ms, under load: p99", "ms", "s4_load_probe_p99"),
    ("S4 probe submit under load: max", "ms", "s4_load_probe_max"),
    ("S4 probe submit, quiet + snapshots: p99", "ms", "s4_quiet_probe_p99"),
    ("S4 probe submit, quiet + snapshots: max", "ms", "s4_quiet_probe_max"),
    ("S4 quiet: probe max while the leader snapshots", "ms", "s4_snapshot_probe_max"),
    ("S4 quiet: whole snapshots written in it (all nodes)", "count", "s4_quiet_snapshots_done"),
    ("S4 snapshots (log compactions) made (all nodes)", "count", "s4_snapshots"),
    ("S4 longest snapshot (any node's duration gauge)", "s", "s4_snapshot_max"),
    ("S4 snapshot save from the leader (schedctl): time", "s", "s4_save_seconds"),
    ("S4 snapshot save from the leader: image", "bytes", "s4_save_bytes"),
    ("S4 snapshot save from the leader: rate", "MiB/s", "s4_save_mib_s"),
    ("S4 snapshot save from the leader: probe p99", "ms", "s4_save_probe_p99"),
    ("S4 snapshot save from the leader: probe max", "ms", "s4_save_probe_max"),
    ("S4 snapshot save from the leader: probes failed", "count", "s4_save_probe_errors"),
    ("S4 snapshot save from the leader: its WAL, largest", "MiB", "s4_save_wal_mib"),
    ("S4 snapshot save from the leader: node wrote", "MiB", "s4_save_node_write_mib"),
    ("S4 snapshot save from the leader: term increments", "count", "s4_save_elections"),
    ("S4 snapshot save from the follower (schedctl): time", "s", "s4_save_follower_seconds"),
    ("S4 snapshot save from the follower: image", "bytes", "s4_save_follower_bytes"),
    ("S4 snapshot save from the follower: rate", "MiB/s", "s4_save_follower_mib_s"),
    ("S4 snapshot save from the follower: probe p99", "ms", "s4_save_follower_probe_p99"),
    ("S4 snapshot save from the follower: probe max", "ms", "s4_save_follower_probe_max"),
    ("S4 snapshot save from the follower: probes failed", "count", "s4_save_follower_probe_errors"),
    ("S4 snapshot save from the follower: its WAL, largest", "MiB", "s4_save_follower_wal_mib"),
    ("S4 snapshot save from the follower: node wrote", "MiB", "s4_save_follower_node_write_mib"),
    ("S4 snapshot save from the follower: term increments", "count", "s4_save_follower_elections"),
    ("S4 follower SIGKILL, restarts that exited at once", "count", "s4_restart_failures"),
    ("S4 follower SIGKILL, restart -> answers HTTP", "s", "s4_restart_answer"),
    ("S4 follower SIGKILL, restart -> caught up", "s", "s4_catchup"),
    ("S4 follower SIGKILL, behind at the timeout", "entries", "s4_catchup_behind"),
    ("S4 wiped follower: its raft/ deleted", "MiB", "s4_wiped_removed_mib"),
    ("S4 wiped follower: restarts that exited", "count", "s4_wiped_restart_failures"),
    ("S4 wiped follower: restart -> answers HTTP", "s", "s4_wiped_answer"),
    ("S4 wiped follower: restart -> caught up", "s", "s4_wiped_catchup"),
    ("S4 wiped follower: not caught up within", "s", "s4_wiped_timeout"),
    ("S4 wiped follower: behind at the timeout", "entries", "s4_wiped_behind"),
    ("S4 wiped follower: written by its last start", "MiB", "s4_wiped_write_mib"),
    ("S4 wiped follower: probe submit meanwhile, p99", "ms", "s4_wiped_probe_p99"),
    ("S4 wiped follower: probe submit meanwhile, max", "ms", "s4_wiped_probe_max"),
    ("S4 wiped follower: probe submits failed", "count", "s4_wiped_probe_errors"),
    ("S4 wiped follower: batches (x1,000) meanwhile", "count", "s4_wiped_batches"),
    ("S5 {s5_kills} leader SIGKILLs under load: first dispatch p50", "s", "s5_dispatch_p50"),
    ("S5 first dispatch p99 (of the kills)", "s", "s5_dispatch_p99"),
    ("S5 first dispatch max", "s", "s5_dispatch_max"),
    ("S5 leader SIGKILL -> next ack p50", "s", "s5_ack_p50"),
    ("S5 leader SIGKILL -> next ack max", "s", "s5_ack_max"),
    ("S5 kill -> leader.elected p50 (node log)", "s", "s5_elected_p50"),
    ("S5 kill -> new leader ready p50 (node log)", "s", "s5_ready_p50"),
    ("S5 kill -> worker welcomed by new leader p50", "s", "s5_welcome_p50"),
    ("S5 acknowledged jobs lost (never started)", "jobs", "s5_lost"),
    ("S5 acknowledged -> started, slowest job", "s", "s5_ack_to_start_max"),
    ("S5 longest time without a handler start", "s", "s5_max_start_gap"),
    ("S5 leader changes besides the kills and SIGTERMs", "count", "s5_extra_leader_changes"),
    ("S5 killed node restarted -> caught up p50", "s", "s5_restart_p50"),
    ("S5 submit load (acknowledged jobs / load time)", "jobs/s", "s5_load_rate"),
    ("S5 {s5_terms} leader SIGTERMs (hand-over): first dispatch p50", "s", "s5_term_dispatch_p50"),
    ("S5 leader SIGTERM -> first dispatch max", "s", "s5_term_dispatch_max"),
    ("S5 leader SIGTERM -> next ack p50", "s", "s5_term_ack_p50"),
    ("S5 leader SIGTERM -> leader.elected p50 (node log)", "s", "s5_term_elected_p50"),
    ("S5 leader SIGTERM -> process exit max", "s", "s5_term_exit_max"),
    ("S5 SIGTERMs without leader.handed_over", "count", "s5_term_handover_failed"),
    (
        "S6 {s6_jobs} every 1 s + {s6_oneoff} one-off/s, forgetting after 1 min: runs",
        "runs/s",
        "s6_runs_per_s",
    ),
    ("S6 leader VmRSS growth, forgetting", "KiB/min", "s6_rss_kib_per_min"),
    ("S6 state.db + wal growth, forgetting", "KiB/min", "s6_db_kib_per_min"),
    ("S6 state.db + wal at the end, forgetting", "MiB", "s6_db_mib_end"),
    ("S6 keeping every run: runs", "runs/s", "s6_keep_runs_per_s"),
    ("S6 leader VmRSS growth, keeping every run", "KiB/min", "s6_keep_rss_kib_per_min"),
    ("S6 state.db + wal growth, keeping every run", "KiB/min", "s6_keep_db_kib_per_min"),
    ("S6 state.db + wal at the end, keeping every run", "MiB", "s6_keep_db_mib_end"),
    ("S6 database growth: forgetting / keeping", "ratio", "s6_db_growth_vs_keep_all"),
    (
        "S7 a node's core shared with a 100% CPU loop, {s7_seconds} s: elections",
        "count",
        "s7_elections",
    ),
    ("S7 leader.elected beyond the first (node logs)", "count", "s7_leader_changes"),
    ("S7 acknowledged jobs", "jobs", "s7_acked"),
    ("S7 acknowledged jobs started", "jobs", "s7_started"),
    ("S7 acknowledged jobs lost (never started)", "jobs", "s7_lost"),
    ("S7 submits not acknowledged", "count", "s7_not_acked"),
    ("S7 submit -> ack p50, hog running", "ms", "s7_submit_p50"),
    ("S7 submit -> ack p99, hog running", "ms", "s7_submit_p99"),
    ("S7 submit -> ack p99, before the hog", "ms", "s7_base_submit_p99"),
    ("S7 submit -> ack p99, hog next to a follower", "ms", "s7_follower_submit_p99"),
    ("S7 submit -> ack p99, hog next to the leader", "ms", "s7_leader_submit_p99"),
    ("S7 hog's CPU next to the follower", "% core", "s7_follower_hog_cpu"),
    ("S7 follower's CPU beside the hog", "% core", "s7_follower_node_cpu"),
    ("S7 hog's CPU next to the leader", "% core", "s7_leader_hog_cpu"),
    ("S7 leader's CPU beside the hog", "% core", "s7_leader_node_cpu"),
    ("S7 submit load (acknowledged jobs / load time)", "jobs/s", "s7_load_rate"),
    ("peer: Huey (SQLite) enqueue, tight loop", "jobs/s", "huey_enqueue"),
    ("peer: Huey drain, 1 consumer (1 thread)", "jobs/s", "huey_drain"),
    ("peer: Celery 5 + Redis enqueue, tight loop", "jobs/s", "celery_enqueue"),
    ("peer: Celery drain, 1 worker (solo pool)", "jobs/s", "celery_drain"),
]

RATIOS = {
    "s1_vs_ceiling": ("s1", "ceiling"),
    "s1_vs_syncobj": ("s1", "syncobj_entries"),
    "s1_vs_huey": ("s1", "huey_enqueue"),
    "s1_vs_celery": ("s1", "celery_enqueue"),
    "s1b_vs_syncobj_ops": ("s1b", "syncobj_ops"),
    "s1b_vs_huey": ("s1b", "huey_enqueue"),
    "s1b_vs_celery": ("s1b", "celery_enqueue"),
    "s1d_vs_s1b": ("s1d", "s1b"),
    "s1d_vs_huey": ("s1d", "huey_enqueue"),
    "s1d_nobatch_vs_s1": ("s1d_nobatch", "s1"),
    "s2_2w_vs_s2": ("s2_2w", "s2"),
    "s2_vs_huey": ("s2", "huey_drain"),
    "s2_vs_celery": ("s2", "celery_drain"),
}


def table(
    out: dict[str, dict[str, float]], markdown: bool = False, labels: dict[str, str] | None = None
) -> str:
    lines = []
    width = 52
    if markdown:
        lines += ["| scenario | unit | median | min | max |", "|---|---|---:|---:|---:|"]
    else:
        lines.append(f"{'scenario':{width}} {'unit':9} {'median':>11} {'min':>11} {'max':>11}")
    for name, unit, key in ROWS:
        s = out.get(key)
        if s is None:
            continue
        name = name.format(**(labels or {}))
        fmt = (
            ",.4f"
            if unit == "ratio" and s["median"] < 0.1
            else ",.2f"
            if unit == "ratio" or s["median"] < 100
            else ",.0f"
        )
        cells = [format(s[c], fmt) for c in ("median", "min", "max")]
        if markdown:
            lines.append(f"| {name} | {unit} | " + " | ".join(cells) + " |")
        else:
            lines.append(f"{name:{width}} {unit:9} " + " ".join(f"{c:>11}" for c in cells))
    return "\n".join(lines)


def _check_bad(res: dict[str, list[float]], failures: list[str], key: str, bound: str) -> None:
    """``<key>_bad`` = early + missing per run; either one fails the run."""
    if f"{key}_early" not in res:
        return
    res[f"{key}_bad"] = [
        e + m for e, m in zip(res[f"{key}_early"], res[f"{key}_missing"], strict=True)
    ]
    if any(res[f"{key}_early"]):
        failures.append(f"{key}: jobs started before their scheduled time: {res[f'{key}_early']}")
    if any(res[f"{key}_missing"]):
        failures.append(f"{key}: jobs not started within {bound}: {res[f'{key}_missing']}")


def _median(res: dict[str, list[float]], key: str) -> float | None:
    values = res.get(key)
    return statistics.median(values) if values else None


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="scripts/bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="small counts, one run, short timeouts (a smoke test, < ~2.5 min)",
    )
    ap.add_argument("--no-peers", action="store_true", help="skip Huey and Celery")
    ap.add_argument("--json", type=Path, default=REPO / "bench-results" / "latest.json")
    ap.add_argument(
        "--s3b-jobs",
        type=int,
        default=None,
        help="S3b's job count (default 100,000; --quick: 10,000)",
    )
    ap.add_argument(
        "--s4-jobs",
        type=int,
        default=None,
        help="S4's pending job count (default 2,000,000; --quick: 20,000)",
    )
    ap.add_argument(
        "--s4-wipe-timeout",
        type=float,
        default=None,
        help="how long S4's wiped follower has to catch up, s (default 900 s per 10,000,000 "
        "jobs, at least 120; --quick: 60)",
    )
    ap.add_argument(
        "--s4-add",
        type=float,
        default=None,
        metavar="S",
        help="add to S4 a fourth node by raft.join once the state is loaded: seconds until it "
        "is a learner and a voter, probe p50/p99/max meanwhile (at most S seconds)",
    )
    ap.add_argument(
        "--s4-skip-wipe",
        action="store_true",
        help="skip S4's last phase, the follower restarted with its raft/ directory emptied",
    )
    ap.add_argument(
        "--s5-kills", type=int, default=None, help="S5's leader SIGKILLs (default 10; --quick: 1)"
    )
    ap.add_argument(
        "--s5-terms",
        type=int,
        default=None,
        help="S5's leader SIGTERMs (graceful hand-overs) after the kills (default 3; --quick: 1)",
    )
    ap.add_argument(
        "--s5-rate", type=float, default=200.0, help="S5's submit load, requests/s (default 200)"
    )
    ap.add_argument(
        "--s6-jobs", type=int, default=30, help="S6's jobs, each every second (default 30)"
    )
    ap.add_argument(
        "--s6-oneoff",
        type=int,
        default=20,
        help="S6's one-off jobs submitted each second (default 20)",
    )
    ap.add_argument(
        "--s6-seconds",
        type=float,
        default=None,
        help="S6's run time per configuration (default 300; --quick: 30)",
    )
    ap.add_argument(
        "--s7-seconds",
        type=float,
        default=None,
        help="S7's run time, half next to a follower, half next to the leader "
        "(default 600; --quick: 30)",
    )
    ap.add_argument(
        "--s7-rate", type=float, default=100.0, help="S7's submit load, requests/s (default 100)"
    )
    ap.add_argument(
        "--only",
        type=_scenarios,
        default=None,
        metavar="S5,S3,...",
        help="run only these scenarios ("
        + ", ".join(SCENARIOS)
        + "; default: all but "
        + ", ".join(OPT_IN)
        + ", which run only when named here)",
    )
    return ap.parse_args()


async def main() -> int:
    args = _parse_args()
    # the scenarios write their detail files beside it as they finish
    args.json.parent.mkdir(parents=True, exist_ok=True)

    on = partial(_selected, args.only)
    runs = 1 if args.quick else args.runs
    if args.quick:
        n_submit, n_seq, n_drain, n_delayed, n_raft, n_peer = 300, 100, 300, 2000, 2000, 1000
        n_batch, n_s3b, n_s4 = 8000, 10_000, 20_000
    else:
        n_submit, n_seq, n_drain, n_delayed, n_raft, n_peer = 4000, 500, 3000, 2000, 20000, 4000
        n_batch, n_s3b, n_s4 = 40_000, 100_000, 2_000_000
    n_s3b = args.s3b_jobs or n_s3b
    n_s4 = args.s4_jobs or n_s4
    n_s5 = args.s5_kills or (1 if args.quick else 10)
    n_s5_terms = (1 if args.quick else 3) if args.s5_terms is None else args.s5_terms
    s6_seconds = args.s6_seconds or (30.0 if args.quick else 300.0)
    s7_seconds = args.s7_seconds or (30.0 if args.quick else 600.0)
    # S3b: jobs not started this long after the due second are missing; S4: snapshot period,
    # longest quiet period waiting for every node's snapshot, follower catch-up limit (s).
    s3b_bound = max(30.0, n_s3b / 700)
    # S5, S7: an acknowledged job not started this long after the load stopped is lost (s).
    s5_bound = 30.0
    s4_compaction, s4_load, s4_quiet, s4_catchup = (
        (3.0, 60.0, 30.0, 60.0) if args.quick else (30.0, 1200.0, 240.0, 90.0)
    )
    if not args.quick:  # a larger S4 (--s4-jobs) gets the time it needs at ~4,000 jobs/s, and
        # a snapshot of its database (~25,000 jobs/s) in its quiet period
        s4_load, s4_quiet = max(s4_load, n_s4 / 4000), max(s4_quiet, n_s4 / 25_000)
    # the wiped follower's catch-up limit (s): 900 s at 10,000,000 jobs
    s4_wipe = args.s4_wipe_timeout or (60.0 if args.quick else max(120.0, 900.0 * n_s4 / 1e7))
    # two backups of the state (~1 KB a job) streamed at raft.snapshot_rate (32 MiB/s), with room
    s4_saves = 2 * (60.0 + 1.5 * n_s4 * 1000 / (32 << 20))
    # Per-scenario timeouts (s): generous multiples of a normal run on a busy 2-core machine.
    t = {
        "ceiling": 30,
        "syncobj": 60,
        "cluster": 45,
        "s1": 60,
        "s1c": 60,
        "s1d": 60,
        "s2": 90,
        "s3": 60,
        "install": 600,
        "huey": 90,
        "celery": 120,
        "settle": 30,
        "s1b": 60,
        "s3b": 60 + s3b_bound + n_s3b / 500,
        "s4": 120
        + s4_load
        + s4_quiet
        + s4_saves
        + s4_catchup
        + (0 if args.s4_skip_wipe else 60 + s4_wipe),
        "s5": 60 + 90 * (n_s5 + n_s5_terms) + 2 * s5_bound,
        "s6": 2 * (90 + s6_seconds),
        "s7": 120 + s7_seconds + 2 * s5_bound,
    }
    if args.quick:
        # (S1b keeps its full minute: 4 batches of 5,000 jobs are 20,000 jobs whatever the
        # counts, 16-25 s on 2 shared cores when the leader's long appends cost an election)
        t.update(ceiling=15, syncobj=30, s1=20, s1c=20, s1d=20, s2=30, s3=40, huey=40, celery=40)
    envs = REPO / "bench-results" / "envs"
    runner = Runner()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="schedd-bench-") as tmp_s:
        tmp = Path(tmp_s)
        os.environ.setdefault("SCHEDD_TEST_RECORD", str(tmp / "record"))
        peering = on("peers") and not args.no_peers
        if peering:
            # installed once, outside the timed runs (a no-op when already there)
            await runner.run("install peers", t["install"], lambda: _install(envs))
        per_run = ("ceiling", "syncobj", "s1", "s1c", "s1d", "s2", "s3", "s1b")
        for r in range(runs if any(map(on, per_run)) or peering else 0):
            if on("ceiling"):
                await runner.run("ceiling", t["ceiling"], lambda: ceiling(n_submit))
            if on("syncobj"):
                await runner.run(
                    "syncobj",
                    t["syncobj"],
                    partial(syncobj_ceiling, tmp / f"run{r}-syncobj", n_raft, free_port),
                )
            if any(map(on, ("s1", "s1c", "s1d", "s2", "s3", "s1b"))):
                await _on_cluster(
                    runner,
                    on,
                    t,
                    tmp,
                    Cluster(tmp / f"run{r}"),
                    (n_submit, n_seq, n_drain, n_delayed, n_batch),
                )
            if peering:
                await runner.run(
                    "huey",
                    t["huey"],
                    partial(peers.huey, envs, tmp / f"run{r}-huey", n_peer, t["huey"] - 5),
                )
                await runner.run(
                    "celery",
                    t["celery"],
                    partial(
                        peers.celery,
                        envs,
                        tmp / f"run{r}-celery",
                        n_peer,
                        t["celery"] - 10,
                        free_port,
                    ),
                )
            print(f"run {r + 1}/{runs} done ({time.perf_counter() - began:.0f}s)", file=sys.stderr)
        # Once per invocation, each on its own fresh cluster.
        res = runner.results
        once = {
            "s5": partial(
                failover.s5,
                tmp / "s5",
                n_s5,
                args.s5_rate,
                s5_bound,
                n_s5_terms,
                detail=args.json.with_name(args.json.stem + "-s5.json"),
            ),
            "s3b": partial(
                scale.s3b,
                tmp / "s3b",
                n_s3b,
                _median(res, "s1b") or 2000.0,
                s3b_bound,
                min(MAX_WORKER_CAPACITY, max(S2_CONCURRENCY, n_s3b // 20)),
                _median(res, "s2_2w"),
            ),
            "s4": partial(
                scale.s4,
                tmp / "s4",
                n_s4,
                s4_compaction,
                s4_load,
                s4_quiet,
                s4_catchup,
                args.json.with_name(args.json.stem + "-s4.json"),
                None if args.s4_skip_wipe else s4_wipe,
                args.s4_add,
            ),
            # samples start once the retention has begun forgetting (20 s + a purge period)
            "s6": partial(
                retention.s6,
                tmp / "s6",
                args.s6_jobs,
                args.s6_oneoff,
                s6_seconds,
                min(90.0, s6_seconds / 3),
                args.json.with_name(args.json.stem + "-s6.json"),
            ),
            "s7": partial(
                cpuhog.s7,
                tmp / "s7",
                s7_seconds,
                args.s7_rate,
                s5_bound,
                detail=args.json.with_name(args.json.stem + "-s7.json"),
            ),
        }
        for name, fn in once.items():
            if on(name):
                await runner.run(name, t[name], fn)
    for key in ("cluster up", "install peers", "settle"):
        res.pop(key, None)
    _ratios(res)
    _check_bad(res, runner.failures, "s3", "30 s")
    # the targets are for the full-size run: at --quick's 20,000 jobs the fixed memory of a
    # node is most of its RSS growth
    _check_s4(res, runner.failures, n_s4, s4_load, s4_catchup, s4_wipe, targets=not args.quick)
    _check_bad(res, runner.failures, "s3b", f"{s3b_bound:.0f} s after the due second")
    _check_lost(res, runner.failures, "s5", s5_bound)
    _check_s7(res, runner.failures, s5_bound)
    out = {k: summary(v) for k, v in res.items()}
    labels = {
        "s3b_n": f"{n_s3b:,}",
        "s4_n": f"{n_s4:,}",
        "s5_kills": str(n_s5),
        "s5_terms": str(n_s5_terms),
        "s7_seconds": f"{s7_seconds:.0f}",
        "s6_jobs": str(args.s6_jobs),
        "s6_oneoff": str(args.s6_oneoff),
    }
    print("\n" + table(out, labels=labels))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "command": "scripts/bench " + " ".join(sys.argv[1:]),
                "runs": runs,
                "quick": args.quick,
                "elapsed_s": time.perf_counter() - began,
                "results": out,
                "raw": res,
                "counts": {
                    "s1b_jobs": n_batch,
                    "s3b_jobs": n_s3b,
                    "s4_jobs": n_s4,
                    "s4_compaction_s": s4_compaction,
                    "s4_load_cap_s": s4_load,
                    "s4_wipe_timeout_s": None if args.s4_skip_wipe else s4_wipe,
                    "s3b_missing_after_s": s3b_bound,
                    "s5_kills": n_s5,
                    "s5_terms": n_s5_terms,
                    "s5_rate": args.s5_rate,
                    "s5_lost_after_s": s5_bound,
                    "s6_jobs": args.s6_jobs,
                    "s6_oneoff": args.s6_oneoff,
                    "s6_seconds": s6_seconds,
                    "s7_seconds": s7_seconds,
                    "s7_rate": args.s7_rate,
                },
                "failures": runner.failures,
                "markdown": table(out, markdown=True, labels=labels),
            },
            indent=2,
        )
    )
    print(f"\nJSON: {args.json}   ({time.perf_counter() - began:.0f}s)")
    if runner.failures:
        print("\nFAILED:\n  " + "\n  ".join(runner.failures), file=sys.stderr)
        return 1
    return 0


async def _on_cluster(
    runner: Runner,
    on: Callable[[str], bool],
    t: dict[str, float],
    tmp: Path,
    cluster: Cluster,
    n: tuple[int, int, int, int, int],
) -> None:
    """The scenarios that share one run's cluster, in order."""
    n_submit, n_seq, n_drain, n_delayed, n_batch = n
    try:
        cluster.start()
        if not await runner.run("cluster up", t["cluster"], partial(_up, cluster)):
            return
        if on("s1"):
            await runner.run("s1", t["s1"], partial(s1, cluster, n_submit))
        if on("s1c"):
            await runner.run("s1c", t["s1c"], partial(_s1c, cluster, n_seq))
        if on("s1d"):
            await runner.run("s1d", t["s1d"], partial(s1d, cluster, 4 * n_submit, True))
            await runner.run("s1d_nobatch", t["s1d"], partial(s1d, cluster, n_submit, False))
        if on("s2"):
            await runner.run("s2", t["s2"], partial(s2, cluster, n_drain))
            await runner.run("s2_2w", t["s2"], partial(s2, cluster, n_drain, 2))
        if on("s3"):
            await runner.run("s3", t["s3"], partial(s3, cluster, tmp, n_delayed, 3.0))
        # last on this cluster: its pending jobs would weigh on the scenarios above
        if on("s1b") and await runner.run("settle", t["settle"], partial(_settle, cluster)):
            await runner.run("s1b", t["s1b"], partial(scale.s1b, cluster, 1000, n_batch))
            await runner.run("s1b_5000", t["s1b"], partial(scale.s1b, cluster, 5000, n_batch))
    finally:
        stop_cluster(cluster)


def _check_s4(
    res: dict[str, list[float]],
    failures: list[str],
    n_s4: int,
    s4_load: float,
    s4_catchup: float,
    s4_wipe: float,
    targets: bool,
) -> None:
    if res.get("s4_jobs") and res["s4_jobs"][0] < n_s4:
        failures.append(
            f"s4: only {res['s4_jobs'][0]:,.0f} of {n_s4:,} jobs submitted within {s4_load:.0f}s "
            f"({res['s4_elections'][0]:.0f} elections, {res['s4_retries'][0]:.0f} batches re-sent); "
            "the figures are for those"
        )
    limits = (
        ("s4_elections", 0.0, "elections"),
        ("s4_bytes_per_job", 100.0, "bytes of leader RSS per pending job"),
        ("s4_quiet_probe_p99", 100.0, "ms probe p99 while the nodes snapshot"),
        ("s4_save_probe_p99", 100.0, "ms probe p99 while a backup streams from the leader"),
        ("s4_restart_answer", 5.0, "s from a follower's restart to its first answer"),
        ("s4_catchup", 30.0, "s from a follower's restart to caught up"),
    )
    for key, limit, what in limits if targets else ():
        if res.get(key) and res[key][0] > limit:
            failures.append(f"s4: {res[key][0]:,.1f} {what} (target: at most {limit:g})")
    if res.get("s4_catchup_timeout"):
        behind = res.get("s4_catchup_behind")
        failed = res.get("s4_restart_failures", [0.0])[0]
        failures.append(
            f"s4: the restarted follower did not catch up within {s4_catchup:.0f}s ("
            + (
                f"{behind[0]:,.0f} entries behind the leader's commit index then"
                if behind
                else "it never answered HTTP"
            )
            + (f"; {failed:.0f} restarts exited at once" if failed else "")
            + ")"
        )
    if res.get("s4_wiped_timeout"):
        behind = res.get("s4_wiped_behind")
        failures.append(
            f"s4: the follower restarted with an empty raft/ did not catch up within "
            f"{s4_wipe:.0f}s ("
            + (
                f"{behind[0]:,.0f} entries behind the leader's commit index then"
                if behind
                else "it never answered HTTP"
            )
            + ")"
        )


def _ratios(res: dict[str, list[float]]) -> None:
    for key, (a, b) in RATIOS.items():
        if len(res.get(a, [])) == len(res.get(b, [])) > 0:
            res[key] = [x / y for x, y in zip(res[a], res[b], strict=True)]


def _check_s7(res: dict[str, list[float]], failures: list[str], bound: float) -> None:
    """S7's targets: no election (term increments, and leader.elected lines beyond the first
    leader's), no acknowledged job lost."""
    for key, what in (
        ("s7_elections", "Raft term increments"),
        ("s7_leader_changes", "leader.elected lines beyond the first"),
    ):
        if res.get(key) and res[key][0]:
            failures.append(f"s7: {res[key][0]:.0f} {what} with a node's core hogged (target: 0)")
    _check_lost(res, failures, "s7", bound)


def _check_lost(res: dict[str, list[float]], failures: list[str], key: str, bound: float) -> None:
    if res.get(f"{key}_lost") and res[f"{key}_lost"][0]:
        failures.append(
            f"{key}: {res[f'{key}_lost'][0]:.0f} of {res[f'{key}_acked'][0]:.0f} acknowledged "
            f"jobs did not start within {bound:.0f}s of the load's end (job ids in the "
            f"-{key}.json file)"
        )


SCENARIOS = (
    "ceiling",
    "syncobj",
    "S1",
    "S1c",
    "S1d",
    "S2",
    "S3",
    "S1b",
    "peers",
    "S3b",
    "S4",
    "S5",
    "S6",
    "S7",
)
# Scenarios that run only when named in --only (S7 takes 10 minutes).
OPT_IN = ("S7",)


def _selected(only: set[str] | None, scenario: str) -> bool:
    """Whether to run ``scenario`` (lower case): named in ``--only``, or without ``--only`` any
    scenario but the OPT_IN ones."""
    if only is None:
        return scenario not in {s.lower() for s in OPT_IN}
    return scenario in only


def _scenarios(text: str) -> set[str]:
    """``--only``: comma-separated scenario names, any case."""
    names = {x.strip().lower() for x in text.split(",") if x.strip()}
    unknown = names - {s.lower() for s in SCENARIOS}
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(SCENARIOS)}, got {text!r}")
    return names


async def _up(cluster: Cluster) -> dict[str, float]:
    await leader_url(cluster)
    return {}


async def _settle(cluster: Cluster) -> dict[str, float]:
    await scale.settle(cluster)
    return {}


async def _s1c(cluster: Cluster, n: int) -> dict[str, float]:
    p50, p99 = await s1c(cluster, n)
    return {"s1c_p50": p50, "s1c_p99": p99}


async def _install(envs: Path) -> dict[str, float]:
    for name in peers.PEERS:
        await peers.ensure_env(envs, name)
    await peers.ensure_redis_server()
    return {}


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
