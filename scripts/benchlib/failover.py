"""S5: the leader SIGKILLed under load, then stopped gracefully (SIGTERM).  Target, over at
least 10 kills (the default): "the new leader's first dispatch p99 ≤ 2 s; no acknowledged job
lost".  Its own three-node cluster, once per invocation.

Load, for the whole scenario: one ``schedd-worker`` process (``bench.failover`` from
scripts/benchlib/tasks.py, ``--concurrency`` WORKER_CONCURRENCY) and an open-loop generator
that submits one run-now job per request (``POST /api/v1/jobs``) at ``rate`` requests/s, round
robin over the nodes that are up (a follower hands the write to the leader through Raft), each
request on its own whatever the others are doing (at most MAX_INFLIGHT in flight: a request
beyond that is skipped and counted).

``kills`` times: once steady (the leader lists the worker and welcomed it more than
``STABLE_SESSION`` + 1 s ago, every node's applied index has reached the leader's commit index,
jobs are starting), the leader is SIGKILLed; once both figures below are seen it is restarted
and must catch up before the next kill.  (A worker connection that ends sooner than
``STABLE_SESSION`` after its welcome keeps the reconnect backoff of the failover before, see
schedd/worker/client.py; real failovers are further apart than that.)  Per kill, from
``t_kill`` (``time.time()`` just before the signal):

* **first dispatch**: to the first handler start (the worker's ``time.time()``, same host) of a
  run *leased by a leader elected after the kill*: one whose lease fence (the Raft index of the
  entry that leased it, recorded by ``bench.failover``) is above the claim index (leader fence)
  of the first node to log ``leader.ready`` after the kill.  Every lease a leader commits lies
  after its claim in the log, and the old leader's leases that the worker received were
  committed, so lie before it.  Runs the old leader leased just before dying that start after
  the kill (their lease frame was on its way) therefore do not count; runs queued before the
  kill and leased by the new leader do.  The figure covers the election, the new leader's claim
  and rebuild, the worker's reconnection and the lease's commit.
* **next ack**: to the first acknowledgement (201; or 200, a retry deduplicated by the server)
  of a submit *sent* after the kill (secondary; what S5 measured before, then without load).
* from the surviving nodes' logs and the worker's log: kill -> ``leader.elected``,
  ``leader.ready``, and the worker's ``worker.welcome`` by the new leader (where the time goes);
  restart -> the leader reports the restarted node connected, and -> caught up.

Then ``terms`` times the same with SIGTERM instead of SIGKILL: the node steps down, hands
leadership to the most caught-up follower (Raft TimeoutNow; ``leader.handed_over`` or
``leader.handover_failed`` in its log) and exits.  The same first dispatch is measured from the
signal (a run leased by the node that logs ``leader.ready`` after it), and the time to the
process's exit; once it has exited it is restarted and must catch up, as after a kill.

Over the whole load: leader changes besides the kills (``leader.elected`` lines beyond the
first leader and one per kill or SIGTERM: e.g. a restarted node that campaigns before the leader's
connection reaches it deposes the leader) and the longest interval without any handler start.

**Lost**: after the last kill and SIGTERM the load stops; every job that was acknowledged must start within
``bound`` seconds of the load's end and of the last leader change, at most ``2 * bound`` after
the load's end (checked by job id against the worker's records).  A new leader keeps every lease
it finds in the state for max(the job's heartbeat timeout, ``REBUILD_GRACE_S`` = 10 s) before it
retries it, so a lease committed just before a leader change whose frame never reached the
worker starts only once a leader has lasted that long: the jobs are submitted with
``heartbeat_timeout: 10s`` so the grace is 10 s (the 60 s default would make it 60 s).  The
slowest acknowledged -> started is reported.  Every wait is bounded; every process is stopped
by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import re
import signal
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from schedd.worker.client import STABLE_SESSION
from tests.cluster.harness import Cluster, cluster_view

from .clusterops import find_leader, start_lag_worker, stop_cluster
from .common import pct, stop_pid

TASK = "bench.failover"
WORKER_CONCURRENCY = 1000
MAX_INFLIGHT = 1000
REQUEST_TIMEOUT = 15.0  # above the server's own 10 s write deadline (schedd.api.common)
HEARTBEAT_TIMEOUT = "10s"  # the jobs' heartbeat timeout: see "Lost" above
WARMUP = 1.0  # s of steady load before each kill
# A worker connection that ends (here: its leader is killed) less than STABLE_SESSION seconds
# after its welcome keeps the reconnect backoff of the failover before (schedd/worker/client.py):
# each kill waits until the worker has been with the current leader a bit longer than that,
# as it would be between two real failovers.
SESSION_BEFORE_KILL = STABLE_SESSION + 1.0


@dataclass
class _Sub:
    """One submit: sent and acknowledged (``time.time()``), the job id when acknowledged."""

    sent: float
    acked: float = math.nan
    job: str | None = None
    status: int = 0  # 0: no HTTP answer


@dataclass
class _Load:
    """The open-loop submit generator."""

    cluster: Cluster
    http: aiohttp.ClientSession
    rate: float
    down: set[int] = field(default_factory=set)  # nodes not to send to (killed, restarting)
    subs: list[_Sub] = field(default_factory=list)
    skipped: int = 0
    inflight: set[asyncio.Task[None]] = field(default_factory=set)
    began: float = math.nan
    ended: float = math.nan
    _rr: int = 0

    async def run(self) -> None:
        t0 = time.monotonic()
        self.began = time.time()
        n = 0
        while True:
            due = int((time.monotonic() - t0) * self.rate)
            while n < due:
                n += 1
                up = [
                    k
                    for k, node in enumerate(self.cluster.nodes)
                    if node.alive and k not in self.down
                ]
                if not up or len(self.inflight) >= MAX_INFLIGHT:
                    self.skipped += 1
                    continue
                self._rr += 1
                task = asyncio.create_task(self._one(up[self._rr % len(up)], n))
                self.inflight.add(task)
                task.add_done_callback(self.inflight.discard)
            await asyncio.sleep(0.005)

    async def _one(self, k: int, seq: int) -> None:
        sub = _Sub(time.time())
        self.subs.append(sub)
        body = orjson.dumps({"task": TASK, "payload": seq, "heartbeat_timeout": HEARTBEAT_TIMEOUT})
        try:
            async with self.http.post(
                self.cluster.urls[k] + "/api/v1/jobs",
                data=body,
                headers=self.cluster.headers(),
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
            ) as r:
                data = await r.read()
                sub.status = r.status
                if r.status in (200, 201):
                    sub.acked = time.time()
                    sub.job = orjson.loads(data)["id"]
        except (aiohttp.ClientError, TimeoutError, OSError):
            pass

    def first_ack_after(self, t: float) -> float:
        return min(
            (s.acked for s in self.subs if s.sent >= t and s.acked == s.acked), default=math.nan
        )


@dataclass
class _Starts:
    """The worker's ``bench.failover`` records (``<start> <job id> <fence> <attempt>``), read
    as they grow."""

    path: Path
    offset: int = 0
    starts: list[tuple[float, int]] = field(default_factory=list)  # (start, fence) in file order
    first: dict[str, float] = field(default_factory=dict)  # job id -> its first start
    repeated: int = 0  # starts of a job after its first

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.offset += end + 1
        for line in data[:end].decode().split("\n"):
            started, job, fence, _attempt = line.split(" ")
            t = float(started)
            self.starts.append((t, int(fence)))
            if job in self.first:
                self.repeated += 1
                self.first[job] = min(t, self.first[job])
            else:
                self.first[job] = t

    def last(self) -> float:
        return max((t for t, _ in self.starts[-200:]), default=math.nan)


_ISO = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z")
_FENCE = re.compile(r"\bfence[\"=:\s]+(\d+)")
_WELCOMED = re.compile(r"\bworker\.welcome node=(\S+)")


def _lines(path: Path) -> list[str]:
    """The lines of a log that may not exist yet."""
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def node_events(path: Path, event: str, since: float) -> list[tuple[float, str]]:
    """(time, line) of a node log's ``event`` lines (text or JSON format) logged at or after
    ``since`` (the log's timestamps are truncated to the millisecond), in time order."""
    out = []
    for line in _lines(path):
        if event not in line:
            continue
        m = _ISO.search(line)
        if m is None:
            continue
        t = datetime.fromisoformat(m.group(1)).replace(tzinfo=UTC).timestamp()
        if t >= since - 0.001:
            out.append((t, line))
    return sorted(out)


def _welcomes(path: Path, since: float) -> list[tuple[float, str]]:
    """(time, node id) of the worker's ``worker.welcome`` lines at or after ``since`` (the
    worker program logs as the nodes do)."""
    out = []
    for t, line in node_events(path, "worker.welcome", since):
        m = _WELCOMED.search(line)
        if m is not None:
            out.append((t, m.group(1)))
    return out


@dataclass
class _Kill:
    """One leader SIGKILL (or SIGTERM); times in seconds after ``t_kill``."""

    node: str
    t_kill: float
    signal: str = "SIGKILL"
    new_leader: str | None = None
    claim: int | None = None  # the new leader's fence (its claim's log index)
    elected: float = math.nan  # leader.elected logged by a surviving node
    ready: float = math.nan  # leader.ready (claim committed, wheel and queues rebuilt)
    welcome: float = math.nan  # the worker welcomed by the new leader
    dispatch: float = math.nan  # first handler start of a run the new leader leased
    ack: float = math.nan  # first ack of a submit sent after the kill
    exited: float = math.nan  # SIGTERM: the signalled node's process exited (NaN: SIGKILLed)
    handed_over: bool | None = None  # SIGTERM: leader.handed_over (or handover_failed) logged
    handover: float = math.nan  # SIGTERM: when it logged either (the node's own log)
    reconnected: float = math.nan  # restart of the killed node -> the leader connected to it
    restart: float = math.nan  # restart of the killed node -> caught up (s)
    restart_failures: int = 0  # restarts that exited at once


@dataclass
class Loaded:
    """A fresh three-node cluster under load (see :func:`loaded`): S5's, and S7's
    (scripts/benchlib/cpuhog.py)."""

    cluster: Cluster
    http: aiohttp.ClientSession  # for everything but the load
    load: _Load
    starts: _Starts
    name: str  # the worker's
    task: asyncio.Task[None] | None = None  # the load generator
    acked: dict[str, float] = field(default_factory=dict)  # job id -> acknowledged at

    @property
    def worker_log(self) -> Path:
        return self.cluster.root / f"{self.name}.log"

    def check(self) -> None:
        """Raise what ended the load generator, if anything did."""
        if self.task is not None and self.task.done():
            self.task.result()

    async def stop_load(self) -> None:
        """Stop the generator; let the requests in flight finish (cancel them after
        REQUEST_TIMEOUT); ``acked`` is then every acknowledged job."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        if self.load.ended != self.load.ended:
            self.load.ended = time.time()
        if self.load.inflight:
            await asyncio.wait(set(self.load.inflight), timeout=REQUEST_TIMEOUT + 1)
        for task in list(self.load.inflight):
            task.cancel()
        self.acked = {s.job: s.acked for s in self.load.subs if s.job is not None}

    async def finish(self, bound: float) -> None:
        """Stop the load; until every acknowledged job has started (see :func:`_all_started`)."""
        await self.stop_load()
        await _all_started(self.cluster, self.starts, set(self.acked), self.load.ended, bound)

    def figures(self, prefix: str) -> dict[str, float]:
        """What every loaded scenario reports (call after :meth:`finish`)."""
        lost = [job for job in self.acked if job not in self.starts.first]
        return {
            f"{prefix}_lost": float(len(lost)),
            f"{prefix}_acked": float(len(self.acked)),
            f"{prefix}_not_acked": float(sum(1 for s in self.load.subs if s.job is None)),
            f"{prefix}_skipped": float(self.load.skipped),
            f"{prefix}_repeated": float(self.starts.repeated),
            f"{prefix}_load_rate": len(self.acked) / max(1e-3, self.load.ended - self.load.began),
        }

    def write_detail(self, path: Path | None, **extra: Any) -> None:
        """``extra`` and :meth:`detail` to ``path`` as JSON (nothing when ``path`` is None)."""
        if path is not None:
            path.write_text(json.dumps({**extra, **self.detail()}, indent=1))

    def detail(self) -> dict[str, Any]:
        """The lost jobs, the slowest acknowledged -> started and the submits not acknowledged
        by status, for a scenario's JSON file."""
        started = self.starts.first
        slow = sorted(
            ((started[job] - t, job, t) for job, t in self.acked.items() if job in started),
            reverse=True,
        )[:20]
        return {
            "lost": [job for job in self.acked if job not in started][:100],
            "slowest_ack_to_start": [
                {"job": job, "acked": t, "seconds": round(d, 3)} for d, job, t in slow
            ],
            "not_acked_by_status": _by_status(self.load.subs),
        }


@contextlib.asynccontextmanager
async def loaded(root: Path, rate: float, prefix: str) -> AsyncIterator[Loaded]:
    """A fresh three-node cluster under ``root`` with one ``schedd-worker`` (``bench.failover``,
    its starts recorded to ``<root>/<prefix>.starts``) and the open-loop submit generator at
    ``rate`` requests/s; everything is stopped (by PID) on the way out."""
    cluster = Cluster(root)
    cluster.start()
    worker = None
    run: Loaded | None = None
    name = f"bench-{prefix}-{time.monotonic_ns()}"
    record = root / f"{prefix}.starts"
    try:
        async with (
            aiohttp.ClientSession() as http,
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_INFLIGHT + 10)
            ) as loadhttp,
        ):
            try:
                await find_leader(http, cluster)
                worker = start_lag_worker(cluster, name, record, WORKER_CONCURRENCY)
                run = Loaded(cluster, http, _Load(cluster, loadhttp, rate), _Starts(record), name)
                run.task = asyncio.create_task(run.load.run())
                yield run
            finally:
                if run is not None:
                    if run.task is not None and not run.task.done():
                        run.task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await run.task
                    for task in list(run.load.inflight):
                        task.cancel()
    finally:
        stop_pid(worker, grace=20)
        stop_cluster(cluster)


async def steady(
    http: aiohttp.ClientSession, cluster: Cluster, starts: _Starts, worker: str, timeout: float
) -> int:
    """Until the leader lists ``worker`` and welcomed it SESSION_BEFORE_KILL seconds ago or
    more, every node has applied the leader's commit index and jobs have been starting for
    WARMUP seconds; the leader's index."""
    worker_log = cluster.root / f"{worker}.log"
    deadline = time.monotonic() + timeout
    since = time.time()
    state = "no leader"
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        starts.poll()
        i = await find_leader(http, cluster, timeout=max(1.0, deadline - time.monotonic()))
        url, headers = cluster.urls[i], cluster.headers()
        try:
            async with http.get(
                url + "/api/v1/workers", headers=headers, timeout=aiohttp.ClientTimeout(total=2)
            ) as r:
                listed = (await r.json())["workers"] if r.status == 200 else []
        except (aiohttp.ClientError, TimeoutError):
            listed = []
        if not any(w.get("worker_id") == worker for w in listed):
            state = f"the leader ({cluster.nodes[i].node_id}) does not list the worker"
            continue
        lead = await cluster_view(http, url, headers)
        views = [await cluster_view(http, u, headers) for u in cluster.urls]
        if lead is None or not all(v and v["applied_index"] >= lead["commit_index"] for v in views):
            state = "a node has not caught up with the leader"
            continue
        if not starts.last() >= since + WARMUP:
            state = "no job started lately"
            continue
        welcomes = _welcomes(worker_log, 0.0)
        if not welcomes or welcomes[-1][1] != cluster.nodes[i].node_id:
            state = "the worker's last welcome is not by the leader"
            continue
        if time.time() - welcomes[-1][0] < SESSION_BEFORE_KILL:
            continue
        return i
    raise RuntimeError(f"not steady within {timeout:.0f}s: {state}")


async def _failover(run: Loaded, sig: signal.Signals, timeout: float) -> _Kill:
    """SIGKILL (or SIGTERM) the leader; until the new leader's first dispatch and the next ack
    are seen, and after a SIGTERM until the node's process has exited."""
    http, cluster, load, starts = run.http, run.cluster, run.load, run.starts
    i = await find_leader(http, cluster, timeout=10.0)
    survivors = [k for k in range(len(cluster.nodes)) if k != i]
    load.down.add(i)
    seen = len(starts.starts)
    kill = _Kill(cluster.nodes[i].node_id, time.time(), sig.name)
    cluster.kill(i, sig)
    t_kill = kill.t_kill
    deadline = time.monotonic() + timeout
    while True:
        await asyncio.sleep(0.05)
        starts.poll()
        if kill.claim is None:
            readies = sorted(
                (t, k, line)
                for k in survivors
                for t, line in node_events(cluster.nodes[k].log, "leader.ready", t_kill)
            )
            for t, k, line in readies:
                m = _FENCE.search(line)
                if m is not None:
                    kill.claim, kill.ready = int(m.group(1)), t - t_kill
                    kill.new_leader = cluster.nodes[k].node_id
                    break
        if kill.claim is not None:
            kill.dispatch = (
                min(
                    (t for t, fence in starts.starts[seen:] if fence > kill.claim), default=math.nan
                )
                - t_kill
            )
        kill.ack = load.first_ack_after(t_kill) - t_kill
        if kill.dispatch == kill.dispatch and kill.ack == kill.ack:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{timeout:.0f}s after {sig.name} of the leader {kill.node}: "
                + (
                    "no leader.ready logged by a surviving node"
                    if kill.claim is None
                    else f"new leader {kill.new_leader} (fence {kill.claim}): "
                    + (
                        "no run it leased has started"
                        if kill.dispatch != kill.dispatch
                        else "no submit acknowledged"
                    )
                )
            )
    elected = [
        t for k in survivors for t, _ in node_events(cluster.nodes[k].log, "leader.elected", t_kill)
    ]
    kill.elected = min(elected, default=math.nan) - t_kill
    welcomed = [t for t, node in _welcomes(run.worker_log, t_kill) if node == kill.new_leader]
    kill.welcome = min(welcomed, default=math.nan) - t_kill
    if sig != signal.SIGKILL:
        await _exited(cluster, i, kill, timeout)
    return kill


async def _exited(cluster: Cluster, i: int, kill: _Kill, timeout: float) -> None:
    """Until node ``i`` (signalled at ``kill.t_kill``) has exited: ``kill.exited``; SIGKILLed
    (``exited`` left NaN) after ``timeout`` seconds.  ``kill.handed_over`` from its log."""
    node = cluster.nodes[i]
    deadline = time.monotonic() + timeout
    while node.alive and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if node.alive:
        cluster.kill(i, signal.SIGKILL)
    else:
        kill.exited = time.time() - kill.t_kill
    for event, ok in (("leader.handed_over", True), ("leader.handover_failed", False)):
        logged = node_events(node.log, event, kill.t_kill)
        if logged:
            kill.handed_over, kill.handover = ok, logged[0][0] - kill.t_kill


async def _restart(
    http: aiohttp.ClientSession, cluster: Cluster, load: _Load, kill: _Kill, timeout: float
) -> None:
    """Start the killed node again (again each time it exits at once, as a supervisor would)
    until its applied index reaches the leader's commit index."""
    j = next(k for k, n in enumerate(cluster.nodes) if n.node_id == kill.node)
    headers = cluster.headers()
    t0 = time.monotonic()
    cluster.start(j)
    while time.monotonic() - t0 < timeout:
        await asyncio.sleep(0.1)
        if not cluster.nodes[j].alive:
            kill.restart_failures += 1
            await asyncio.sleep(1.0)
            cluster.start(j)
            continue
        i = await find_leader(http, cluster, timeout=max(1.0, timeout - (time.monotonic() - t0)))
        lead = await cluster_view(http, cluster.urls[i], headers)  # first: the load moves it
        mine = await cluster_view(http, cluster.urls[j], headers)
        if mine is None:
            continue
        load.down.discard(j)
        if lead is None:
            continue
        if kill.reconnected != kill.reconnected and any(
            n.get("raft") == f"127.0.0.1:{cluster.nodes[j].raft_port}" and n.get("connected")
            for n in lead["nodes"]
        ):
            kill.reconnected = time.monotonic() - t0
        if mine["applied_index"] >= lead["commit_index"]:
            kill.restart = time.monotonic() - t0
            return
    raise RuntimeError(
        f"the {kill.signal} node {kill.node} did not catch up within {timeout:.0f}s "
        f"of its restart ({kill.restart_failures} restarts exited at once)"
    )


async def s5(
    root: Path,
    kills: int,
    rate: float,
    bound: float,
    terms: int = 0,
    failover_timeout: float = 30.0,
    steady_timeout: float = 30.0,
    catchup_timeout: float = 60.0,
    detail: Path | None = None,
) -> dict[str, float]:
    """The scenario (see the module docstring): ``kills`` SIGKILL rounds, then ``terms``
    SIGTERM rounds; figures in seconds unless named otherwise.  ``detail``: the per-round
    figures, as JSON."""
    results: list[_Kill] = []
    rounds = [signal.SIGKILL] * kills + [signal.SIGTERM] * terms
    async with loaded(root, rate, "s5") as run:
        http, cluster = run.http, run.cluster
        i = await steady(http, cluster, run.starts, run.name, steady_timeout)
        term0 = await term(http, cluster, i)
        for n, sig in enumerate(rounds):
            if n:
                await steady(http, cluster, run.starts, run.name, steady_timeout)
            run.check()
            kill = await _failover(run, sig, failover_timeout)
            await _restart(http, cluster, run.load, kill, catchup_timeout)
            results.append(kill)
            same = rounds.count(sig)
            print(
                f"    s5: {sig.name} {rounds[: n + 1].count(sig)}/{same} ({kill.node}, new leader "
                f"{kill.new_leader}): first dispatch {kill.dispatch:.2f}s, next ack "
                f"{kill.ack:.2f}s, elected {kill.elected:.2f}s, ready {kill.ready:.2f}s, "
                f"worker welcomed {kill.welcome:.2f}s"
                + (
                    f", handed over {kill.handover:.2f}s ({kill.handed_over}), exited "
                    f"{kill.exited:.2f}s"
                    if sig != signal.SIGKILL
                    else ""
                )
                + f"; restart -> leader connected {kill.reconnected:.1f}s, "
                f"caught up {kill.restart:.1f}s",
                file=sys.stderr,
                flush=True,
            )
        term1 = await term(http, cluster, await find_leader(http, cluster))
        # stop the load; every acknowledged job must start within ``bound``
        await run.finish(bound)
    run.write_detail(detail, kills=[asdict(k) for k in results], rate=rate, bound_s=bound)
    return _s5_figures(run, results, term1 - term0)


def p50(values: list[float]) -> float:
    """The median of the values that are not NaN (NaN when none is)."""
    values = [v for v in values if v == v]
    return statistics.median(values) if values else math.nan


def _s5_figures(run: Loaded, results: list[_Kill], elections: int) -> dict[str, float]:
    starts, load = run.starts, run.load
    kills = [k for k in results if k.signal == "SIGKILL"]
    terms = [k for k in results if k.signal != "SIGKILL"]
    elected = sum(len(node_events(n.log, "leader.elected", 0.0)) for n in run.cluster.nodes)
    during = sorted(t for t, _ in starts.starts if load.began <= t <= load.ended)
    gaps = [b - a for a, b in itertools.pairwise(during)]
    to_start = [starts.first[job] - t for job, t in run.acked.items() if job in starts.first]
    dispatch = [k.dispatch for k in kills]
    term_dispatch = [k.dispatch for k in terms]
    return {
        "s5_dispatch_p50": p50(dispatch),
        "s5_dispatch_p99": pct(dispatch, 0.99) if dispatch else math.nan,
        "s5_dispatch_max": max(dispatch, default=math.nan),
        "s5_ack_p50": p50([k.ack for k in kills]),
        "s5_ack_max": max((k.ack for k in kills), default=math.nan),
        "s5_elected_p50": p50([k.elected for k in kills]),
        "s5_ready_p50": p50([k.ready for k in kills]),
        "s5_welcome_p50": p50([k.welcome for k in kills]),
        "s5_restart_connected_p50": p50([k.reconnected for k in kills]),
        "s5_restart_p50": p50([k.restart for k in kills]),
        "s5_term_dispatch_p50": p50(term_dispatch),
        "s5_term_dispatch_max": max(term_dispatch, default=math.nan),
        "s5_term_ack_p50": p50([k.ack for k in terms]),
        "s5_term_elected_p50": p50([k.elected for k in terms]),
        "s5_term_exit_max": max((k.exited for k in terms), default=math.nan),
        "s5_term_handover_failed": float(sum(1 for k in terms if k.handed_over is not True)),
        **run.figures("s5"),
        "s5_ack_to_start_max": max(to_start, default=math.nan),
        "s5_kills": float(len(kills)),
        "s5_terms": float(len(terms)),
        "s5_elections": float(elections),
        # leader.elected lines beyond the first leader and one per kill or SIGTERM: e.g. a
        # restarted node that campaigns before the leader reaches it deposes the leader
        "s5_extra_leader_changes": float(elected - 1 - len(results)),
        "s5_max_start_gap": max(gaps, default=math.nan),
    }


async def _all_started(
    cluster: Cluster, starts: _Starts, jobs: set[str], since: float, bound: float
) -> None:
    """Until every job in ``jobs`` has started, or ``bound`` seconds have passed since ``since``
    (the load's end) and since the last leader change (``leader.ready`` in any node's log: a
    new leader gives the old leader's leases a fresh grace, see the module docstring), at most
    ``2 * bound`` seconds after ``since``."""
    last_ready = since
    checked = 0.0
    while True:
        starts.poll()
        if jobs.issubset(starts.first):
            return
        now = time.time()
        if now - checked > 1.0:
            checked = now
            readies = [
                t for n in cluster.nodes for t, _ in node_events(n.log, "leader.ready", since)
            ]
            last_ready = max([since, *readies])
        if now > min(since + 2 * bound, last_ready + bound):
            await asyncio.sleep(0.2)  # the worker's records are flushed every 50 ms
            starts.poll()
            return
        await asyncio.sleep(0.2)


async def term(http: aiohttp.ClientSession, cluster: Cluster, i: int) -> int:
    """Node ``i``'s Raft term."""
    view = await cluster_view(http, cluster.urls[i], cluster.headers(), timeout=10)
    if view is None:
        raise RuntimeError(f"{cluster.nodes[i].node_id} does not answer /api/v1/cluster")
    return int(view["term"])


def _by_status(subs: list[_Sub]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in subs:
        if s.job is None:
            out[str(s.status)] = out.get(str(s.status), 0) + 1
    return out
