"""Workers' progress reports on the leader: which to commit, and when.

A worker lists every lease it holds in each heartbeat (and in its hello), with the handler's
latest ``ctx.progress``.  Heartbeats never go through Raft, but a progress must, to be kept with
the attempt on every node, so the leader commits one only:

* when it differs from what the attempt holds (or will hold once the command in flight is
  applied): a heartbeat that repeats it costs nothing;
* at most once per lease per :data:`PROGRESS_PERIOD_S`: a value reported sooner waits for the
  lease's next turn, and a newer report replaces it (the latest wins);
* batched: every lease whose turn has come in one ``Progress`` command (of about
  :data:`PROGRESS_BATCH_BYTES` at most), one command at a time;
* bounded: a value larger than ``MAX_PROGRESS_BYTES`` as JSON is dropped with a log line (once
  per lease), and the attempt keeps the value it had.

The end of an attempt (a worker's ``complete``/``fail``, or a lease the leader ends) records
the final progress: the one the result carries, or else the one still waiting (:meth:`final`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from schedd.leader.workers import LeaseInfo, LeaseProgress
from schedd.protocol.messages import MAX_PROGRESS_BYTES, progress_json

#: A lease's progress is committed at most this often.  The welcome's default heartbeat interval
#: (``scheduler.heartbeat_interval``) is 5 s, so a worker at the defaults has every changed
#: report recorded; only leases that heartbeat more often (a job with a short heartbeat timeout
#: asks for a third of it) or a worker that reports faster than asked are slowed down, to at
#: most one entry's worth of their progress per 5 s, however chatty.
PROGRESS_PERIOD_S = 5.0
#: The progress of this many bytes at most (as JSON) goes in one command; the rest waits for
#: the next (a value is at most ``MAX_PROGRESS_BYTES``, so a command holds 64 of the largest).
PROGRESS_BATCH_BYTES = 256 * 1024


def held_progress(value: Any) -> LeaseProgress | None:
    """The bookkeeping of a lease whose attempt already holds the progress ``value`` (a new
    leader's rebuild): a report of the same value is not committed again."""
    return None if value is None else LeaseProgress(recorded=progress_json(value))


class ProgressBook:
    """The leases whose progress waits to be committed (see the module docstring)."""

    def __init__(self, dropped: Callable[[LeaseInfo, int], None] = lambda info, size: None):
        #: told of a report too large to keep (once per lease): the lease, its size as JSON
        #: (-1: not JSON at all); the leader logs it
        self.dropped = dropped
        self._queue: list[tuple[float, int, LeaseInfo]] = []  # (turn, order, lease): a heap
        self._order = itertools.count()
        self.busy = False  # a Progress command is being committed

    def reported(self, info: LeaseInfo, value: Any) -> None:
        """The worker holding the lease ``info`` reports ``value`` (None: no progress)."""
        p = self._take(info, value)
        if p is not None and p.waiting is not None and not p.queued:
            p.queued = True
            heapq.heappush(self._queue, (p.after, next(self._order), info))

    def _take(self, info: LeaseInfo, value: Any) -> LeaseProgress | None:
        """Note ``value`` as the lease's progress waiting to be recorded (not when the attempt
        holds it already, nor when it is too large); its bookkeeping, None when never any."""
        if value is None:
            return info.progress
        text = progress_json(value)
        p = info.progress
        if p is None:
            p = info.progress = LeaseProgress()
        if text is None or len(text) > MAX_PROGRESS_BYTES:
            if not p.warned:
                p.warned = True
                self.dropped(info, -1 if text is None else len(text))
        elif text == p.recorded:
            p.value = p.waiting = None  # back to what the attempt holds: nothing to record
        else:
            p.value, p.waiting = value, text
        return p

    def due(self, now: float, live: Callable[[LeaseInfo], bool]) -> list[tuple[LeaseInfo, Any]]:
        """The waiting progress whose lease's turn has come at ``now`` (monotonic), of the leases
        still ``live``, up to about ``PROGRESS_BATCH_BYTES``; each counts as recorded from now,
        and its lease's next turn is ``PROGRESS_PERIOD_S`` later."""
        out: list[tuple[LeaseInfo, Any]] = []
        size = 0
        queue = self._queue
        while queue and queue[0][0] <= now and size < PROGRESS_BATCH_BYTES:
            info = heapq.heappop(queue)[2]
            p = info.progress
            assert p is not None
            p.queued = False
            if p.waiting is None or not live(info):
                continue  # recorded with the attempt's end meanwhile, or the lease is over
            out.append((info, p.value))
            size += len(p.waiting)
            p.recorded, p.value, p.waiting = p.waiting, None, None
            p.after = now + PROGRESS_PERIOD_S
        return out

    def not_recorded(self, infos: tuple[LeaseInfo, ...]) -> None:
        """The command with the progress of ``infos`` was not committed: what it held no longer
        counts as recorded, so the next report of it (workers repeat theirs in every heartbeat)
        is committed in the lease's next turn."""
        for info in infos:
            if info.progress is not None:
                info.progress.recorded = None

    def final(self, info: LeaseInfo | None, value: Any) -> Any:
        """The progress to record with the end of a lease: ``value`` (what the result carries;
        None: none), or else the progress still waiting; None when there is nothing new.  For
        ``info`` None (a result for a lease this leader does not hold) ``value`` if it fits.
        Nothing waits for the lease afterwards."""
        if info is None:
            text = None if value is None else progress_json(value)
            return value if text is not None and len(text) <= MAX_PROGRESS_BYTES else None
        p = self._take(info, value)
        if p is None or p.waiting is None:
            return None
        out, p.value, p.waiting = p.value, None, None
        return out
