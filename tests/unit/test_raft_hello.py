"""The Raft connection hello (``schedd.raft.peerguard``) on real pysyncobj nodes (real sockets),
ticked by hand: nodes that speak the same protocol form a cluster as before; a node that speaks
another one - pysyncobj's own messages without a hello, as a schedd without pre-vote does, or
a newer protocol - is refused on both ends with a line that says why, gets no Raft message and
cannot disturb the cluster's term."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj
from pysyncobj.transport import TCPTransport

from schedd.raft.patches import read_before_judging
from schedd.raft.peerguard import (
    HELLO,
    PROTOCOL_VERSION,
    RAFT_PROTOCOL,
    SHARD_LAYOUT,
    PeerGuard,
)
from schedd.raft.prevote import pre_vote
from tests.conftest import free_port
from tests.unit.test_raft_pauses import MAX_TIMEOUT, hand_ticked, tick


class Guarded(PeerGuard, TCPTransport):  # type: ignore[misc]
    """The transport a schedd node runs (without the durable journal's sync)."""


class Newer(Guarded):
    protocol = RAFT_PROTOCOL + 1


class OtherShard(Guarded):
    """The Raft group of another shard of the same cluster (a port wired to the wrong one)."""

    shard = 1


class MoreShards(Guarded):
    """A node of a cluster of three shards."""

    shards = 3


class Spy:
    """Every message a node's SyncObj is given, by sender."""

    def __init__(self, obj: SyncObj) -> None:
        self.seen: list[tuple[str, Any]] = []
        transport = obj._SyncObj__transport
        inner = transport._onMessageReceivedCallback

        def receive(node: Any, message: Any) -> None:
            self.seen.append((str(node.address), message))
            inner(node, message)

        transport.setOnMessageReceivedCallback(receive)

    def types_from(self, address: str) -> set[str]:
        return {m.get("type", "?") for a, m in self.seen if a == address and isinstance(m, dict)}


def node(tmp_path: Path, i: int, addr: str, addrs: list[str], cls: type | None) -> SyncObj:
    """A schedd transport class, or None for pysyncobj's plain transport (a node that speaks
    Raft without a hello)."""
    kwargs: dict[str, Any] = {} if cls is None else {"transportClass": cls}
    obj = SyncObj(addr, [a for a in addrs if a != addr], hand_ticked(tmp_path, i), **kwargs)
    if cls is not None:
        pre_vote(obj)
        read_before_judging(obj)
    return obj


def build(tmp_path: Path, transports: list[type | None]) -> list[SyncObj]:
    """One node per entry, the last with the lowest address: the others connect to it (a node
    connects to the peers whose address sorts before its own)."""
    addrs = sorted((f"127.0.0.1:{free_port()}" for _ in transports), reverse=True)
    made: list[SyncObj] = []
    try:
        for i, (addr, cls) in enumerate(zip(addrs, transports, strict=True)):
            made.append(node(tmp_path, i, addr, addrs, cls))
    except BaseException:
        for n in made:
            n.destroy()
        raise
    return made


@pytest.fixture
def destroy() -> Iterator[list[SyncObj]]:
    made: list[SyncObj] = []
    yield made
    for n in made:
        n.destroy()


def transport(obj: SyncObj) -> Any:
    return obj._SyncObj__transport


def leader_of(nodes: list[SyncObj]) -> SyncObj | None:
    leaders = [n for n in nodes if n._isLeader()]
    return leaders[0] if len(leaders) == 1 else None


def until(nodes: list[SyncObj], done: Any, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not done():
        assert time.monotonic() < deadline, "not reached in time"
        tick(nodes, 0.05)


def with_odd_one(
    tmp_path: Path, destroy: list[SyncObj], caplog: pytest.LogCaptureFixture, odd: type | None
) -> tuple[list[SyncObj], list[SyncObj], SyncObj]:
    """Two schedd nodes and one with the transport ``odd``: all, the two, the odd one."""
    caplog.set_level(logging.ERROR, logger="schedd.raft.peerguard")
    nodes = build(tmp_path, [Guarded, Guarded, odd])
    destroy.extend(nodes)
    return nodes, nodes[:2], nodes[2]


def elected(nodes: list[SyncObj], members: list[SyncObj]) -> tuple[SyncObj, int]:
    """Tick until one of ``members`` leads: it, and its term."""
    until(nodes, lambda: leader_of(members) is not None)
    leader = leader_of(members)
    assert leader is not None
    return leader, leader.raftCurrentTerm


def refusal_lines(caplog: pytest.LogCaptureFixture, peer: str) -> list[dict[str, Any]]:
    return [
        r.fields  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage() == "raft.peer_refused" and r.fields.get("peer") == peer  # type: ignore[attr-defined]
    ]


def test_nodes_that_speak_the_same_protocol_form_a_cluster_after_their_hellos(
    tmp_path: Path, destroy: list[SyncObj]
) -> None:
    nodes = build(tmp_path, [Guarded, Guarded, Guarded])
    destroy.extend(nodes)
    spies = [Spy(n) for n in nodes]
    until(nodes, lambda: leader_of(nodes) is not None)
    leader = leader_of(nodes)
    assert leader is not None
    until(nodes, lambda: all(n._getLeader() == leader.selfNode for n in nodes))
    for n, spy in zip(nodes, spies, strict=True):
        assert transport(n).refusals[PROTOCOL_VERSION] == 0
        assert len(transport(n)._verified) == 2
        assert not any(isinstance(m, dict) and m.get("type") == HELLO for _, m in spy.seen)


def test_a_node_without_the_hello_is_refused_and_cannot_disturb_the_cluster(
    tmp_path: Path, destroy: list[SyncObj], caplog: pytest.LogCaptureFixture
) -> None:
    nodes, schedd_nodes, old = with_odd_one(tmp_path, destroy, caplog, None)
    spies = [Spy(n) for n in schedd_nodes]
    leader, term = elected(nodes, schedd_nodes)
    # The old node runs election after election (nobody answers it): its vote requests are
    # refused at the connection, so the leader keeps its term.
    until(nodes, lambda: old.raftCurrentTerm > term + 2)
    old_address = str(old.selfNode.address)
    until(nodes, lambda: all(transport(n).refusals[PROTOCOL_VERSION] >= 1 for n in schedd_nodes))
    tick(nodes, 2 * MAX_TIMEOUT)
    assert leader._isLeader() and leader.raftCurrentTerm == term
    assert old._getLeader() is None  # nobody sends it appends
    for n, spy in zip(schedd_nodes, spies, strict=True):
        assert spy.types_from(old_address) == set()  # nothing of it reached pysyncobj
        assert old.selfNode not in transport(n)._verified
    lines = refusal_lines(caplog, old_address)
    assert lines and all(line["reason"] == PROTOCOL_VERSION for line in lines)
    assert "protocol 1" in lines[0]["hint"] and "Upgrades" in lines[0]["hint"]


def test_a_node_of_another_protocol_is_refused_on_both_ends(
    tmp_path: Path, destroy: list[SyncObj], caplog: pytest.LogCaptureFixture
) -> None:
    nodes, current, newer = with_odd_one(tmp_path, destroy, caplog, Newer)
    leader, term = elected(nodes, current)
    until(nodes, lambda: all(transport(n).refusals[PROTOCOL_VERSION] >= 1 for n in nodes))
    tick(nodes, 3 * MAX_TIMEOUT)
    # The newer node speaks pre-vote too: refused by both, it never raises its term.
    assert newer.raftCurrentTerm <= term and newer._getLeader() is None
    assert leader._isLeader() and leader.raftCurrentTerm == term
    newer_address = str(newer.selfNode.address)
    hints = [line["hint"] for line in refusal_lines(caplog, newer_address)]
    assert any(f"protocol {RAFT_PROTOCOL + 1}" in h for h in hints)
    # and the newer node refused them, saying so too
    theirs = [line["hint"] for line in refusal_lines(caplog, str(leader.selfNode.address))]
    assert any(f"speaks schedd Raft protocol {RAFT_PROTOCOL} " in h for h in theirs)


def test_a_refused_node_upgraded_in_place_joins(tmp_path: Path, destroy: list[SyncObj]) -> None:
    nodes = build(tmp_path, [Guarded, Guarded, None])
    destroy.extend(nodes)
    schedd_nodes, old = nodes[:2], nodes[2]
    until(nodes, lambda: all(transport(n).refusals[PROTOCOL_VERSION] >= 1 for n in schedd_nodes))
    leader, term = elected(nodes, schedd_nodes)
    # Upgraded: the same address, now with the hello (the others' connections to it are the
    # ones they opened before, reconnected).
    address = str(old.selfNode.address)
    old.destroy()
    destroy.remove(old)
    addrs = [str(n.selfNode.address) for n in nodes]
    upgraded = node(tmp_path, 3, address, addrs, Guarded)
    destroy.append(upgraded)
    nodes = [*schedd_nodes, upgraded]
    until(nodes, lambda: upgraded._getLeader() == leader.selfNode)
    assert leader._isLeader() and leader.raftCurrentTerm == term
    assert all(len(transport(n)._verified) == 2 for n in nodes)


class LosesFirstHellos(Guarded):
    """Its first hello to each peer is lost on the way (as on a connection that drops
    messages, like the fault proxy's)."""

    def _onNodeConnected(self, node: Any) -> None:
        lost: set[Any] = self.__dict__.setdefault("lost_to", set())
        conn = self._connections.get(node)
        if node in lost or conn is None:
            super()._onNodeConnected(node)
            return
        lost.add(node)
        conn.send = lambda message: None
        try:
            super()._onNodeConnected(node)
        finally:
            del conn.send


def test_hellos_lost_both_ways_cost_a_reconnection_not_the_link(
    tmp_path: Path, destroy: list[SyncObj]
) -> None:
    nodes = build(tmp_path, [LosesFirstHellos, LosesFirstHellos, Guarded])
    destroy.extend(nodes)
    for n in nodes:
        n._SyncObj__conf.connectionRetryTime = 0.5
    # Two nodes wait for each other's hello, and neither sends anything else before it: only
    # the hello timeout (connectionTimeout) gets them a new connection with new hellos.
    until(nodes, lambda: all(len(transport(n)._verified) == 2 for n in nodes), limit=30)
    leader, _ = elected(nodes, nodes)
    until(nodes, lambda: all(n._getLeader() == leader.selfNode for n in nodes))


def test_a_message_on_a_peers_older_connection_is_dropped_not_refused(
    tmp_path: Path, destroy: list[SyncObj]
) -> None:
    """A peer that reconnected (after a pause, say) may leave its older connection open here
    for a while, pysyncobj having replaced it without closing it: what still arrives on that
    one is neither the new connection's hello nor anything to act on."""
    nodes = build(tmp_path, [Guarded, Guarded, Guarded])
    destroy.extend(nodes)
    until(nodes, lambda: all(len(transport(n)._verified) == 2 for n in nodes))
    a, b = nodes[0], nodes[1]
    guard = transport(b)
    peer = next(n for n in guard._connections if str(n.address) == str(a.selfNode.address))
    spy = Spy(b)
    guard._onNodeConnected(peer)  # a new connection, its hello not there yet
    older = object()  # the connection it replaced
    stale = {"type": "append_entries", "term": a.raftCurrentTerm, "commit_index": 0}
    guard._from(older, peer, stale)
    assert guard.refusals[PROTOCOL_VERSION] == 0 and peer in guard._awaiting_hello
    assert spy.seen == []
    guard._from(guard._connections[peer], peer, stale)  # on the new one: Raft before a hello
    assert peer not in guard._awaiting_hello  # closed at the next tick, quietly (spoke ours)
    assert guard.refusals[PROTOCOL_VERSION] == 0


@pytest.mark.parametrize(
    ("odd", "says"),
    [
        (OtherShard, "is shard 1's Raft port and this one shard 0's"),
        (MoreShards, "is a node of a cluster of 3 shard(s) and this node of 1"),
    ],
)
def test_a_node_of_another_shard_layout_is_refused_on_both_ends(
    tmp_path: Path,
    destroy: list[SyncObj],
    caplog: pytest.LogCaptureFixture,
    odd: type,
    says: str,
) -> None:
    nodes, same, other = with_odd_one(tmp_path, destroy, caplog, odd)
    leader, term = elected(nodes, same)
    until(nodes, lambda: all(transport(n).refusals[SHARD_LAYOUT] >= 1 for n in nodes))
    tick(nodes, 3 * MAX_TIMEOUT)
    # It speaks the same protocol, but it is another group: no vote of it counts, no entry
    # reaches it, and the cluster keeps its leader and term.
    assert other._getLeader() is None and other.raftCurrentTerm <= term
    assert leader._isLeader() and leader.raftCurrentTerm == term
    for n in same:
        assert other.selfNode not in transport(n)._verified
        assert transport(n).refusals[PROTOCOL_VERSION] == 0
    hints = [line["hint"] for line in refusal_lines(caplog, str(other.selfNode.address))]
    assert hints and all(says in h for h in hints), hints
    reasons = {line["reason"] for line in refusal_lines(caplog, str(leader.selfNode.address))}
    assert reasons == {SHARD_LAYOUT}  # and the odd node refused them
