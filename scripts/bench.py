"""schedd benchmarks against a real local three-node cluster, with the machine's ceiling measured
in the same run (a bare aiohttp server answering the same POST with no work behind it).

    scripts/bench [--runs N] [--quick] [--json FILE]

Scenarios (medians of --runs, with min–max):
  ceiling  bare aiohttp POST, 64 concurrent clients (requests/s)
  S1       submit, 64 concurrent clients, each job committed on a majority before the reply
  S1c      one client submitting sequentially (p50/p99 latency)
  S2       dispatch + completion of no-op jobs by one schedd-worker process (jobs/s)
  S5       leader SIGKILLed under load: time until a submit is acknowledged again (s)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster.harness import Cluster  # noqa: E402

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


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))]


async def ceiling(n: int) -> float:
    from tests.conftest import free_port

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
        proc.terminate()
        proc.wait(10)


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


async def s2(cluster: Cluster, n: int) -> float:
    _, url = await leader_url(cluster)
    worker = cluster.start_worker("--import", "schedd.worker.demo_tasks", "--concurrency", "64",
                                  name=f"bench-{time.monotonic_ns()}")
    try:
        async with aiohttp.ClientSession() as http:
            async def active() -> int:
                async with http.get(url + "/api/v1/jobs?status=active&task=demo.echo&limit=1",
                                    headers=cluster.headers()) as r:
                    return len((await r.json())["jobs"])

            while True:  # the worker is connected once a probe job has run
                async with http.get(url + "/api/v1/workers", headers=cluster.headers()) as r:
                    if r.status == 200 and (await r.json())["workers"]:
                        break
                await asyncio.sleep(0.1)
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
        worker.terminate()
        worker.wait(20)


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


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


async def main() -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small counts, one run (a smoke test)")
    ap.add_argument("--json", type=Path, default=REPO / "bench-results" / "latest.json")
    args = ap.parse_args()
    runs = 1 if args.quick else args.runs
    n_submit, n_seq, n_drain = (300, 100, 300) if args.quick else (4000, 500, 3000)
    results: dict[str, list[Any]] = {k: [] for k in ("ceiling", "s1", "s1c_p50", "s1c_p99", "s2", "s5")}
    with tempfile.TemporaryDirectory(prefix="schedd-bench-") as tmp:
        os.environ.setdefault("SCHEDD_TEST_RECORD", str(Path(tmp) / "record"))
        for r in range(runs):
            results["ceiling"].append(await ceiling(n_submit))
            cluster = Cluster(Path(tmp) / f"run{r}")
            cluster.start()
            try:
                results["s1"].append(await s1(cluster, n_submit))
                p50, p99 = await s1c(cluster, n_seq)
                results["s1c_p50"].append(p50)
                results["s1c_p99"].append(p99)
                results["s2"].append(await s2(cluster, n_drain))
                results["s5"].append(await s5(cluster))
            finally:
                cluster.stop()
            print(f"run {r + 1}/{runs} done", file=sys.stderr)
    out = {k: summary(v) for k, v in results.items()}
    out["s1_vs_ceiling"] = summary([a / b for a, b in zip(results["s1"], results["ceiling"], strict=True)])
    rows = [
        ("ceiling: bare aiohttp POST, 64 clients", "req/s", out["ceiling"]),
        ("S1 submit, 64 clients, majority commit", "jobs/s", out["s1"]),
        ("S1 as a fraction of the ceiling", "ratio", out["s1_vs_ceiling"]),
        ("S1c sequential submit p50", "ms", out["s1c_p50"]),
        ("S1c sequential submit p99", "ms", out["s1c_p99"]),
        ("S2 dispatch+complete, 1 worker process", "jobs/s", out["s2"]),
        ("S5 leader SIGKILL -> next ack", "s", out["s5"]),
    ]
    print(f"\n{'scenario':44} {'unit':7} {'median':>10} {'min':>10} {'max':>10}")
    for name, unit, s in rows:
        print(f"{name:44} {unit:7} {s['median']:10.3f} {s['min']:10.3f} {s['max']:10.3f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"runs": runs, "quick": args.quick, "results": out,
                                     "raw": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
