"""Small asyncio helpers.

``asyncio.wait_for`` on Python 3.11 can swallow a cancellation that arrives as the awaited
thing completes (the task then never stops: seen here as a node that did not exit on SIGTERM).
``asyncio.timeout`` counts cancellations correctly, so waits in loops use these instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

T = TypeVar("T")


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait for ``event`` at most ``timeout`` seconds; True when it was set."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
        return True
    except TimeoutError:
        return False


async def within(aw: Awaitable[T], timeout: float) -> T:
    """``await aw`` with a timeout (raises ``TimeoutError``), cancellation-safe."""
    async with asyncio.timeout(timeout):
        return await aw


async def first_set(*events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set (a stop asked for, or a failure)."""
    waits = {asyncio.ensure_future(e.wait()) for e in events}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on uvloop (a dependency on Linux), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main)
    return uvloop.run(main)


class PerTurn(Generic[T]):
    """Items put during one turn of the event loop, handed to ``send`` as one list after it
    (many small frames of one turn become one message).  An item put ``lazy`` may wait up to
    ``lazy_s`` for others (a heartbeat: many workers' in one message), and goes at once with
    the next item that may not."""

    def __init__(self, send: Callable[[list[T]], None], lazy_s: float = 0.0) -> None:
        self._send = send
        self.lazy_s = lazy_s
        self.pending: list[T] = []
        self._soon = False
        self._later: asyncio.TimerHandle | None = None

    def put(self, item: T, lazy: bool = False) -> None:
        self.pending.append(item)
        if self._soon:
            return
        loop = asyncio.get_running_loop()
        if not lazy or self.lazy_s <= 0:
            self._soon = True
            loop.call_soon(self._flush)
        elif self._later is None:
            self._later = loop.call_later(self.lazy_s, self._flush)

    def _flush(self) -> None:
        self._soon = False
        if self._later is not None:
            self._later.cancel()
            self._later = None
        if self.pending:
            pending, self.pending = self.pending, []
            self._send(pending)
