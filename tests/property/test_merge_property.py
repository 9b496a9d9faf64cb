"""Pages merged across shards, page after page, give every matching item of every shard once,
in the listing's order, whatever the shards hold, the page size, the direction, and however
few rows each shard reads for a page (a filter read in windows)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schedd.api.merge import GlobalKey, Key, Placement, ShardPage, merge

Row = tuple[int, int]  # (time, seq): a shard's own place


def shard_page(
    shard: int, rows: list[Row], after: Key | None, limit: int, window: int | None, desc: bool
) -> ShardPage[tuple[int, int, int]]:
    """What a shard's reader answers (schedd.storage.reader.Reader.jobs_page): the matching rows
    after ``after`` in order, at most ``limit``, reading at most ``window`` rows."""
    ordered = sorted(rows, reverse=desc)
    if after is not None:
        ordered = [r for r in ordered if (r < after if desc else r > after)]
    scanned = ordered if window is None else ordered[:window]
    matching = [r for r in scanned if r[1] % 3 != 0]  # the filter
    items = [(r, (r[0], shard, r[1])) for r in matching[:limit]]
    if len(matching) > limit:
        return ShardPage(shard, items, matching[limit - 1])
    if window is not None and len(ordered) > window:
        return ShardPage(shard, items, scanned[-1])  # read to the window's end
    return ShardPage(shard, items, None)


shards_rows = st.lists(
    st.lists(st.integers(0, 6), max_size=25).map(
        lambda times: [(t, seq) for seq, t in enumerate(times)]
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(
    shards=shards_rows,
    limit=st.integers(1, 7),
    window=st.none() | st.integers(1, 6),
    desc=st.booleans(),
)
def test_every_match_once_in_order(
    shards: list[list[Row]], limit: int, window: int | None, desc: bool
) -> None:
    placement = Placement(desc)
    want = sorted(
        ((t, k, seq) for k, rows in enumerate(shards) for t, seq in rows if seq % 3 != 0),
        reverse=desc,
    )
    got: list[tuple[int, int, int]] = []
    cursor: GlobalKey | None = None
    for _ in range(1_000):
        pages = [
            shard_page(
                k,
                rows,
                None if cursor is None else placement.local_after(k, cursor),
                limit,
                window,
                desc,
            )
            for k, rows in enumerate(shards)
        ]
        items, after = merge(pages, limit, placement)
        assert len(items) <= limit
        got += items
        if after is None:
            break
        assert cursor is None or (after < cursor if desc else after > cursor)  # it moves on
        cursor = after
    assert got == want
