"""A node's front door merges its shards' pages, page after page, with a cursor holding each
shard's own: every matching item of every shard comes once, in the listing's order, whatever
the shards hold, the page size, the direction, and however few rows each shard reads for a
page (a filtered listing read in windows)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schedd.shard.frontdoor import (
    BadCursor,
    Page,
    decode_cursor,
    encode_cursor,
    merge_pages,
)

Row = tuple[int, int]  # (time, seq): a shard's own order is by time, then seq


def shard_page(
    shard: int, rows: list[Row], cursor: str, limit: int, window: int | None, desc: bool
) -> Page:
    """What a shard's API answers with ``?places``: the matching rows after its cursor ("":
    from the first) in order, at most ``limit``, reading at most ``window`` rows; each row's
    own cursor; where it goes on."""
    ordered = sorted(rows, reverse=desc)
    if cursor:
        t, seq = (int(x) for x in cursor.split("."))
        ordered = [r for r in ordered if (r < (t, seq) if desc else r > (t, seq))]
    scanned = ordered if window is None else ordered[:window]
    matching = [r for r in scanned if r[1] % 3 != 0]  # the filter
    taken = matching[:limit]
    items = [{"key": (r[0], shard, r[1])} for r in taken]
    places = [f"{r[0]}.{r[1]}" for r in taken]
    if len(matching) > limit:
        return Page(items, places, places[-1])
    if window is not None and len(ordered) > window:
        return Page(items, places, f"{scanned[-1][0]}.{scanned[-1][1]}")  # the window's end
    return Page(items, places, None)


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
    want = sorted(
        ((t, k, seq) for k, rows in enumerate(shards) for t, seq in rows if seq % 3 != 0),
        reverse=desc,
    )
    got: list[tuple[int, int, int]] = []
    cursors: list[str | None] = [""] * len(shards)
    for _ in range(1_000):
        pages = [
            None if c is None else shard_page(k, rows, c, limit, window, desc)
            for k, (rows, c) in enumerate(zip(shards, cursors, strict=True))
        ]
        items, after = merge_pages(pages, limit, lambda item: item["key"], desc, cursors)
        assert len(items) <= limit
        got += [item["key"] for item in items]
        if after is None:
            break
        # it moves on, and the cursor it gives survives its round trip
        assert after != cursors or items
        cursors = decode_cursor(encode_cursor(after), len(shards))
    else:
        raise AssertionError("the listing did not end")
    assert got == want


@given(st.lists(st.none() | st.text(max_size=12), min_size=1, max_size=5))
def test_a_cursor_round_trips(cursors: list[str | None]) -> None:
    assert decode_cursor(encode_cursor(cursors), len(cursors)) == cursors


def test_a_cursor_of_another_listing_or_size_is_refused() -> None:
    for text, shards in (("12", 3), ("s1.!!", 3), (encode_cursor(["a", None]), 3)):
        try:
            decode_cursor(text, shards)
        except BadCursor:
            continue
        raise AssertionError(f"{text!r} accepted")
