"""Which node should lead each shard: the leaders of a cluster's shards spread over its nodes.

Every node computes the same answer from the shard's voters alone, with no message between
them: shard k's *preference* is the voters in address order, turned by k places, so with
``n`` voters and ``N`` shards each node is first for ⌈N / n⌉ or ⌊N / n⌋ of them.  The node that
leads a shard hands it to the first voter of the preference that is ready to take it (a
connected follower holding the whole log), if that voter comes before itself; a node ahead of
it that is down or behind is passed over, so a failover leaves the shard where it went until
the preferred node is back and caught up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def _address_key(address: str) -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[::1]:port``) in the order of its host, then its port."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port) if port.isdigit() else -1


def preference(voters: Sequence[str], shard: int) -> list[str]:
    """Shard ``shard``'s voters (Raft addresses of its group) in the order they should lead
    it: address order, turned by ``shard`` places."""
    order = sorted(voters, key=_address_key)
    if not order:
        return []
    turn = shard % len(order)
    return order[turn:] + order[:turn]


def hand_to(
    leader: str, voters: Sequence[str], shard: int, ready: Callable[[str], bool]
) -> str | None:
    """The voter the leader ``leader`` of shard ``shard`` should hand it to now (None: keep it):
    the first of the preference before ``leader`` for which ``ready`` holds."""
    for address in preference(voters, shard):
        if address == leader:
            return None
        if ready(address):
            return address
    return None
