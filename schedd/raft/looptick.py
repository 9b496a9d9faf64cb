"""The Raft node's ticks driven by the event loop, not a thread of their own.

pysyncobj polls its sockets with ``select.poll``, which has no descriptor an event loop can
wait on.  :class:`EpollPoller` is the same poller over ``select.epoll``, whose descriptor
becomes readable when any of the node's sockets is: the loop watches it (``add_reader``) and
runs a tick (``doTick(0)``: timers, sends, applies, then the sockets without waiting) when
something arrived, when a command is queued, and every ``autoTickPeriod`` for the timers.  One
thread runs everything: the commit path never waits for the GIL between the Raft work and the
event loop's.
"""

from __future__ import annotations

import select
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pysyncobj.syncobj as _syncobj
from pysyncobj.poller import POLL_EVENT_TYPE, Poller


class EpollPoller(Poller):  # type: ignore[misc]
    """pysyncobj's poller over ``epoll`` (level-triggered, as ``poll``)."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._callbacks: dict[int, Callable[[int, int], None]] = {}
        self.events = 0  # events handled by the latest poll

    def fileno(self) -> int:
        return self._epoll.fileno()

    def subscribe(self, descr: Any, callback: Callable[[int, int], None], eventMask: int) -> None:
        mask = 0
        if eventMask & POLL_EVENT_TYPE.READ:
            mask |= select.EPOLLIN
        if eventMask & POLL_EVENT_TYPE.WRITE:
            mask |= select.EPOLLOUT
        if eventMask & POLL_EVENT_TYPE.ERROR:
            mask |= select.EPOLLERR
        fd = descr if isinstance(descr, int) else descr.fileno()
        self._callbacks[fd] = callback
        try:
            self._epoll.register(fd, mask)
        except FileExistsError:
            self._epoll.modify(fd, mask)

    def unsubscribe(self, descr: Any) -> None:
        fd = descr if isinstance(descr, int) else descr.fileno()
        self._callbacks.pop(fd, None)
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError, KeyError):  # closed already: epoll dropped it
            pass

    def poll(self, timeout: float) -> None:
        ready = self._epoll.poll(timeout if timeout > 0 else 0)
        self.events = len(ready)
        for fd, event in ready:
            mask = 0
            if event & select.EPOLLIN:
                mask |= POLL_EVENT_TYPE.READ
            if event & select.EPOLLOUT:
                mask |= POLL_EVENT_TYPE.WRITE
            if event & (select.EPOLLERR | select.EPOLLHUP):
                mask |= POLL_EVENT_TYPE.ERROR
            callback = self._callbacks.get(fd)
            if callback is not None:
                callback(fd, mask)

    def close(self) -> None:
        self._epoll.close()


@contextmanager
def swap_create_poller(poller: EpollPoller) -> Iterator[None]:
    """While the block runs, ``SyncObj(...)`` polls with ``poller`` (pysyncobj has no option for
    a poller object: it calls the ``createPoller`` imported into ``pysyncobj.syncobj``).  Call
    it inside ``swap_create_journal``'s block, whose lock makes constructions one at a time."""
    original = _syncobj.createPoller
    _syncobj.createPoller = lambda kind: poller
    try:
        yield
    finally:
        _syncobj.createPoller = original
