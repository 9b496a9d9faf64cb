"""``set_members`` (schedd/raft/patches.py) on real pysyncobj nodes ticked by hand: a learner is
replicated to but never counted in a majority; promoted, it is; removed, it is forgotten."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pysyncobj import SyncObjConf

from schedd.raft.patches import learners, set_members
from tests.conftest import free_port
from tests.unit.test_raft_patches import Counter, tick_until


def addr() -> str:
    port = free_port()
    while port >= 32768:
        port = free_port()
    return f"127.0.0.1:{port}"


@pytest.fixture
def leader_and_newcomer(tmp_path: Path) -> Iterator[tuple[Counter, Counter]]:
    """A one-voter cluster that has elected itself, and a node that knows it (not a member)."""
    a, x = addr(), addr()
    made: list[Counter] = []
    try:
        for i, (me, others) in enumerate(((a, []), (x, [a]))):
            conf = SyncObjConf(
                autoTick=False,
                appendEntriesPeriod=0.05,
                raftMinTimeout=0.3,
                raftMaxTimeout=0.4,
                journalFile=str(tmp_path / f"j{i}"),
                fullDumpFile=str(tmp_path / f"d{i}"),
            )
            made.append(Counter(me, others, conf))
        made[1]._SyncObj__raftElectionDeadline = float("inf")  # the newcomer never campaigns
        assert tick_until(made[:1], made[0]._isLeader, 5)
        yield made[0], made[1]
    finally:
        for n in made:
            n.destroy()


def test_a_learner_is_replicated_to_a_voter_counts_a_removed_node_is_dropped(
    leader_and_newcomer: tuple[Counter, Counter],
) -> None:
    leader, x = leader_and_newcomer
    both = [leader, x]
    me = leader.selfNode.id
    assert set_members(leader, {me}, {x.selfNode.id})
    assert not set_members(leader, {me}, {x.selfNode.id})  # the same again: no change
    assert learners(leader) == {x.selfNode.id}
    # a learner: sent the entries...
    leader.add(1)
    assert tick_until(both, lambda: x.values == [1], 5)
    # ... but never waited for: with the learner silent, the leader alone commits
    leader.add(2)
    assert tick_until([leader], lambda: leader.values == [1, 2], 2)
    assert tick_until(both, lambda: x.values == [1, 2], 5)
    # promoted: a majority of two now needs it
    assert set_members(leader, {me, x.selfNode.id}, ())
    assert learners(leader) == set()
    assert leader.hasQuorum  # connected to it
    leader.add(3)
    assert not tick_until([leader], lambda: 3 in leader.values, 0.5)
    assert tick_until(both, lambda: 3 in leader.values and 3 in x.values, 5)
    # removed: the leader commits alone again, and no longer knows it
    assert set_members(leader, {me}, ())
    leader.add(4)
    assert tick_until([leader], lambda: 4 in leader.values, 2)
    transport = leader._SyncObj__transport
    assert x.selfNode.id not in {n.id for n in transport._nodes}
    assert x.selfNode not in leader._SyncObj__raftMatchIndex
