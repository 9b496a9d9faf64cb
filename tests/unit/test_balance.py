"""The leaders of a cluster's shards spread over its nodes, each node computing the same."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from schedd.core.balance import hand_to, preference

NODES = ["10.0.0.3:7701", "10.0.0.1:7701", "10.0.0.2:7701"]


def shard_voters(shard: int) -> list[str]:
    """Shard k's group: every node's Raft port + k."""
    return [f"{a.rsplit(':', 1)[0]}:{7701 + shard}" for a in NODES]


def test_each_node_is_first_for_its_share_of_the_shards() -> None:
    firsts = Counter(preference(shard_voters(k), k)[0].rsplit(":", 1)[0] for k in range(7))
    assert sorted(firsts.values()) == [2, 2, 3]  # 7 shards over 3 nodes: 3, 2, 2
    assert preference(shard_voters(0), 0)[0] == "10.0.0.1:7701"
    assert preference(shard_voters(1), 1)[0] == "10.0.0.2:7702"


def test_ipv6_voters_are_ordered_by_their_addresses_without_the_brackets() -> None:
    # "fd00::1" comes before "fd00::1:2", of which it is the start; with its bracket kept,
    # "]" would sort after ":" and put it second
    voters = ["[fd00::1:2]:7701", "[fd00::1]:7701"]
    assert preference(voters, 0) == ["[fd00::1]:7701", "[fd00::1:2]:7701"]
    assert preference(voters, 1) == ["[fd00::1:2]:7701", "[fd00::1]:7701"]


@given(st.permutations(NODES), st.integers(0, 31))
def test_the_order_of_the_voters_given_does_not_matter(order: list[str], shard: int) -> None:
    assert preference(order, shard) == preference(NODES, shard)


def test_the_leader_hands_over_only_to_a_ready_voter_ahead_of_it() -> None:
    voters = shard_voters(1)  # preference: .2, .3, .1
    everyone = lambda address: True  # noqa: E731
    assert hand_to("10.0.0.1:7702", voters, 1, everyone) == "10.0.0.2:7702"
    assert hand_to("10.0.0.2:7702", voters, 1, everyone) is None  # it is the first
    # the first is down: the second keeps it, the third hands it to the second
    down = lambda address: address != "10.0.0.2:7702"  # noqa: E731
    assert hand_to("10.0.0.3:7702", voters, 1, down) is None
    assert hand_to("10.0.0.1:7702", voters, 1, down) == "10.0.0.3:7702"
    assert hand_to("10.0.0.1:7702", voters, 1, lambda a: False) is None
