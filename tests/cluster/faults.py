"""Seeded, replayable fault schedules against a real three-node cluster with real workers.

A schedule is a list of timed steps drawn from ``random.Random(seed)``: the same seed always
gives the same kinds, times, durations and parameters.  Which node is "the leader" is resolved
when a step starts (a real cluster elects whom it elects), and every resolved target is written
to the history, so a run can be read back and replayed step by step.

Fault kinds (``KINDS``):

=====================  =====================================================================
kill_leader            SIGKILL the leader, restart it after 1–4 s
kill_follower          SIGKILL a follower, restart it after 1–4 s
pause_leader           SIGSTOP the leader for 2–5 s, then SIGCONT
pause_follower         SIGSTOP a follower for 2–5 s, then SIGCONT
isolate_leader         partition {leader} | {two followers} (minority leader) for 3–6 s
isolate_follower       partition {follower} | {leader, follower} for 3–6 s
cut_link               cut the leader ↔ one follower link only (a non-transitive partition)
one_way_leader_out     the leader's frames to both followers are dropped; it still hears them
one_way_leader_in      the followers' frames to the leader are dropped; it still reaches them
flaky_link             30–120 ms delay on every link, and on one link a 2 % chance per frame
                       that the connection is closed, for 4–8 s
kill_all               SIGKILL all three nodes, restart them together after 1–3 s
clock_skew             one node's wall clock stepped by ±5–45 s for 5–10 s, then stepped back
                       (Python-level time.time/time_ns in that node; see harness.SKEW_LAUNCHER)
worker_kill            SIGKILL a worker (mid-run: workers always hold leases under this load),
                       restart it after 1–3 s
worker_stall           SIGSTOP a worker for heartbeat_timeout + 1–3 s, then SIGCONT: its leases
                       are lost and re-leased, and its late results must be refused
power_loss             SIGKILL all three nodes, drop what each one's disk had not synced (a
                       random prefix of each file's unsynced writes kept: torn tails), restart
                       them together after 1–3 s
slow_disk              every fsync on one node (the leader or a follower) 50–500 ms longer,
                       for 5–10 s
disk_full              one node's (the leader's or a follower's) journal, or its state
                       database, may grow 8–64 KiB more, then its writes fail ENOSPC, for
                       6–10 s: the node stops (status 70) and is restarted every 2 s as
                       systemd would (Restart=on-failure, RestartSec=2), stopping again while
                       the disk is full; space freed, the next restart brings it back
net_isolate_leader     the leader's packets to and from every other host dropped (the other
                       nodes, the workers, the client) for 3–6 s: its connections hang
net_cut_worker         a worker's packets to and from the leader dropped for heartbeat_timeout
                       + 1–4 s: it runs on, its leases are lost and re-leased, and its late
                       results (once healed) must be refused
net_cut_client         the client's packets to and from the leader dropped for 3–6 s: its
                       requests there hang, it must get through the other nodes
wipe_follower          SIGKILL a follower, delete everything it wrote in its data directory
                       (Raft journal and its state file, snapshot, state database with its
                       -wal/-shm, temporary files), restart it empty after 1–4 s; the step
                       then leaves it REBUILD_S to be rebuilt from the leader (a whole copy
                       of the state, once the leader's log no longer starts at index 1), and
                       waits until it has applied the leader's commit index (at most
                       checker.REBUILD_BOUND_S from the restart) before the next step
replace_node           SIGKILL a follower; 1–3 s later remove it (``DELETE
                       /api/v1/cluster/nodes/{id}``), start a new node at a new address (new
                       ports, an empty data directory, ``raft.join`` = the live members' API
                       URLs) and start the removed one once more with its data: it must be
                       refused and stop with status 2.  The step waits until the new node is
                       a voter (at most PROMOTE_WAIT_S) and the old one has stopped
                       (RETIRE_WAIT_S); the new node is a member from then on
add_interrupted        start a new node with ``raft.join``; as soon as the leader lists it as
                       a learner (still loading the state), SIGKILL the leader, restart it
                       after 1–4 s.  The step waits until the new node is a voter (four
                       voters), then until the killed node has caught up, and removes it
                       (back to three voters; were it the leader, it hands over first): it
                       must stop by itself with status 2
=====================  =====================================================================

The two membership kinds change who the members are: every later step picks its leader,
follower, link or victims among the live members (:attr:`Run.members`), restarts only them
(``kill_all``, ``power_loss``, the final heal: a removed node is never started again after
its one refused restart), and the checker reads the state and the membership from them.

The three disk kinds put every node's data directory on a lossy FUSE mount
(tests/cluster/lossyfs.py), only in a schedule that has one of them (and one more mount ready
for each node a membership step will add).  The ``net_`` kinds put every node and every worker
in a network namespace of its own (tests/cluster/netns.py), the test process (the client) on
the bridge between them, and cut with nftables rules that drop packets, so connections hang
as they do across a real partition.  The membership kinds do too (with one namespace ready for
each node they will add): behind the Raft proxy each node knows the others by their proxy
ports but itself by its own, so the leader records no membership there and refuses changes.
In such a schedule there is no Raft proxy and the proxy's kinds are nftables rules too:
isolate and cut as above (every packet between the nodes, not only Raft's), one-way cuts drop
one direction on arrival, and flaky_link is packet loss (2 % on every link between nodes,
10–30 % on one) instead of delay.

:func:`run_schedule` starts the cluster (Raft links through tests/cluster/proxy.py), two
workers running ``tests.acceptance.tasks`` (``acc.record`` logs every execution with its
fence), an open-loop load of one-off jobs (some of them long) and a few ``* * * * * *`` cron
jobs with ``overlap: allow``, plays the schedule, heals everything, lets the cluster settle and
hands the recorded history to tests/cluster/checker.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from schedd.aio import wait_event
from schedd.shard.layout import shard_address
from tests.cluster import checker
from tests.cluster.harness import BIN, SNAPSHOT_INSTALL_EVENTS, Cluster
from tests.cluster.lossyfs import LossyMount
from tests.cluster.members import NODES, call, new_node, raft_addr
from tests.cluster.members import members as members_view
from tests.cluster.netns import CLIENT, NetLab

KINDS = (
    "kill_leader",
    "kill_follower",
    "pause_leader",
    "pause_follower",
    "isolate_leader",
    "isolate_follower",
    "cut_link",
    "one_way_leader_out",
    "one_way_leader_in",
    "flaky_link",
    "kill_all",
    "clock_skew",
    "worker_kill",
    "worker_stall",
    "power_loss",
    "slow_disk",
    "disk_full",
    "net_isolate_leader",
    "net_cut_worker",
    "net_cut_client",
    "wipe_follower",
    "replace_node",
    "add_interrupted",
)
# Kinds that need the nodes' data directories on lossy mounts.
DISK_KINDS = frozenset({"power_loss", "slow_disk", "disk_full"})
# Kinds that need every node and worker in a network namespace (tests/cluster/netns.py).
NET_KINDS = frozenset({"net_isolate_leader", "net_cut_worker", "net_cut_client"})
# Kinds the Raft proxy (tests/cluster/proxy.py) plays, or nftables rules in namespaces.
PROXY_KINDS = frozenset(
    {"isolate_leader", "isolate_follower", "cut_link", "one_way_leader_out", "one_way_leader_in"}
    | {"flaky_link"}
)
# Kinds that start a new node (at a new address) and change the membership; in namespaces too.
MEMBER_KINDS = frozenset({"replace_node", "add_interrupted"})
WORKERS = ("w1", "w2")
NETNS_HTTP_PORT = 17700  # every node's, each in its own namespace (Raft: the next port)
# Faults that leave a connected majority of live nodes (one-way faults too: the two followers
# still talk to each other both ways): writes must resume within the bound while the fault
# lasts.  Only kill_all leaves no majority; it is measured from its heal (the restart).
KEEPS_MAJORITY = frozenset(KINDS) - {"kill_all", "power_loss"}

HEARTBEAT_INTERVAL_S = 0.5
HEARTBEAT_TIMEOUT_S = 3.0
RESTART_SEC = 2.0  # systemd/schedd.service RestartSec
FULL_DISK_EXIT = 70  # a node that cannot write its data stops with EX_SOFTWARE
FAILOVER_BOUND_S = 10.0
#: what a wipe_follower step lasts beyond the follower's restart: time for the leader to send
#: it a whole copy and for it to catch up, before the next step (checker.REBUILD_BOUND_S, from
#: the restart, is the bound it is held to)
REBUILD_S = 6.0
#: what a replace_node step lasts beyond the removal (the new node started, loaded and
#: promoted; the removed one started again and refused), and an add_interrupted step beyond
#: the new node's start (JOIN_S: until it is a learner) and the leader's restart (ADD_S: the
#: learner promoted, the killed node removed): room in the schedule, not bounds
REPLACE_S = 8.0
JOIN_S = 3.0
ADD_S = 10.0
#: the most a membership step waits for a new node to be a learner, then a voter, and for a
#: removed node to stop (with REMOVED_EXIT) before it goes on
JOIN_WAIT_S = 20.0
PROMOTE_WAIT_S = 30.0
RETIRE_WAIT_S = 15.0
REMOVED_EXIT = 2  # a node removed from its cluster stops, or is refused, with this status


@dataclass
class Step:
    at: float  # seconds after the fault phase starts
    kind: str
    duration: float
    pick: float  # which follower / worker / link, resolved when the step runs
    value: float = 0.0  # clock shift in seconds, the delay in ms, or the room left in KiB

    def describe(self) -> str:
        extra = f" value={self.value:g}" if self.value else ""
        return f"t={self.at:5.1f}s {self.kind:<19} for {self.duration:4.1f}s pick={self.pick:.2f}{extra}"

    @property
    def heal_after(self) -> float:
        """Seconds from the fault's start to its heal: the whole step, except for a wiped
        follower, restarted after ``value`` s and given the rest of the step to be rebuilt, a
        replaced node (removed after ``value`` s) and an interrupted add (the leader restarted
        after ``value`` s), the rest of whose step is the new node's promotion."""
        if self.kind in ("wipe_follower", *MEMBER_KINDS):
            return self.value
        return self.duration


#: the shortest and longest duration of each kind that has no other parameter
_SPANS = {
    "kill_leader": (1, 4),
    "kill_follower": (1, 4),
    "pause_leader": (2, 5),
    "pause_follower": (2, 5),
    "isolate_leader": (3, 6),
    "isolate_follower": (3, 6),
    "cut_link": (3, 6),
    "net_isolate_leader": (3, 6),
    "net_cut_client": (3, 6),
    "one_way_leader_out": (3, 5),
    "one_way_leader_in": (3, 5),
    "kill_all": (1, 3),
    "power_loss": (1, 3),
    "slow_disk": (5, 10),
    "worker_kill": (1, 3),
}


def _duration(kind: str, rng: random.Random) -> tuple[float, float]:
    """(duration, value) of one step of ``kind``."""
    if kind in _SPANS:
        return rng.uniform(*_SPANS[kind]), 0.0
    if kind in ("net_cut_worker", "worker_stall"):
        return HEARTBEAT_TIMEOUT_S + rng.uniform(1, 4 if kind == "net_cut_worker" else 3), 0.0
    if kind == "flaky_link":
        return rng.uniform(4, 8), rng.uniform(30, 120)
    if kind == "disk_full":
        return rng.uniform(6, 10), rng.uniform(8, 64)
    if kind == "clock_skew":
        return rng.uniform(5, 10), rng.choice((-1, 1)) * rng.uniform(5, 45)
    if kind == "wipe_follower":
        down = rng.uniform(1, 4)
        return down + REBUILD_S, down
    if kind == "replace_node":
        down = rng.uniform(1, 3)
        return down + REPLACE_S, down
    if kind == "add_interrupted":
        down = rng.uniform(1, 4)
        return JOIN_S + down + ADD_S, down
    raise ValueError(f"unknown fault kind {kind!r}")


def make_schedule(
    seed: int, duration: float = 40.0, kinds: tuple[str, ...] | list[str] = KINDS
) -> list[Step]:
    """Steps one after another (each healed before the next), with 2–4 s between them so
    recovery can be seen; kinds come from a shuffled bag, so a long run uses all of them."""
    rng = random.Random(seed)
    steps: list[Step] = []
    bag: list[str] = []
    t = rng.uniform(2, 4)
    while True:
        if not bag:
            bag = list(kinds)
            rng.shuffle(bag)
        kind = bag.pop()
        dur, value = _duration(kind, rng)
        if t + dur > duration:
            break
        steps.append(
            Step(round(t, 3), kind, round(dur, 3), round(rng.random(), 4), round(value, 3))
        )
        t += dur + rng.uniform(2, 4)
    return steps


# -- running one schedule -------------------------------------------------------------------------


@dataclass
class Run:
    seed: int
    root: Path
    cluster: Cluster
    history: checker.History
    http: aiohttp.ClientSession
    rng: random.Random
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    paused: set[int] = field(default_factory=set)
    inflight: set[asyncio.Task[None]] = field(default_factory=set)
    cron_ids: list[str] = field(default_factory=list)
    #: per node, its lossy data directory (only when the schedule has a disk fault)
    disks: list[LossyMount] = field(default_factory=list)
    #: the network namespaces of the nodes and workers (only when the schedule has a net_ kind)
    lab: NetLab | None = None
    #: processes the harness killed, and those whose exit has been looked at
    killed: list[subprocess.Popen[bytes]] = field(default_factory=list)
    seen: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: node processes that ran while their disk was full (a stop with status 70 is expected)
    exposed: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: per node with a full disk, the task restarting it as systemd would
    supervisors: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    full_stops: int = 0
    #: per recurring job, when the harness cancelled it (wall-clock ms)
    cancelled_ms: dict[str, int] = field(default_factory=dict)
    #: the nodes (indexes in ``cluster.nodes``) that are members now: the cluster's first
    #: ones, then as the membership kinds replace and add nodes
    members: list[int] = field(default_factory=list)
    #: removed nodes' processes: each must stop by itself with status 2 (REMOVED_EXIT)
    retiring: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.members = self.members or list(range(len(self.cluster.nodes)))

    def record_file(self, worker: str) -> Path:
        return self.root / f"exec-{worker}.txt"

    @property
    def urls(self) -> list[str]:
        """The live members' API URLs."""
        return [self.cluster.nodes[i].url for i in self.members]

    def start_worker(self, name: str) -> None:
        """A worker given the live members' URLs (``Cluster.start_worker`` gives every node's,
        removed ones too)."""
        c = self.cluster
        args = [*(self.lab.prefix(name) if self.lab else []), str(BIN / "schedd-worker")]
        args += [f"--token={c.token}", "--worker-id", name]
        for url in self.urls:
            args += ["--server", url]
        args += ["--import", "tests.acceptance.tasks", "--concurrency", "8"]
        record = {"SCHEDD_TEST_RECORD": str(self.record_file(name)), "SCHEDD_TEST_RECORD_TIME": "1"}
        self.workers[name] = c.spawn(args, c.root / f"{name}.log", record)

    # -- client operations ---------------------------------------------------------------------
    async def submit(self, op: checker.Op, deadline_s: float = 30.0) -> None:
        """POST the job, retrying on every node with one X-Request-Id until acknowledged."""
        h = self.history
        body = orjson.dumps(op.body)
        headers = {
            **self.cluster.headers(),
            "X-Request-Id": f"torture-{self.seed}-{op.op}",
            "Content-Type": "application/json",
        }
        i = op.op
        delay = 0.05
        while h.now() - op.invoked < deadline_s:
            members = self.members
            node = members[i % len(members)]
            i += 1
            sent = h.now()
            try:
                async with self.http.post(
                    self.cluster.nodes[node].url + "/api/v1/jobs",
                    data=body,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=3),
                ) as r:
                    data = await r.read()
                    op.attempts.append(
                        checker.Attempt(
                            node,
                            sent,
                            h.now(),
                            r.status,
                            None if r.status < 300 else data[:200].decode(errors="replace"),
                        )
                    )
                    if r.status in (200, 201):
                        op.ok, op.completed = True, h.now()
                        op.job_id = str(orjson.loads(data)["id"])
                        return
                    if r.status not in (429, 503):
                        return  # refused for good (recorded; the report shows it)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                op.attempts.append(checker.Attempt(node, sent, h.now(), None, repr(exc)[:200]))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.4)
        op.completed = None

    def body(self, kind: str, n: int) -> dict[str, Any]:
        payload: dict[str, Any] = {"tag": f"s{self.seed}-{n}"}
        body: dict[str, Any] = {
            "task": "acc.record",
            "payload": payload,
            "retry": {"max_attempts": 10, "initial": "0.2s", "max": "2s"},
        }
        if kind == "long":
            payload["sleep"] = round(self.rng.uniform(1.0, 3.0), 2)
        elif kind == "cron":
            body["schedule"] = {"cron": "* * * * * *", "overlap": "allow"}
            payload["sleep"] = 0.05
        else:
            payload["sleep"] = round(self.rng.uniform(0.02, 0.3), 3)
        return body

    def launch(self, kind: str) -> checker.Op:
        op = self.history.new_op(kind, self.body(kind, len(self.history.ops)))
        task = asyncio.create_task(self.submit(op))
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)
        return op

    async def load(self, stop: asyncio.Event, rate: float, long_share: float) -> None:
        """Open loop: a new submission every 1/rate s whatever the ones in flight are doing, so
        the ack times of the ones started after a fault measure when writes came back."""
        h = self.history
        nxt = h.now()
        while not stop.is_set():
            if len(self.inflight) < 400:
                self.launch("long" if self.rng.random() < long_share else "oneoff")
            nxt += 1.0 / rate
            await wait_event(stop, max(0.0, nxt - h.now()))

    # -- cluster views ---------------------------------------------------------------------------
    async def leader(self, timeout: float = 4.0) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            nodes = self.cluster.nodes
            views = [
                (i, await self.cluster.view(self.http, i))
                for i in list(self.members)
                if nodes[i].alive and i not in self.paused
            ]
            claims = [
                (v["term"], i)
                for i, v in views
                if v and v["role"] == "leader" and v["leader"] == nodes[i].node_id
            ]
            if claims:
                return max(claims)[1]
            await asyncio.sleep(0.1)
        return None

    def name(self, i: int | None) -> str:
        return "none" if i is None else self.cluster.nodes[i].node_id

    # -- processes -------------------------------------------------------------------------------
    def kill(self, proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGKILL) -> None:
        """Kill a node's or a worker's process on purpose (its exit is then expected)."""
        assert proc is not None
        self.killed.append(proc)
        proc.send_signal(sig)
        proc.wait(10)

    def observe(self) -> None:
        """Look at every node and worker that has exited since the last look: an exit the
        harness did not cause (nor a full disk's status 70) goes into the history."""
        procs = [(n.node_id, n.proc) for n in self.cluster.nodes]
        procs += list(self.workers.items())
        for name, p in procs:
            if p is None or p.poll() is None or any(p is q for q in self.seen):
                continue
            self.seen.append(p)
            if any(p is q for q in self.killed):
                continue
            if p.returncode == FULL_DISK_EXIT and any(p is q for q in self.exposed):
                self.full_stops += 1
                self.history.note(f"{name} stopped on its full disk (status 70)")
                continue
            if p.returncode == REMOVED_EXIT and any(p is q for q in self.retiring):
                self.history.note(f"{name} stopped: removed from the cluster (status 2)")
                continue
            self.history.exits.append(
                f"{name} (pid {p.pid}) exited with status {p.returncode} by itself at "
                f"t={self.history.now():.1f}s; see its log"
            )

    async def supervise(self, i: int) -> None:
        """systemd's Restart=on-failure for node i: started again RestartSec after it stops."""
        while True:
            await asyncio.sleep(RESTART_SEC)
            self.observe()
            if not self.cluster.nodes[i].alive:
                self.cluster.start(i)
                self.exposed.append(self.cluster.nodes[i].proc)  # type: ignore[arg-type]

    def disk_free(self, i: int) -> None:
        task = self.supervisors.pop(i, None)
        if task is not None:
            task.cancel()
        self.disks[i].call("full off")
        self.observe()
        if not self.cluster.nodes[i].alive:
            self.cluster.start(i)

    # -- faults ------------------------------------------------------------------------------------
    async def inject(self, n: int, step: Step) -> tuple[checker.Fault, list[Any]]:
        """Start one step; returns its fault record and the actions that heal it."""
        self.observe()
        members = list(self.members)
        lead: int | None = None
        follower: int | None = None
        if step.kind not in ("worker_kill", "worker_stall", "kill_all", "power_loss"):
            lead = await self.leader()
            if lead is None:  # no leader right now: any member
                lead = members[int(step.pick * len(members)) % len(members)]
            others = [i for i in members if i != lead]
            follower = others[int(step.pick * len(others)) % len(others)]
        if step.kind in MEMBER_KINDS:
            assert lead is not None and follower is not None
            target, detail, heal = await self._member_fault(step, lead, follower)
        elif step.kind.startswith("worker_"):
            target, detail, heal = await self._worker_fault(step)
        elif step.kind in NET_KINDS:
            assert lead is not None
            target, detail, heal = self._ns_fault(step, lead)
        elif step.kind in (
            "isolate_leader",
            "isolate_follower",
            "cut_link",
            "flaky_link",
        ) or step.kind.startswith("one_way"):
            assert lead is not None and follower is not None
            if self.lab is not None:
                target, detail, heal = self._lab_network_fault(step, lead, follower)
            else:
                target, detail, heal = self._network_fault(step, lead, follower)
        else:
            target, detail, heal = self._node_fault(step, lead, follower)
        shift = step.value if step.kind == "clock_skew" else 0.0
        fault = self.history.fault_started(
            n, step.kind, target, detail, step.kind in KEEPS_MAJORITY, shift
        )
        if step.kind == "wipe_follower":
            fault.wiped = target
        return fault, heal

    def _node_fault(
        self, step: Step, lead: int | None, follower: int | None
    ) -> tuple[str, str, list[Any]]:
        c = self.cluster
        kind = step.kind
        if kind in ("kill_all", "power_loss"):
            for i in self.members:
                self.kill(c.nodes[i].proc)
            restart = f"restart after {step.duration:.1f}s"
            if kind == "power_loss":
                seed = int(step.pick * 10_000)
                undone = [
                    self.disks[i].crash("random", seed + k) for k, i in enumerate(self.members)
                ]
                restart = f"unsynced writes undone {undone}, {restart}"
            return ",".join(self.name(i) for i in self.members), restart, [("start_all",)]
        if kind == "slow_disk":
            victim = lead if step.pick < 0.5 else follower
            assert victim is not None
            self.disks[victim].call(f"seed {int(step.pick * 10_000)}")
            self.disks[victim].call("delay 50 500")
            role = "leader" if victim == lead else "follower"
            return self.name(victim), f"{role}, fsync +50-500 ms", [("fast_disk", victim)]
        if kind == "disk_full":
            victim = lead if step.pick < 0.5 else follower
            assert victim is not None
            names = "raft.journal" if int(step.pick * 100) % 2 == 0 else "state.db,state.db-wal"
            self.disks[victim].call(f"full {names} {int(step.value * 1024)}")
            self.exposed.append(c.nodes[victim].proc)  # type: ignore[arg-type]
            self.supervisors[victim] = asyncio.create_task(self.supervise(victim))
            role = "leader" if victim == lead else "follower"
            return (
                self.name(victim),
                f"{role}: {names} may grow {step.value:.0f} KiB more, then ENOSPC",
                [("disk_free", victim)],
            )
        if kind == "clock_skew":
            victim = lead if step.pick < 0.5 else follower
            assert victim is not None
            c.set_clock_offset(victim, step.value)
            role = "leader" if victim == lead else "follower"
            return self.name(victim), f"{role}, wall clock {step.value:+.1f}s", [("clock", victim)]
        victim = lead if kind.endswith("_leader") else follower
        assert victim is not None
        if kind.startswith("kill_"):
            self.kill(c.nodes[victim].proc)
            return self.name(victim), f"restart after {step.duration:.1f}s", [("start", victim)]
        if kind == "wipe_follower":
            self.kill(c.nodes[victim].proc)
            since = c.log_size(victim)  # its log's lines from the restart on tell how it came back
            gone = c.wipe(victim)
            return (
                self.name(victim),
                f"data directory wiped ({', '.join(gone)}); restart after {step.value:.1f}s",
                [("start", victim), ("rebuilt", victim, since)],
            )
        assert kind.startswith("pause_"), kind
        c.kill(victim, signal.SIGSTOP)
        self.paused.add(victim)
        return self.name(victim), f"SIGSTOP for {step.duration:.1f}s", [("cont", victim)]

    def _network_fault(self, step: Step, lead: int, follower: int) -> tuple[str, str, list[Any]]:
        net = self.cluster.net
        members = self.members
        others = [i for i in members if i != lead]
        kind = step.kind
        if kind in ("isolate_leader", "isolate_follower"):
            victim = lead if kind == "isolate_leader" else follower
            net.isolate(victim)
            return self.name(victim), "partitioned from the other two", [("heal",)]
        if kind == "cut_link":
            net.cut(lead, follower)
            return f"{self.name(lead)}<->{self.name(follower)}", "only this link", [("heal",)]
        if kind == "one_way_leader_out":
            for o in others:
                net.cut_one_way(lead, o)
            return self.name(lead), "its frames to the followers dropped", [("heal",)]
        if kind == "one_way_leader_in":
            for o in others:
                net.cut_one_way(o, lead)
            return self.name(lead), "the followers' frames to it dropped", [("heal",)]
        assert kind == "flaky_link", kind
        for a in members:
            for b in members:
                if a != b:
                    net.delay(a, b, step.value)
        k = int(step.pick * len(members)) % len(members)
        a, b = members[k], members[(k + 1) % len(members)]
        net.drop(a, b, 0.02)
        net.drop(b, a, 0.02)
        return (
            f"all links +{step.value:.0f}ms, {self.name(a)}<->{self.name(b)} drop 2%",
            "",
            [("heal",)],
        )

    def _ns_fault(self, step: Step, lead: int) -> tuple[str, str, list[Any]]:
        """The net_ kinds: packets dropped by nftables between namespaces."""
        lab = self.lab
        assert lab is not None
        leader = self.name(lead)
        if step.kind == "net_isolate_leader":
            lab.cut(leader, *[h for h in [*lab.hosts, CLIENT] if h != leader])
            return leader, "cut from the other nodes, the workers and the client", [("heal",)]
        if step.kind == "net_cut_worker":
            names = sorted(self.workers)
            wname = names[int(step.pick * len(names)) % len(names)]
            lab.cut(wname, leader)
            return f"{wname}<->{leader}", f"for {step.duration:.1f}s", [("heal",)]
        assert step.kind == "net_cut_client", step.kind
        lab.cut(CLIENT, leader)
        return f"client<->{leader}", "the client's requests there hang", [("heal",)]

    def _lab_network_fault(
        self, step: Step, lead: int, follower: int
    ) -> tuple[str, str, list[Any]]:
        """The Raft proxy's kinds, as nftables rules between the nodes' namespaces."""
        lab = self.lab
        assert lab is not None
        nodes = [self.name(i) for i in self.members]
        leader = self.name(lead)
        others = [n for n in nodes if n != leader]
        kind = step.kind
        if kind in ("isolate_leader", "isolate_follower"):
            victim = leader if kind == "isolate_leader" else self.name(follower)
            lab.cut(victim, *[n for n in nodes if n != victim])
            return victim, "every packet to and from the other two dropped", [("heal",)]
        if kind == "cut_link":
            lab.cut(leader, self.name(follower))
            return f"{leader}<->{self.name(follower)}", "only this pair", [("heal",)]
        if kind == "one_way_leader_out":
            for o in others:
                lab.cut_one_way(leader, o)
            return leader, "its packets to the followers dropped", [("heal",)]
        if kind == "one_way_leader_in":
            for o in others:
                lab.cut_one_way(o, leader)
            return leader, "the followers' packets to it dropped", [("heal",)]
        assert kind == "flaky_link", kind
        a = int(step.pick * len(nodes)) % len(nodes)
        b = (a + 1) % len(nodes)
        heavy = round(10 + (step.value - 30) / 90 * 20)  # 10-30 %, from the proxy's delay draw
        for i in range(len(nodes)):
            for j in range(i + 1, len(nodes)):
                lab.loss(nodes[i], nodes[j], 2)
        lab.loss(nodes[a], nodes[b], heavy)
        return (
            f"every link between nodes loses 2 %, {nodes[a]}<->{nodes[b]} {heavy} %",
            "",
            [("heal",)],
        )

    def heal_net(self) -> None:
        if self.lab is not None:
            self.lab.heal()
        if self.cluster.net is not None:
            self.cluster.net.heal()

    async def _worker_fault(self, step: Step) -> tuple[str, str, list[Any]]:
        names = sorted(self.workers)
        wname = names[int(step.pick * len(names)) % len(names)]
        proc = self.workers[wname]
        held = await self.leases_of(wname)
        if step.kind == "worker_kill":
            self.kill(proc)
            return (
                wname,
                f"holding {held} leases; restart after {step.duration:.1f}s",
                [("worker_start", wname)],
            )
        proc.send_signal(signal.SIGSTOP)
        return (
            wname,
            f"holding {held} leases; SIGSTOP {step.duration:.1f}s > heartbeat timeout",
            [("worker_cont", wname)],
        )

    async def leases_of(self, worker: str) -> int | None:
        for url in self.urls:
            try:
                async with self.http.get(
                    url + "/api/v1/workers",
                    headers=self.cluster.headers(),
                    timeout=aiohttp.ClientTimeout(total=1),
                ) as r:
                    if r.status == 200:
                        for w in (await r.json())["workers"]:
                            if w["worker_id"] == worker:
                                return int(w["leases"])
                        return 0
            except (aiohttp.ClientError, TimeoutError):
                continue
        return None

    def do_heal(self, actions: list[Any]) -> None:
        """Carry out a step's healing actions (``rebuilt`` is awaited by :meth:`play` after)."""
        c = self.cluster
        self.observe()
        for action in actions:
            what = action[0]
            if what == "start":
                c.start(action[1])
            elif what == "start_all":
                for i in self.members:
                    c.start(i)
            elif what == "cont":
                c.kill(action[1], signal.SIGCONT)
                self.paused.discard(action[1])
            elif what == "heal":
                self.heal_net()
            elif what == "clock":
                c.set_clock_offset(action[1], 0)
            elif what == "worker_start":
                self.start_worker(action[1])
            elif what == "worker_cont":
                self.workers[action[1]].send_signal(signal.SIGCONT)
            elif what == "fast_disk":
                self.disks[action[1]].call("delay 0")
            elif what == "disk_free":
                self.disk_free(action[1])

    def heal_everything(self) -> None:
        c = self.cluster
        self.heal_net()
        for i in list(self.supervisors):
            self.disk_free(i)
        self.observe()
        for disk in self.disks:
            disk.call("delay 0")
        for i, n in enumerate(c.nodes):
            if c.clock_skew:
                c.set_clock_offset(i, 0)
            if n.alive:
                n.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        self.paused.clear()
        for i in self.members:  # never a removed node
            c.start(i)
        for name, proc in list(self.workers.items()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
            else:
                self.start_worker(name)

    async def play(self, steps: list[Step]) -> None:
        h = self.history
        start = h.now()
        for n, step in enumerate(steps):
            await asyncio.sleep(max(0.0, start + step.at - h.now()))
            fault, heal = await self.inject(n, step)
            await asyncio.sleep(max(0.0, fault.started + step.heal_after - h.now()))
            self.do_heal(heal)
            h.fault_healed(fault)
            for action in heal:
                if action[0] == "rebuilt":
                    await self.rebuilt(fault, action[1], action[2])
                elif action[0] == "replace":
                    await self.replace(fault, action[1])
                elif action[0] == "promoted":
                    await self.promoted(fault, *action[1:])
                elif action[0] == "retire":
                    await self.retire(fault, action[1])

    async def rebuilt(self, fault: checker.Fault, i: int, since: int) -> None:
        """Wait until node i, restarted empty, has applied the leader's commit index (read
        before its own applied index), at most checker.REBUILD_BOUND_S from its restart; write
        down how long it took and whether it installed a whole copy of the state (its log from
        byte ``since``) or was sent the leader's log."""
        h = self.history
        assert fault.healed is not None
        if await self.caught_up(i, fault.healed + checker.REBUILD_BOUND_S):
            fault.rebuilt_s = round(h.now() - fault.healed, 3)
        installs = self.cluster.log_events(i, SNAPSHOT_INSTALL_EVENTS, since)
        fault.rebuilt_by = "snapshot" if installs else "log"
        if fault.rebuilt_s is None:
            h.note(
                f"{self.name(i)} not caught up {checker.REBUILD_BOUND_S:g}s after its restart "
                f"(a whole copy installed: {bool(installs)})"
            )
        else:
            h.note(
                f"{self.name(i)} rebuilt {fault.rebuilt_s}s after its restart, "
                + ("from a whole copy of the state" if installs else "from the leader's log")
            )

    # -- membership changes ------------------------------------------------------------------------
    async def _member_fault(
        self, step: Step, lead: int, follower: int
    ) -> tuple[str, str, list[Any]]:
        c = self.cluster
        if step.kind == "replace_node":
            self.kill(c.nodes[follower].proc)
            return (
                self.name(follower),
                f"follower SIGKILLed; removed after {step.value:.1f}s, a new node started at a "
                "new address with raft.join, the removed one started again with its data",
                [("replace", follower)],
            )
        assert step.kind == "add_interrupted", step.kind
        h = self.history
        new = self.add_node()
        addr = raft_addr(c, new)
        started = h.now()
        c.start(new)
        self.members.append(new)
        role = None
        while role is None and h.now() - started < JOIN_WAIT_S:
            view = await self.nodes_view(lead)
            role = None if view is None else _role(view, addr)
            if role is None:
                await asyncio.sleep(0.05)
        self.kill(c.nodes[lead].proc)
        as_seen = f"a {role}" if role else "not yet a member"
        return (
            f"{self.name(lead)} (leader), {self.name(new)} joining",
            f"{self.name(new)} started with raft.join; the leader SIGKILLed "
            f"{h.now() - started:.2f}s later, {self.name(new)} then {as_seen} in its "
            f"membership; restart after {step.value:.1f}s",
            [("start", lead), ("promoted", new, started, role), ("retire", lead)],
        )

    def add_node(self) -> int:
        """A new node's config, at a new address (its own namespace and new ports, its own
        lossy mount in a disk schedule), with raft.join naming the live members' APIs."""
        c = self.cluster
        name = f"n{len(c.nodes) + 1}"
        assert self.lab is not None and name in self.lab.ip, f"no namespace ready for {name}"
        raft = {**c.raft, "join": self.urls}
        port = NETNS_HTTP_PORT + 10 * (len(c.nodes) - 2)  # 17700 + 10, + 20, ...
        i = new_node(
            c, name, raft, self.lab.ip[name], self.lab.prefix(name), port, c.scheduler, c.shards
        )  # fmt: skip
        if self.disks:
            assert self.disks[i].mountpoint == c.data_dir(i), f"no lossy mount ready for {name}"
        if c.clock_skew:
            c.clock_file(i).write_text("0\n")
        return i

    async def gone(self, via: int, i: int) -> bool:
        """Whether node i is no member of any shard's group, as node ``via`` sees them."""
        c = self.cluster
        for k in range(c.shards):
            try:
                view = await asyncio.wait_for(
                    members_view(self.http, c, via, k if c.shards > 1 else None), 5.0
                )
            except TimeoutError:
                view = None
            host, port = raft_addr(c, i).rsplit(":", 1)
            if view is None or _role(view, f"{host}:{int(port) + k}") is not None:
                return False
        return True

    async def shard_members(self, k: int) -> dict[str, Any]:
        """Shard k's group as every live member sees it at the end (its Raft addresses are the
        nodes' Raft ports + k), and what names each address."""
        alias = {
            shard_address(raft_addr(self.cluster, i), k): self.name(i)
            for i in range(len(self.cluster.nodes))
        }
        headers = {**self.cluster.headers(), "X-Schedd-Shard": str(k)}
        views = await checker.read_members(self.http, self.urls, headers, alias)
        return {"views": views, "alias": alias}

    async def nodes_view(self, i: int, timeout: float = 1.0) -> dict[str, Any] | None:
        """Node i's ``GET /api/v1/cluster/nodes``, or None."""
        try:
            return await asyncio.wait_for(members_view(self.http, self.cluster, i), timeout)
        except TimeoutError:
            return None

    async def remove(self, fault: checker.Fault, i: int) -> bool:
        """``DELETE /api/v1/cluster/nodes/{id}`` through the live members (a follower forwards
        it), retried while they answer 503 or not at all, at most JOIN_WAIT_S; whether node i
        was removed (and is no member from now on).  A removal refused goes into the history
        (membership_divergence), and node i stays a member."""
        h = self.history
        node = self.cluster.nodes[i]
        fault.removed = node.node_id
        at = self.members.index(i)
        self.members.remove(i)
        if node.proc is not None:
            self.retiring.append(node.proc)  # it stops by itself (status 2) if it runs
        began = h.now()
        got: Any = "no answer"
        k = 0
        while h.now() - began < JOIN_WAIT_S:
            via = self.members[k % len(self.members)]
            k += 1
            try:
                status, got = await call(
                    self.http, self.cluster, via, "DELETE", f"{NODES}/{node.node_id}"
                )
            except (aiohttp.ClientError, TimeoutError) as exc:
                status, got = None, repr(exc)[:200]
            if status == 200:
                h.note(f"{node.node_id} removed ({h.now() - began:.2f}s)")
                return True
            if status not in (None, 503):
                if await self.gone(via, i):
                    h.note(f"{node.node_id} removed (an earlier try went through)")
                    return True
                if status != 409:  # (409: another change in flight in some shard: again)
                    break
            await asyncio.sleep(0.2)
        h.membership.append(f"fault {fault.step} {fault.kind}: removing {node.node_id}: {got}")
        h.note(f"{node.node_id} not removed: {got}")
        self.members.insert(at, i)
        self.retiring = [p for p in self.retiring if p is not node.proc]
        return False

    async def replace(self, fault: checker.Fault, old: int) -> None:
        """The dead follower removed, a new node in its place; the removed one started once
        more with its data: it must be refused (status 2)."""
        c = self.cluster
        if not await self.remove(fault, old):
            c.start(old)  # still a member: back as after a kill_follower
            return
        new = self.add_node()
        started = self.history.now()
        c.start(new)
        self.members.append(new)
        c.start(old)
        self.retiring.append(c.nodes[old].proc)  # type: ignore[arg-type]
        await self.promoted(fault, new, started)
        await self.stopped(fault, old)

    async def promoted(
        self, fault: checker.Fault, new: int, started: float, role: str | None = ""
    ) -> None:
        """Wait until the leader lists node ``new`` as a voter, at most PROMOTE_WAIT_S from its
        start; write down how long that took (and, for add_interrupted, what it was when the
        leader was killed: ``role``)."""
        h = self.history
        fault.joined = self.name(new)
        if role != "":
            fault.learner_at_kill = role == "learner"
        addr = raft_addr(self.cluster, new)
        while h.now() - started < PROMOTE_WAIT_S and self.cluster.nodes[new].alive:
            lead = await self.leader(timeout=max(0.1, started + PROMOTE_WAIT_S - h.now()))
            view = None if lead is None else await self.nodes_view(lead)
            if view is not None and _role(view, addr) == "voter":
                fault.promoted_s = round(h.now() - started, 3)
                h.note(f"{fault.joined} a voter {fault.promoted_s}s after its start")
                return
            await asyncio.sleep(0.1)
        h.note(f"{fault.joined} not seen a voter (it runs: {self.cluster.nodes[new].alive})")

    async def retire(self, fault: checker.Fault, i: int) -> None:
        """add_interrupted's end: the node that was killed, once caught up since its restart
        (at most RETIRE_WAIT_S), removed: back to three voters.  It runs: it must stop by
        itself (status 2)."""
        await self.caught_up(i, self.history.now() + RETIRE_WAIT_S)
        if await self.remove(fault, i):
            await self.stopped(fault, i)

    async def stopped(self, fault: checker.Fault, i: int) -> None:
        """Wait until removed node i stops, at most RETIRE_WAIT_S; one still running then is a
        membership divergence (and is killed)."""
        h = self.history
        proc = self.cluster.nodes[i].proc
        assert proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(proc.wait, RETIRE_WAIT_S)
        fault.refused = proc.poll() == REMOVED_EXIT
        if proc.poll() is None:
            self.kill(proc)
            h.membership.append(
                f"fault {fault.step} {fault.kind}: {self.name(i)} was removed and still ran "
                f"{RETIRE_WAIT_S:g}s later"
            )
        self.observe()  # another status than 2 is an unexpected exit

    async def caught_up(self, i: int, deadline: float) -> bool:
        """Whether node i applies the leader's commit index (read before its own applied
        index) before ``deadline`` (the history's time)."""
        h = self.history
        while h.now() < deadline:
            lead = await self.leader(timeout=max(0.1, deadline - h.now()))
            theirs = None if lead is None else await self.cluster.view(self.http, lead)
            mine = await self.cluster.view(self.http, i)
            if theirs and mine and mine["applied_index"] >= theirs["commit_index"]:
                return True
            await asyncio.sleep(0.1)
        return False

    # -- after the schedule ------------------------------------------------------------------------
    async def cancel_crons(self) -> None:
        for k, job_id in enumerate(self.cron_ids):
            headers = {**self.cluster.headers(), "X-Request-Id": f"torture-{self.seed}-cancel-{k}"}
            for attempt in range(100):
                url = self.urls[attempt % len(self.urls)]
                try:
                    async with self.http.delete(
                        f"{url}/api/v1/jobs/{job_id}",
                        headers=headers,
                        timeout=aiohttp.ClientTimeout(total=5),
                    ) as r:
                        if r.status in (204, 404):
                            self.cancelled_ms[job_id] = int(time.time() * 1000)
                            break
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.2)
            self.history.note(f"cron job {job_id} cancelled")

    async def active_jobs(self) -> int | None:
        for url in self.urls:
            try:
                async with self.http.get(
                    url + "/api/v1/jobs?status=active&limit=1000",
                    headers=self.cluster.headers(),
                    timeout=aiohttp.ClientTimeout(total=5),
                ) as r:
                    if r.status == 200:
                        return len((await r.json())["jobs"])
            except (aiohttp.ClientError, TimeoutError):
                continue
        return None

    async def settle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self.active_jobs() == 0:
                self.history.note("settled: no active job")
                return
            await asyncio.sleep(0.5)
        self.history.note(
            f"not settled after {timeout:.0f}s: {await self.active_jobs()} active jobs"
        )


async def run_schedule(
    seed: int,
    root: Path,
    *,
    duration: float = 40.0,
    kinds: tuple[str, ...] | list[str] = KINDS,
    rate: float = 8.0,
    long_share: float = 0.15,
    cron_jobs: int = 3,
    bound_s: float = FAILOVER_BOUND_S,
    settle_timeout: float = 60.0,
    compaction: tuple[int, str] = (1000, "10s"),
    shards: int = 1,
) -> dict[str, Any]:
    """Play ``make_schedule(seed, duration, kinds)`` on a fresh cluster in ``root`` and check
    the history.  Every process started here is stopped by PID before this returns.

    ``shards`` > 1: a cluster of that many shards (every node a supervisor with a process per
    shard).  "The leader" is then shard 0's leader (each node leads a shard, so every node
    fault hits one), the Raft proxy's kinds are nftables rules in network namespaces (the
    proxy has one port per node), and the checker waits for every shard's group to converge."""
    steps = make_schedule(seed, duration, kinds)
    began = time.monotonic()
    mounts = contextlib.ExitStack()
    try:  # namespaces and mounts made so far go again if the setup fails
        raft: dict[str, Any] = {
            "log_compaction_min_entries": compaction[0],
            "log_compaction_min_time": compaction[1],
        }
        where: dict[str, Any] = {"proxied": shards == 1}  # (one proxy port per node)
        lab: NetLab | None = None
        nodes = ["n1", "n2", "n3"]
        # the nodes the membership steps will add: a namespace and a lossy mount ready for each
        spare = [
            f"n{len(nodes) + 1 + k}"
            for k, s in enumerate(s for s in steps if s.kind in MEMBER_KINDS)
        ]
        proxy_kinds = {s.kind for s in steps} & PROXY_KINDS if shards > 1 else set()
        if proxy_kinds or (NET_KINDS | MEMBER_KINDS).intersection(s.kind for s in steps):
            lab = mounts.enter_context(NetLab([*nodes, *spare, *WORKERS]))
            where = {
                "hosts": [lab.ip[n] for n in nodes],
                "launch": [lab.prefix(n) for n in nodes],
                "http_ports": [NETNS_HTTP_PORT] * len(nodes),
            }
            key = root / "raft.key"  # off loopback, the nodes need a Raft secret
            root.mkdir(parents=True, exist_ok=True)
            key.write_text(secrets.token_hex(48) + "\n")
            key.chmod(0o600)
            raft["secret_file"] = str(key)
        cluster = Cluster(
            root / "cluster",
            clock_skew=True,
            scheduler={
                "heartbeat_interval": f"{HEARTBEAT_INTERVAL_S}s",
                "heartbeat_timeout": f"{HEARTBEAT_TIMEOUT_S}s",
            },
            raft=raft,
            shards=shards,
            **where,
        )
        history = checker.History()
        states: list[checker.NodeState] = []
        info: dict[str, Any] = {}
        membership: dict[str, Any] | None = None  # the members' views at the end
        run: Run | None = None
        disks: list[LossyMount] = []
        if DISK_KINDS.intersection(s.kind for s in steps):
            disks = [
                mounts.enter_context(
                    LossyMount(root / "disk" / n, cluster.root / n, root / f"{n}.fs.log")
                )
                for n in [*nodes, *spare]
            ]  # fmt: skip
    except BaseException:
        mounts.close()
        raise
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            run = Run(seed, root, cluster, history, http, random.Random(seed ^ 0x5EED))
            run.disks = disks
            run.lab = lab
            await cluster.wait_serving(http)
            for name in WORKERS:
                run.start_worker(name)
            crons = [run.launch("cron") for _ in range(cron_jobs)]
            await asyncio.gather(*list(run.inflight))
            run.cron_ids = [op.job_id for op in crons if op.job_id]
            history.note(f"cluster up; schedule of {len(steps)} steps starts")
            stop = asyncio.Event()
            loader = asyncio.create_task(run.load(stop, rate, long_share))
            try:
                await run.play(steps)
            finally:
                try:
                    run.heal_everything()
                    history.note("everything healed")
                    await asyncio.sleep(2.0)  # some load after the last heal, then stop it
                finally:
                    stop.set()
                    await loader
            await asyncio.gather(*list(run.inflight))
            await run.cancel_crons()
            await run.settle(settle_timeout)
            names = [run.name(i) for i in run.members]
            states, info = await checker.collect(
                http, run.urls, cluster.headers(), nodes=run.members
            )
            alias = {raft_addr(cluster, i): run.name(i) for i in range(len(cluster.nodes))}
            if cluster.net is not None:  # behind the proxy, the others know node i by its port
                for i, port in enumerate(cluster.net.proxy_ports):
                    alias[f"{cluster.net.host}:{port}"] = run.name(i)
            membership = {
                "names": names,
                "expected": names,
                "alias": alias,
                "views": await checker.read_members(http, run.urls, cluster.headers(), alias),
                "shards": {k: await run.shard_members(k) for k in range(1, shards)},
            }
            run.observe()
    finally:
        try:
            cluster.stop()
        finally:
            mounts.close()
    workers = sorted(run.workers if run else {})
    report = checker.check_recorded(
        history,
        states,
        info,
        [root / f"exec-{w}.txt" for w in workers],
        [root / "cluster" / f"{w}.log" for w in workers],
        bound_s=bound_s,
        cron_jobs=run.cron_ids if run else [],
        members=membership,
    )
    report["seed"] = seed
    report["schedule"] = [asdict(s) | {"text": s.describe()} for s in steps]
    report["elapsed_s"] = round(time.monotonic() - began, 1)
    report["proxy"] = dict(cluster.net.stats) if cluster.net else {}
    report["members"] = [] if run is None else [run.name(i) for i in run.members]
    return report


def _role(view: dict[str, Any], raft: str) -> str | None:
    """The role of the node at Raft address ``raft`` in a ``/cluster/nodes`` answer."""
    return next((str(n["role"]) for n in view["nodes"] if n["raft"] == raft), None)


def summary_line(report: dict[str, Any]) -> str:
    inv = report["invariants"]
    bad = {k: n for k, n in inv.items() if n}
    return (
        f"seed {report['seed']}: {'OK  ' if report['ok'] else 'FAIL'} "
        f"{report['ops']['acknowledged']}/{report['ops']['submitted']} acked, "
        f"{report['runs'].get('runs', 0)} runs, {report['executions']} executions, "
        f"{len(report['faults'])} faults ({', '.join(f['kind'] for f in report['faults'])}), "
        f"failover p50 {report['failover_p50_s']}s max {report['failover_max_s']}s, "
        f"{report['elapsed_s']}s" + (f" VIOLATIONS {bad}" if bad else "")
    )
