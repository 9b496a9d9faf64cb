"""S6: a node that runs recurring jobs for a long time stays the same size.

The same workload twice, each on a fresh three-node cluster: ``jobs`` jobs ``every: 1s`` and
``oneoff`` one-off jobs a second (submitted once a second, to run at once), one worker that runs
them all (``bench.lag``, recording each start), for ``seconds``.  Once with a history of one
minute (``[history] retention = "1m"``: finished runs and jobs are forgotten as the scheduler
goes) and once keeping everything (the peer: what a node did before retention, a retention
longer than the run and no cap worth the name).  Every ``SAMPLE_EVERY`` seconds the
leader's VmRSS and the size of its state database (``schedd_state_db_bytes`` +
``schedd_state_wal_bytes``) are sampled; the growth rate of each is the least-squares slope
(``statistics.linear_regression``) over the samples after the first ``warmup``
seconds (the retention has then started forgetting).  The figures: runs executed per second,
both slopes in each configuration, and the ratios kept/forgot of the database slope.
"""

# Small local file reads and stats (worker records, /proc) in a benchmark driver.
# ruff: noqa: ASYNC240

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.cluster.harness import Cluster

from .clusterops import (
    gauge,
    leader_url,
    post_batches,
    rss_bytes,
    scrape,
    stop_cluster,
    wait_worker,
)
from .common import stop_pid

SAMPLE_EVERY = 5.0
RETENTION = {"retention": "1m"}
KEEP_ALL = {"retention": "7d", "max_runs_per_job": 1_000_000}


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(t, y)``, y per second (NaN with fewer than two points)."""
    if len(points) < 2:
        return float("nan")
    return statistics.linear_regression(*zip(*points, strict=True)).slope


async def _db_bytes(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> float:
    metrics = await scrape(http, url, headers)
    return sum(
        gauge(metrics, name) or 0.0 for name in ("schedd_state_db_bytes", "schedd_state_wal_bytes")
    )


async def _one(
    root: Path,
    history: dict[str, Any],
    jobs: int,
    oneoff: int,
    seconds: float,
    warmup: float,
    samples: dict[str, Any],
) -> dict[str, float]:
    cluster = Cluster(root, history=history)
    cluster.start()
    worker = None
    try:
        i, url = await leader_url(cluster)
        headers = cluster.headers()
        record = root / "w.lag"
        name = f"bench-s6-{time.monotonic_ns()}"
        worker = cluster.start_worker(
            "--import",
            "scripts.benchlib.tasks",
            "--concurrency",
            str(max(8, jobs + oneoff)),
            name=name,
            env={"SCHEDD_BENCH_LAG": str(record)},
        )
        async with aiohttp.ClientSession() as http:
            await wait_worker(http, url, cluster, name)
            body = orjson.dumps(
                {
                    "jobs": [
                        {"task": "bench.lag", "payload": k, "schedule": {"every": "1s"}}
                        for k in range(jobs)
                    ]
                }
            )
            await post_batches(http, url, headers, [body], 1)
            pid = cluster.nodes[i].proc.pid  # type: ignore[union-attr]
            t0 = time.monotonic()
            rss: list[tuple[float, float]] = []
            db: list[tuple[float, float]] = []
            once = orjson.dumps(
                {"jobs": [{"task": "bench.lag", "payload": k} for k in range(oneoff)]}
            )
            next_sample = 0.0
            while (now := time.monotonic() - t0) < seconds:
                if oneoff:
                    await post_batches(http, url, headers, [once], 1)
                if now >= next_sample:
                    next_sample = now + SAMPLE_EVERY
                    if now >= warmup:
                        rss.append((now, float(rss_bytes(pid))))
                        db.append((now, await _db_bytes(http, url, headers)))
                await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - t0 - now)))
        samples.update(rss=rss, db=db)
        ran = record.read_bytes().count(b"\n") if record.exists() else 0
        return {
            "runs_per_s": ran / (time.monotonic() - t0),
            "runs": float(ran),
            "rss_kib_per_min": slope(rss) * 60 / 1024,
            "db_kib_per_min": slope(db) * 60 / 1024,
            "rss_mib_end": rss[-1][1] / 2**20 if rss else float("nan"),
            "db_mib_end": db[-1][1] / 2**20 if db else float("nan"),
        }
    finally:
        if worker is not None:
            stop_pid(worker, grace=20)
        stop_cluster(cluster)


async def s6(
    root: Path, jobs: int, oneoff: int, seconds: float, warmup: float, detail: Path | None = None
) -> dict[str, float]:
    """See the module docstring.  ``detail``: the samples ``(s, bytes)``, as JSON."""
    samples: dict[str, dict[str, Any]] = {"forgetting": {}, "keeping": {}}
    forgot = await _one(
        root / "retention", RETENTION, jobs, oneoff, seconds, warmup, samples["forgetting"]
    )
    kept = await _one(
        root / "keep-all", KEEP_ALL, jobs, oneoff, seconds, warmup, samples["keeping"]
    )
    if detail is not None:
        detail.write_text(json.dumps(samples))
    out = {f"s6_{k}": v for k, v in forgot.items()}
    out.update({f"s6_keep_{k}": v for k, v in kept.items()})
    out["s6_db_growth_vs_keep_all"] = (
        forgot["db_kib_per_min"] / kept["db_kib_per_min"]
        if kept["db_kib_per_min"] > 0
        else float("nan")
    )
    return out
