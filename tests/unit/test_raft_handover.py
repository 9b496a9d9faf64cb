"""A leadership transfer under a steady stream of commands (what a stopping leader does, see
``RaftNode.transfer_leadership``), on real pysyncobj nodes ticked by hand.  pysyncobj sends
TimeoutNow only to a follower that holds the leader's whole log; while commands keep coming,
none ever does, and the transfer waits for a lull.  A leader that appends nothing new while it
hands over - its own commands held, those followers forward refused (``refuse_forwarded``) -
hands over within a few ticks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from pysyncobj import FAIL_REASON, SyncObj, replicated

from schedd.raft.patches import most_caught_up, refuse_forwarded
from tests.unit.test_raft_pauses import settled, three, tick


class Counter(SyncObj):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.total = 0

    @replicated
    def add(self, n: int) -> int:
        self.total += n
        return self.total


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Counter]]:
    with three(tmp_path, Counter) as made:
        yield made


@pytest.mark.parametrize("hold", [True, False], ids=["held", "pysyncobj"])
def test_a_leader_that_appends_nothing_new_hands_over_within_a_few_ticks(
    nodes: list[Counter], hold: bool
) -> None:
    handing_over: list[SyncObj] = []  # the node handing over
    for n in nodes:
        refuse_forwarded(n, lambda n=n: hold and n in handing_over)  # type: ignore[misc]
    _, leader = settled(nodes)  # type: ignore[arg-type]
    follower = next(n for n in nodes if n is not leader)
    forwarded: list[int] = []  # the errors of the commands the follower forwarded
    handing_over.append(leader)
    ticks, deadline = 0, time.monotonic() + 3
    while leader._isLeader() and time.monotonic() < deadline:
        if not hold:
            leader.add(1)  # its own clients' commands keep coming
        follower.add(1, callback=lambda _res, err: forwarded.append(err))
        for n in nodes:
            n.doTick(0.002)
        leader.transferLeadership()  # as RaftNode does on every tick while handing over
        ticks += 1
    if hold:
        assert not leader._isLeader() and ticks <= 30, ticks
        assert FAIL_REASON.NOT_LEADER in forwarded  # refused, not appended: its caller retries
        limit = time.monotonic() + 5
        while not any(n._isLeader() for n in nodes) and time.monotonic() < limit:
            tick(nodes, 0.01)
        [new] = [n for n in nodes if n._isLeader()]
        assert new is not leader
        # and the follower's commands reach the new leader once it knows it
        while follower._getLeader() != new.selfNode and time.monotonic() < limit:
            tick(nodes, 0.01)
        done: list[int] = []
        follower.add(1, callback=lambda _res, err: done.append(err))
        while not done and time.monotonic() < limit:
            tick(nodes, 0.01)
        assert done == [FAIL_REASON.SUCCESS] or follower is new
    else:  # pysyncobj alone: the log keeps growing, no follower ever holds all of it
        assert leader._isLeader(), f"handed over after {ticks} ticks"


@dataclass(frozen=True)
class Peer:
    id: str


def test_one_follower_is_asked_to_take_over_for_the_whole_hand_over() -> None:
    """With three followers catching up at different paces, pysyncobj's own pick moved from one
    to the next as they did, and two of them, each told to take over, split the vote."""
    a, b, c = (Peer(f"10.0.0.{i}:7701") for i in (2, 3, 4))
    obj = SimpleNamespace(
        _SyncObj__connectedNodes={a, b, c},
        _SyncObj__otherNodes={a, b, c},
        _SyncObj__raftMatchIndex={a: 90, b: 99, c: 95},
    )
    first = most_caught_up(obj)  # type: ignore[arg-type]
    assert first is b
    obj._SyncObj__raftMatchIndex.update({a: 100, c: 100})  # the others catch up meanwhile
    assert most_caught_up(obj, first) is b  # type: ignore[arg-type]
    obj._SyncObj__connectedNodes.discard(b)  # gone: another one, the most caught up
    assert most_caught_up(obj, first) in (a, c)  # type: ignore[arg-type]
    obj._SyncObj__otherNodes = {a}  # (c removed meanwhile)
    assert most_caught_up(obj, c) is a  # type: ignore[arg-type]
    obj._SyncObj__connectedNodes = set()
    assert most_caught_up(obj, a) is None  # type: ignore[arg-type]
