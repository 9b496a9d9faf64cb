"""The fault-injection suite's CI subset: seven fixed seeds, each a ~32 s schedule on a real
three-node cluster (Raft links through tests/cluster/proxy.py, or every node and worker in a
network namespace for the ``net_`` and membership kinds) with two real workers, a few
hundred one-off jobs and three ``* * * * * *`` cron jobs; every invariant of
tests/cluster/checker.py must be 0.  Between them the seven schedules use every fault kind.

``scripts/torture --schedules N --seed S`` runs as many schedules as wanted (RELIABILITY.md).
A failing seed replays with ``scripts/torture --schedules 1 --seed SEED --kinds ...``.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import checker
from tests.cluster.faults import (
    DISK_KINDS,
    KINDS,
    MEMBER_KINDS,
    NET_KINDS,
    Run,
    make_schedule,
    run_schedule,
    summary_line,
)
from tests.cluster.harness import Cluster
from tests.cluster.lossyfs import available as lossy_unavailable
from tests.cluster.netns import available as netns_unavailable

pytestmark = [pytest.mark.cluster]

# (seed, kinds): each seed was chosen so that its 32 s schedule uses every kind of its group.
CI_SCHEDULES = [
    (7, ("kill_leader", "pause_follower", "isolate_leader", "worker_stall", "clock_skew")),
    (4, ("kill_follower", "pause_leader", "one_way_leader_in", "worker_kill", "cut_link")),
    (1, ("kill_all", "isolate_follower", "one_way_leader_out", "flaky_link")),
    (2, ("power_loss", "slow_disk", "disk_full")),  # on lossy mounts (tests/cluster/lossyfs.py)
    # in network namespaces (tests/cluster/netns.py), flaky_link there as packet loss
    (9, ("net_isolate_leader", "net_cut_worker", "net_cut_client", "flaky_link")),
    # a follower wiped early (rebuilt from the leader's log) and late (from a whole copy, the
    # log compacted by then), each followed by the leader's death: the rebuilt node must elect
    (28, ("wipe_follower", "kill_leader")),
    # in namespaces: a new node joins and the leader is killed while it is a learner (the
    # killed node removed after), the leader killed among the new members, then a follower
    # replaced by a new node at a new address
    (45, ("replace_node", "add_interrupted", "kill_leader")),
]
DURATION_S = 32.0


def test_the_ci_schedules_cover_every_fault_kind() -> None:
    used = {s.kind for seed, kinds in CI_SCHEDULES for s in make_schedule(seed, DURATION_S, kinds)}
    assert used == set(KINDS)
    # Replayable: the same seed gives the same schedule.
    assert make_schedule(5, 60) == make_schedule(5, 60)
    assert make_schedule(5, 60) != make_schedule(6, 60)


def _needs(kinds: tuple[str, ...]) -> list[pytest.MarkDecorator]:
    why = lossy_unavailable() if DISK_KINDS.intersection(kinds) else None
    why = why or (netns_unavailable() if (NET_KINDS | MEMBER_KINDS).intersection(kinds) else None)
    return [pytest.mark.skip(reason=why)] if why else []


@pytest.mark.timeout(150)
@pytest.mark.long
@pytest.mark.parametrize(
    ("seed", "kinds"),
    [
        pytest.param(seed, kinds, id=f"seed{seed}", marks=_needs(kinds))
        for seed, kinds in CI_SCHEDULES
    ],
)
async def test_invariants_hold_under_a_fault_schedule(
    tmp_path: Path, seed: int, kinds: tuple[str, ...]
) -> None:
    report = await run_schedule(seed, tmp_path, duration=DURATION_S, kinds=kinds, rate=8.0)
    check_report(report, tmp_path, seed, kinds)


def check_report(report: dict[str, Any], where: Path, seed: int, kinds: tuple[str, ...]) -> None:
    """A schedule's report, kept in ``where``: every kind played, enough load, a consistent
    read at the end, every invariant 0, every new node promoted and every removed one
    stopped."""
    (where / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print(summary_line(report))
    schedule = "\n".join(s["text"] for s in report["schedule"])
    assert report["faults_by_kind"].keys() == set(kinds), report["notes"]
    assert report["ops"]["acknowledged"] >= 150, report["ops"]
    assert report["state"].get("converged"), report["state"]
    assert report["ok"], (
        f"seed {seed}: invariants {report['invariants']}\nschedule:\n{schedule}\n"
        f"violations: {json.dumps(report['violations'], indent=1)}\nnotes: {report['notes']}\n"
        f"report: {where / 'report.json'}"
    )
    for f in report["faults"]:  # every new node promoted, every removed node stopped (status 2)
        if f["kind"] in MEMBER_KINDS:
            assert f["promoted_s"] is not None and f["refused"], f


# A cluster of three shards (each node leads one): the node kinds, the workers' and partitions
# in namespaces; the checker waits for every shard's group and reads every shard's jobs.
SHARD_SCHEDULES = [
    (3, ("kill_leader", "kill_follower", "pause_leader", "worker_kill", "kill_all")),
    (7, ("isolate_leader", "cut_link", "worker_stall", "wipe_follower")),
    (2, ("power_loss", "slow_disk", "disk_full")),
    # a node joins every shard's group while the leader is killed, a follower is replaced
    (45, ("replace_node", "add_interrupted", "kill_leader")),
]


@pytest.mark.timeout(180)
@pytest.mark.long
@pytest.mark.parametrize(
    ("seed", "kinds"),
    [
        pytest.param(
            seed, kinds, id=f"shards3-seed{seed}", marks=_needs((*kinds, "net_cut_client"))
        )
        for seed, kinds in SHARD_SCHEDULES
    ],
)
async def test_invariants_hold_under_a_fault_schedule_with_three_shards(
    tmp_path: Path, seed: int, kinds: tuple[str, ...]
) -> None:
    # A kill_all restarts twelve processes (a supervisor and three shards per node) on two
    # cores: the first submit after it took 9.8 s once, so the bound is 15 s here, not 10.
    report = await run_schedule(
        seed, tmp_path, duration=DURATION_S, kinds=kinds, rate=8.0, shards=3, bound_s=15.0
    )
    check_report(report, tmp_path, seed, kinds)


# -- the checker itself: it must see what it is meant to see ------------------------------------


def _attempt(
    n: int, fence: int, start: str, end: str | None, outcome: str | None
) -> dict[str, Any]:
    return {
        "attempt": n,
        "fence": fence,
        "worker_id": "w1",
        "started_at": start,
        "deadline": None,
        "ended_at": end,
        "outcome": outcome,
        "error": None,
    }


def _run(
    run_id: str,
    state: str,
    attempts: list[dict[str, Any]],
    result: Any = None,
    scheduled: str = "2026-01-01T00:00:00.000Z",
) -> dict[str, Any]:
    return {
        "id": run_id,
        "job_id": run_id.split("@")[0],
        "state": state,
        "scheduled_at": scheduled,
        "attempts": attempts,
        "result": result,
    }


def test_the_checker_counts_each_kind_of_violation() -> None:
    h = checker.History()
    ops = []
    for k in range(4):
        op = h.new_op("oneoff", {"task": "acc.record", "payload": {"tag": f"t{k}"}})
        op.ok, op.completed, op.job_id = True, 0.1, f"J{k}"
        ops.append(op)
    cron = h.new_op("cron", {"task": "acc.record", "payload": {"tag": "c"}})
    cron.ok, cron.completed, cron.job_id = True, 0.1, "C"
    f = h.fault_started(0, "kill_leader", "n1", "", True)
    h.fault_healed(f)  # no submit acknowledged after it: over the bound

    t0, t1, t2 = "2026-01-01T00:00:01.000Z", "2026-01-01T00:00:02.000Z", "2026-01-01T00:00:03.000Z"
    runs = {
        # fine: lost, then succeeded with the newer fence and its own result
        "J0": [
            _run(
                "J0@1",
                "succeeded",
                [_attempt(1, 10, t0, t1, "lost"), _attempt(2, 20, t1, t2, "succeeded")],
                {"run_id": "J0@1", "attempt": 2},
            )
        ],
        # stale completion: attempt 1 (fence 10) accepted after attempt 2 was leased
        "J1": [
            _run(
                "J1@1",
                "succeeded",
                [_attempt(1, 10, t0, t2, "succeeded"), _attempt(2, 20, t1, None, None)],
                {"run_id": "J1@1", "attempt": 1},
            )
        ],
        # the stored result came from attempt 1, whose lease was lost
        "J4": [
            _run(
                "J4@1",
                "succeeded",
                [_attempt(1, 50, t0, t1, "lost"), _attempt(2, 60, t1, t2, "succeeded")],
                {"run_id": "J4@1", "attempt": 1},
            )
        ],
        # a one-off job fired twice
        "J2": [
            _run(
                "J2@1",
                "succeeded",
                [_attempt(1, 30, t0, t1, "succeeded")],
                {"run_id": "J2@1", "attempt": 1},
            ),
            _run("J2@2", "queued", [], None, t2),
        ],
        "C": [
            _run(
                "C@1000",
                "succeeded",
                [_attempt(1, 40, t0, t1, "succeeded")],
                {"run_id": "C@1000", "attempt": 1},
                "2026-01-01T00:00:01.000Z",
            ),
            _run("C@1001", "queued", [], None, "2026-01-01T00:00:01.001Z"),
        ],
    }
    jobs = {
        j: {"id": j, "payload": {"tag": f"t{j[1:]}" if j != "C" else "c"}, "status": "done"}
        for j in runs
    }
    # J3 acknowledged but missing everywhere
    states = [
        checker.NodeState(
            i,
            100,
            {k: dict(v) for k, v in jobs.items()},
            {k: list(v) for k, v in runs.items()},
            list(jobs),
        )
        for i in range(3)
    ]
    states[2].jobs["J0"] = {**jobs["J0"], "status": "active"}  # replica diverged
    executions = [
        ("J0@1", 10, 1, "w1"),
        ("J0@1", 20, 2, "w2"),
        ("J1@1", 10, 1, "w1"),
        ("J2@1", 30, 1, "w1"),
        ("J2@1", 30, 1, "w1"),  # one fence executed twice
        ("C@1000", 40, 1, "w1"),
        ("J4@1", 50, 1, "w1"),
        ("J4@1", 60, 2, "w2"),
        ("J9@1", 99, 1, "w2"),
    ]  # never granted
    report = checker.check(
        h,
        states,
        {"converged": True, "leader": 0},
        executions,
        0,
        [],
        bound_s=10.0,
        cron_jobs=["C"],
    )
    inv = report["invariants"]
    assert inv["lost_acknowledged_jobs"] == 3  # J3 on each of the three nodes
    assert inv["replica_divergence"] == 1
    assert inv["stale_completions"] == 2  # J1: not the last fence; J4: another attempt's result
    assert inv["overlapping_leases"] == 1  # J1: attempt 1 ended after attempt 2 started
    assert inv["duplicate_fires"] == 3  # J2 twice, C's bumped occurrence, fence 30 twice
    assert inv["executions_without_lease"] == 1
    assert inv["failover_over_bound"] == 1
    assert inv["duplicate_job_ids"] == 0 and inv["stuck_jobs"] == 0
    assert not report["ok"]


def test_the_checker_counts_a_wiped_follower_not_rebuilt_within_the_bound() -> None:
    h = checker.History()
    for step, rebuilt_s in enumerate((2.5, None, checker.REBUILD_BOUND_S + 1)):
        f = h.fault_started(step, "wipe_follower", "n2", "", True)
        h.fault_healed(f)
        f.wiped, f.rebuilt_s = "n2", rebuilt_s
    h.fault_healed(h.fault_started(3, "kill_follower", "n3", "", True))  # no node wiped
    report = checker.check(h, [], {}, [], 0, [], bound_s=10.0, cron_jobs=[])
    assert report["invariants"]["rebuild_over_bound"] == 2, report["violations"]
    slow = report["violations"]["rebuild_over_bound"]
    assert "fault 1 " in slow[0] and "never applied" in slow[0]
    assert "fault 2 " in slow[1] and f"{checker.REBUILD_BOUND_S + 1}s later" in slow[1]


def test_the_checker_counts_membership_divergence_and_stuck_learners() -> None:
    def view(index: int, nodes: dict[str, str], removed: tuple[str, ...] = ()) -> dict[str, Any]:
        return {
            "index": index,
            "nodes": [{"id": None, "raft": a, "role": r} for a, r in nodes.items()],
            "removed": list(removed),
        }

    a, b, c, d = "10.0.0.1:7701", "10.0.0.2:7701", "10.0.0.3:7701", "10.0.0.4:7701"
    alias = {a: "n1", b: "n2", c: "n3", d: "n4", "127.0.0.1:9002": "n2"}
    same = view(9, {a: "voter", b: "voter", d: "voter"}, (c,))

    def check(views: list[Any], expected: list[str]) -> dict[str, int]:
        h = checker.History()
        members = {"views": views, "names": ["n1", "n2", "n4"], "expected": expected}
        report = checker.check(
            h, [], {}, [], 0, [], bound_s=10.0, cron_jobs=[], members={**members, "alias": alias}
        )
        return dict(report["invariants"])

    ok = check([same, same, same], ["n1", "n2", "n4"])
    assert ok["membership_divergence"] == 0 and ok["stuck_learner"] == 0
    # a node known by another address (a proxy's) is the same node
    proxied = view(9, {a: "voter", "127.0.0.1:9002": "voter", d: "voter"}, (c,))
    assert check([same, proxied, same], ["n1", "n2", "n4"])["membership_divergence"] == 0
    # n4 still sees n3 (an older membership), n2 does not answer, and the harness removed n2
    older = view(7, {a: "voter", b: "voter", c: "voter"})
    inv = check([same, None, older], ["n1", "n4"])
    assert inv["membership_divergence"] == 3 and inv["stuck_learner"] == 0
    # a learner left behind, seen by two members, counts once
    learning = view(10, {a: "voter", b: "voter", d: "learner"}, (c,))
    inv = check([learning, learning, same], ["n1", "n2", "n4"])
    assert inv["stuck_learner"] == 1 and inv["membership_divergence"] == 1
    # with shards, every shard's group is checked, and its evidence names the shard: shard 0
    # agrees, shard 2 still holds n3 on one node and a learner on every node
    a2, b2, c2, d2 = (x[:-1] + "3" for x in (a, b, c, d))  # shard 2: the Raft ports + 2
    alias2 = {a2: "n1", b2: "n2", c2: "n3", d2: "n4"}
    same2 = view(12, {a2: "voter", b2: "voter", d2: "voter"}, (c2,))
    behind = view(8, {a2: "voter", b2: "voter", c2: "voter"})
    learner2 = view(13, {a2: "voter", b2: "voter", d2: "learner"}, (c2,))
    members = {"views": [same] * 3, "names": ["n1", "n2", "n4"], "expected": ["n1", "n2", "n4"]}
    sharded = {
        **members,
        "alias": alias,
        "shards": {
            1: {"views": [same2] * 3, "alias": alias2},
            2: {"views": [same2, behind, learner2], "alias": alias2},
        },
    }
    report = checker.check(
        checker.History(), [], {}, [], 0, [], bound_s=10.0, cron_jobs=[], members=sharded
    )
    assert report["invariants"]["membership_divergence"] == 2, report["violations"]
    assert report["invariants"]["stuck_learner"] == 1
    evidence = report["violations"]["membership_divergence"] + report["violations"]["stuck_learner"]
    assert all(e.startswith("shard 2: ") for e in evidence), evidence
    sharded["shards"][2]["views"] = [same2] * 3
    report = checker.check(
        checker.History(), [], {}, [], 0, [], bound_s=10.0, cron_jobs=[], members=sharded
    )
    inv = report["invariants"]
    assert inv["membership_divergence"] == 0 and inv["stuck_learner"] == 0, report["violations"]
    # what the harness saw go wrong (a removed node still running) counts too
    h = checker.History()
    h.membership.append("fault 1 replace_node: n3 was removed and still ran 15s later")
    report = checker.check(h, [], {}, [], 0, [], bound_s=10.0, cron_jobs=[])
    assert report["invariants"]["membership_divergence"] == 1 and not report["ok"]


def test_the_checker_forgives_only_what_retention_may_have_forgotten() -> None:
    h = checker.History()
    read_ms = int(h.wall0 * 1000) + 1_000_000  # the nodes read 1,000 s after the start
    old_ms = int(h.wall0 * 1000) + 100  # long before the retention (600 s)
    recent_ms = read_ms - 10_000
    for name, kind, at in (
        ("old", "oneoff", 0.1),  # ran long ago: may be forgotten
        ("recent", "oneoff", 900.0),  # acknowledged and ran too recently
        ("never_ran", "oneoff", 0.1),  # no worker ran it
        ("late", "oneoff", 0.1),  # acknowledged long ago but ran recently (a delayed job)
        ("cron", "cron", 0.1),  # recurring: never forgotten while active
        ("cron_done", "cron", 0.1),  # recurring, cancelled long ago: may be forgotten
        ("kept", "oneoff", 0.1),
        ("cron_kept", "cron", 0.1),
    ):
        op = h.new_op(kind, {"task": "acc.record", "payload": {"tag": name}})
        op.ok, op.completed, op.job_id = True, at, name.upper()
    done = ("2026-01-01T00:00:01.000Z", "2026-01-01T00:00:02.000Z")
    kept = {
        job: {"id": job, "payload": {"tag": job.lower()}, "status": "done"}
        for job in ("KEPT", "CRON_KEPT")
    }
    kept_run = _run(
        f"KEPT@{old_ms + 1}",
        "succeeded",
        [_attempt(1, 5, *done, "succeeded")],
        {"run_id": f"KEPT@{old_ms + 1}", "attempt": 1},
    )
    states = [
        checker.NodeState(i, 7, dict(kept), {"KEPT": [kept_run], "CRON_KEPT": []}, list(kept))
        for i in range(3)
    ]
    executions = [
        (f"OLD@{old_ms}", 1, 1, "w1"),  # its job forgotten: fine
        (f"RECENT@{recent_ms}", 2, 1, "w1"),  # too recent to be forgotten
        (f"KEPT@{old_ms}", 3, 1, "w1"),  # a one-off job still kept lost this run
        (f"KEPT@{old_ms + 1}", 5, 1, "w1"),
        (f"CRON_KEPT@{old_ms}", 6, 1, "w1"),  # an old run of a recurring job: may go
    ]
    last = {"OLD": old_ms, "RECENT": recent_ms, "LATE": recent_ms, "CRON": old_ms}
    last["CRON_DONE"] = old_ms
    info = {"converged": True, "leader": 0, "read_wall_ms": read_ms}

    def check(retention_s: float | None) -> dict[str, Any]:
        return checker.check(
            h, states, info, executions, 0, [], bound_s=10.0, cron_jobs=["CRON_KEPT"],
            retention_s=retention_s, executed_ms=last, cancelled_ms={"CRON_DONE": old_ms + 5},
        )  # fmt: skip

    report = check(600.0)
    inv = report["invariants"]
    lost = " ".join(report["violations"]["lost_acknowledged_jobs"])
    # RECENT, NEVER_RAN, LATE and CRON are lost, on each of the three nodes; OLD was forgotten.
    assert inv["lost_acknowledged_jobs"] == 12, report["violations"]
    assert all(j in lost for j in ("RECENT", "NEVER_RAN", "LATE", "CRON")) and "OLD" not in lost
    assert report["runs"]["forgotten_jobs"] == 2  # OLD and CRON_DONE
    without = " ".join(report["violations"]["executions_without_lease"])
    assert inv["executions_without_lease"] == 2 and "RECENT@" in without and "KEPT@" in without
    assert report["runs"]["executions_of_forgotten_runs"] == 2  # OLD's and CRON_KEPT's
    # Without retention nothing may be missing.
    inv = check(None)["invariants"]
    assert inv["lost_acknowledged_jobs"] == 18 and inv["executions_without_lease"] == 4


def test_a_process_that_exits_by_itself_is_a_violation(tmp_path: Path) -> None:
    """Only the harness's kills, and a full disk's status 70, are expected exits."""
    cluster = Cluster(tmp_path / "c", size=3)  # not started: its nodes' processes are set here

    def exiting(status: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", f"raise SystemExit({status})"])

    history = checker.History()
    run = Run(1, tmp_path, cluster, history, None, random.Random(1))  # type: ignore[arg-type]
    crashed, full = exiting(3), exiting(70)
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    cluster.nodes[0].proc, cluster.nodes[1].proc, cluster.nodes[2].proc = crashed, killed, full
    run.exposed.append(full)  # it ran on a full disk
    run.workers["w1"] = exiting(0)
    run.kill(killed)
    for p in (crashed, full, run.workers["w1"]):
        p.wait(10)
    run.observe()
    run.observe()  # each exit is looked at once
    assert len(history.exits) == 2, history.exits
    assert "n1" in history.exits[0] and "status 3" in history.exits[0]
    assert "w1" in history.exits[1] and "status 0" in history.exits[1]
    assert run.full_stops == 1
    report = checker.check(history, [], {}, [], 0, [], bound_s=10.0, cron_jobs=[])
    assert report["invariants"]["unexpected_exits"] == 2 and not report["ok"]
