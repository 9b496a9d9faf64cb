"""A namespace's concurrency cap holds across shards at every step, whatever is lost.

Three shard leaders (the real :class:`schedd.leader.core.LeaderCore`, each over its own
replicated state with the real ``apply``) lease runs of one capped namespace to their workers,
while the real :class:`schedd.shard.caps.CapsCoordinator` moves slots between them.  A random
walk (one per seed) submits runs, commits or loses what each leader asked for, ends runs,
fails a shard's leader over (what it had not committed is lost, the next one starts from the
log), loses the coordinator's requests before or after they take effect, and lets a second,
stale coordinator act on what the shards said several steps before.  After every step:

* the runs leased (and being leased) across the shards are at most the cap;
* the allowances plus the transfers given and not yet credited add up to the cap exactly (a
  slot is never made twice nor lost);

and once the faults stop, every run that waits gets a slot and ends.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from typing import Any

import pytest

from schedd.config import load_config
from schedd.core import commands
from schedd.core.allowances import allowance
from schedd.core.model import RunState
from schedd.core.state import Ok
from schedd.shard.caps import CapsCoordinator
from tests.unit.test_leader_core import Sim

SHARDS = 3
NS = "default"


class Lost(OSError):
    """A request or its answer went missing."""


class Cluster:
    def __init__(self, rng: random.Random, cap: int) -> None:
        self.rng = rng
        self.cap = cap
        self.sims = [self._leader(k) for k in range(SHARDS)]
        self.jobs = 0
        self.faults = True
        self.history: list[dict[int, Any]] = []  # the views of earlier steps (a stale one)

    def _leader(self, k: int, state: Any = None) -> Sim:
        sim = Sim(state, caps={NS: self.cap}, shards=SHARDS, shard=k)
        sim.connect("w1", capacity=50)
        return sim

    def view(self, k: int) -> dict[str, Any]:
        return {"node": "n1", **self.sims[k].leader.caps_view()}

    # -- the walk's steps --------------------------------------------------------------------
    def submit(self) -> None:
        k = self.rng.randrange(SHARDS)
        self.jobs += 1
        self.sims[k].submit(f"J{self.jobs}")

    def work(self) -> None:
        sim = self.sims[self.rng.randrange(SHARDS)]
        sim.tick()
        if sim.pending and self.faults and self.rng.random() < 0.15:
            sim.lose()
        elif sim.pending:
            sim.commit()

    def end_one(self) -> None:
        sim = self.sims[self.rng.randrange(SHARDS)]
        running = [r for r in sim.state.runs.values() if r.state is RunState.RUNNING]
        if not running:
            return
        run = self.rng.choice(running)
        assert run.current is not None
        sim.log(commands.CompleteRun("c", sim.wall, sim.leader.fence, run.id, run.current.fence))

    def fail_over(self) -> None:
        k = self.rng.randrange(SHARDS)
        old = self.sims[k]
        old.pending = []  # what it had not committed is lost with it
        self.sims[k] = self._leader(k, old.state)

    # -- the coordinators' requests ----------------------------------------------------------
    async def ask(self, k: int, body: dict[str, Any], stale: bool) -> tuple[int, Any]:
        lossy = self.faults and self.rng.random() < 0.1
        if lossy and self.rng.random() < 0.5:
            raise Lost("the request was lost")
        sim = self.sims[k]
        op = body["op"]
        answer: Any
        if op == "view":
            answer = self.rng.choice(self.history)[k] if stale and self.history else self.view(k)
        elif op == "limit":
            sim.do(sim.leader.limit_caps(body["limits"], body["hold_s"], sim.now))
            answer = {}
        elif op == "give":
            replies: list[Any] = []
            sim.do(sim.leader.give(NS, body["amount"], body["dest"], sim.now, replies.append))
            if sim.pending and self.faults and self.rng.random() < 0.3:
                raise Lost("no commit in time")  # stays pending: committed or lost later
            sim.commit()
            [res] = replies
            if not isinstance(res, Ok):
                return 503, {}
            answer = {"seq": res.value[0], "amount": res.value[1]}
        elif op == "take":
            [res] = sim.log(
                commands.CapsTake(
                    "t", sim.wall, sim.leader.fence, body["source"], body["seq"], NS, body["amount"]
                )
            )
            answer = {"credited": bool(res.value)}
        else:
            sim.log(
                commands.CapsDelivered("d", sim.wall, sim.leader.fence, body["dest"], body["seq"])
            )
            answer = {}
        if lossy:
            raise Lost("the answer was lost")
        return 200, answer

    def coordinate(self, coordinator: CapsCoordinator) -> None:
        asyncio.run(coordinator.round())

    # -- what must hold ----------------------------------------------------------------------
    def check(self) -> None:
        in_use = sum(s.leader.caps.in_use(NS) for s in self.sims)
        running = sum(
            1 for s in self.sims for r in s.state.runs.values() if r.state is RunState.RUNNING
        )
        assert running <= in_use <= self.cap, (running, in_use, self.cap)
        allowed = sum(
            allowance(self.cap, SHARDS, k, s.state.caps, NS) for k, s in enumerate(self.sims)
        )
        uncredited = sum(
            t.amount
            for k, s in enumerate(self.sims)
            for t in s.state.caps.outbox
            if t.seq > self.sims[t.dest].state.caps.taken.get(k, 0)
        )
        assert allowed + uncredited == self.cap, (allowed, uncredited, self.cap)
        self.history = [*self.history[-5:], {k: self.view(k) for k in range(SHARDS)}]


def coordinator(cluster: Cluster, stale: bool) -> CapsCoordinator:
    base = load_config(None, env={})
    cfg = replace(
        base,
        node=replace(base.node, id="n1"),  # the node whose view of shard 0 says it leads it
        limits=replace(base.limits, concurrency=((NS, cluster.cap),)),
    )

    async def ask(k: int, body: dict[str, Any]) -> tuple[int, Any]:
        return await cluster.ask(k, body, stale)

    return CapsCoordinator(cfg, SHARDS, ask)


@pytest.mark.parametrize("seed", range(40))
def test_the_cap_holds_across_shards_and_every_run_gets_a_slot(seed: int) -> None:
    rng = random.Random(seed)
    cluster = Cluster(rng, cap=rng.randint(1, 5))
    fresh, stale = coordinator(cluster, False), coordinator(cluster, True)
    steps = [
        (cluster.submit, 3),
        (cluster.work, 6),
        (cluster.end_one, 3),
        (cluster.fail_over, 0.5),
        (lambda: cluster.coordinate(fresh), 2),
        (lambda: cluster.coordinate(stale), 1),
    ]
    actions, weights = zip(*steps, strict=True)
    cluster.check()
    for _ in range(250):
        rng.choices(actions, weights)[0]()
        cluster.check()
    # the faults stop: every run waiting gets a slot in turn and ends
    cluster.faults = False
    for _ in range(400):
        for k in range(SHARDS):
            cluster.sims[k].advance(0.5)
            cluster.work()
            cluster.end_one()
        cluster.coordinate(fresh)
        cluster.check()
        if all(r.state is RunState.SUCCEEDED for s in cluster.sims for r in s.state.runs.values()):
            break
    left = [
        (k, r.id, r.state)
        for k, s in enumerate(cluster.sims)
        for r in s.state.runs.values()
        if r.state is not RunState.SUCCEEDED
    ]
    assert left == []
