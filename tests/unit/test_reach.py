"""A node says, every period while it lasts, which peer it cannot reach and that it knows no
leader, and once when it is over."""

from __future__ import annotations

from dataclasses import dataclass

from schedd.raft.reach import Reachability


@dataclass
class Peer:
    addr: str
    connected: bool


@dataclass
class Status:
    leader: str | None
    peers: tuple[Peer, ...]


def test_a_peer_down_for_a_period_is_named_each_period_then_once_back() -> None:
    reach = Reachability(period=5.0)
    down = Status(None, (Peer("10.0.0.2:7701", False), Peer("10.0.0.3:7701", True)))
    assert reach.look(down, 100.0) == []  # just seen: it may be connecting
    assert reach.look(down, 103.0) == []
    out = dict(reach.look(down, 105.0))
    assert out["raft.peer_unreachable"] == {"peer": "10.0.0.2:7701", "for_s": 5}
    assert out["cluster.no_leader"]["reached"] == "10.0.0.3:7701"
    again = dict(reach.look(down, 110.0))
    assert again["raft.peer_unreachable"]["for_s"] == 10 and "cluster.no_leader" in again
    back = Status("10.0.0.3:7701", (Peer("10.0.0.2:7701", True), Peer("10.0.0.3:7701", True)))
    assert reach.look(back, 115.0) == [
        ("raft.peer_reachable", {"peer": "10.0.0.2:7701"}),
        ("cluster.leader_known", {"leader": "10.0.0.3:7701"}),
    ]
    assert reach.look(back, 120.0) == []


def test_a_node_alone_says_nothing() -> None:
    assert Reachability(period=1.0).look(Status(None, ()), 10.0) == []


def test_a_peer_removed_from_the_cluster_is_forgotten() -> None:
    reach = Reachability(period=1.0)
    down = Status("10.0.0.3:7701", (Peer("10.0.0.2:7701", False), Peer("10.0.0.3:7701", True)))
    assert dict(reach.look(down, 10.0)) == {}
    assert "raft.peer_unreachable" in dict(reach.look(down, 11.0))
    removed = Status("10.0.0.3:7701", (Peer("10.0.0.3:7701", True),))
    assert reach.look(removed, 12.0) == [] and reach.down_since == {} and not reach.reported
