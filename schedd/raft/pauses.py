"""A node whose Raft thread did not run for a while reads its sockets before judging timeouts.

pysyncobj's tick checks the election deadline (a follower) and when each follower last answered
(a leader, ``leaderFallbackTimeout``) at its start, and reads the network only at its end.  When
the tick thread has not run for longer than those timeouts - the process spent a second in a
full garbage collection, the event loop held the GIL through a large apply, the machine stalled
it - the leader's heartbeats and the followers' answers are waiting in the sockets, but the tick
judges the silence first: a follower becomes a candidate and deposes a healthy leader, a leader
steps down.  Measured here: three nodes in one process paused by one 0.6 s collection went
through an election every time.

:func:`read_before_judging` wraps the node's tick: when the previous tick ended more than
``threshold`` seconds ago it first polls the sockets without waiting, so the messages that
arrived meanwhile are handled (a heartbeat moves the follower's deadline on, an answer the
leader's record) before the timers are looked at.  Nothing is assumed: if nothing arrived
(the leader really is gone, the followers really are silent) the timers fire as before.  A node
paused longer than its peers' own timeouts still loses its role - they judged it meanwhile.

:func:`bound_apply` keeps the tick itself short: pysyncobj applies every committed entry in one
go, and a leader that applies ten large entries (batches of a thousand jobs, fires of a thousand
runs: 50-100 ms each) sends no heartbeat meanwhile, a follower answers nothing, and the peers
time out.  Bounded, a tick applies entries until ``budget`` seconds have passed (at least one)
and leaves the rest to the next tick, after the heartbeats went out and the network was read;
pysyncobj is in that state (committed ahead of applied) between every commit and its apply
anyway.  The entries of one tick are applied between the calls of an :class:`ApplyBatch`, and
their results handed to the callers only after it ended: the node commits them to its database
in one transaction there, so a caller that reads what it wrote finds it.
"""

from __future__ import annotations

import logging
from typing import Any

from pysyncobj import FAIL_REASON
from pysyncobj.monotonic import monotonic as raft_clock
from pysyncobj.syncobj import SyncObjExceptionWrongVer

log = logging.getLogger(__name__)

#: a gap between two ticks longer than this counts as a pause (a tick ends with a poll of at
#: most ``autoTickPeriod``, 10 ms by default, so consecutive ticks are normally ~0 apart)
DEFAULT_THRESHOLD_S = 0.05


#: how long one tick may spend applying committed entries before it sends and reads
DEFAULT_APPLY_BUDGET_S = 0.05


def read_before_judging(obj: Any, threshold: float = DEFAULT_THRESHOLD_S) -> None:
    """Wrap the pysyncobj ``obj``'s tick (its auto-tick thread and ``doTick`` call
    ``self._onTick``) so that after a pause it reads the network before its timers."""
    original = obj._onTick
    transport = obj._SyncObj__transport
    last_end = [raft_clock()]

    def on_tick(timeToWait: float = 0.0) -> None:  # noqa: N803 - pysyncobj's name
        if raft_clock() - last_end[0] > threshold and transport.ready:
            obj._poller.poll(0)
        try:
            original(timeToWait)
        finally:
            last_end[0] = raft_clock()

    obj._onTick = on_tick
    # pysyncobj pickles every attribute of the SyncObj into its snapshots except those it had
    # when it was made: this one is not replicated state (and a closure does not pickle).
    obj._SyncObj__properies.add("_onTick")


class ApplyBatch:
    """What to do around the entries one tick applies (:func:`bound_apply`): ``begin`` before
    the first, ``end`` after the last, before any of their results is handed to its caller
    (the node applies them in one database transaction, committed by ``end``)."""

    def begin(self) -> None:
        """Before the first entry of a tick."""

    def awaited(self, waited: bool) -> None:
        """Before each entry: whether a caller on this node waits for its result."""

    def end(self) -> None:
        """After the last entry of a tick, before their callbacks run."""

    def idle(self) -> None:
        """On a tick with nothing to apply."""


def bound_apply(obj: Any, budget: float = DEFAULT_APPLY_BUDGET_S,
                batch: ApplyBatch | None = None) -> None:
    """Replace the pysyncobj ``obj``'s apply step (``SyncObj.__applyLogEntries``, looked up on
    the instance by its mangled name) with one that stops after ``budget`` seconds and calls
    ``batch`` around the entries it applies; the results reach their callers after
    ``batch.end``.  Otherwise the same code as pysyncobj 0.3.17's, which this must be kept in
    step with."""
    do_apply = obj._SyncObj__doApplyCommand
    get_entries = obj._SyncObj__getEntries
    use_batch = obj._SyncObj__conf.appendEntriesUseBatch
    around = batch or ApplyBatch()

    def apply_log_entries() -> bool:
        commit, applied = obj._SyncObj__raftCommitIndex, obj._SyncObj__raftLastApplied
        if commit <= applied:
            around.idle()
            return False
        stop_at = raft_clock() + budget
        waiting = obj._SyncObj__commandsWaitingCommit  # looked up each time: never a stale copy
        answers: list[tuple[list[Any], Any, Any]] = []  # (subscribers, term, result)
        around.begin()
        try:
            for entry in get_entries(applied + 1, commit - applied):
                try:
                    subscribers = waiting.pop(entry[1], [])
                    around.awaited(any(term == entry[2] for term, _ in subscribers))
                    answers.append((subscribers, entry[2], do_apply(entry[0])))
                    obj._SyncObj__raftLastApplied += 1
                except SyncObjExceptionWrongVer as e:
                    log.error("request to switch to an unsupported code version (%d)", e.ver)
                if raft_clock() >= stop_at:
                    break
        finally:
            around.end()
        for subscribers, term, res in answers:
            for subscribed_term, callback in subscribers:
                if subscribed_term == term:
                    callback(res, FAIL_REASON.SUCCESS)
                else:
                    callback(None, FAIL_REASON.DISCARDED)
        return not use_batch

    obj._SyncObj__applyLogEntries = apply_log_entries
    obj._SyncObj__properies.add("_SyncObj__applyLogEntries")  # not replicated state
