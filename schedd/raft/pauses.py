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
"""

from __future__ import annotations

from typing import Any

from pysyncobj.monotonic import monotonic as raft_clock

#: a gap between two ticks longer than this counts as a pause (a tick ends with a poll of at
#: most ``autoTickPeriod``, 10 ms by default, so consecutive ticks are normally ~0 apart)
DEFAULT_THRESHOLD_S = 0.05


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
