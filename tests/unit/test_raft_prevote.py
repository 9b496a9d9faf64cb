"""Pre-vote and leader stickiness (``schedd.raft.prevote.pre_vote``) on real pysyncobj nodes
(real sockets), ticked by hand.  Links are cut by dropping messages while the TCP connections
stay up - the worst case: pysyncobj alone raises its term at every timeout then.  Each test that
shows a bug of pysyncobj alone runs unpatched too, and asserts the bug."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic as raft_clock

from schedd.raft.patches import read_before_judging
from schedd.raft.prevote import ElectionStats, pre_vote
from tests.conftest import free_port
from tests.unit.test_raft_pauses import MAX_TIMEOUT, MIN_TIMEOUT, hand_ticked, settled, tick


class Cuts:
    """Which nodes are cut off: their messages are dropped both ways (the connections stay);
    and which directed links (src, dst) drop their messages."""

    def __init__(self) -> None:
        self.cut: set[str] = set()
        self.links: set[tuple[str, str]] = set()
        self.holding: set[str] = set()  # nodes whose received messages are held back
        self.held: list[tuple[Any, Any, Any]] = []

    def release(self, first: str) -> None:
        """Deliver the held messages, those from ``first`` before the others (each sender's in
        the order they came), in one go: as one poll that found them in that order."""
        held, self.held = self.held, []
        for receive, node, message in sorted(held, key=lambda h: str(h[1].id) != first):
            receive(node, message)

    def install(self, obj: SyncObj) -> None:
        transport = obj._SyncObj__transport
        me = str(obj.selfNode.id)
        send, receive = transport.send, transport._onMessageReceivedCallback

        def filtered_send(node: Any, message: Any) -> Any:
            if me in self.cut or str(node.id) in self.cut or (me, str(node.id)) in self.links:
                return False
            return send(node, message)

        def filtered_receive(node: Any, message: Any) -> None:
            peer = str(node.id)
            if me in self.holding:
                self.held.append((receive, node, message))
            elif me not in self.cut and peer not in self.cut and (peer, me) not in self.links:
                receive(node, message)

        transport.send = filtered_send
        transport.setOnMessageReceivedCallback(filtered_receive)


@pytest.fixture
def cluster(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[list[SyncObj], Cuts, list[ElectionStats]]]:
    patched: bool = getattr(request, "param", True)
    ports = [free_port() for _ in range(3)]
    addrs = [f"127.0.0.1:{p}" for p in ports]
    made: list[SyncObj] = []
    stats: list[ElectionStats] = []
    cuts = Cuts()
    try:
        for i, addr in enumerate(addrs):
            obj = SyncObj(addr, [a for a in addrs if a != addr], hand_ticked(tmp_path, i))
            if patched:
                stats.append(pre_vote(obj))
                read_before_judging(obj)
            cuts.install(obj)  # outermost: a cut message reaches neither pysyncobj nor the patch
            made.append(obj)
        yield made, cuts, stats
    finally:
        for n in made:
            n.destroy()


Trio = tuple[list[SyncObj], "Cuts", list[ElectionStats]]
#: run a test with the patch and without it (pysyncobj alone, whose bug it then asserts)
BOTH = pytest.mark.parametrize(
    "cluster", [True, False], indirect=True, ids=["pre-vote", "pysyncobj"]
)


def name(obj: SyncObj) -> str:
    return str(obj.selfNode.id)


@BOTH
def test_a_follower_whose_deadline_passes_while_the_leader_lives_keeps_its_term(
    cluster: Trio,
) -> None:
    nodes, _, stats = cluster
    term, leader = settled(nodes)
    started = [dict(s.started) for s in stats]  # the first election
    follower = next(n for n in nodes if n is not leader)
    follower._SyncObj__raftElectionDeadline = 0  # as if its timer fired
    tick(nodes, 2 * MAX_TIMEOUT)
    if stats:
        assert {n.raftCurrentTerm for n in nodes} == {term} and leader._isLeader()
        refused = sum(sum(s.refused.values()) for s in stats)
        assert refused >= 1  # its round was refused: the others hear from the leader
        assert [s.started for s in stats] == started
    else:  # pysyncobj alone: a new term, and the leader deposed by it
        assert max(n.raftCurrentTerm for n in nodes) > term


@BOTH
def test_an_isolated_follower_comes_back_without_deposing_the_leader(
    cluster: Trio,
) -> None:
    nodes, cuts, stats = cluster
    term, leader = settled(nodes)
    started = [dict(s.started) for s in stats]  # the first election
    follower = next(n for n in nodes if n is not leader)
    cuts.cut.add(name(follower))
    tick(nodes, 5 * MAX_TIMEOUT)
    isolated_term = follower.raftCurrentTerm
    cuts.cut.clear()
    tick(nodes, 3 * MAX_TIMEOUT)
    if stats:
        assert isolated_term == term  # its rounds were lost; its term never moved
        assert leader._isLeader() and {n.raftCurrentTerm for n in nodes} == {term}
        assert follower._getLeader() == leader.selfNode
        assert stats[nodes.index(follower)].rounds["lost"] >= 2
        assert [s.started for s in stats] == started
    else:  # pysyncobj alone: its term ran away, and it deposed the leader on its return
        assert isolated_term > term
        assert min(n.raftCurrentTerm for n in nodes) > term


@BOTH
def test_a_stalled_node_reads_the_leaders_heartbeats_before_it_grants_a_pre_vote(
    cluster: Trio,
) -> None:
    """A follower cut off from the leader asks the other follower, which is stalled (not
    scheduled): the stalled node then reads, in one poll, that pre-vote and the leader's
    heartbeats queued meanwhile, in the order their sockets became readable - here the
    pre-vote first.  Judged on the spot it finds the last contact a stall old and is granted:
    an election, although the leader was alive all along."""
    nodes, cuts, stats = cluster
    term, leader = settled(nodes)
    cut_off, stalled = (n for n in nodes if n is not leader)
    started = [dict(s.started) for s in stats]
    cuts.links |= {(name(leader), name(cut_off)), (name(cut_off), name(leader))}
    cut_off._SyncObj__raftElectionDeadline = 0  # its timer fires: a pre-vote, or an election
    # The stall outlasts the election timeout but not the leader's check-quorum (the stalled
    # node is the only follower it reaches).
    assert MIN_TIMEOUT + 0.1 < MAX_TIMEOUT
    tick(nodes, MIN_TIMEOUT + 0.05, skip=stalled)
    cuts.holding.add(name(stalled))
    stalled._poller.poll(0)  # what queued up during the stall ...
    cuts.holding.clear()
    assert {str(h[1].id) for h in cuts.held} == {name(leader), name(cut_off)}
    cuts.release(first=name(cut_off))  # ... handled as one poll would, the pre-vote first
    tick(nodes, 2 * MAX_TIMEOUT)
    cuts.links.clear()
    tick(nodes, 2 * MAX_TIMEOUT)
    if stats:
        assert {n.raftCurrentTerm for n in nodes} == {term} and leader._isLeader()
        assert [s.started for s in stats] == started
        assert stats[nodes.index(stalled)].refused.get("leader_alive", 0) >= 1
    else:  # pysyncobj alone: no pre-vote, the cut-off node's election raises the term
        assert max(n.raftCurrentTerm for n in nodes) > term


def test_an_isolated_leader_steps_down_the_others_elect_and_it_rejoins_quietly(
    cluster: Trio,
) -> None:
    nodes, cuts, stats = cluster
    term, leader = settled(nodes)
    started = [dict(s.started) for s in stats]
    cuts.cut.add(name(leader))
    others = [n for n in nodes if n is not leader]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        leader._isLeader() or not any(n._isLeader() for n in others)
    ):
        tick(nodes, 0.05)
    assert not leader._isLeader()  # check-quorum: no majority heard within the fallback timeout
    assert stats[nodes.index(leader)].stepdowns == {"quorum_lost": 1}
    [new] = [n for n in others if n._isLeader()]
    new_term = new.raftCurrentTerm
    assert new_term == term + 1  # one round won, one election
    i = nodes.index(new)
    assert stats[i].started == {"prevote_won": started[i].get("prevote_won", 0) + 1}
    cuts.cut.clear()
    tick(nodes, 3 * MAX_TIMEOUT)
    assert new._isLeader() and {n.raftCurrentTerm for n in nodes} == {new_term}
    assert leader._getLeader() == new.selfNode


def test_two_rounds_at_once_elect_one_leader_without_a_split_vote(cluster: Trio) -> None:
    """The leader is cut off and both followers' deadlines pass together: both run a pre-vote
    round before either reads the other's.  Each would grant the other's, both would win and
    both would stand for the same term - a split vote, another election timeout without a
    leader.  Every message is held here until both have acted on what they had, so the two
    rounds overlap as fully as they can: the one that goes first (same log, lower id) refuses
    the other's, the other grants it and drops its own round, and one election follows."""
    nodes, cuts, stats = cluster
    term, leader = settled(nodes)
    started = [dict(s.started) for s in stats]
    cuts.cut.add(name(leader))
    first, second = sorted((n for n in nodes if n is not leader), key=name)
    assert first._SyncObj__getCurrentLogIndex() == second._SyncObj__getCurrentLogIndex()

    def hold_until(count: int) -> None:
        """Read the sockets (holding what comes) until ``count`` messages are held."""
        deadline = time.monotonic() + 5
        while len(cuts.held) < count and time.monotonic() < deadline:
            for n in (first, second):
                n._poller.poll(0.005)
        assert len(cuts.held) == count

    def release() -> None:
        cuts.holding.clear()
        cuts.release(first=name(first))

    def tick_once_holding() -> None:
        cuts.holding |= {name(first), name(second)}
        for n in (first, second):
            n.doTick(0)

    for n in (first, second):  # no round until their leader's last contact is old
        n._SyncObj__raftElectionDeadline = raft_clock() + 100
    tick(nodes, MIN_TIMEOUT + 0.05)
    for n in (first, second):
        n._SyncObj__raftElectionDeadline = 0
    tick_once_holding()  # both rounds start, neither has read the other's pre-vote
    for n in (first, second):
        n._SyncObj__raftElectionDeadline = raft_clock() + 100  # and neither retries here
    hold_until(2)  # the two pre-votes
    release()
    tick_once_holding()  # the pre-votes are answered
    hold_until(2)  # the two answers
    release()
    tick_once_holding()  # an election (two, in a split) before any vote request is read
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(n._isLeader() for n in (first, second)):
        release()
        tick([first, second], 0.05)
    assert first._isLeader() and first.raftCurrentTerm == term + 1  # one election, not a split
    assert stats[nodes.index(first)].refused.get("campaigning") == 1
    assert stats[nodes.index(second)].rounds["yielded"] == 1
    i, j = nodes.index(first), nodes.index(second)
    assert stats[i].started == {**started[i], "prevote_won": started[i].get("prevote_won", 0) + 1}
    assert stats[j].started == started[j]
    tick([first, second], MAX_TIMEOUT)
    assert second._getLeader() == first.selfNode and second.raftCurrentTerm == term + 1


def test_a_round_the_peer_refused_does_not_stand_in_the_peers_way(cluster: Trio) -> None:
    """The node that goes first (same log, lower id) runs a round while the other still hears
    the leader and refuses it; then the leader is gone and the other runs its round.  The
    first's round, refused, can no longer win: it grants the other's and yields, instead of
    refusing it for a round that cannot count on that peer (no leader until it gave up)."""
    nodes, cuts, stats = cluster
    term, leader = settled(nodes)
    first, second = sorted((n for n in nodes if n is not leader), key=name)
    cuts.links.add((name(leader), name(first)))  # only the first stops hearing the leader
    first._SyncObj__raftElectionDeadline = raft_clock() + 100
    tick(nodes, MIN_TIMEOUT + 0.05)
    first._SyncObj__raftElectionDeadline = 0
    first.doTick(0)  # its round starts ...
    first._SyncObj__raftElectionDeadline = raft_clock() + 100  # ... and runs on here
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not stats[nodes.index(second)].refused:
        tick(nodes, 0.05)
    assert stats[nodes.index(second)].refused == {"leader_alive": 1}
    tick(nodes, 0.05)  # the refusal reaches the first
    cuts.cut.add(name(leader))  # now the leader is gone for the other too
    second._SyncObj__raftElectionDeadline = raft_clock() + 100
    tick(nodes, MIN_TIMEOUT + 0.05)
    second._SyncObj__raftElectionDeadline = 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not second._isLeader():
        tick(nodes, 0.05)
    assert second._isLeader() and second.raftCurrentTerm == term + 1
    assert stats[nodes.index(first)].rounds["yielded"] == 1
    assert "campaigning" not in stats[nodes.index(first)].refused


def test_a_vote_request_is_ignored_while_the_leader_lives_but_a_transfer_is_honoured(
    cluster: Trio,
) -> None:
    nodes, _, stats = cluster
    term, leader = settled(nodes)
    started = [dict(s.started) for s in stats]
    follower = next(n for n in nodes if n is not leader)
    transport = follower._SyncObj__transport
    other = next(n for n in nodes if n is not leader and n is not follower)
    from_node = next(node for node in transport._connections if str(node.id) == name(other))
    request = {
        "type": "request_vote",
        "term": term + 5,
        "last_log_index": 10**6,
        "last_log_term": term + 5,
    }
    transport._onMessageReceivedCallback(from_node, request)
    assert follower.raftCurrentTerm == term  # neither granted nor its term taken
    assert stats[nodes.index(follower)].ignored == {"leader_alive": 1}
    # a leadership transfer is a real election at once, honoured by the others
    leader.transferLeadership()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and leader._isLeader():
        tick(nodes, 0.05)
    tick(nodes, MAX_TIMEOUT)
    leaders = [n for n in nodes if n._isLeader()]
    assert len(leaders) == 1 and leaders[0] is not leader
    assert stats[nodes.index(leader)].stepdowns == {"transfer": 1}
    i = nodes.index(leaders[0])
    assert stats[i].started == {**started[i], "transfer": 1}


def test_a_follower_whose_term_passed_the_leaders_brings_back_one_leader(
    cluster: Trio,
) -> None:
    nodes, _, stats = cluster
    term, leader = settled(nodes)
    follower = next(n for n in nodes if n is not leader)
    follower._SyncObj__setCurrentTerm(term + 3, None)  # it ignores the leader's appends from now on
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        tick(nodes, 0.1)
        leaders = [n for n in nodes if n._isLeader()]
        if len(leaders) == 1 and {n.raftCurrentTerm for n in nodes} == {leaders[0].raftCurrentTerm}:
            if all(n._getLeader() == leaders[0].selfNode for n in nodes):
                break
    else:
        raise AssertionError("no single leader again within 15 s")
    assert leaders[0].raftCurrentTerm > term + 3
    assert stats[nodes.index(leader)].stepdowns.get("higher_term", 0) >= 1


@BOTH
def test_a_leader_whose_process_dies_is_replaced_by_the_first_follower_at_once(
    cluster: Trio,
) -> None:
    nodes, _, stats = cluster
    term, leader = settled(nodes)
    others = [n for n in nodes if n is not leader]
    stats_of = {name(n): s for n, s in zip(nodes, stats, strict=False)}
    nodes.remove(leader)  # the fixture must not destroy it twice
    leader.destroy()  # its connections close, as a killed process's do
    killed = time.monotonic()
    deadline = killed + 10
    while not any(n._isLeader() for n in others):
        assert time.monotonic() < deadline, "no new leader within 10 s"
        tick(others, 0.002)
    took = time.monotonic() - killed
    [new] = [n for n in others if n._isLeader()]
    if stats:
        # The first of the others by id runs its pre-vote as soon as the connection closes,
        # the second 0.1 s later: no wait for an election timeout, no split vote.
        assert took < MIN_TIMEOUT, took
        assert new is min(others, key=name) and new.raftCurrentTerm == term + 1
        assert stats_of[name(new)].leader_lost == {"connection_closed": 1}
    else:  # pysyncobj alone waits for the election timeout from the leader's last heartbeat
        assert took > MIN_TIMEOUT - 0.05, took


def test_a_deadline_that_passes_during_the_tick_starts_no_election(tmp_path: Path) -> None:
    """The thread preempted between pre-vote's look at the deadline and pysyncobj's own (later
    in the same tick): the deadline passed meanwhile, and no election may follow from it."""
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    nodes: list[SyncObj] = []
    preempt: list[SyncObj] = []  # the node whose next tick is preempted

    def preempted(obj: SyncObj) -> Any:
        tick_ = obj._onTick

        def on_tick(timeToWait: float = 0.0) -> None:
            if obj in preempt:
                preempt.clear()
                time.sleep(0.02)  # its deadline passes here
            tick_(timeToWait)

        return on_tick

    try:
        for i, addr in enumerate(addrs):
            obj = SyncObj(addr, [a for a in addrs if a != addr], hand_ticked(tmp_path, i))
            obj._onTick = preempted(obj)  # inside pre-vote: what it calls pysyncobj's tick
            pre_vote(obj)
            read_before_judging(obj)
            nodes.append(obj)
        term, leader = settled(nodes)
        follower = next(n for n in nodes if n is not leader)
        preempt.append(follower)
        follower._SyncObj__raftElectionDeadline = raft_clock() + 0.002
        follower.doTick(0)
        assert follower.raftCurrentTerm == term and follower._getLeader() == leader.selfNode
        tick(nodes, MAX_TIMEOUT)
        assert leader._isLeader() and {n.raftCurrentTerm for n in nodes} == {term}
    finally:
        for n in nodes:
            n.destroy()


def test_a_single_node_elects_itself_at_its_first_ticks(tmp_path: Path) -> None:
    obj = SyncObj(f"127.0.0.1:{free_port()}", [], hand_ticked(tmp_path, 0))
    try:
        stats = pre_vote(obj)
        read_before_judging(obj)
        started = time.monotonic()
        for _ in range(5):
            obj.doTick(0)
            if obj._isLeader():
                break
        assert obj._isLeader(), "not leader after 5 ticks"
        assert time.monotonic() - started < MIN_TIMEOUT  # no election timeout waited out
        assert stats.started == {"single_node": 1}
    finally:
        obj.destroy()


@BOTH
def test_a_fresh_cluster_elects_its_first_leader_without_waiting_out_a_timeout(
    cluster: Trio,
) -> None:
    nodes, _, stats = cluster
    started = time.monotonic()
    while not any(n._isLeader() for n in nodes):
        assert time.monotonic() - started < 10, "no leader within 10 s"
        tick(nodes, 0.002)
    took = time.monotonic() - started
    if stats:  # the first by id asks as soon as it is connected
        assert took < MIN_TIMEOUT, took
        assert sum(s.started.get("prevote_won", 0) for s in stats) == 1
    else:  # pysyncobj alone: an election timeout first
        assert took > MIN_TIMEOUT - 0.05, took
