"""One listing across shards: each shard reads a page of its own in one order, and the pages are
merged into one page of that order, with a cursor every shard can go on from.

Each shard's page says where its reading stopped (its own cursor; None: it has nothing more).
Everything up to the earliest of those places, in the listing's order, is known from every
shard, so the merged page holds what lies up to there, at most ``limit`` items; its cursor is
its last item's place, or that earliest place when fewer were known (a page can then be short,
or empty, and still go on: as a filtered page of one shard already can).

A place in the whole listing is a *global* key: for an order by a time, ``(time, shard, seq)``
(seq, the shard's own order of addition, breaks ties within a shard, and the shard's number
between shards); for an order by job id (created, across shards), ``(id,)``.  A shard goes on
from a global key through :meth:`Placement.local_after`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
Key = tuple[int, ...]  # a shard's own place: (time, seq)
GlobalKey = tuple[int, ...]  # a place in the whole listing: (time, shard, seq)

#: a seq no row has: above every seq (they count up from 0 and stay below 2^62)
_ABOVE = 1 << 62
_BELOW = -1


@dataclass(frozen=True, slots=True)
class ShardPage(Generic[T]):
    """What one shard read: its items in the listing's order, each with its own place, and
    where its reading stopped (None: it has nothing after its items)."""

    shard: int
    items: Sequence[tuple[Key, T]]
    cursor: Key | None


@dataclass(frozen=True, slots=True)
class Placement:
    """The listing's direction, and how a shard's places and the whole listing's map."""

    desc: bool

    @staticmethod
    def to_global(shard: int, key: Key) -> GlobalKey:
        time, seq = key
        return (time, shard, seq)

    def local_after(self, shard: int, after: GlobalKey) -> Key:
        """The place shard ``shard`` goes on after (exclusive), for a listing that goes on
        after the global place ``after``: a shard ordered before ``after``'s in the listing
        has nothing more at ``after``'s time, one ordered after it has all of that time still
        to come, and ``after``'s own shard goes on after ``after``'s seq."""
        time, owner, seq = after
        if shard == owner:
            return (time, seq)
        earlier = shard < owner if not self.desc else shard > owner
        if earlier:  # its rows at that time come before ``after``: all of them were listed
            return (time, _BELOW if self.desc else _ABOVE)
        return (time, _ABOVE if self.desc else _BELOW)  # none of them yet


def merge(
    pages: Sequence[ShardPage[T]], limit: int, placement: Placement
) -> tuple[list[T], GlobalKey | None]:
    """One page of at most ``limit`` items from the shards' pages, and the global place the
    next page goes on after (None: this is the last)."""
    horizon: GlobalKey | None = None
    for page in pages:
        if page.cursor is None:
            continue
        edge = placement.to_global(page.shard, page.cursor)
        if horizon is None or (edge > horizon if placement.desc else edge < horizon):
            horizon = edge
    known = [
        (placement.to_global(page.shard, key), item) for page in pages for key, item in page.items
    ]
    if horizon is not None:
        known = [(g, i) for g, i in known if (g >= horizon if placement.desc else g <= horizon)]
    known.sort(key=lambda gi: gi[0], reverse=placement.desc)
    taken = known[:limit]
    if len(known) > limit:
        return [i for _, i in taken], taken[-1][0]
    return [i for _, i in taken], horizon
