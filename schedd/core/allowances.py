"""Concurrency caps across shards: each shard's share of a namespace's cap, and the ledger of
the slots moved between shards.

A namespace's cap ``C`` (``limits.concurrency``) holds for the whole cluster.  With ``N``
shards, shard ``k`` may have ``allowance(C, N, k, ledger, ns)`` runs of the namespace leased
at once: its static share of the cap (``C // N``, plus one for ``k < C % N``; the shares add
up to ``C``) plus what its ledger says it took from other shards less what it gave them.

Slots move only by two replicated steps, each in its own shard's log:

1. the source's leader gives slots it does not use (``CapsGive``): its ``moved`` falls and
   the transfer waits in its outbox, under the index of the give as its ``seq``;
2. the destination credits it (``CapsTake``) only if ``seq`` is above the last one it took
   from that source, so a transfer delivered twice counts once; the source then drops it
   from its outbox (``CapsDelivered``).

Transfers from one source to one destination are delivered in ``seq`` order, so a ``seq``
at or below what a destination took is one it has.  At every moment the allowances, plus the
transfers in outboxes, add up to the cap: a deposed leader cannot commit a give, a new leader
starts from its log, and whoever delivers a transfer, it is credited once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Transfer(NamedTuple):
    """Slots given by this shard, not yet known to be credited by ``dest``."""

    seq: int  # the log index of the give
    namespace: str
    amount: int
    dest: int


@dataclass(frozen=True, slots=True)
class CapsLedger:
    """One shard's record of the slots it moved: replaced (never changed) by each command."""

    #: namespace -> slots taken less slots given (a shard's allowance is its share plus this)
    moved: Mapping[str, int] = field(default_factory=dict)
    outbox: tuple[Transfer, ...] = ()
    #: source shard -> the highest seq credited from it
    taken: Mapping[int, int] = field(default_factory=dict)

    def give(self, seq: int, namespace: str, amount: int, dest: int) -> CapsLedger:
        moved = dict(self.moved)
        moved[namespace] = moved.get(namespace, 0) - amount
        return CapsLedger(
            _nonzero(moved), (*self.outbox, Transfer(seq, namespace, amount, dest)), self.taken
        )

    def take(self, source: int, seq: int, namespace: str, amount: int) -> CapsLedger | None:
        """The ledger with the transfer credited; None if it was credited before."""
        if seq <= self.taken.get(source, 0):
            return None
        moved = dict(self.moved)
        moved[namespace] = moved.get(namespace, 0) + amount
        return CapsLedger(_nonzero(moved), self.outbox, {**self.taken, source: seq})

    def delivered(self, dest: int, seq: int) -> CapsLedger:
        """Without the transfers to ``dest`` up to ``seq`` (credited there)."""
        keep = tuple(t for t in self.outbox if t.dest != dest or t.seq > seq)
        return self if len(keep) == len(self.outbox) else CapsLedger(self.moved, keep, self.taken)

    def to_json(self) -> dict[str, Any]:
        return {
            "moved": dict(self.moved),
            "outbox": [[t.seq, t.namespace, t.amount, t.dest] for t in self.outbox],
            "taken": {str(k): v for k, v in self.taken.items()},
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> CapsLedger:
        return cls(
            {str(k): int(v) for k, v in obj.get("moved", {}).items()},
            tuple(
                Transfer(int(s), str(ns), int(a), int(d)) for s, ns, a, d in obj.get("outbox", [])
            ),
            {int(k): int(v) for k, v in obj.get("taken", {}).items()},
        )


EMPTY = CapsLedger()


def _nonzero(moved: dict[str, int]) -> dict[str, int]:
    return {ns: n for ns, n in moved.items() if n}


def static_share(cap: int, shards: int, shard: int) -> int:
    """Shard ``shard``'s share of ``cap`` before any transfer; the shares add up to ``cap``."""
    return cap // shards + (1 if shard < cap % shards else 0)


def allowance(cap: int, shards: int, shard: int, ledger: CapsLedger, namespace: str) -> int:
    """How many runs of ``namespace`` shard ``shard`` may have leased at once."""
    if shards == 1:
        return cap
    return max(0, static_share(cap, shards, shard) + ledger.moved.get(namespace, 0))


class ShardCaps(NamedTuple):
    """What a shard's leader reports of one namespace: the coordinator's input."""

    allowance: int  # what it may lease at once
    in_use: int  # leased, or being leased
    waiting: int  # runs ready for a worker


def fair_shares(cap: int, demand: Mapping[int, int], turn: int) -> dict[int, int]:
    """Max-min fair shares of ``cap`` slots among the shards by what they want (``demand``,
    runs in flight plus runs waiting; a shard wanting nothing gets 0).  Slots that do not
    divide evenly go round the shards by ``turn`` (the coordinator's round), so with fewer
    slots than shards that want them, each gets one in turn."""
    share = dict.fromkeys(demand, 0)
    left = cap
    open_ = sorted(k for k, d in demand.items() if d > 0)
    while left > 0 and open_:
        each = left // len(open_)
        if each == 0:  # fewer slots than shards: by turn
            start = turn % len(open_)
            for k in (open_[start:] + open_[:start])[:left]:
                share[k] += 1
            break
        for k in list(open_):
            n = min(each, demand[k] - share[k])
            share[k] += n
            left -= n
            if share[k] >= demand[k]:
                open_.remove(k)
    return share


def plan(
    cap: int, view: Mapping[int, ShardCaps], turn: int
) -> tuple[list[tuple[int, int, int]], dict[int, int]]:
    """The transfers ``(source, dest, amount)`` that bring each shard towards its fair share
    of ``cap`` (:func:`fair_shares`), and the soft limits ``shard -> limit`` for shards over
    their share while another is under it: such a shard leases no more than its share, so
    the slots its runs free go to the others (they are given at a later round).  A source
    gives only slots it does not use.  Shards not in ``view`` (not reachable) take no part."""
    fair = fair_shares(cap, {k: s.in_use + s.waiting for k, s in view.items()}, turn)
    deficit = {k: fair[k] - s.allowance for k, s in view.items() if fair[k] > s.allowance}
    if not deficit:
        return [], {}
    over = {k: s.allowance - fair[k] for k, s in view.items() if s.allowance > fair[k]}
    limits = {k: fair[k] for k in over}
    moves: list[tuple[int, int, int]] = []
    for dest in sorted(deficit, key=lambda k: (-deficit[k], k)):
        for source in sorted(over, key=lambda k: (-over[k], k)):
            free = min(over[source], view[source].allowance - view[source].in_use)
            n = min(free - sum(m for s, _, m in moves if s == source), deficit[dest])
            if n > 0:
                moves.append((source, dest, n))
                deficit[dest] -= n
    return moves, limits
