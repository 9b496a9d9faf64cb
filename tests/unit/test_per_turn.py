"""``schedd.aio.PerTurn``: what one turn of the loop puts goes as one list after it, in the
order put; an item put ``lazy`` waits for others up to ``lazy_s``, and goes at once with the
next one that may not wait."""

from __future__ import annotations

import asyncio

from schedd.aio import PerTurn


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_one_turns_items_go_as_one_list_after_it() -> None:
    sent: list[list[int]] = []
    turn = PerTurn(sent.append)
    turn.put(1)
    turn.put(2)
    assert sent == []  # not during the turn
    await settle()
    turn.put(3)
    await settle()
    assert sent == [[1, 2], [3]]


async def test_a_lazy_item_waits_for_others_then_goes_with_the_next_urgent_one() -> None:
    sent: list[list[str]] = []
    turn = PerTurn(sent.append, lazy_s=60.0)
    turn.put("beat-a", lazy=True)
    await settle()
    turn.put("beat-b", lazy=True)
    await settle()
    assert sent == []  # waiting for others (up to a minute here)
    turn.put("result")
    await settle()
    assert sent == [["beat-a", "beat-b", "result"]]  # in the order put, at once


async def test_a_lazy_item_alone_goes_within_lazy_s() -> None:
    sent: list[list[str]] = []
    done = asyncio.Event()
    turn = PerTurn(lambda items: (sent.append(items), done.set()), lazy_s=0.01)
    turn.put("beat", lazy=True)
    await settle()
    assert sent == []
    await asyncio.wait_for(done.wait(), 5)
    assert sent == [["beat"]]
    turn.put("next")  # the timer gone with the flush: an urgent item goes after its turn
    await settle()
    assert sent == [["beat"], ["next"]]
