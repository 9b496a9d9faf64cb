"""Membership changes (docs/operations.md, "Membership") on a real cluster whose nodes live in
network namespaces of their own (tests/cluster/netns.py), each new node in a new namespace with
an address no node had before, under an open-loop load of submits and a worker (in its own
namespace) executing the runs; the whole history goes to tests/cluster/checker.py, and every
invariant must be 0: no acknowledged job lost, no duplicate id, no overlapping leases or
duplicate fires, every replica the same, every member with the same membership (the one the
test made) and no learner left.

* Replace a dead node: three nodes, a follower's VM dies (SIGKILL, and every packet to and from
  its address dropped from then on); ``schedctl node remove`` it, then a new node at a new
  address joins by ``raft.join`` with an empty data directory and is promoted.  The two
  survivors are a majority throughout: writes never stop for :data:`GAP_BOUND_S`.
* Grow to five, shrink to three: one node joins by ``raft.join``, the next is added by
  ``schedctl node add`` and started with ``raft.peers``, each once the previous one is a voter;
  then a follower and the leader (which hands over first) are removed.
* A lost majority: the load quiesced and every job on every node, two VMs die for good; the
  survivor answers no write; stopped, ``schedd recover --force-new-cluster`` runs in its
  namespace; started again it leads alone, and two new nodes join by ``raft.join`` under load.
  Every job acknowledged before the loss is on the new cluster's three nodes.

Each prints what it measured (``pytest -s``): how long each new node took from its start to be
a voter, the write latency (the request that was acknowledged) p50/p99 while the membership
changed, and the longest time without an acknowledgement.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import random
import signal
import statistics
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.cluster import checker
from tests.cluster.faults import REMOVED_EXIT, Run
from tests.cluster.harness import BIN, Cluster
from tests.cluster.members import (
    check_members_hold,
    exit_status,
    leader_of,
    members,
    new_node,
    raft_addr,
    schedctl,
    wait_voter,
)
from tests.cluster.netns import CLIENT, NetLab, available
from tests.cluster.test_membership import RAFT
from tests.cluster.test_partitions import HTTP_PORT, partitioned
from tests.conftest import wait_for

pytestmark = [
    pytest.mark.long,
    pytest.mark.cluster,
    pytest.mark.timeout(150),
    pytest.mark.skipif(available() is not None, reason=str(available())),
]

WORKER = "w1"
RATE = 8.0  # submits a second, open loop (tests/cluster/faults.py: Run.load)
LONG_SHARE = 0.1  # of them jobs that run 1-3 s
#: the longest time without an acknowledged submit while a majority of the voters is up (and
#: the checker's bound from each change's start to the first acknowledgement after it)
GAP_BOUND_S = 5.0
#: the checker's bound from the recovered survivor's start to the first acknowledgement
RECOVERED_BOUND_S = 10.0


@dataclasses.dataclass
class Lab:
    """A cluster in a NetLab under load, its history recorded for the checker.  ``run.members``
    are the nodes that are members now: where the load goes, and what the checker reads."""

    net: NetLab
    cluster: Cluster
    http: aiohttp.ClientSession
    run: Run
    dead: list[str] = dataclasses.field(default_factory=list)
    figures: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def of(
        cls, net: NetLab, cluster: Cluster, http: aiohttp.ClientSession, root: Path, seed: int
    ) -> Lab:
        history = checker.History()
        run = Run(seed, root, cluster, history, http, random.Random(seed ^ 0x5EED))
        run.lab = net
        return cls(net, cluster, http, run)

    @property
    def history(self) -> checker.History:
        return self.run.history

    def acked(self) -> int:
        return sum(1 for op in self.history.ops if op.ok)

    async def more(self, n: int, timeout: float = 60) -> None:
        """Until ``n`` more submits are acknowledged."""
        target = self.acked() + n
        await wait_for(lambda: self.acked() >= target, timeout=timeout, interval=0.1)

    @contextlib.asynccontextmanager
    async def load(self) -> AsyncIterator[None]:
        """The open-loop load while inside; every submit it started has ended after."""
        stop = asyncio.Event()
        loader = asyncio.create_task(self.run.load(stop, RATE, LONG_SHARE))
        try:
            yield
        finally:
            stop.set()
            await loader
            await asyncio.gather(*list(self.run.inflight))

    def vm(self, name: str, raft: dict[str, Any]) -> int:
        """A new VM: a namespace with a new address, and a node's config there (not started),
        with the cluster's [raft] and [scheduler] settings and ``raft``; its index."""
        self.net.add(name)
        for gone in self.dead:  # a dead VM's address answers nobody, the new one neither
            self.net.cut(gone, name)
        c = self.cluster
        ip, prefix = self.net.ip[name], self.net.prefix(name)
        return new_node(c, name, {**c.raft, **raft}, ip, prefix, HTTP_PORT, c.scheduler)

    def start(self, i: int) -> None:
        """Node i started, a member from now on (the load goes there too)."""
        self.cluster.start(i)
        self.run.members.append(i)

    def die(self, *nodes: int) -> None:
        """These nodes' VMs die at once: SIGKILL to all, then every packet to or from their
        addresses dropped.  (One after the other, the survivors could elect a leader between
        the two deaths, which may take writes it can no longer commit.)"""
        procs = [self.cluster.nodes[i].proc for i in nodes]
        for proc in procs:
            assert proc is not None
            proc.kill()
            self.run.killed.append(proc)
        for proc in procs:
            assert proc is not None
            proc.wait(10)
        for i in nodes:
            name = self.cluster.nodes[i].node_id
            self.dead.append(name)
            self.net.cut(name, *[h for h in [*self.net.hosts, CLIENT] if h != name])

    def removing(self, i: int) -> None:
        """Node i is being removed: no member from now on; running, it must stop by itself
        with status 2."""
        self.run.members.remove(i)
        proc = self.cluster.nodes[i].proc
        if proc is not None and proc.poll() is None:
            self.run.retiring.append(proc)

    def removed(self, i: int) -> None:
        """Node i, removed, stopped by itself saying why."""
        assert exit_status(self.cluster, i) == REMOVED_EXIT
        assert "was removed from its cluster" in self.cluster.nodes[i].log.read_text()

    def measure(self, what: str, start: float, end: float) -> dict[str, float]:
        """The submits acknowledged between ``start`` and ``end`` (history seconds): how many,
        the latency p50/p99 of the acknowledged requests sent in that time, and the longest
        time without an acknowledgement (from ``start``, up to ``end``)."""
        ops = [
            op
            for op in self.history.ops
            if op.ok and op.completed is not None and start <= op.completed <= end
        ]
        write = [a.done - a.sent for a in (op.attempts[-1] for op in ops) if a.sent >= start]
        cuts = statistics.quantiles(write, n=100, method="inclusive")
        times = sorted([start, end, *(op.completed for op in ops if op.completed is not None)])
        fig = {
            "acks": len(ops),
            "p50_ms": round(cuts[49] * 1000, 1),
            "p99_ms": round(cuts[98] * 1000, 1),
            "gap_s": round(max(b - a for a, b in itertools.pairwise(times)), 2),
        }
        self.figures.append(
            f"{what}: {fig['acks']} acks in {end - start:.1f}s, write p50 {fig['p50_ms']:.0f} ms "
            f"p99 {fig['p99_ms']:.0f} ms, longest gap between acks {fig['gap_s']:.2f}s"
        )
        return fig

    async def check(self, live: list[int], bound_s: float, root: Path) -> dict[str, Any]:
        """Once the jobs are done: every member (``live``, and no other) read, the history
        checked, every invariant 0 (the membership ones too)."""
        c, run = self.cluster, self.run
        assert sorted(run.members) == sorted(live), (run.members, live)
        await run.settle(60)
        states, info = await checker.collect(self.http, run.urls, c.headers(), nodes=run.members)
        names = [c.nodes[i].node_id for i in run.members]
        alias = {raft_addr(c, i): n.node_id for i, n in enumerate(c.nodes)}
        views = await checker.read_members(self.http, run.urls, c.headers(), alias)
        run.observe()
        report = checker.check_recorded(
            self.history,
            states,
            info,
            [run.record_file(WORKER)],
            [c.root / f"{WORKER}.log"],
            bound_s=bound_s,
            cron_jobs=[],
            members={"names": names, "expected": names, "alias": alias, "views": views},
        )
        (root / "report.json").write_text(json.dumps(report, indent=1, default=str))
        ops = [dataclasses.asdict(op) for op in self.history.ops]  # each HTTP attempt: when, where
        (root / "history.json").write_text(json.dumps(ops, default=str))
        bad = {k: n for k, n in report["invariants"].items() if n}
        assert not bad and report["ok"], (bad, report["violations"], report["notes"])
        assert report["executions"] > 0 and report["ops"]["acknowledged"] > 0
        self.figures.append(
            f"checker: {report['ops']['acknowledged']}/{report['ops']['submitted']} acked, "
            f"{report['runs'].get('runs', 0)} runs, {report['executions']} executions, "
            f"every invariant 0"
        )
        return report

    def print(self) -> None:
        print("\n" + "\n".join(f"  {line}" for line in self.figures))


async def voters_and_quorum(lab: Lab, i: int) -> tuple[set[str], int]:
    view = await members(lab.http, lab.cluster, i)
    assert view is not None
    return {n["id"] for n in view["nodes"] if n["role"] == "voter"}, int(view["quorum"])


@contextlib.asynccontextmanager
async def three_nodes(tmp_path: Path, seed: int) -> AsyncIterator[tuple[Lab, int]]:
    """Three nodes and the worker, each in a namespace of its own, all serving: the lab, and
    the leader's index."""
    with partitioned(tmp_path, workers=(WORKER,), raft=dict(RAFT)) as (netlab, cluster):
        async with aiohttp.ClientSession() as http:
            lab = Lab.of(netlab, cluster, http, tmp_path, seed)
            leader = await cluster.wait_serving(http)
            lab.run.start_worker(WORKER)
            yield lab, leader


async def test_a_dead_node_is_replaced_by_a_new_one_at_a_new_address(tmp_path: Path) -> None:
    async with three_nodes(tmp_path, seed=1) as (lab, leader):
        cluster, http, h = lab.cluster, lab.http, lab.history
        dead = max(i for i in range(3) if i != leader)  # a follower
        name = cluster.nodes[dead].node_id
        live = [i for i in range(3) if i != dead]
        async with lab.load():
            await lab.more(80)
            t0 = h.now()
            death = h.fault_started(0, "vm_dies", name, "SIGKILL, its packets dropped", True)
            lab.die(dead)
            await lab.more(16)  # two of three: writes go on
            lab.removing(dead)
            code, out = await schedctl(cluster, leader, "node", "remove", name)
            assert code == 0, out
            assert {n["raft"] for n in orjson.loads(out)["nodes"]} == {
                raft_addr(cluster, i) for i in live
            }
            h.fault_healed(death)
            await lab.more(16)
            new = lab.vm("n4", {"join": [cluster.nodes[i].url for i in live]})
            joined = h.fault_started(1, "join", "n4", "raft.join, empty data directory", True)
            lab.start(new)
            took = await wait_voter(http, cluster, leader, new)
            h.fault_healed(joined)
            await lab.more(40)
            t1 = h.now()
        fig = lab.measure("kill -> removed -> n4 a voter", t0, t1)
        lab.figures.insert(
            0, f"n4 (new address {lab.net.ip['n4']}) a voter {took:.1f}s after its start"
        )
        code, out = await schedctl(cluster, leader, "node", "list", json=False)
        assert code == 0 and "3 voters, a majority is 2" in out, out
        ids, quorum = await voters_and_quorum(lab, leader)
        assert ids == {cluster.nodes[i].node_id for i in [*live, new]} and quorum == 2
        await lab.check([*live, new], GAP_BOUND_S, tmp_path)
        lab.print()
        assert fig["gap_s"] < GAP_BOUND_S, lab.figures


async def test_three_to_five_to_three(tmp_path: Path) -> None:
    async with three_nodes(tmp_path, seed=2) as (lab, leader):
        cluster, http, h = lab.cluster, lab.http, lab.history
        follower = next(i for i in range(3) if i != leader)
        lead_id = cluster.nodes[leader].node_id
        async with lab.load():
            await lab.more(80)
            t0 = h.now()
            # n4 asks to join (raft.join names a follower's API: it forwards to the leader)
            n4 = lab.vm("n4", {"join": [cluster.nodes[follower].url]})
            change = h.fault_started(0, "join", "n4", "raft.join", True)
            lab.start(n4)
            took4 = await wait_voter(http, cluster, leader, n4)
            h.fault_healed(change)
            await lab.more(24)
            # n5 is added by the operator, then started with raft.peers naming the members
            n5 = lab.vm("n5", {"peers": [raft_addr(cluster, i) for i in (0, 1, 2, n4)]})
            change = h.fault_started(1, "add", "n5", "schedctl node add; raft.peers", True)
            code, out = await schedctl(cluster, leader, "node", "add", raft_addr(cluster, n5))
            assert code == 0, out
            lab.start(n5)
            took5 = await wait_voter(http, cluster, leader, n5)
            h.fault_healed(change)
            code, out = await schedctl(cluster, n4, "node", "list", json=False)
            assert code == 0 and "5 voters, a majority is 3" in out, out
            await lab.more(24)
            t1 = h.now()
            # shrink: a follower, then the leader (it hands over first)
            gone = cluster.nodes[follower].node_id
            change = h.fault_started(2, "remove", gone, "a follower", True)
            lab.removing(follower)
            code, out = await schedctl(cluster, n5, "node", "remove", gone)
            assert code == 0, out
            lab.removed(follower)
            h.fault_healed(change)
            await lab.more(24)
            t2 = h.now()
            change = h.fault_started(3, "remove", lead_id, "the leader: hands over", True)
            lab.removing(leader)
            code, out = await schedctl(cluster, leader, "node", "remove", lead_id)
            assert code == 0, out
            lab.removed(leader)
            live = [i for i in (0, 1, 2, n4, n5) if i not in (follower, leader)]
            new_leader = await leader_of(http, cluster, live)
            h.fault_healed(change)
            await lab.more(40)
            t3 = h.now()
        lab.figures += [
            f"n4 (raft.join) a voter {took4:.1f}s after its start, "
            f"n5 (node add + raft.peers) {took5:.1f}s",
            f"leader {lead_id} removed, {cluster.nodes[new_leader].node_id} leads",
        ]
        grow = lab.measure("3 -> 5", t0, t1)
        shrink = lab.measure("5 -> 3", t1, t3)
        lab.measure("leader removed (hand-over)", t2, t3)
        ids, quorum = await voters_and_quorum(lab, new_leader)
        assert ids == {cluster.nodes[i].node_id for i in live} and quorum == 2
        await lab.check(live, GAP_BOUND_S, tmp_path)
        lab.print()
        assert max(grow["gap_s"], shrink["gap_s"]) < GAP_BOUND_S, lab.figures


async def test_a_lost_majority_is_recovered_and_grown_back(tmp_path: Path) -> None:
    async with three_nodes(tmp_path, seed=3) as (lab, leader):
        cluster, http, h = lab.cluster, lab.http, lab.history
        async with lab.load():
            await lab.more(120)
        # quiesced: every run done, every node at the leader's commit index
        await lab.run.settle(60)
        assert await lab.run.active_jobs() == 0, h.notes
        ok, _ = await checker.converged(http, cluster.urls, cluster.headers(), 30)
        assert ok, "the nodes did not converge"
        before = [op.job_id for op in h.ops if op.ok and op.job_id]
        await check_members_hold(http, cluster, [0, 1, 2], before)
        survivor = min(i for i in range(3) if i != leader)  # a follower
        lost = [i for i in range(3) if i != survivor]
        names = ",".join(cluster.nodes[i].node_id for i in lost)
        loss = h.fault_started(0, "lost_majority", names, "two VMs gone for good", False)
        lab.die(*lost)
        for i in lost:
            lab.removing(i)  # recover lists them as removed
        # the survivor answers reads, and no write
        assert await cluster.job_ids(http, cluster.nodes[survivor].url) == set(before)
        async with http.post(
            cluster.nodes[survivor].url + "/api/v1/jobs",
            json={"task": "acc.record", "payload": {"tag": "lost"}},
            headers=cluster.headers(),
            timeout=aiohttp.ClientTimeout(total=30),
        ) as r:
            assert r.status == 503, (r.status, await r.text())
        proc = cluster.nodes[survivor].proc
        lab.run.killed.append(proc)  # type: ignore[arg-type]
        cluster.kill(survivor, signal.SIGTERM)
        assert exit_status(cluster, survivor) == 0
        config = str(cluster.nodes[survivor].config)
        cmd = [*lab.net.prefix(cluster.nodes[survivor].node_id), str(BIN / "schedd")]
        out = await asyncio.to_thread(
            subprocess.run,
            [*cmd, "recover", "--force-new-cluster", "--config", config],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0 and "NEW ONE-NODE CLUSTER" in out.stderr, out
        cluster.start(survivor)
        h.fault_healed(loss)
        async with lab.load():
            await leader_of(http, cluster, [survivor])
            first = h.now()
            await lab.more(16)
            t0 = h.now()
            took: dict[str, float] = {}
            live = [survivor]
            for k, name in enumerate(("n4", "n5")):
                new = lab.vm(name, {"join": [cluster.nodes[survivor].url]})
                live.append(new)
                change = h.fault_started(1 + k, "join", name, "raft.join", True)
                lab.start(new)
                took[name] = await wait_voter(http, cluster, survivor, new)
                h.fault_healed(change)
                await lab.more(24)
            t1 = h.now()
        assert loss.healed is not None
        lab.figures += [
            f"recovered {cluster.nodes[survivor].node_id} leads {first - loss.healed:.1f}s "
            "after its start",
            f"n4 a voter {took['n4']:.1f}s after its start, n5 {took['n5']:.1f}s",
        ]
        fig = lab.measure("1 -> 3 after the recovery", t0, t1)
        ids, quorum = await voters_and_quorum(lab, survivor)
        assert ids == {cluster.nodes[i].node_id for i in live} and quorum == 2
        await check_members_hold(http, cluster, live, before)
        report = await lab.check(live, RECOVERED_BOUND_S, tmp_path)
        back = report["recovery"][0]["from_heal_s"]
        lab.figures.insert(-1, f"first write acknowledged {back}s after the recovered node's start")
        # and the write refused while the majority was lost did not come back with the recovery
        state = await checker.read_node(http, cluster.nodes[survivor].url, cluster.headers(), 0)
        assert not [j for j in state.jobs.values() if (j.get("payload") or {}).get("tag") == "lost"]
        lab.print()
        assert fig["gap_s"] < GAP_BOUND_S, lab.figures
