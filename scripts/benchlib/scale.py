"""The scale scenarios: S1b (batch submit), S3b (100,000 one-off jobs due within one
second) and S4 (1,000,000 pending jobs: memory, Raft stalls while snapshotting, follower
catch-up).  S3b and S4 each start their own three-node cluster; S1b uses the caller's."""

# Small local file reads (worker records, /proc, stat of snapshot files): blocking is fine here.
# ruff: noqa: ASYNC240

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import aiohttp
import orjson

from tests.cluster.harness import BIN, Cluster
from tests.cluster.members import new_node, raft_addr

from .clusterops import (
    CpuMeter,
    bucket_diff,
    buckets,
    cluster_view,
    find_leader,
    gauge,
    histogram_quantile,
    leader_url,
    mem_available,
    post_batches,
    raft_gaps,
    rss_bytes,
    scrape,
    start_lag_worker,
    stop_cluster,
    wait_worker,
    write_bytes,
)
from .common import pct, stop_pid

T = TypeVar("T")

NOOP = {"task": "bench.noop", "schedule": {"in": "1h"}}
S1B_CLIENTS = 4
# S1b's main figure: 1,000 jobs per batch was faster than 5,000 on the 2-core machine, and
# 5,000-job entries cost leader elections (each node applies one on its Raft tick thread for
# ~0.2-0.4 s, near raft_min_timeout = 0.4 s).  S3b and S4 submit in the same batches.
S1B_MAIN_BATCH = 1000


def _batch_body(jobs: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"jobs": jobs})


# -- S1b ------------------------------------------------------------------------------------------


async def s1b(
    cluster: Cluster, batch: int, total: int, clients: int = S1B_CLIENTS
) -> dict[str, float]:
    """``clients`` concurrent clients POST batches of ``batch`` one-hour-delayed no-op jobs to
    ``/api/v1/jobs/batch`` (each batch committed on a majority before its reply) until ``total``
    jobs are in: jobs/s, how many leader elections happened meanwhile (term changes), and each
    node's CPU per job."""
    leader, url = await leader_url(cluster)
    count = max(clients, total // batch)
    body = _batch_body([NOOP] * batch)
    key = "s1b" if batch == S1B_MAIN_BATCH else f"s1b_{batch}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients + 1)) as http:
        term0 = await _term(http, url, cluster.headers())
        cpu = CpuMeter(cluster)
        cpu.start()
        sent = await post_batches(http, url, cluster.headers(), [body] * count, clients)
        used = cpu.stop(key, count * batch, leader)
        url = await current_leader(http, cluster)
        term1 = await _term(http, url, cluster.headers())
        gaps = await raft_gaps(http, cluster, key)  # since the cluster started (S1 to S1b)
    return {
        key: count * batch / sent.elapsed,
        f"{key}_elections": term1 - term0,
        f"{key}_retries": float(sent.retries),
        **used,
        **gaps,
    }


async def _term(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> float:
    """The Raft term ``url`` reports (any node: all agree once an election is over)."""
    view = await cluster_view(http, url, headers, timeout=10)
    if view is None:
        raise RuntimeError(f"{url} does not answer /api/v1/cluster")
    return float(view["term"])


async def current_leader(http: aiohttp.ClientSession, cluster: Cluster) -> str:
    """The URL of the node that now reports itself leader."""
    return cluster.urls[await find_leader(http, cluster)]


async def settle(cluster: Cluster, timeout: float = 30.0) -> None:
    """Until every node's applied index reaches the leader's commit index (after S5 restarted a
    node, so the next scenario does not share the machine with its catch-up)."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            i = await find_leader(http, cluster)
            lead = await cluster_view(http, cluster.urls[i], cluster.headers())
            views = [await cluster_view(http, u, cluster.headers()) for u in cluster.urls]
            if lead and all(v and v["applied_index"] >= lead["commit_index"] for v in views):
                return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"nodes not caught up with the leader within {timeout}s")


# -- S3b ------------------------------------------------------------------------------------------

S3B_WORKERS = 2
S3B_BATCH = S1B_MAIN_BATCH
S3B_CLIENTS = 4
DISPATCH_AHEAD = 1.0  # scheduler.dispatch_ahead's default: fires start this long before due


def _read_lags(paths: list[Path]) -> tuple[list[float], int]:
    """(start lag of each job's first start, number of repeated starts) from the ``bench.lag``
    records (``<start epoch> <scheduled_at> <job id>``) in ``paths``."""
    first: dict[str, tuple[float, float]] = {}
    starts = 0
    for path in paths:
        if not path.exists():
            continue
        for line in _lines(path):
            started, sched, job = line.split(" ")
            starts += 1
            t = float(started)
            if job not in first or t < first[job][0]:
                first[job] = (t, datetime.fromisoformat(sched).timestamp())
    return [t - sched for t, sched in first.values()], starts - len(first)


def _lines(path: Path) -> list[str]:
    """Complete lines only: the worker may be writing the last one."""
    return path.read_text().split("\n")[:-1]


def _last_start(paths: list[Path]) -> float:
    return max(
        (float(line.split(" ", 1)[0]) for p in paths if p.exists() for line in _lines(p)),
        default=math.nan,
    )


async def _fire_histograms(
    http: aiohttp.ClientSession, cluster: Cluster
) -> list[list[tuple[float, float]]]:
    """Every node's ``schedd_fire_lag_seconds`` buckets (a node observes the fires it commits
    while leading: after an election the fires are split between nodes)."""
    return [
        buckets(await scrape(http, url, cluster.headers()), "schedd_fire_lag_seconds")
        for url in cluster.urls
    ]


async def s3b(
    root: Path,
    n: int,
    submit_rate: float,
    bound: float,
    concurrency: int,
    s2_rate: float | None = None,
) -> dict[str, float]:
    """``n`` one-off ``bench.lag`` jobs due at instants spread evenly over one second ``[D, D+1)``,
    all submitted (batches of 1,000, 4 clients) before ``D - dispatch_ahead``; two worker
    processes with ``concurrency`` each.  ``D`` is chosen from ``submit_rate`` (an estimate of
    batch-submit jobs/s): 1.5 times the expected submit time plus margins.

    * fire lag p50/p99: the leader's ``schedd_fire_lag_seconds`` histogram (due -> fire
      committed; fires committed ahead of due count as 0), scraped before and after and
      differenced, quantiles interpolated linearly within buckets;
    * start lag p50/p99/max: handler start on the worker's clock - scheduled time;
    * early: starts before the scheduled time (must be 0); missing: not started within
      ``bound`` seconds after ``D + 1``;
    * drain: started jobs / (last start - D).
    """
    cluster = Cluster(root)
    cluster.start()
    workers = []
    try:
        _i, url = await leader_url(cluster)
        headers = cluster.headers()
        records = [root / f"w{k}.lag" for k in range(S3B_WORKERS)]
        names = [f"bench-s3b-{k}-{time.monotonic_ns()}" for k in range(S3B_WORKERS)]
        for name, record in zip(names, records, strict=True):
            workers.append(start_lag_worker(cluster, name, record, concurrency))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=8)) as http:
            for name in names:
                await wait_worker(http, url, cluster, name)
            term0 = await _term(http, url, headers)
            expected = n / max(submit_rate, 200.0)
            lead = 1.5 * expected + DISPATCH_AHEAD + 3.0
            due = math.ceil(time.time() + lead)
            bodies = []
            for start in range(0, n, S3B_BATCH):
                jobs = []
                for k in range(start, min(n, start + S3B_BATCH)):
                    at = datetime.fromtimestamp(due + (k * 1000 // n) / 1000, UTC)
                    jobs.append(
                        {
                            "task": "bench.lag",
                            "payload": k,
                            "schedule": {
                                "at": at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
                            },
                        }
                    )
                bodies.append(_batch_body(jobs))
            t_submit = time.time()
            sent = await post_batches(http, url, headers, bodies, S3B_CLIENTS)
            submitted = time.time()
            margin = due - submitted
            # the fires start at due - dispatch_ahead: scrape the histograms before that
            before = await _fire_histograms(http, cluster)
            if margin <= 0:
                raise RuntimeError(
                    f"submitting {n} jobs took {submitted - t_submit:.1f}s and ended "
                    f"{-margin:.1f}s into the due second (lead was {lead:.1f}s from an "
                    f"estimated {submit_rate:.0f} jobs/s): the scenario is void"
                )
            deadline = due + 1 + bound
            while time.time() < deadline:
                await asyncio.sleep(0.5)
                if sum(p.read_bytes().count(b"\n") for p in records if p.exists()) >= n:
                    break
            lags, repeated = _read_lags(records)
            last = _last_start(records)
            await asyncio.sleep(0.3)  # the last fire's histogram observation
            after = await _fire_histograms(http, cluster)
            lead_url = cluster.urls[await find_leader(http, cluster)]
            term1 = await _term(http, lead_url, headers)
            gaps = await raft_gaps(http, cluster, "s3b")
            # where the jobs that did not start are: stuck (queued, running) or still waiting
            states = {
                labels["state"]: value
                for _, labels, value in (await scrape(http, lead_url, headers)).get(
                    "schedd_runs", []
                )
            }
        if not lags:
            raise RuntimeError("no bench.lag job started")
        # summed over the nodes: complete even when the leader changed
        fires: list[tuple[float, float]] = []
        for b, a in zip(before, after, strict=True):
            diff = bucket_diff(a, b)
            fires = (
                diff
                if not fires
                else [(le, c + d) for (le, c), (_, d) in zip(fires, diff, strict=True)]
            )
        out = {
            "s3b_fire_p50": histogram_quantile(fires, 0.5) * 1000,
            "s3b_fire_p99": histogram_quantile(fires, 0.99) * 1000,
            "s3b_fires": fires[-1][1] if fires else 0.0,
            "s3b_p50": pct(lags, 0.5) * 1000,
            "s3b_p99": pct(lags, 0.99) * 1000,
            "s3b_max": max(lags) * 1000,
            "s3b_early": float(sum(1 for x in lags if x < 0)),
            "s3b_missing": float(n - len(lags)),
            "s3b_repeated": float(repeated),
            "s3b_drain": len(lags) / max(1e-3, last - due),
            "s3b_submit_margin": margin,
            "s3b_submit_rate": n / (submitted - t_submit),
            "s3b_elections": term1 - term0,
            "s3b_retries": float(sent.retries),
            **gaps,
        }
        if len(lags) < n:
            out.update({f"s3b_left_{k}": v for k, v in states.items() if v and k != "succeeded"})
        if s2_rate:
            out["s3b_drain_vs_s2"] = out["s3b_drain"] / s2_rate
        return out
    finally:
        for w in workers:
            stop_pid(w, grace=20)
        stop_cluster(cluster)


# -- S4 -------------------------------------------------------------------------------------------

S4_BATCH = S1B_MAIN_BATCH
S4_CLIENTS = 4
PROBE_PERIOD = 0.05
MIN_AVAILABLE = 2 << 30  # abort S4 if the machine has less than this left (bytes)


@dataclass
class _Probe:
    """One job submitted every ``PROBE_PERIOD`` seconds, sequentially; (start, latency, ok)."""

    url: str
    headers: dict[str, str]
    samples: list[tuple[float, float, bool]] = field(default_factory=list)

    async def run(self, http: aiohttp.ClientSession) -> None:
        body = orjson.dumps({"task": "bench.noop", "payload": {"n": 1}, "schedule": {"in": "6h"}})
        nxt = time.monotonic()
        while True:
            t0 = time.monotonic()
            ok = False
            try:
                async with http.post(
                    self.url + "/api/v1/jobs",
                    data=body,
                    headers=self.headers,
                    timeout=aiohttp.ClientTimeout(total=30),
                ) as r:
                    await r.read()
                    ok = r.status == 201
            except (aiohttp.ClientError, TimeoutError):
                pass
            self.samples.append((t0, time.monotonic() - t0, ok))
            nxt = max(nxt + PROBE_PERIOD, time.monotonic())
            await asyncio.sleep(nxt - time.monotonic())

    def window(self, lo: float, hi: float) -> list[float]:
        return [lat for t, lat, _ in self.samples if lo <= t < hi]

    def window_samples(self, lo: float, hi: float) -> list[tuple[float, float, bool]]:
        return [x for x in self.samples if lo <= x[0] < hi]


@dataclass
class _Snapshot:
    node: int
    end: float  # monotonic: when the node's raft.dump changed (its mtime)
    duration: float = math.nan  # the node's schedd_raft_snapshot_duration_seconds; NaN unread

    @property
    def start(self) -> float:
        """When the compaction began: its end less the duration the node reported (NaN until
        that is read)."""
        return self.end - self.duration


@dataclass
class _Snapshots:
    """Watches each node's log compactions (Raft snapshots) by the one file every compaction
    replaces, ``raft/raft.dump``, whatever else it writes meanwhile: whether that file is a
    whole copy of the database or a small marker, its mtime changes when the compaction is
    done.  How long the compaction took is what the node reports next in
    ``schedd_raft_snapshot_duration_seconds``, so its interval is ``[end - duration, end]``,
    known once it is over.  Also points the probe at the new leader after an election, and
    aborts the scenario when the machine runs short of memory."""

    READ_FOR: ClassVar[float] = 15.0  # s to wait for the duration gauge after a compaction

    cluster: Cluster
    probe: _Probe
    done: list[_Snapshot] = field(default_factory=list)
    seen: dict[int, float] = field(default_factory=dict)  # node -> raft.dump mtime
    gauges: dict[int, float] = field(default_factory=dict)  # node -> last duration read
    leaderless: int = 0  # looks for the leader that found none within 30 s
    _reads: set[asyncio.Task[None]] = field(default_factory=set)

    def mtime(self, k: int) -> float:
        dump = self.cluster.root / self.cluster.nodes[k].node_id / "raft" / "raft.dump"
        try:
            return dump.stat().st_mtime
        except OSError:
            return 0.0

    async def run(self, http: aiohttp.ClientSession) -> None:
        for k in range(len(self.cluster.nodes)):
            self.seen[k] = self.mtime(k)
        checked = time.monotonic()
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            if now - checked > 1.0:
                checked = now
                view = await cluster_view(http, self.probe.url, self.cluster.headers())
                if view is None or view["role"] != "leader":
                    try:
                        self.probe.url = await current_leader(http, self.cluster)
                    except RuntimeError as exc:  # the load's retries decide; look again
                        self.leaderless += 1
                        print(f"    s4: {exc}; looking again", file=sys.stderr, flush=True)
            avail = mem_available()
            if avail < MIN_AVAILABLE:
                raise RuntimeError(f"S4 aborted: only {avail >> 20} MiB of memory left")
            for k, node in enumerate(self.cluster.nodes):
                m = self.mtime(k)
                if m == self.seen.setdefault(k, m):  # (a node added since: from now on)
                    continue
                self.seen[k] = m
                if not m or not node.alive:  # deleted (a wiped node), or not by a live node
                    continue
                snap = _Snapshot(k, now - max(0.0, time.time() - m))
                self.done.append(snap)
                task = asyncio.create_task(self._duration(http, snap))
                self._reads.add(task)
                task.add_done_callback(self._reads.discard)

    async def _duration(self, http: aiohttp.ClientSession, snap: _Snapshot) -> None:
        """The node's Raft thread notes the end of the compaction (and sets the gauge) a tick
        or so later: the first new value within ``READ_FOR`` s, else the value then (two
        compactions that took exactly as long)."""
        node = self.cluster.nodes[snap.node]
        deadline = time.monotonic() + self.READ_FOR
        value: float | None = None
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, RuntimeError):
                value = gauge(
                    await scrape(http, node.url, self.cluster.headers()),
                    "schedd_raft_snapshot_duration_seconds",
                )
                if value is not None and value != self.gauges.get(snap.node):
                    break
        if value is not None:
            self.gauges[snap.node] = snap.duration = value

    def completed_since(self, t: float) -> set[int]:
        """Nodes that made a whole compaction (begun and finished) after ``t``."""
        return {s.node for s in self.done if s.start >= t}

    def windows(self, k: int) -> list[tuple[float, float]]:
        """Node ``k``'s compactions (monotonic intervals; one whose duration is unread as its
        end alone)."""
        return [
            (s.start if s.duration == s.duration else s.end, s.end)
            for s in self.done
            if s.node == k
        ]


async def _guarded(coro: Awaitable[T], guard: asyncio.Task[None]) -> T:
    """``await coro``, but raise at once if ``guard`` (a watcher that never returns) fails."""
    task = asyncio.ensure_future(coro)
    await asyncio.wait({task, guard}, return_when=asyncio.FIRST_COMPLETED)
    if guard.done() and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        guard.result()
    return task.result()


def _ms(values: list[float], p: float) -> float:
    return pct(values, p) * 1000 if values else math.nan


async def s4(
    root: Path,
    n: int,
    compaction: float,
    load_cap: float,
    quiet_cap: float,
    catchup_timeout: float,
    detail: Path | None = None,
    wipe_timeout: float | None = None,
    add_timeout: float | None = None,
) -> dict[str, float]:
    """``n`` pending delayed no-op jobs (due in 6 h, payload ``{"n": 1}``) submitted in batches
    of 1,000 by 4 clients to a fresh cluster whose nodes snapshot every ``compaction`` seconds
    (``raft.log_compaction_min_time``; batches never reach ``log_compaction_min_entries``).  No
    batch is started after ``load_cap`` seconds (``s4_jobs`` says how many went in).

    (a) leader memory per pending job: leader VmRSS after the quiet period - before the load,
        over the jobs submitted in between (followers' max reported too);
    (b) bytes written per pending job: the same for each node process's ``write_bytes``
        (``/proc/<pid>/io``: every file, every thread), and each node's total in MiB;
    (c) probe submits, one job every 50 ms sequentially to the leader, during the load and
        during a quiet period afterwards that lasts until every node has made a whole log
        compaction (begun after the load; see :class:`_Snapshots`), at most ``quiet_cap`` s
        (the leader must at least have finished one in it): p99/max latency of each, max over
        quiet-period probes in flight while the leader was compacting, and the longest
        compaction any node reported;
    (c2) a backup saved by ``schedctl snapshot save`` from the leader, then from a follower
        (:func:`_save`), each under a probe job every 50 ms to the leader;
    (d) catch-up: a follower is SIGKILLed, 1 % of ``n`` more jobs go in, it is restarted (and
        started again, as a supervisor would, each time it exits: its old snapshot writer may
        still hold its port), and the time from the first restart until its applied index
        reaches the leader's commit index;
    (e) unless ``add_timeout`` is None, a fourth node added by ``raft.join`` (:func:`_added`):
        until it is a learner and a voter, at most ``add_timeout`` s;
    (f) unless ``wipe_timeout`` is None, a wiped follower (:func:`_wiped`), at most
        ``wipe_timeout`` s.

    ``detail``: the probes and snapshot intervals (and each save's probes), as JSON, for a
    closer look; the node logs are copied beside it (``<detail's stem>-logs/``), whatever the
    outcome.
    """
    cluster = Cluster(root, raft={"log_compaction_min_time": f"{compaction}s"})
    cluster.start()
    try:
        i, url = await leader_url(cluster)
        headers = cluster.headers()
        job = {"task": "bench.noop", "payload": {"n": 1}, "schedule": {"in": "6h"}}
        body = _batch_body([job] * S4_BATCH)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as http:
            # warm-up (code paths, buffers) outside the measurement
            await post_batches(http, url, headers, [_batch_body([job] * 1000)], 1)
            await asyncio.sleep(1.0)
            pids = [node.proc.pid for node in cluster.nodes]  # type: ignore[union-attr]
            rss0 = [rss_bytes(pid) for pid in pids]
            written0 = [write_bytes(pid) for pid in pids]
            view0 = await cluster_view(http, url, headers)
            probe = _Probe(url, headers)
            snaps = _Snapshots(cluster, probe)
            guard = asyncio.create_task(snaps.run(http))
            probing = asyncio.create_task(probe.run(http))
            try:
                load_start = time.monotonic()
                sent = await _guarded(
                    post_batches(
                        http,
                        url,
                        headers,
                        [body] * max(1, n // S4_BATCH),
                        S4_CLIENTS,
                        stop_after=load_cap,
                    ),
                    guard,
                )
                load_end = time.monotonic()
                jobs = sent.done * S4_BATCH
                print(
                    f"    s4: {jobs} jobs in {sent.elapsed:.1f}s, quiet period...",
                    file=sys.stderr,
                    flush=True,
                )
                everyone = set(range(len(cluster.nodes)))

                async def quiet() -> None:
                    while (
                        snaps.completed_since(load_end) != everyone
                        and time.monotonic() - load_end < quiet_cap
                    ):
                        await asyncio.sleep(0.2)
                    await asyncio.sleep(1.0)

                await _guarded(quiet(), guard)
                quiet_end = time.monotonic()
                probing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await probing
                # the leader now (after an election during the load, the node that holds the
                # leader's structures at the end)
                url = await current_leader(http, cluster)
                i = cluster.urls.index(url)
                followers = [k for k in range(len(cluster.nodes)) if k != i]
                windows = snaps.windows(i)
                if not any(hi > load_end for _, hi in windows):
                    raise RuntimeError(
                        f"the leader did not finish a snapshot within {quiet_cap}s of "
                        f"quiet (snapshots every {compaction}s)"
                    )
                submitted = jobs + sum(1 for *_, ok in probe.samples if ok)
                rss1 = [rss_bytes(pid) for pid in pids]
                written = [write_bytes(pid) - w0 for pid, w0 in zip(pids, written0, strict=True)]
                view1 = await cluster_view(http, url, headers)
                if not view0 or not view1:
                    raise RuntimeError("the leader does not answer /api/v1/cluster")
                # quiet-period probes in flight while the leader was snapshotting (under load
                # the probes wait behind the batches, whatever the snapshots do)
                during = [
                    lat
                    for t, lat, _ in probe.samples
                    if t >= load_end and any(t < hi and t + lat > lo for lo, hi in windows)
                ]
                load = probe.window(load_start, load_end)
                calm = probe.window(load_end, quiet_end)
                durations = [x.duration for x in snaps.done if x.duration == x.duration]
                out = {
                    "s4_submit_rate": jobs / sent.elapsed,
                    "s4_jobs": float(jobs),
                    "s4_bytes_per_job": (rss1[i] - rss0[i]) / submitted,
                    "s4_follower_bytes_per_job": max(
                        (rss1[k] - rss0[k]) / submitted for k in followers
                    ),
                    "s4_leader_rss_mib": rss1[i] / 2**20,
                    "s4_write_bytes_per_job": written[i] / submitted,
                    "s4_follower_write_bytes_per_job": max(
                        written[k] / submitted for k in followers
                    ),
                    "s4_write_mib_leader": written[i] / 2**20,
                    **{
                        f"s4_write_mib_follower_{m}": written[k] / 2**20
                        for m, k in enumerate(followers, 1)
                    },
                    "s4_load_probe_p99": _ms(load, 0.99),
                    "s4_load_probe_max": _ms(load, 1.0),
                    "s4_load_probes": float(len(load)),
                    "s4_quiet_probe_p99": _ms(calm, 0.99),
                    "s4_quiet_probe_max": _ms(calm, 1.0),
                    "s4_quiet_s": quiet_end - load_end,
                    "s4_quiet_snapshots_done": float(len(snaps.completed_since(load_end))),
                    "s4_snapshot_probe_max": max(during, default=math.nan) * 1000,
                    "s4_probe_errors": float(sum(1 for *_, ok in probe.samples if not ok)),
                    "s4_snapshots": float(len(snaps.done)),
                    "s4_snapshot_max": max(durations, default=math.nan),
                    "s4_elections": float(view1["term"] - view0["term"]),
                    "s4_leaderless_30s": float(snaps.leaderless),
                    "s4_retries": float(sent.retries),
                }
                if detail is not None:
                    record: dict[str, Any] = {
                        "n": n,
                        "leader": i,
                        "load": [0.0, load_end - load_start],
                        "quiet_end": quiet_end - load_start,
                        "probes": [
                            (round(t - load_start, 3), round(lat, 4), ok)
                            for t, lat, ok in probe.samples
                        ],
                        "snapshots": [
                            (
                                x.node,
                                round(x.start - load_start, 2),
                                round(x.end - load_start, 2),
                                x.duration,
                            )
                            for x in snaps.done
                        ],
                        "written_bytes": {
                            node.node_id: written[k] for k, node in enumerate(cluster.nodes)
                        },
                    }
                    detail.write_text(json.dumps(record))
                # before a follower is killed (the leader's wait for its answers is not a gap)
                out.update(await raft_gaps(http, cluster, "s4"))
                # a backup of the whole state, from the leader (what the operations guide says
                # to save from), then from a follower, each under the probe
                for key, k in (("s4_save", i), ("s4_save_follower", followers[0])):
                    saved, probes = await _guarded(_save(cluster, http, snaps, k, key), guard)
                    out.update(saved)
                    if detail is not None:
                        record[key] = {
                            "node": cluster.nodes[k].node_id,
                            "probes": [
                                (round(t - load_start, 3), round(lat, 4), ok)
                                for t, lat, ok in probes
                            ],
                        }
                        detail.write_text(json.dumps(record))
                out.update(
                    await _guarded(
                        _catchup(
                            cluster, http, url, followers[0], max(1000, n // 100), catchup_timeout
                        ),
                        guard,
                    )
                )
                if add_timeout is not None:
                    out.update(await _guarded(_added(cluster, http, snaps, add_timeout), guard))
                if wipe_timeout is not None:
                    # the other follower: the one above has just caught up
                    out.update(
                        await _guarded(
                            _wiped(cluster, http, snaps, followers[-1], wipe_timeout), guard
                        )
                    )
                return out
            finally:
                for task in (probing, guard):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                        await task
    finally:
        stop_cluster(cluster)
        if detail is not None:  # the cluster's folder goes with the bench's temporary one
            logs = detail.with_name(detail.stem + "-logs")
            logs.mkdir(parents=True, exist_ok=True)
            for log in cluster.root.glob("*.log"):
                shutil.copyfile(log, logs / log.name)
            print(f"    s4: node logs kept in {logs}", file=sys.stderr, flush=True)


SAVE_RATE = 32 << 20  # raft.snapshot_rate's default (bytes/s): the pace an image streams at


async def _save(
    cluster: Cluster, http: aiohttp.ClientSession, snaps: _Snapshots, k: int, key: str
) -> tuple[dict[str, float], list[tuple[float, float, bool]]]:
    """``schedctl -o json snapshot save`` from node ``k`` (``GET /api/v1/snapshot`` with the
    admin token, every frame checked by an ``ImageSink`` as it arrives, the file synced and
    renamed once whole) into the cluster's folder, while a probe job every 50 ms goes to the
    leader; the file is deleted after.  Seconds and bytes as schedctl reports them (from its
    request to the synced file), MiB/s, the probe's p99/max meanwhile, the node's write-ahead
    log at its largest meanwhile (the image's read transaction holds its checkpoints back),
    what the node process wrote meanwhile, term increments; and the probes."""
    headers = cluster.headers()
    node = cluster.nodes[k]
    assert node.proc is not None
    pid = node.proc.pid
    url = await current_leader(http, cluster)
    term0 = await _term(http, url, headers)
    raft = cluster.root / node.node_id / "raft"
    dest = cluster.root / f"{key}.snap"

    def size(path: Path) -> int:
        try:
            return path.stat().st_size
        except OSError:
            return 0

    db, wal = raft / "state.db", raft / "state.db-wal"
    limit = 60.0 + 3.0 * (size(db) + size(wal)) / SAVE_RATE
    print(
        f"    s4: saving a backup from {node.node_id} "
        f"({'leader' if url == node.url else 'follower'}, state.db "
        f"{size(db) / 2**20:,.0f} MiB)...",
        file=sys.stderr,
        flush=True,
    )
    probe = _Probe(url, headers)
    snaps.probe = probe  # the watcher points it at a new leader
    wal0 = wal_max = size(wal)
    written0 = write_bytes(pid)
    env = {**os.environ, "SCHEDD_TOKEN": cluster.token, "SCHEDD_SERVER": node.url}
    probing = asyncio.create_task(probe.run(http))
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "schedctl"),
        "-o",
        "json",
        "snapshot",
        "save",
        str(dest),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    talk = asyncio.ensure_future(proc.communicate())
    try:
        while not talk.done():
            await asyncio.wait({talk}, timeout=0.5)
            wal_max = max(wal_max, size(wal))
            if time.monotonic() - t0 > limit:
                raise RuntimeError(
                    f"{key}: schedctl snapshot save still running after {limit:.0f}s"
                )
        t1 = time.monotonic()
        stdout, stderr = talk.result()
        if proc.returncode != 0:
            raise RuntimeError(
                f"{key}: schedctl snapshot save exited {proc.returncode}: "
                f"{stderr.decode(errors='replace').strip()}"
            )
        saved = orjson.loads(stdout)
    finally:
        if proc.returncode is None:
            proc.kill()
            talk.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await talk
            await proc.wait()
        probing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probing
        for path in (dest, dest.with_name(dest.name + ".part")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    window = probe.window(t0, t1)
    seconds = float(saved["seconds"])
    url = await current_leader(http, cluster)
    print(
        f"    s4: saved {saved['bytes'] / 2**20:,.0f} MiB from {node.node_id} in {seconds:.1f}s, "
        f"probe p99 {_ms(window, 0.99):,.1f} ms",
        file=sys.stderr,
        flush=True,
    )
    return {
        f"{key}_seconds": seconds,
        f"{key}_bytes": float(saved["bytes"]),
        f"{key}_mib_s": saved["bytes"] / 2**20 / seconds,
        f"{key}_probe_p99": _ms(window, 0.99),
        f"{key}_probe_max": _ms(window, 1.0),
        f"{key}_probe_errors": float(sum(1 for t, _, ok in probe.samples if t >= t0 and not ok)),
        f"{key}_wal_mib": wal_max / 2**20,
        f"{key}_wal_growth_mib": (wal_max - wal0) / 2**20,
        f"{key}_node_write_mib": (write_bytes(pid) - written0) / 2**20,
        f"{key}_elections": await _term(http, url, headers) - term0,
    }, probe.window_samples(t0, t1)


async def _catchup(
    cluster: Cluster, http: aiohttp.ClientSession, url: str, j: int, extra: int, timeout: float
) -> dict[str, float]:
    """SIGKILL follower ``j``, submit ``extra`` jobs, restart it: seconds until it answers and
    until its applied index reaches the leader's commit index (``s4_catchup``); when it does
    not within ``timeout``, ``s4_catchup_timeout`` and how far behind it still was."""
    headers = cluster.headers()
    cluster.kill(j, signal.SIGKILL)
    job = {"task": "bench.noop", "payload": {"n": 1}, "schedule": {"in": "6h"}}
    await post_batches(http, url, headers, [_batch_body([job] * 1000)] * max(1, extra // 1000), 2)
    r = await _rejoin(cluster, http, url, j, timeout)
    out = {"s4_restart_answer": r.answered, "s4_restart_failures": float(r.failed)}
    if r.caught_up == r.caught_up:
        return {**out, "s4_catchup": r.caught_up}
    return {**out, "s4_catchup_timeout": timeout, "s4_catchup_behind": r.behind}


@dataclass
class _Rejoined:
    """How a restarted node came back (seconds from its first start)."""

    caught_up: float = math.nan  # its applied index reached the leader's commit index; NaN: not
    answered: float = math.nan  # it first answered /api/v1/cluster
    behind: float = math.nan  # entries behind the leader's commit index at the last look
    failed: int = 0  # starts that exited (e.g. its port still held by its old snapshot writer)


async def _rejoin(
    cluster: Cluster, http: aiohttp.ClientSession, url: str, j: int, timeout: float
) -> _Rejoined:
    """Start node ``j`` (stopped), and again after 1 s each time it exits, as a supervisor
    would, until its applied index reaches the leader's commit index or ``timeout`` s."""
    headers = cluster.headers()
    out = _Rejoined()
    t0 = time.monotonic()
    cluster.start(j)
    while time.monotonic() < t0 + timeout:
        if not cluster.nodes[j].alive:
            out.failed += 1
            await asyncio.sleep(1.0)
            cluster.start(j)
            continue
        lead = await cluster_view(http, url, headers)
        if lead is None or lead["role"] != "leader":
            url = await current_leader(http, cluster)
            continue
        mine = await cluster_view(http, cluster.urls[j], headers)
        if mine is not None:
            if out.answered != out.answered:
                out.answered = time.monotonic() - t0
            out.behind = lead["commit_index"] - mine["applied_index"]
            if out.behind <= 0:
                out.caught_up = time.monotonic() - t0
                break
        await asyncio.sleep(0.1)
    return out


WIPE_BATCH_EVERY = 5.0  # s between the batches of 1,000 jobs that go in while a wiped node joins


async def _trickle(
    http: aiohttp.ClientSession, probe: _Probe, headers: dict[str, str], sent: list[int]
) -> None:
    """A batch of 1,000 jobs to the probe's node every ``WIPE_BATCH_EVERY`` s, for ever:
    ``sent`` counts those committed and those given up on."""
    job = {"task": "bench.noop", "payload": {"n": 1}, "schedule": {"in": "6h"}}
    body = _batch_body([job] * S4_BATCH)
    while True:
        try:
            await post_batches(http, probe.url, headers, [body], 1)
            sent[0] += 1
        except (aiohttp.ClientError, RuntimeError, TimeoutError):
            sent[1] += 1
        await asyncio.sleep(WIPE_BATCH_EVERY)


async def _added(
    cluster: Cluster, http: aiohttp.ClientSession, snaps: _Snapshots, timeout: float
) -> dict[str, float]:
    """A fourth node started empty with ``raft.join`` (the leader's API) while a probe job goes
    to the leader every 50 ms and a batch of 1,000 jobs every ``WIPE_BATCH_EVERY`` s: seconds
    until the cluster recorded it as a learner (``s4_added_learner``), and until the leader
    promoted it to a voter (``s4_added_voter``: it has loaded a whole copy and caught up), the
    probe's p50/p99/max meanwhile, term increments, what the new node wrote.  When it is not a
    voter within ``timeout``: ``s4_added_timeout``."""
    headers = cluster.headers()
    url = await current_leader(http, cluster)
    term0 = await _term(http, url, headers)
    j = new_node(cluster, f"n{len(cluster.nodes) + 1}", {"join": [url]})
    addr = raft_addr(cluster, j)
    probe = _Probe(url, headers)
    snaps.probe = probe
    sent = [0, 0]  # batches committed, batches given up on

    async def role() -> str | None:
        try:
            async with http.get(
                url + "/api/v1/cluster/nodes",
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=5),
            ) as r:
                view = await r.json()
        except (aiohttp.ClientError, TimeoutError):
            return None
        return next((n["role"] for n in view.get("nodes", []) if n["raft"] == addr), None)

    tasks = [
        asyncio.create_task(probe.run(http)),
        asyncio.create_task(_trickle(http, probe, headers, sent)),
    ]
    t0 = time.monotonic()
    learner = voter = math.nan
    print(f"    s4: adding {cluster.nodes[j].node_id} ({addr}) by raft.join...", file=sys.stderr)
    cluster.start(j)
    try:
        while time.monotonic() - t0 < timeout:
            now_role = await role()
            if now_role is not None and learner != learner:
                learner = time.monotonic() - t0
            if now_role == "voter":
                voter = time.monotonic() - t0
                break
            await asyncio.sleep(0.2)
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    window = probe.window(t0, time.monotonic())
    out: dict[str, float] = {
        "s4_added_learner": learner,
        "s4_added_probe_p50": _ms(window, 0.5),
        "s4_added_probe_p99": _ms(window, 0.99),
        "s4_added_probe_max": _ms(window, 1.0),
        "s4_added_probe_errors": float(sum(1 for t, _, ok in probe.samples if t >= t0 and not ok)),
        "s4_added_batches": float(sent[0]),
        "s4_added_elections": await _term(http, url, headers) - term0,
    }
    out["s4_added_voter" if voter == voter else "s4_added_timeout"] = (
        voter if voter == voter else timeout
    )
    proc = cluster.nodes[j].proc
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(OSError, RuntimeError):
            out["s4_added_write_mib"] = write_bytes(proc.pid) / 2**20
    return out


async def _wiped(
    cluster: Cluster,
    http: aiohttp.ClientSession,
    snaps: _Snapshots,
    j: int,
    timeout: float,
) -> dict[str, float]:
    """SIGKILL follower ``j``, delete everything the node wrote under its data directory (the
    contents of ``raft/``: database, write-ahead log, Raft journal and its state, snapshot,
    temporary files; the harness keeps the node's configuration and tokens elsewhere), and
    start it again (and again each time it exits, as a supervisor would), while a probe job
    every 50 ms goes to the leader and a batch of 1,000 jobs every ``WIPE_BATCH_EVERY`` s:
    seconds until it answers HTTP and until its applied index reaches the leader's commit index
    (``s4_wiped_catchup``), the probe's p99/max meanwhile; when it does not within ``timeout``,
    ``s4_wiped_timeout`` and how far behind it still was."""
    headers = cluster.headers()
    url = await current_leader(http, cluster)
    cluster.kill(j, signal.SIGKILL)
    removed = _wipe(cluster.root / cluster.nodes[j].node_id / "raft")
    print(
        f"    s4: follower {cluster.nodes[j].node_id} wiped ({removed / 2**20:,.0f} MiB), "
        "restarting...",
        file=sys.stderr,
        flush=True,
    )
    probe = _Probe(url, headers)
    snaps.probe = probe  # the watcher points it at a new leader
    sent = [0, 0]  # batches committed, batches given up on

    tasks = [
        asyncio.create_task(probe.run(http)),
        asyncio.create_task(_trickle(http, probe, headers, sent)),
    ]
    t0 = time.monotonic()
    try:
        r = await _rejoin(cluster, http, url, j, timeout)
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    window = probe.window(t0, time.monotonic())
    out = (
        {"s4_wiped_catchup": r.caught_up}
        if r.caught_up == r.caught_up
        else {"s4_wiped_timeout": timeout, "s4_wiped_behind": r.behind}
    )
    proc = cluster.nodes[j].proc
    if proc is not None and proc.poll() is None:
        # the last start's writes: the copy it was sent, installed, and the log after it
        with contextlib.suppress(OSError, RuntimeError):
            out["s4_wiped_write_mib"] = write_bytes(proc.pid) / 2**20
    return {
        **out,
        "s4_wiped_answer": r.answered,
        "s4_wiped_removed_mib": removed / 2**20,
        "s4_wiped_restart_failures": float(r.failed),
        "s4_wiped_probe_p99": _ms(window, 0.99),
        "s4_wiped_probe_max": _ms(window, 1.0),
        "s4_wiped_probe_errors": float(sum(1 for t, _, ok in probe.samples if t >= t0 and not ok)),
        "s4_wiped_batches": float(sent[0]),
        "s4_wiped_batches_failed": float(sent[1]),
    }


def _wipe(directory: Path) -> int:
    """Delete everything in ``directory`` (files and folders, the folder itself kept): bytes
    removed."""
    removed = 0
    for entry in list(directory.iterdir()) if directory.is_dir() else []:
        if entry.is_dir() and not entry.is_symlink():
            removed += sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
            shutil.rmtree(entry)
        else:
            with contextlib.suppress(FileNotFoundError):
                removed += entry.lstat().st_size
                entry.unlink()
    return removed
