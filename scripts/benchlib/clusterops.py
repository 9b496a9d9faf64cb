"""Talking to a bench cluster (tests/cluster/harness.py ``Cluster``): the leader, workers,
batched submits, Prometheus scrapes and process memory."""

# Small local file reads (/proc) in a benchmark driver: blocking is fine here.

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.harness import Cluster, cluster_view


async def leader_url(cluster: Cluster) -> tuple[int, str]:
    """(index, URL) of the node that reports itself leader (see :func:`find_leader`)."""
    async with aiohttp.ClientSession() as http:
        i = await find_leader(http, cluster)
    return i, cluster.urls[i]


async def find_leader(http: aiohttp.ClientSession, cluster: Cluster, timeout: float = 30.0) -> int:
    """Index of the node that reports the Raft role leader (the highest term if two do).

    Unlike ``Cluster.wait_leader`` this does not need the node's leader claim to be committed
    for the current term: a node that lost and regained leadership between two looks of its
    role watcher keeps its claim from the earlier term, and is still the leader."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        best: tuple[int, int] | None = None
        for i, node in enumerate(cluster.nodes):
            if not node.alive:
                continue
            view = await cluster_view(http, node.url, cluster.headers())
            if view and view["role"] == "leader" and (best is None or view["term"] > best[0]):
                best = (view["term"], i)
        if best is not None:
            return best[1]
        await asyncio.sleep(0.1)
    raise RuntimeError(f"no node reports itself leader within {timeout}s")


async def wait_worker(http: aiohttp.ClientSession, url: str, cluster: Cluster, name: str) -> None:
    """Until the leader lists the worker ``name`` as connected."""
    while True:
        async with http.get(url + "/api/v1/workers", headers=cluster.headers()) as r:
            if r.status == 200 and any(
                w.get("worker_id") == name for w in (await r.json())["workers"]
            ):
                return
        await asyncio.sleep(0.1)


# A batch answered 503 (no commit in time: an election) or 429, or whose connection failed, is
# sent again with the same X-Request-Id, which the server deduplicates (the first result, never
# a second set of jobs), for up to RETRY_FOR seconds.
RETRY_STATUS = (429, 503)
RETRY_FOR = 60.0


@dataclass
class Batches:
    """What :func:`post_batches` did."""

    elapsed: float = 0.0
    done: int = 0  # batches committed
    retries: int = 0  # batches sent again


async def post_batches(
    http: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    bodies: Sequence[bytes],
    clients: int,
    stop_after: float | None = None,
) -> Batches:
    """POST each body (``{"jobs": [...]}``) to ``/api/v1/jobs/batch`` with ``clients`` concurrent
    clients, each batch committed before its reply.  The replies (every created job's view) are
    read but not parsed.  With ``stop_after`` (seconds), no batch is started after that."""
    todo = iter(enumerate(bodies))
    run = uuid.uuid4().hex[:12]
    out = Batches()
    t0 = time.perf_counter()

    async def client() -> None:
        for k, body in todo:
            if stop_after is not None and time.perf_counter() - t0 > stop_after:
                return
            hdrs = {**headers, "X-Request-Id": f"bench-{run}-{k}"}
            give_up = time.monotonic() + RETRY_FOR
            wait = 0.1
            while True:
                try:
                    async with http.post(url + "/api/v1/jobs/batch", data=body, headers=hdrs) as r:
                        await r.read()
                        if r.status == 201:
                            out.done += 1
                            break
                        if r.status not in RETRY_STATUS or time.monotonic() > give_up:
                            raise RuntimeError(
                                f"batch submit: {r.status}: {(await r.text())[:500]}"
                            )
                except aiohttp.ClientConnectionError:
                    if time.monotonic() > give_up:
                        raise
                out.retries += 1
                await asyncio.sleep(wait)
                wait = min(1.0, wait * 2)

    await asyncio.gather(*(client() for _ in range(clients)))
    out.elapsed = time.perf_counter() - t0
    return out


async def scrape(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """``GET /metrics`` parsed: family name -> [(sample name, labels, value)]."""
    async with http.get(
        url + "/metrics", headers=headers, timeout=aiohttp.ClientTimeout(total=10)
    ) as r:
        if r.status != 200:
            raise RuntimeError(f"/metrics: {r.status}: {(await r.text())[:300]}")
        text = await r.text()
    out: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = [(s.name, dict(s.labels), float(s.value)) for s in fam.samples]
    return out


def gauge(metrics: dict[str, list[tuple[str, dict[str, str], float]]], name: str) -> float | None:
    samples = metrics.get(name)
    return samples[0][2] if samples else None


def buckets(
    metrics: dict[str, list[tuple[str, dict[str, str], float]]], name: str
) -> list[tuple[float, float]]:
    """A histogram's cumulative buckets ``[(le, count)]`` in ``le`` order (``+Inf`` last)."""
    out = [
        (float(labels["le"]), value)
        for sample, labels, value in metrics.get(name, [])
        if sample == name + "_bucket"
    ]
    return sorted(out)


def bucket_diff(
    after: list[tuple[float, float]], before: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """What was observed between two scrapes of the same histogram."""
    prev = dict(before)
    return [(le, count - prev.get(le, 0.0)) for le, count in after]


def histogram_quantile(cumulative: list[tuple[float, float]], q: float) -> float:
    """Prometheus' ``histogram_quantile``: the bucket holding rank ``q * total``, linearly
    interpolated between its lower and upper bound (the first bucket's lower bound is 0; a
    rank in the ``+Inf`` bucket returns the highest finite bound)."""
    if not cumulative or cumulative[-1][1] <= 0:
        return math.nan
    rank = q * cumulative[-1][1]
    lower, below = 0.0, 0.0
    for le, count in cumulative:
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


#: schedd_raft_gap_seconds kinds, and their short names in the figures
GAP_KINDS = {"tick": "tick", "leader_contact": "contact", "follower_answer": "answer"}


async def raft_gaps(http: aiohttp.ClientSession, cluster: Cluster, prefix: str) -> dict[str, float]:
    """The intervals the election timers judge by (``schedd_raft_gap_seconds``), over every
    node since it started: ``{prefix}_gap_{kind}_p50/p99/p999`` (s, from the buckets: an upper
    estimate within one bucket) and ``_max`` (the longest, exact), kinds ``tick``,
    ``contact`` (follower <- leader) and ``answer`` (leader <- follower); and
    ``{prefix}_prevote_rounds_lost``, election timers that fired while the leader lived."""
    merged: dict[str, dict[float, float]] = {kind: {} for kind in GAP_KINDS}
    longest: dict[str, float] = dict.fromkeys(GAP_KINDS, 0.0)
    rounds = 0.0
    for url in cluster.urls:
        metrics = await scrape(http, url, cluster.headers())
        rounds += sum(
            value
            for sample, labels, value in metrics.get("schedd_raft_prevote_rounds", [])
            if sample.endswith("_total") and labels.get("outcome") == "lost"
        )
        for sample, labels, value in metrics.get("schedd_raft_gap_seconds", []):
            if sample == "schedd_raft_gap_seconds_bucket":
                le = float(labels["le"])
                merged[labels["kind"]][le] = merged[labels["kind"]].get(le, 0.0) + value
        for _, labels, value in metrics.get("schedd_raft_gap_max_seconds", []):
            longest[labels["kind"]] = max(longest[labels["kind"]], value)
    # an election timer that fired while the leader lived (its pre-vote refused)
    out: dict[str, float] = {f"{prefix}_prevote_rounds_lost": rounds}
    for kind, short in GAP_KINDS.items():
        cumulative = sorted(merged[kind].items())
        for name, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999)):
            estimate = histogram_quantile(cumulative, q)  # never above the longest seen
            out[f"{prefix}_gap_{short}_{name}"] = min(estimate, longest[kind])
        out[f"{prefix}_gap_{short}_max"] = longest[kind]
    return out


def start_lag_worker(
    cluster: Cluster, name: str, record: Path, concurrency: int
) -> subprocess.Popen[bytes]:
    """A ``schedd-worker`` running ``scripts.benchlib.tasks`` that appends each handler start
    (``bench.lag``) to ``record``."""
    return cluster.start_worker(
        "--import",
        "scripts.benchlib.tasks",
        "--concurrency",
        str(concurrency),
        name=name,
        env={"SCHEDD_BENCH_LAG": str(record)},
    )


def stop_cluster(cluster: Cluster) -> int:
    """``cluster.stop()``, then SIGKILL (by PID) any process still running with a node's exact
    ``--config`` path (found in /proc), so that nothing of a scenario outlives it and skews the
    next; how many.  (Nodes no longer fork snapshot writers, which used to outlive them.)"""
    cluster.stop()
    configs = {str(n.config) for n in cluster.nodes}
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.decode(errors="replace") in configs for a in args):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    if killed:
        print(
            f"    reaped {killed} leftover process(es) of {cluster.root}",
            file=sys.stderr,
            flush=True,
        )
    return killed


def rss_bytes(pid: int) -> int:
    """``VmRSS`` of a process from ``/proc/<pid>/status``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def write_bytes(pid: int) -> int:
    """``write_bytes`` of ``/proc/<pid>/io``: what the process (all its threads) had sent to the
    storage layer, every file, since it started (reading another user's needs root)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError(f"no write_bytes for pid {pid}")


def mem_available() -> int:
    """The machine's ``MemAvailable`` in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


class CpuMeter:
    """CPU time per operation of each node over a window: ``utime + stime`` of every node
    process (all threads) from ``/proc/<pid>/stat`` at :meth:`start` and :meth:`stop`, so a
    figure does not depend on how busy the machine was, only on what the node did."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._pids: list[int] = []
        self._t0: list[float] = []

    def start(self) -> None:
        self._pids = [n.proc.pid for n in self.cluster.nodes if n.proc is not None and n.alive]
        self._t0 = [cpu_seconds(pid) for pid in self._pids]

    def stop(self, key: str, ops: int, leader: int) -> dict[str, float]:
        """``{key}_leader_us`` and ``{key}_follower_us`` (the followers' median): µs of CPU
        per operation; ``leader``: the leader's index among the cluster's nodes."""
        used = [cpu_seconds(pid) - t0 for pid, t0 in zip(self._pids, self._t0, strict=True)]
        proc = self.cluster.nodes[leader].proc
        lead = proc.pid if proc is not None else -1
        per_op = {pid: 1e6 * u / max(1, ops) for pid, u in zip(self._pids, used, strict=True)}
        followers = sorted(v for pid, v in per_op.items() if pid != lead)
        out = {f"{key}_leader_us": per_op.get(lead, float("nan"))}
        if followers:
            out[f"{key}_follower_us"] = followers[len(followers) // 2]
        return out


def cpu_seconds(pid: int) -> float:
    """``utime + stime`` of a process (all its threads) from ``/proc/<pid>/stat``, seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # from field 3 (state) on
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
