"""A long soak at a steady mixed load on a real local three-node cluster, with history retention
in minutes: is anything growing that should not, and is every invariant still 0 at the end?

    scripts/soak [--duration 7200] [--retention 5m] [--rate 8] [--crons 300] [--every-second 5]
                 [--intervals 20] [--sample 60] [--warmup SECONDS] [--shards 1] [--out DIR]
                 [--json FILE]

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
descriptors (a node of several shards: its supervisor's and its shard processes' together)
and data directory size (blocks on disk), and the leader's fire and lease lag over
the last minute (``GET /api/v1/scheduling-lag``).  At the end every node is read and
tests/cluster/checker.py counts each invariant, retention-aware (a one-off job may be gone only
if a worker last ran it more than the retention before the read).  The summary gives the slope of memory and disk (least squares, after the
warm-up: retention + 10 minutes by default) and, per quarter of the steady part, the median
and the maximum of the per-minute lag percentiles.  During the run, every sample also looks up
20 jobs acknowledged 30-150 s before (and a minute inside the retention) on every node (each must be there); the first 10
dead-lettered runs stay in the queue throughout (they must be kept, retention or not).  At
the end the recurring jobs are cancelled, the rest of the queue dropped, and the read waits
until retention has forgotten what it will (a consistent read needs a still commit index).
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
    p.add_argument(
        "--shards", type=int, default=1, help="[cluster] shards of the cluster (default 1)"
    )
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


DLQ_KEPT = 10  # dead-lettered runs left in the queue from first to last
SPOT_CHECKS = 20  # jobs looked up on every node per sample


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

    async def spot_check(self, checked: list[str], missing: list[str], retention_s: float) -> None:
        """Jobs acknowledged 30 s to 150 s ago (and at least a minute inside the retention)
        must be on every node, each node asked on its own (its local state)."""
        now, upper = self.history.now(), min(150.0, retention_s - 60)
        ops = [
            o for o in self.history.ops if o.ok and o.completed and 30 < now - o.completed < upper
        ]
        for op in self.rng.sample(ops, min(SPOT_CHECKS, len(ops))):
            for n in self.cluster.nodes:
                try:
                    async with self.http.get(
                        f"{n.url}/api/v1/jobs/{op.job_id}",
                        headers=self.cluster.headers(),
                        timeout=aiohttp.ClientTimeout(total=5),
                    ) as r:
                        if r.status == 404:
                            missing.append(f"{op.job_id} (op {op.op}) missing on {n.node_id}")
                        elif r.status == 200:
                            checked.append(op.job_id or "")
                except (aiohttp.ClientError, TimeoutError):
                    pass  # not answering is not losing

    async def quiet(self, timeout: float) -> bool:
        """Wait until the leader's commit index stands still for 3 purge periods (every
        finished run and job forgotten that the retention lets go)."""
        deadline = time.monotonic() + timeout
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            lead = await self.leader()
            view = await self.cluster.view(self.http, lead) if lead is not None else None
            index = int(view["commit_index"]) if view else -1
            if index != last:
                last, since = index, time.monotonic()
            elif time.monotonic() - since >= 15:
                return True
            await asyncio.sleep(1.0)
        return False

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

    #: the first dead-lettered runs, left in the queue for the whole soak: kept, retention or not
    dlq_kept: list[str]

    async def operator(self, stop: asyncio.Event, counts: dict[str, int]) -> None:
        """Once a minute: replay three dead-lettered runs, drop the others (but the first
        DLQ_KEPT ever seen, which stay)."""
        while not await wait_event(stop, 60.0):
            page = await self.api("GET", "/dlq?limit=1000")
            ids = [r["id"] for r in (page or {}).get("runs", [])]
            for run_id in reversed(ids):  # the oldest first
                if len(self.dlq_kept) < DLQ_KEPT and run_id not in self.dlq_kept:
                    self.dlq_kept.append(run_id)
            ids = [r for r in ids if r not in self.dlq_kept]
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


def tree_status(pid: int) -> dict[str, int]:
    """:func:`proc_status` of ``pid`` and its children added up (a node of several shards:
    the supervisor and a process per shard)."""
    out = proc_status(pid)
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for child in children:
        for key, value in proc_status(int(child)).items():
            out[key] = out.get(key, 0) + value
    return out


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
            {"node": n.node_id, **tree_status(pid), "disk": tree_bytes(cluster.root / n.node_id)}
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
    """Slopes (least squares, per hour) of each node's memory, disk and descriptors after the
    warm-up, and per quarter of the steady part the median and the maximum of the per-minute
    lag percentiles.  A reading that failed is left out, not taken as 0."""
    steady = [s for s in samples if s["t"] >= warmup]
    mb = 1 / 2**20
    out: dict[str, Any] = {"samples": len(samples), "steady_samples": len(steady), "nodes": {}}

    def series(rows: list[dict[str, Any]], key: str, scale: float) -> list[tuple[float, float]]:
        return [(t, row[key] * scale) for t, row in zip(ts, rows, strict=True) if key in row]

    ts = [s["t"] for s in steady]
    for k, name in enumerate(n["node"] for n in samples[0]["nodes"]):
        rows = [s["nodes"][k] for s in steady]
        rss, disk, fds = series(rows, "VmRSS", mb), series(rows, "disk", mb), series(rows, "fds", 1)
        out["nodes"][name] = {
            "rss_mb_first": round(rss[0][1], 1) if rss else None,
            "rss_mb_last": round(rss[-1][1], 1) if rss else None,
            "rss_mb_max": round(max(v for _, v in rss), 1) if rss else None,
            "rss_slope_mb_per_h": _r(slope(rss)),
            "disk_mb_min": round(min(v for _, v in disk), 1) if disk else None,
            "disk_mb_max": round(max(v for _, v in disk), 1) if disk else None,
            "disk_slope_mb_per_h": _r(slope(disk)),
            "fds_first": fds[0][1] if fds else None,
            "fds_last": fds[-1][1] if fds else None,
            "fds_slope_per_h": _r(slope(fds)),
        }
    out["workers"] = {
        name: {
            "rss_slope_mb_per_h": _r(
                slope(series([s["workers"].get(name, {}) for s in steady], "VmRSS", mb))
            )
        }
        for name in samples[0]["workers"]
    }
    quarters: list[dict[str, Any]] = []
    n = len(steady)
    for q in range(4):
        part_samples = steady[n * q // 4 : n * (q + 1) // 4]
        part = [s["lag"] for s in part_samples if s.get("lag")]
        if not part:
            continue

        def stat(kind: str, p: str, how: Any, part: list[dict[str, Any]] = part) -> float | None:
            vals = [x[kind][p] for x in part if (x.get(kind) or {}).get(p) is not None]
            return round(how(vals), 4) if vals else None

        quarters.append(
            {
                "from_s": part_samples[0]["t"],
                "to_s": part_samples[-1]["t"],
                "minutes": len(part),
                "fire_p50_median": stat("fire", "p50", statistics.median),
                "fire_p99_median": stat("fire", "p99", statistics.median),
                "fire_p99_max": stat("fire", "p99", max),
                "lease_p50_median": stat("lease", "p50", statistics.median),
                "lease_p99_median": stat("lease", "p99", statistics.median),
                "lease_p99_max": stat("lease", "p99", max),
                "fires_per_min_median": stat("fire", "count", statistics.median),
            }
        )
    out["lag_by_quarter"] = quarters
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


async def soak(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    cluster = Cluster(
        out / "cluster", size=3, history={"retention": args.retention}, shards=args.shards
    )
    cron_ids: list[str] = []
    interval_ids: list[str] = []
    history = checker.History()
    samples: list[dict[str, Any]] = []
    counts = {"replayed": 0, "dropped": 0}
    checked: list[str] = []
    missing: list[str] = []
    started = time.monotonic()
    run: SoakRun | None = None
    states: list[checker.NodeState] = []
    info: dict[str, Any] = {}
    log = (out / "samples.jsonl").open("a")
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            run = SoakRun(args.seed, out, cluster, history, http, random.Random(args.seed))
            run.dlq_kept = []
            await cluster.wait_leader(http, timeout=60)
            for name in ("w1", "w2"):
                run.start_worker(name)
            crons = [{"cron": f"* * * * * {i % 60}"} for i in range(args.crons)]
            crons += [{"cron": "* * * * * *"} for _ in range(args.every_second)]
            run.recurring = [{"every": "10s"} for _ in range(args.intervals)] + crons[::-1]
            recurring = [run.launch("cron") for _ in range(len(run.recurring))]  # pops the end
            await asyncio.gather(*list(run.inflight))
            run.cron_ids = [op.job_id for op in recurring if op.job_id]
            cron_ids, interval_ids = run.cron_ids[: len(crons)], run.cron_ids[len(crons) :]
            print(f"{len(run.cron_ids)} recurring jobs; load for {args.duration:.0f}s", flush=True)
            stop = asyncio.Event()
            tasks = [
                asyncio.create_task(run.soak_load(stop, args.rate)),
                asyncio.create_task(run.operator(stop, counts)),
            ]
            t0 = time.monotonic()
            try:
                while (t := time.monotonic() - t0) < args.duration:
                    run.observe()
                    await run.spot_check(checked, missing, args.retention_s)
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
            dlq = await run.api("GET", "/dlq?limit=1000")
            rest = [r["id"] for r in (dlq or {}).get("runs", []) if r["id"] not in run.dlq_kept]
            if rest:
                await run.api("POST", "/dlq/drop", {"dry_run": False, "run_ids": rest})
            await run.settle(180.0)
            # A consistent read of every node needs a commit index that stands still: wait
            # until the retention has forgotten what it will (no purge is committed then).
            history.note(f"quiet: {await run.quiet(args.retention_s + 120)}")
            states, info = await checker.collect(http, cluster.urls, cluster.headers(), 120.0)
            run.observe()
    finally:
        cluster.stop()
        log.close()
    workers = sorted(run.workers if run else {})
    records = [out / f"exec-{w}.txt" for w in workers]
    report = checker.check_recorded(
        history,
        states,
        info,
        records,
        [cluster.root / f"{w}.log" for w in workers],
        bound_s=10.0,
        cron_jobs=cron_ids,
        interval_jobs=interval_ids,
        retention_s=args.retention_s,
        executed_ms=checker.last_executions(records),
        cancelled_ms=run.cancelled_ms if run else {},
    )
    # Dead-lettered runs are kept whatever the retention: the ones left in the queue all
    # along, and their jobs, on every node.
    kept_missing = [
        f"{run_id} (dead-lettered) missing on n{s.node + 1}"
        for run_id in (run.dlq_kept if run else [])
        for s in states
        if not any(r["id"] == run_id for r in s.runs.get(run_id.rpartition("@")[0], []))
    ]
    report["soak_checks"] = {
        "spot_checked": len(checked),
        "spot_missing": missing[:50],
        "dlq_kept": run.dlq_kept if run else [],
        "dlq_kept_missing": kept_missing,
    }
    if missing or kept_missing or not (run and run.dlq_kept):
        report["ok"] = False
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
