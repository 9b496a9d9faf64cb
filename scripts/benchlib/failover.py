"""S5: the leader SIGKILLed under load.  Target: "the new leader's first dispatch p99
≤ 2 s; no acknowledged job lost".  Its own three-node cluster, once per invocation.

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

Over the whole load: leader changes besides the kills (``leader.elected`` lines beyond the
first leader and one per kill: e.g. a restarted node that campaigns before the leader's
connection reaches it deposes the leader) and the longest interval without any handler start.

**Lost**: after the last kill the load stops; every job that was acknowledged must start within
``bound`` seconds of the load's end and of the last leader change, at most ``2 * bound`` after
the load's end (checked by job id against the worker's records).  A new leader keeps every lease
it finds in the state for max(the job's heartbeat timeout, ``REBUILD_GRACE_S`` = 10 s) before it
retries it, so a lease committed just before a leader change whose frame never reached the
worker starts only once a leader has lasted that long: the jobs are submitted with
``heartbeat_timeout: 10s`` so the grace is 10 s (the 60 s default would make it 60 s).  The
slowest acknowledged -> started is reported.  Every wait is bounded; every process is stopped
by PID.
"""

# Small local file reads (worker records, logs): blocking is fine here.
# ruff: noqa: ASYNC240

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
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import orjson

from schedd.worker.client import STABLE_SESSION
from tests.cluster.harness import Cluster

from .clusterops import cluster_view, find_leader, stop_cluster
from .common import pct, stop_pid

TASK = "bench.failover"
WORKER_CONCURRENCY = 1000
MAX_INFLIGHT = 1000
REQUEST_TIMEOUT = 15.0  # above the server's own 10 s write deadline (schedd.api.app)
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
_WELCOME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*\bworker\.welcome node=(\S+)")


def _lines(path: Path) -> list[str]:
    """The lines of a log that may not exist yet."""
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def _node_events(path: Path, event: str, since: float) -> list[tuple[float, str]]:
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
    """(time, node id) of the worker's ``worker.welcome`` lines at or after ``since`` (its log
    uses logging's default local-time ``asctime``)."""
    out = []
    for line in _lines(path):
        m = _WELCOME.match(line)
        if m is None:
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").astimezone().timestamp()
        if t >= since - 0.001:
            out.append((t, m.group(2)))
    return sorted(out)


@dataclass
class _Kill:
    """One leader SIGKILL; times in seconds after ``t_kill``."""

    node: str
    t_kill: float
    new_leader: str | None = None
    claim: int | None = None  # the new leader's fence (its claim's log index)
    elected: float = math.nan  # leader.elected logged by a surviving node
    ready: float = math.nan  # leader.ready (claim committed, wheel and queues rebuilt)
    welcome: float = math.nan  # the worker welcomed by the new leader
    dispatch: float = math.nan  # first handler start of a run the new leader leased
    ack: float = math.nan  # first ack of a submit sent after the kill
    reconnected: float = math.nan  # restart of the killed node -> the leader connected to it
    restart: float = math.nan  # restart of the killed node -> caught up (s)
    restart_failures: int = 0  # restarts that exited at once


async def _steady(
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
    raise RuntimeError(f"S5: not steady within {timeout:.0f}s: {state}")


async def _failover(
    http: aiohttp.ClientSession,
    cluster: Cluster,
    load: _Load,
    starts: _Starts,
    worker_log: Path,
    timeout: float,
) -> _Kill:
    """SIGKILL the leader; until the new leader's first dispatch and the next ack are seen."""
    i = await find_leader(http, cluster, timeout=10.0)
    survivors = [k for k in range(len(cluster.nodes)) if k != i]
    load.down.add(i)
    seen = len(starts.starts)
    kill = _Kill(cluster.nodes[i].node_id, time.time())
    cluster.kill(i, signal.SIGKILL)
    t_kill = kill.t_kill
    deadline = time.monotonic() + timeout
    while True:
        await asyncio.sleep(0.05)
        starts.poll()
        if kill.claim is None:
            readies = sorted(
                (t, k, line)
                for k in survivors
                for t, line in _node_events(cluster.nodes[k].log, "leader.ready", t_kill)
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
                f"S5: {timeout:.0f}s after SIGKILL of the leader {kill.node}: "
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
        t
        for k in survivors
        for t, _ in _node_events(cluster.nodes[k].log, "leader.elected", t_kill)
    ]
    kill.elected = min(elected, default=math.nan) - t_kill
    welcomed = [t for t, node in _welcomes(worker_log, t_kill) if node == kill.new_leader]
    kill.welcome = min(welcomed, default=math.nan) - t_kill
    return kill


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
        f"S5: the killed node {kill.node} did not catch up within {timeout:.0f}s "
        f"of its restart ({kill.restart_failures} restarts exited at once)"
    )


async def s5(
    root: Path,
    kills: int,
    rate: float,
    bound: float,
    failover_timeout: float = 30.0,
    steady_timeout: float = 30.0,
    catchup_timeout: float = 60.0,
    detail: Path | None = None,
) -> dict[str, float]:
    """The scenario (see the module docstring); figures in seconds unless named otherwise.
    ``detail``: the per-kill figures, as JSON."""
    cluster = Cluster(root)
    cluster.start()
    worker = None
    load_task: asyncio.Task[None] | None = None
    load: _Load | None = None
    name = f"bench-s5-{time.monotonic_ns()}"
    record = root / "s5.starts"
    worker_log = cluster.root / f"{name}.log"
    starts = _Starts(record)
    results: list[_Kill] = []
    acked: dict[str, float] = {}  # job id -> acknowledged at
    try:
        async with (
            aiohttp.ClientSession() as http,
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_INFLIGHT + 10)
            ) as loadhttp,
        ):
            await find_leader(http, cluster)
            worker = cluster.start_worker(
                "--import",
                "scripts.benchlib.tasks",
                "--concurrency",
                str(WORKER_CONCURRENCY),
                name=name,
                env={"SCHEDD_BENCH_LAG": str(record)},
            )
            load = _Load(cluster, loadhttp, rate)
            load_task = asyncio.create_task(load.run())
            i = await _steady(http, cluster, starts, name, steady_timeout)
            term0 = await _term(http, cluster, i)
            for n in range(kills):
                if n:
                    await _steady(http, cluster, starts, name, steady_timeout)
                if load_task.done():
                    load_task.result()
                kill = await _failover(http, cluster, load, starts, worker_log, failover_timeout)
                await _restart(http, cluster, load, kill, catchup_timeout)
                results.append(kill)
                print(
                    f"    s5: kill {n + 1}/{kills} ({kill.node}, new leader "
                    f"{kill.new_leader}): first dispatch {kill.dispatch:.2f}s, next ack "
                    f"{kill.ack:.2f}s, elected {kill.elected:.2f}s, ready {kill.ready:.2f}s, "
                    f"worker welcomed {kill.welcome:.2f}s; restart -> leader connected "
                    f"{kill.reconnected:.1f}s, caught up {kill.restart:.1f}s",
                    file=sys.stderr,
                    flush=True,
                )
            term1 = await _term(http, cluster, await find_leader(http, cluster))
            # stop the load; every acknowledged job must start within ``bound``
            load_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load_task
            load.ended = time.time()
            if load.inflight:
                await asyncio.wait(set(load.inflight), timeout=REQUEST_TIMEOUT + 1)
            for task in list(load.inflight):
                task.cancel()
            acked = {s.job: s.acked for s in load.subs if s.job is not None}
            await _all_started(cluster, starts, set(acked), load.ended, bound)
    finally:
        if load_task is not None and not load_task.done():
            load_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load_task
        for task in list(load.inflight) if load is not None else []:
            task.cancel()
        stop_pid(worker, grace=20)
        stop_cluster(cluster)
    elected = sum(len(_node_events(n.log, "leader.elected", 0.0)) for n in cluster.nodes)
    during = sorted(t for t, _ in starts.starts if load.began <= t <= load.ended)
    gaps = [b - a for a, b in itertools.pairwise(during)]
    lost = [job for job in acked if job not in starts.first]
    to_start = [starts.first[job] - t for job, t in acked.items() if job in starts.first]
    dispatch = [k.dispatch for k in results]
    not_acked = sum(1 for s in load.subs if s.job is None)

    def p50(values: list[float]) -> float:
        values = [v for v in values if v == v]
        return statistics.median(values) if values else math.nan

    out = {
        "s5_dispatch_p50": p50(dispatch),
        "s5_dispatch_p99": pct(dispatch, 0.99),
        "s5_dispatch_max": max(dispatch),
        "s5_ack_p50": p50([k.ack for k in results]),
        "s5_ack_max": max(k.ack for k in results),
        "s5_elected_p50": p50([k.elected for k in results]),
        "s5_ready_p50": p50([k.ready for k in results]),
        "s5_welcome_p50": p50([k.welcome for k in results]),
        "s5_restart_connected_p50": p50([k.reconnected for k in results]),
        "s5_restart_p50": p50([k.restart for k in results]),
        "s5_lost": float(len(lost)),
        "s5_acked": float(len(acked)),
        "s5_not_acked": float(not_acked),
        "s5_skipped": float(load.skipped),
        "s5_repeated": float(starts.repeated),
        "s5_ack_to_start_max": max(to_start, default=math.nan),
        "s5_load_rate": len(acked) / max(1e-3, load.ended - load.began),
        "s5_kills": float(len(results)),
        "s5_elections": float(term1 - term0),
        # leader.elected lines beyond the first leader and one per kill: e.g. a restarted node
        # that campaigns before the leader reaches it deposes the leader
        "s5_extra_leader_changes": float(elected - 1 - len(results)),
        "s5_max_start_gap": max(gaps, default=math.nan),
    }
    if detail is not None:
        slow = sorted(
            ((starts.first[job] - t, job, t) for job, t in acked.items() if job in starts.first),
            reverse=True,
        )[:20]
        detail.write_text(
            json.dumps(
                {
                    "kills": [asdict(k) for k in results],
                    "rate": rate,
                    "bound_s": bound,
                    "lost": lost[:100],
                    "slowest_ack_to_start": [
                        {"job": job, "acked": t, "seconds": round(d, 3)} for d, job, t in slow
                    ],
                    "not_acked_by_status": _by_status(load.subs),
                },
                indent=1,
            )
        )
    return out


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
                t for n in cluster.nodes for t, _ in _node_events(n.log, "leader.ready", since)
            ]
            last_ready = max([since, *readies])
        if now > min(since + 2 * bound, last_ready + bound):
            await asyncio.sleep(0.2)  # the worker's records are flushed every 50 ms
            starts.poll()
            return
        await asyncio.sleep(0.2)


async def _term(http: aiohttp.ClientSession, cluster: Cluster, i: int) -> int:
    view = await cluster_view(http, cluster.urls[i], cluster.headers(), timeout=10)
    if view is None:
        raise RuntimeError(f"S5: {cluster.nodes[i].node_id} does not answer /api/v1/cluster")
    return int(view["term"])


def _by_status(subs: list[_Sub]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in subs:
        if s.job is None:
            out[str(s.status)] = out.get(str(s.status), 0) + 1
    return out
