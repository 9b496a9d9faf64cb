"""A long soak at a steady mixed load on a real local three-node cluster, with history retention
in minutes: is anything growing that should not, and is every invariant still 0 at the end?

    scripts/soak [--duration 7200] [--retention 5m] [--rate 8] [--crons 300] [--every-second 5]
                 [--intervals 20] [--sample 60] [--warmup SECONDS] [--out DIR] [--json FILE]

The load, all of it through the public API with real ``schedd-worker`` processes running
``tests.acceptance.tasks`` (every execution recorded with its fence):

* one-off jobs, ``--rate`` per second, open loop, each retried with one ``X-Request-Id`` until
  acknowledged: 70 % run now (20-300 ms of work), 10 % after a 5-90 s delay, 15 % fail their
  first one or two attempts and are retried with exponential backoff and jitter, 5 % fail
  every attempt and are dead-lettered;
* ``--crons`` cron jobs ``* * * * * S`` (six fields, seconds last: once a minute, spread over
  the minute), ``--every-second`` jobs ``* * * * * *`` and ``--intervals`` jobs ``every 10s``;
* an operator who, once a minute, replays three runs of the dead-letter queue and drops the
  others (runs in the queue are kept until then: retention does not forget them).

Every ``--sample`` seconds: each node's and each worker's resident memory (``VmRSS``), open
descriptors and data directory size (blocks on disk), and the leader's fire and lease lag over
the last minute (``GET /api/v1/scheduling-lag``).  At the end: the recurring jobs are
cancelled, the cluster settles, every node is read and tests/cluster/checker.py counts each
invariant, retention-aware (a job may be forgotten only after the retention, and only if a
worker ran it).  The summary gives the slope of memory and disk (least squares, after the
warm-up: retention + 10 minutes by default) and the lag percentiles per quarter of the run.
Exit status 1 if an invariant is violated.  SIGTERM/SIGINT stop the run and every process it
started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from schedd.aio import wait_event
from schedd.core.durations import parse_duration
from schedd.errors import InvalidArgument
from tests.cluster import checker
from tests.cluster.faults import Run
from tests.cluster.harness import Cluster, run_stoppable


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--duration", type=float, default=7200.0, help="seconds of load (default 7200)")
    p.add_argument("--retention", default="5m", help="[history] retention (default 5m)")
    p.add_argument("--rate", type=float, default=8.0, help="one-off jobs per second (default 8)")
    p.add_argument("--crons", type=int, default=300, help="once-a-minute cron jobs (default 300)")
    p.add_argument("--every-second", type=int, default=5, help="'* * * * * *' jobs (default 5)")
    p.add_argument("--intervals", type=int, default=20, help="'every 10s' jobs (default 20)")
    p.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    p.add_argument(
        "--warmup", type=float, default=None, help="seconds left out of the slopes (retention+10m)"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=None, help="directory for the cluster and the results")
    p.add_argument("--json", default=None, help="write the report here (default OUT/soak.json)")
    args = p.parse_args(argv)
    try:
        args.retention_s = parse_duration(args.retention, "--retention") / 1000
    except InvalidArgument as e:
        p.error(f"--retention: {e}")
    if args.warmup is None:
        args.warmup = args.retention_s + 600
    return args


class SoakRun(Run):
    """The fault schedules' client (one X-Request-Id per job, retried on every node until
    acknowledged), with the soak's mix of jobs."""

    def body(self, kind: str, n: int) -> dict[str, Any]:
        rng = self.rng
        payload: dict[str, Any] = {"tag": f"soak-{n}", "sleep": round(rng.uniform(0.02, 0.3), 3)}
        body: dict[str, Any] = {"task": "acc.record", "payload": payload}
        if kind == "delayed":
            body["schedule"] = {"in": f"{rng.randint(5, 90)}s"}
        elif kind == "flaky":
            payload["fail_below"] = rng.choice((2, 3))
            body["retry"] = {"max_attempts": 5, "initial": "0.5s", "max": "5s", "jitter": True}
        elif kind == "doomed":
            payload["fail_below"] = 1000
            body["retry"] = {"max_attempts": 3, "initial": "0.2s", "max": "1s"}
        elif kind == "cron":
            payload["sleep"] = 0.05
            body["schedule"] = self.recurring.pop()
        else:
            body["retry"] = {"max_attempts": 10, "initial": "0.2s", "max": "2s"}
        return body

    recurring: list[dict[str, Any]]

    async def soak_load(self, stop: asyncio.Event, rate: float) -> None:
        h = self.history
        nxt = h.now()
        kinds = ("oneoff", "delayed", "flaky", "doomed")
        weights = (70, 10, 15, 5)
        while not stop.is_set():
            if len(self.inflight) < 400:
                self.launch(self.rng.choices(kinds, weights)[0])
            nxt += 1.0 / rate
            await wait_event(stop, max(0.0, nxt - h.now()))

    async def api(self, method: str, path: str, body: Any = None) -> Any:
        """One API call on whichever node answers it (None if none did)."""
        for url in self.cluster.urls:
            try:
                async with self.http.request(
                    method,
                    url + "/api/v1" + path,
                    data=None if body is None else orjson.dumps(body),
                    headers={**self.cluster.headers(), "Content-Type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as r:
                    if r.status < 300:
                        return orjson.loads(await r.read() or b"null")
            except (aiohttp.ClientError, TimeoutError):
                continue
        return None

    async def operator(self, stop: asyncio.Event, counts: dict[str, int]) -> None:
        """Once a minute: replay three dead-lettered runs, drop the others."""
        while not await wait_event(stop, 60.0):
            page = await self.api("GET", "/dlq?limit=1000")
            ids = [r["id"] for r in (page or {}).get("runs", [])]
            if not ids:
                continue
            replay, drop = ids[:3], ids[3:]
            if await self.api("POST", "/dlq/replay", {"dry_run": False, "run_ids": replay}):
                counts["replayed"] += len(replay)
            if drop and await self.api("POST", "/dlq/drop", {"dry_run": False, "run_ids": drop}):
                counts["dropped"] += len(drop)


def tree_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def proc_status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return out


async def sample(run: SoakRun, t: float) -> dict[str, Any]:
    cluster = run.cluster
    nodes = []
    for n in cluster.nodes:
        pid = n.proc.pid if n.proc else 0
        nodes.append(
            {"node": n.node_id, **proc_status(pid), "disk": tree_bytes(cluster.root / n.node_id)}
        )
    workers = {name: proc_status(p.pid) for name, p in run.workers.items()}
    lag = await run.api("GET", "/scheduling-lag?minutes=1")
    acked = sum(1 for op in run.history.ops if op.ok)
    return {"t": round(t, 1), "nodes": nodes, "workers": workers, "lag": lag, "acked": acked}


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope (units per hour) of (seconds, value) points."""
    if len(points) < 3:
        return None
    xs = [x / 3600 for x, _ in points]
    ys = [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else None


def summarize(samples: list[dict[str, Any]], warmup: float) -> dict[str, Any]:
    steady = [s for s in samples if s["t"] >= warmup]
    mb = 1 / 2**20
    out: dict[str, Any] = {"samples": len(samples), "steady_samples": len(steady), "nodes": {}}
    for k, name in enumerate(n["node"] for n in samples[0]["nodes"]):

        def series(key: str, k: int = k) -> list[tuple[float, float]]:
            return [(s["t"], s["nodes"][k].get(key, 0) * mb) for s in steady if s["nodes"][k]]

        rss, disk = series("VmRSS"), series("disk")
        fds = [(s["t"], float(s["nodes"][k].get("fds", 0))) for s in steady]
        out["nodes"][name] = {
            "rss_mb_first": round(rss[0][1], 1) if rss else None,
            "rss_mb_last": round(rss[-1][1], 1) if rss else None,
            "rss_mb_max": round(max(v for _, v in rss), 1) if rss else None,
            "rss_slope_mb_per_h": _r(slope(rss)),
            "disk_mb_min": round(min(v for _, v in disk), 1) if disk else None,
            "disk_mb_max": round(max(v for _, v in disk), 1) if disk else None,
            "disk_slope_mb_per_h": _r(slope(disk)),
            "fds_slope_per_h": _r(slope(fds)),
        }
    out["workers"] = {
        name: {
            "rss_slope_mb_per_h": _r(
                slope([(s["t"], s["workers"][name].get("VmRSS", 0) * mb) for s in steady])
            )
        }
        for name in samples[0]["workers"]
    }
    quarters: list[dict[str, Any]] = []
    q = max(1, len(steady) // 4)
    for i in range(0, len(steady), q):
        part = [s["lag"] for s in steady[i : i + q] if s.get("lag")]
        if not part:
            continue

        def med(kind: str, p: str, part: list[dict[str, Any]] = part) -> float | None:
            vals = [x[kind][p] for x in part if x[kind].get(p) is not None]
            return round(statistics.median(vals), 4) if vals else None

        quarters.append(
            {
                "from_s": steady[i]["t"],
                "fire_p50": med("fire", "p50"),
                "fire_p99": med("fire", "p99"),
                "lease_p50": med("lease", "p50"),
                "lease_p99": med("lease", "p99"),
                "lease_p99_max": max((x["lease"].get("p99") or 0) for x in part),
                "fires_per_min": med("fire", "count"),
            }
        )
    out["lag_by_quarter"] = quarters
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


async def soak(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    cluster = Cluster(out / "cluster", size=3, history={"retention": args.retention})
    history = checker.History()
    samples: list[dict[str, Any]] = []
    counts = {"replayed": 0, "dropped": 0}
    started = time.monotonic()
    run: SoakRun | None = None
    states: list[checker.NodeState] = []
    info: dict[str, Any] = {}
    log = (out / "samples.jsonl").open("a")
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            run = SoakRun(args.seed, out, cluster, history, http, random.Random(args.seed))
            await cluster.wait_leader(http, timeout=60)
            for name in ("w1", "w2"):
                run.start_worker(name)
            run.recurring = (
                [{"cron": f"* * * * * {i % 60}"} for i in range(args.crons)]
                + [{"cron": "* * * * * *"} for _ in range(args.every_second)]
                + [{"every": "10s"} for _ in range(args.intervals)]
            )
            recurring = [run.launch("cron") for _ in range(len(run.recurring))]
            await asyncio.gather(*list(run.inflight))
            run.cron_ids = [op.job_id for op in recurring if op.job_id]
            print(f"{len(run.cron_ids)} recurring jobs; load for {args.duration:.0f}s", flush=True)
            stop = asyncio.Event()
            tasks = [
                asyncio.create_task(run.soak_load(stop, args.rate)),
                asyncio.create_task(run.operator(stop, counts)),
            ]
            t0 = time.monotonic()
            try:
                while (t := time.monotonic() - t0) < args.duration:
                    s = await sample(run, t)
                    samples.append(s)
                    log.write(json.dumps(s) + "\n")
                    log.flush()
                    lag = s["lag"] or {}
                    print(
                        f"t={t:6.0f}s acked={s['acked']} "
                        + " ".join(
                            f"{n['node']}:{n.get('VmRSS', 0) >> 20}MB/{n['disk'] >> 20}MB"
                            for n in s["nodes"]
                        )
                        + f" fire p99 {(lag.get('fire') or {}).get('p99')}"
                        f" lease p99 {(lag.get('lease') or {}).get('p99')}",
                        flush=True,
                    )
                    await asyncio.sleep(max(0.0, args.sample - (time.monotonic() - t0 - t)))
            finally:
                stop.set()
                await asyncio.gather(*tasks)
            await asyncio.gather(*list(run.inflight))
            await run.cancel_crons()
            await run.api("POST", "/dlq/drop", {"dry_run": False})
            await run.settle(180.0)
            states, info = await checker.collect(http, cluster.urls, cluster.headers(), 120.0)
    finally:
        cluster.stop()
        log.close()
    workers = sorted(run.workers if run else {})
    executions, malformed = checker.read_executions([out / f"exec-{w}.txt" for w in workers])
    refusals = checker.read_refusals([cluster.root / f"{w}.log" for w in workers])
    report = checker.check(
        history,
        states,
        info,
        executions,
        malformed,
        refusals,
        bound_s=10.0,
        cron_jobs=run.cron_ids if run else [],
        retention_s=args.retention_s,
    )
    report["soak"] = summarize(samples, args.warmup) if samples else {}
    report["soak"]["dlq"] = counts
    report["soak"]["config"] = {
        k: getattr(args, k)
        for k in ("duration", "retention", "rate", "crons", "every_second", "intervals", "warmup")
    }
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="schedd-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"soak in {out}", flush=True)

    report = run_stoppable(soak(args, out))
    path = Path(args.json or out / "soak.json")
    path.write_text(json.dumps(report, indent=1, default=str))
    inv = report["invariants"]
    print(json.dumps(report["soak"], indent=1))
    print(
        f"{report['ops']['acknowledged']}/{report['ops']['submitted']} acknowledged, "
        f"{report['runs'].get('runs', 0)} runs kept, {report['executions']} executions, "
        f"forgotten jobs {report['runs'].get('forgotten_jobs', 0)}, invariants {inv}; "
        f"{report['elapsed_s']}s; report {path}"
    )
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
