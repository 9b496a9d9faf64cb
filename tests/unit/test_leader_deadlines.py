"""schedd/leader/leader.py ``Deadlines``: commits that wait a bounded time for their entry fail
with TimeoutError when it passes, those answered in time are left alone, on one timer."""

from __future__ import annotations

import asyncio

from schedd.core.state import Ok, Result
from schedd.leader.leader import Deadlines


async def test_only_the_commits_not_answered_in_time_fail_each_at_its_deadline() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines()
    late: asyncio.Future[Result] = loop.create_future()
    answered: asyncio.Future[Result] = loop.create_future()
    later: asyncio.Future[Result] = loop.create_future()
    deadlines.add(late, 0.05)
    deadlines.add(answered, 0.05)
    deadlines.add(later, 0.3)
    answered.set_result(Ok(1))
    await asyncio.wait([late], timeout=2)
    assert isinstance(late.exception(), TimeoutError)
    assert answered.result() == Ok(1)
    assert not later.done()  # its own deadline is later: the timer was set again for it
    await asyncio.wait([later], timeout=2)
    assert isinstance(later.exception(), TimeoutError)
    assert len(deadlines) == 0


async def test_an_earlier_deadline_added_later_moves_the_timer_forward() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines()
    slow: asyncio.Future[Result] = loop.create_future()
    quick: asyncio.Future[Result] = loop.create_future()
    deadlines.add(slow, 60)
    deadlines.add(quick, 0.05)
    await asyncio.wait([quick], timeout=2)
    assert isinstance(quick.exception(), TimeoutError) and not slow.done()
    deadlines.cancel()
    assert len(deadlines) == 0
