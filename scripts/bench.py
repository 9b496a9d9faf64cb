"""schedd benchmarks against a real local three-node cluster, with the machine's ceilings and the
peers measured in the same run (issue 5).

    scripts/bench [--runs N] [--quick] [--no-peers] [--json FILE]

Each scenario runs under its own timeout; a failure or timeout is reported, the rest still run,
and the exit status is non-zero.  Figures are medians of --runs with min–max.
  ceiling  bare aiohttp POST, 64 concurrent clients (requests/s)
  ceiling  bare pysyncobj three-process cluster, batched no-op entries: entries/s (1 op/entry)
           and ops/s (100 ops/entry)  (scripts/benchlib/syncobj_node.py)
  S1       submit, 64 concurrent clients, each job committed on a majority before the reply
  S1c      one client submitting sequentially (p50/p99 latency)
  S2       dispatch + completion of no-op jobs by one schedd-worker process (jobs/s)
  S3       2,000 delayed jobs due at the same instant, one worker with room for all: start lag
           (scheduled time -> handler start, worker's clock) p50/p99/max; none early, none missing
  S5       leader SIGKILLed: time until a submit is acknowledged again (s)
  peers    Huey (SqliteStorage) and Celery 5 + Redis (own redis-server on loopback), each in its
           own venv under bench-results/envs/: enqueue in a tight loop (S1's work) and drain by
           one consumer process (S2's work)  (scripts/benchlib/peers.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.benchlib import peers  # noqa: E402
from scripts.benchlib.common import pct, stop_pid, summary  # noqa: E402
from scripts.benchlib.syncobj_ceiling import syncobj_ceiling  # noqa: E402
from tests.cluster.harness import Cluster  # noqa: E402
from tests.conftest import free_port  # noqa: E402

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


async def load(url: str, headers: dict[str, str], total: int, concurrency: int,
               body: bytes) -> tuple[float, list[float]]:
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


async def leader_url(cluster: Cluster) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http:
        i = await cluster.wait_leader(http)
    return i, cluster.urls[i]


async def s1(cluster: Cluster, n: int) -> float:
    _, url = await leader_url(cluster)
    body = orjson.dumps({"task": "bench.noop", "schedule": {"in": "1h"}})
    rate, _ = await load(url + "/api/v1/jobs", cluster.headers(), n, 64, body)
    return rate


async def s1c(cluster: Cluster, n: int) -> tuple[float, float]:
    _, url = await leader_url(cluster)
    body = orjson.dumps({"task": "bench.noop", "schedule": {"in": "1h"}})
    _, lat = await load(url + "/api/v1/jobs", cluster.headers(), n, 1, body)
    return pct(lat, 0.5) * 1000, pct(lat, 0.99) * 1000


async def wait_worker(http: aiohttp.ClientSession, url: str, cluster: Cluster, name: str) -> None:
    """Until the leader lists the worker ``name`` as connected."""
    while True:
        async with http.get(url + "/api/v1/workers", headers=cluster.headers()) as r:
            if r.status == 200 and any(w.get("worker_id") == name for w in (await r.json())["workers"]):
                return
        await asyncio.sleep(0.1)


# S2's worker takes up to this many leases at once: a no-op handler finishes in microseconds, so
# the window only has to cover the lease and completion round trips through Raft.
S2_CONCURRENCY = 512


async def s2(cluster: Cluster, n: int) -> float:
    _, url = await leader_url(cluster)
    name = f"bench-{time.monotonic_ns()}"
    worker = cluster.start_worker("--import", "schedd.worker.demo_tasks", "--concurrency", str(S2_CONCURRENCY),
                                  name=name)
    try:
        async with aiohttp.ClientSession() as http:
            async def active() -> int:
                async with http.get(url + "/api/v1/jobs?status=active&task=demo.echo&limit=1",
                                    headers=cluster.headers()) as r:
                    return len((await r.json())["jobs"])

            await wait_worker(http, url, cluster, name)
            jobs = [{"task": "demo.echo", "payload": i, "schedule": {"in": "2s"}} for i in range(n)]
            for start in range(0, n, 1000):
                async with http.post(url + "/api/v1/jobs/batch", data=orjson.dumps({"jobs": jobs[start:start + 1000]}),
                                     headers=cluster.headers()) as r:
                    assert r.status == 201, await r.text()
            due = time.perf_counter() + 2.0 - 0.05
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            while await active():
                await asyncio.sleep(0.02)
            return n / (time.perf_counter() - due)
    finally:
        stop_pid(worker, grace=20)


async def s5(cluster: Cluster) -> float:
    i, _ = await leader_url(cluster)
    body = orjson.dumps({"task": "bench.noop", "schedule": {"in": "1h"}})
    others = [u for j, u in enumerate(cluster.urls) if j != i]
    cluster.kill(i, signal.SIGKILL)
    t0 = time.perf_counter()
    async with aiohttp.ClientSession() as http:
        while True:
            for u in others:
                try:
                    async with http.post(u + "/api/v1/jobs", data=body, headers=cluster.headers(),
                                         timeout=aiohttp.ClientTimeout(total=5)) as r:
                        if r.status == 201:
                            elapsed = time.perf_counter() - t0
                            cluster.start(i)
                            return elapsed
                except (aiohttp.ClientError, TimeoutError):
                    pass
            await asyncio.sleep(0.02)


async def s3(cluster: Cluster, root: Path, n: int, lead: float) -> dict[str, float]:
    """``n`` delayed jobs due at the same instant, one worker with room for all of them: start lag
    (scheduled time -> handler start, on the worker's clock), p50/p99/max in ms; early/missing."""
    _, url = await leader_url(cluster)
    record = root / f"s3-{time.monotonic_ns()}.lag"
    name = f"bench-s3-{time.monotonic_ns()}"
    worker = cluster.start_worker("--import", "scripts.benchlib.tasks", "--concurrency", str(n),
                                  name=name, env={"SCHEDD_BENCH_LAG": str(record)})
    try:
        async with aiohttp.ClientSession() as http:
            await wait_worker(http, url, cluster, name)
            due = datetime.now(UTC) + timedelta(seconds=lead)
            at = due.isoformat(timespec="milliseconds").replace("+00:00", "Z")
            jobs = [{"task": "bench.lag", "payload": i, "schedule": {"at": at}} for i in range(n)]
            for start in range(0, n, 1000):
                async with http.post(url + "/api/v1/jobs/batch",
                                     data=orjson.dumps({"jobs": jobs[start:start + 1000]}),
                                     headers=cluster.headers()) as r:
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
            started, sched = ln.split(" ", 1)
            lags.append(float(started) - datetime.fromisoformat(sched).timestamp())
        if not lags:
            raise RuntimeError("no bench.lag job started")
        early = sum(1 for x in lags if x < 0)
        return {"s3_p50": pct(lags, 0.5) * 1000, "s3_p99": pct(lags, 0.99) * 1000,
                "s3_max": max(lags) * 1000, "s3_early": float(early),
                "s3_missing": float(n - len(lags))}
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
            value = {k: float(v) for k, v in value.items()}
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


ROWS: list[tuple[str, str, str]] = [
    ("ceiling: bare aiohttp POST, 64 clients", "req/s", "ceiling"),
    ("ceiling: bare pysyncobj 3 nodes, 1 op/entry", "entries/s", "syncobj_entries"),
    ("ceiling: bare pysyncobj 3 nodes, 100 ops/entry", "ops/s", "syncobj_ops"),
    ("S1 submit, 64 clients, majority commit", "jobs/s", "s1"),
    ("S1 / aiohttp ceiling", "ratio", "s1_vs_ceiling"),
    ("S1 / pysyncobj entries/s", "ratio", "s1_vs_syncobj"),
    ("S1 / Huey enqueue", "ratio", "s1_vs_huey"),
    ("S1 / Celery enqueue", "ratio", "s1_vs_celery"),
    ("S1c sequential submit p50", "ms", "s1c_p50"),
    ("S1c sequential submit p99", "ms", "s1c_p99"),
    ("S2 dispatch+complete, 1 worker process", "jobs/s", "s2"),
    ("S2 / Huey drain", "ratio", "s2_vs_huey"),
    ("S2 / Celery drain", "ratio", "s2_vs_celery"),
    ("S3 2,000 due at once: start lag p50", "ms", "s3_p50"),
    ("S3 start lag p99", "ms", "s3_p99"),
    ("S3 start lag max", "ms", "s3_max"),
    ("S3 started early / missing", "jobs", "s3_bad"),
    ("S5 leader SIGKILL -> next ack", "s", "s5"),
    ("peer: Huey (SQLite) enqueue, tight loop", "jobs/s", "huey_enqueue"),
    ("peer: Huey drain, 1 consumer (1 thread)", "jobs/s", "huey_drain"),
    ("peer: Celery 5 + Redis enqueue, tight loop", "jobs/s", "celery_enqueue"),
    ("peer: Celery drain, 1 worker (solo pool)", "jobs/s", "celery_drain"),
]

RATIOS = {"s1_vs_ceiling": ("s1", "ceiling"), "s1_vs_syncobj": ("s1", "syncobj_entries"),
          "s1_vs_huey": ("s1", "huey_enqueue"), "s1_vs_celery": ("s1", "celery_enqueue"),
          "s2_vs_huey": ("s2", "huey_drain"), "s2_vs_celery": ("s2", "celery_drain")}


def table(out: dict[str, dict[str, float]], markdown: bool = False) -> str:
    lines = []
    if markdown:
        lines += ["| scenario | unit | median | min | max |", "|---|---|---:|---:|---:|"]
    else:
        lines.append(f"{'scenario':48} {'unit':9} {'median':>11} {'min':>11} {'max':>11}")
    for name, unit, key in ROWS:
        s = out.get(key)
        if s is None:
            continue
        fmt = ",.2f" if unit == "ratio" or s["median"] < 100 else ",.0f"
        cells = [format(s[c], fmt) for c in ("median", "min", "max")]
        if markdown:
            lines.append(f"| {name} | {unit} | " + " | ".join(cells) + " |")
        else:
            lines.append(f"{name:48} {unit:9} " + " ".join(f"{c:>11}" for c in cells))
    return "\n".join(lines)


async def main() -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="small counts, one run, short timeouts (a smoke test, < ~2 min)")
    ap.add_argument("--no-peers", action="store_true", help="skip Huey and Celery")
    ap.add_argument("--json", type=Path, default=REPO / "bench-results" / "latest.json")
    args = ap.parse_args()
    runs = 1 if args.quick else args.runs
    if args.quick:
        n_submit, n_seq, n_drain, n_delayed, n_raft, n_peer = 300, 100, 300, 2000, 2000, 1000
    else:
        n_submit, n_seq, n_drain, n_delayed, n_raft, n_peer = 4000, 500, 3000, 2000, 20000, 4000
    # Per-scenario timeouts (s): generous multiples of a normal run on a busy 2-core machine.
    t = {"ceiling": 30, "syncobj": 60, "cluster": 45, "s1": 60, "s1c": 60, "s2": 90, "s3": 60,
         "s5": 30, "install": 600, "huey": 90, "celery": 120}
    if args.quick:
        t.update(ceiling=15, syncobj=30, s1=20, s1c=20, s2=30, s3=40, s5=20, huey=40, celery=40)
    envs = REPO / "bench-results" / "envs"
    runner = Runner()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="schedd-bench-") as tmp_s:
        tmp = Path(tmp_s)
        os.environ.setdefault("SCHEDD_TEST_RECORD", str(tmp / "record"))
        if not args.no_peers:
            # installed once, outside the timed runs (a no-op when already there)
            await runner.run("install peers", t["install"], lambda: _install(envs))
        for r in range(runs):
            await runner.run("ceiling", t["ceiling"], lambda: ceiling(n_submit))
            await runner.run("syncobj", t["syncobj"],
                             partial(syncobj_ceiling, tmp / f"run{r}-syncobj", n_raft, free_port))
            cluster = Cluster(tmp / f"run{r}")
            try:
                cluster.start()
                if await runner.run("cluster up", t["cluster"], partial(_up, cluster)):
                    await runner.run("s1", t["s1"], partial(s1, cluster, n_submit))
                    await runner.run("s1c", t["s1c"], partial(_s1c, cluster, n_seq))
                    await runner.run("s2", t["s2"], partial(s2, cluster, n_drain))
                    await runner.run("s3", t["s3"], partial(s3, cluster, tmp, n_delayed, 3.0))
                    await runner.run("s5", t["s5"], partial(s5, cluster))
            finally:
                cluster.stop()
            if not args.no_peers:
                await runner.run("huey", t["huey"],
                                 partial(peers.huey, envs, tmp / f"run{r}-huey", n_peer, t["huey"] - 5))
                await runner.run("celery", t["celery"],
                                 partial(peers.celery, envs, tmp / f"run{r}-celery", n_peer,
                                         t["celery"] - 10, free_port))
            print(f"run {r + 1}/{runs} done ({time.perf_counter() - began:.0f}s)", file=sys.stderr)
    res = runner.results
    res.pop("cluster up", None)
    res.pop("install peers", None)
    for key, (a, b) in RATIOS.items():
        if len(res.get(a, [])) == len(res.get(b, [])) > 0:
            res[key] = [x / y for x, y in zip(res[a], res[b], strict=True)]
    if "s3_early" in res:
        res["s3_bad"] = [e + m for e, m in zip(res["s3_early"], res["s3_missing"], strict=True)]
        if any(res["s3_early"]):
            runner.failures.append(f"s3: jobs started before their scheduled time: {res['s3_early']}")
        if any(res["s3_missing"]):
            runner.failures.append(f"s3: jobs not started within 30 s: {res['s3_missing']}")
    out = {k: summary(v) for k, v in res.items()}
    print("\n" + table(out))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "command": "scripts/bench " + " ".join(sys.argv[1:]), "runs": runs, "quick": args.quick,
        "elapsed_s": time.perf_counter() - began, "results": out, "raw": res,
        "failures": runner.failures, "markdown": table(out, markdown=True)}, indent=2))
    print(f"\nJSON: {args.json}   ({time.perf_counter() - began:.0f}s)")
    if runner.failures:
        print("\nFAILED:\n  " + "\n  ".join(runner.failures), file=sys.stderr)
        return 1
    return 0


async def _up(cluster: Cluster) -> dict[str, float]:
    await leader_url(cluster)
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
