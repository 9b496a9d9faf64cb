"""The changes this node applied, for the clients that follow them (``GET /events``).

The tick thread appends each entry's changes (``schedd.core.events.ChangeLog``) to a bounded
ring under a lock of its own (never the state's: a client's read does not hold up apply); the
API's streams pull from it on the event loop.  The event loop is woken only while some stream
listens, at most once per turn however many entries were applied.  With nobody listening an
entry costs its records' fields and one append: the change tuples are made only when a stream
first pulls them (briefly, under the ring's lock).
"""

from __future__ import annotations

import asyncio
import threading

from schedd.core.events import EntryChanges, EventRing, Pulled

DEFAULT_SIZE = 10_000


class EventFeed:
    """``gated``: hand out an entry's changes only once :meth:`visible_upto` says the reads see
    it (a client told "run succeeded" that reads the run then finds it succeeded); else as soon
    as it is appended."""

    def __init__(self, size: int = DEFAULT_SIZE, horizon: int = 0, gated: bool = False) -> None:
        self._lock = threading.Lock()
        self._ring = EventRing(size, horizon)
        self._visible: int | None = horizon if gated else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: set[asyncio.Event] = set()  # event loop only
        self._listening = False  # read by the tick thread without the lock (a hint)
        self._wake_pending = False
        self.closed = False

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    # -- the tick thread -----------------------------------------------------------------------
    def append(self, index: int, changes: EntryChanges) -> None:
        with self._lock:
            self._ring.append(index, changes)
        if self._visible is None:
            self._notify()

    def visible_upto(self, index: int) -> None:
        """The reads now see the entries up to ``index`` (a gated feed hands them out)."""
        with self._lock:
            if self._visible is None or index <= self._visible:
                return
            self._visible = index
        self._notify()

    def restart(self, horizon: int) -> None:
        """A snapshot replaced the state: what came before ``horizon`` is not known here."""
        with self._lock:
            self._ring.restart(horizon)
            if self._visible is not None:
                self._visible = max(self._visible, horizon)
        self._notify()

    def _notify(self) -> None:
        loop = self._loop
        if self._listening and not self._wake_pending and loop is not None:
            self._wake_pending = True
            try:
                loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # the loop is closed: the node is stopping
                self._wake_pending = False

    # -- the event loop ------------------------------------------------------------------------
    def _wake(self) -> None:
        self._wake_pending = False  # before the waiters run: an append after this wakes again
        for waiter in self._waiters:
            waiter.set()

    def listen(self) -> asyncio.Event:
        """An event set whenever changes arrive (or the feed closes); :meth:`unlisten` it."""
        waiter = asyncio.Event()
        self._waiters.add(waiter)
        self._listening = True
        return waiter

    def unlisten(self, waiter: asyncio.Event) -> None:
        self._waiters.discard(waiter)
        self._listening = bool(self._waiters)

    @property
    def listeners(self) -> int:
        return len(self._waiters)

    @property
    def horizon(self) -> int:
        with self._lock:
            return self._ring.horizon

    def pull(self, after: int, limit: int) -> Pulled | None:
        with self._lock:
            return self._ring.pull(after, limit, self._visible)

    def close(self) -> None:
        """The node stops: every stream ends."""
        self.closed = True
        self._wake()
