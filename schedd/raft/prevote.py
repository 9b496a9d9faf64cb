"""Pre-vote and leader stickiness: elections only when the leader is really gone.

pysyncobj raises its term and asks for votes as soon as its election deadline passes, and a
node that gets a vote request of a higher term stops following or leading; so under load one
late heartbeat was an election, and a node cut off for a while came back to depose a healthy
leader.  :func:`pre_vote` wraps the node's tick, its message callback and its transport's
``send`` (what it relies on of pysyncobj's private code is listed, fingerprinted and checked
with the other patches, in :mod:`schedd.raft.patches`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic as raft_clock

# -- elections ----------------------------------------------------------------------------------
#: after its leader's connection closed, a follower's election deadline comes within
#: ``rank * LOST_LEADER_STEP + LOST_LEADER_JITTER`` seconds (see :func:`pre_vote`): the step
#: leaves the first node time for its pre-vote and its election (two round trips and ticks,
#: tens of milliseconds under load) before the second one starts its own
LOST_LEADER_STEP: Final = 0.1
LOST_LEADER_JITTER: Final = 0.05
PRE_VOTE: Final = "schedd.pre_vote"
PRE_VOTE_ANSWER: Final = "schedd.pre_vote_response"
STALE_TERM: Final = "schedd.stale_term"


@dataclass
class ElectionStats:
    """What :func:`pre_vote` counted (tick thread; read elsewhere as a snapshot of ints)."""

    #: real elections this node started, by why it was allowed: prevote_won, transfer,
    #: single_node
    started: dict[str, int] = field(default_factory=dict)
    #: pre-vote rounds this node ran: won (then an election), lost (no majority in time) or
    #: yielded (it granted a peer's round that outranks its own)
    rounds: dict[str, int] = field(default_factory=lambda: {"won": 0, "lost": 0, "yielded": 0})
    #: pre-votes this node refused, by reason: leader, leader_alive, stale_term, log_behind,
    #: abstaining, campaigning
    refused: dict[str, int] = field(default_factory=dict)
    #: vote requests this node ignored because it leads or heard from its leader lately
    ignored: dict[str, int] = field(default_factory=dict)
    #: times this node stopped leading, by cause: quorum_lost, higher_term, transfer
    stepdowns: dict[str, int] = field(default_factory=dict)
    #: times this follower's connection to its leader closed (its deadline brought forward)
    leader_lost: dict[str, int] = field(default_factory=dict)


def _bump(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


class NewNodeGuard(Protocol):
    """What :func:`pre_vote` tells the journal: a leader was heard, with its commit index (a
    node that abstains since it started empty learns how far to catch up)."""

    def leader_contact(self, commit_index: int) -> None: ...


def pre_vote(
    obj: SyncObj,
    may_vote: Callable[[], bool] = lambda: True,
    new_node: NewNodeGuard | None = None,
    may_campaign: Callable[[], bool] = lambda: True,
) -> ElectionStats:
    """Elections only when the leader is really gone: pre-vote and leader stickiness.

    pysyncobj raises its term and asks for votes as soon as its election deadline passes
    (``_onTick``), and a node that gets a vote request of a higher term adopts it and stops
    following or leading (``__onMessageReceived``, before it even decides on the vote).  So a
    follower cut off for a while, or stalled, comes back with a higher term and deposes a
    healthy leader; under load one late heartbeat is an election.

    * **Pre-vote**: when the deadline passes, the node first asks its peers whether they would
      vote for it at ``term + 1`` (``schedd.pre_vote``, nothing persisted, the term unchanged).
      A peer refuses while it leads or heard from a leader within ``raftMinTimeout``, when the
      term is not above its own or the node's log is behind its own, or while its journal
      abstains (``may_vote``); it grants only at its next tick, judging again after whatever
      came with the request (a stalled node reads the leader's queued heartbeats in the same
      poll).  Only a majority of grants lets pysyncobj run its real election,
      on the next tick; otherwise the node draws a new deadline and tries again.  A node that
      hears from a leader meanwhile drops its round.
    * **Two rounds at once**: when the other nodes' deadlines pass within a round trip and a
      tick of each other, each would grant the other's pre-vote and both run an election for
      the same term: a split vote, and another election timeout without a leader.  So a node
      whose own round is running (or won, its election not yet started) answers a peer's
      pre-vote by rank - the longer log, then the lower id, goes first: it refuses a peer it
      outranks (``campaigning``) - unless that peer refused its round, which then cannot count
      on it - and grants one that outranks it, dropping its own round (``yielded``) and drawing
      a new deadline, as after a lost round.  Of two rounds at once, one wins.
    * **Stickiness**: a vote request is ignored (neither granted nor its term adopted) by a
      leader and by a follower that heard from its leader within ``raftMinTimeout`` - unless it
      comes from a leadership transfer (``timeout_now``; marked ``transfer`` by the sender).
    * **Stale terms**: a node whose term passed the leader's (it won a pre-vote just as the
      leader came back) ignores that leader's appends; so it answers them with
      ``schedd.stale_term`` and the leader, seeing a higher term, steps down for a clean
      election instead of the two talking past each other.  A refused pre-vote that names a
      higher term is taken the same way.
    * **Check-quorum** is pysyncobj's own ``leaderFallbackTimeout``: a leader that has not
      heard from a majority within it steps down (counted here as ``quorum_lost``).
    * **A leader whose connection closed**: a leader process that dies (killed, crashed) has
      its connections closed by its host at once.  A follower whose connection to its leader
      closes no longer counts it as heard from, and brings its election deadline forward to
      ``rank * LOST_LEADER_STEP`` plus up to ``LOST_LEADER_JITTER`` from now, ``rank`` being
      its place among the nodes other than the leader, by id: the first runs its pre-vote
      alone, so the two do not split the vote; a round it loses (to a peer that had not seen
      the connection close yet, or whose log is longer) is tried again as soon, for
      ``raftMaxTimeout``.  Safe because of pre-vote: while the leader is alive and reaches a
      majority, a node connected to it refuses.  (A leader host that
      vanishes without closing anything is found by the election timeout, as before.)

    Wraps the tick (install it before :func:`read_before_judging`, so that one stays outermost
    and the sockets are read before the timers), the message callback and the transport's
    ``send``.  Returns the counters it keeps.

    ``may_campaign`` says whether this node may run for leader at all: a learner (a node being
    added, catching up) never does, nor a voter that has not yet applied every entry it knows
    committed (a membership change among them would change whose votes count)."""
    return _PreVote(obj, may_vote, new_node, may_campaign).stats


class _PreVote:
    """:func:`pre_vote`'s state and wrappers (tick thread only)."""

    def __init__(
        self,
        obj: SyncObj,
        may_vote: Callable[[], bool],
        new_node: NewNodeGuard | None = None,
        may_campaign: Callable[[], bool] = lambda: True,
    ) -> None:
        self.may_campaign = may_campaign
        self.obj, self.may_vote, self.new_node = obj, may_vote, new_node
        self.conf = obj._SyncObj__conf
        self.stats = ElectionStats()
        self.contact = float("-inf")  # when a leader's append (term >= ours) was last taken
        self.round: dict[str, Any] | None = None  # the running round: id, term, granted, refused
        self.rid = 0
        self.allow = False  # a round was won: the next tick may run the real election
        self.transfer_tick = False  # this tick's election is a leadership transfer
        self.stale_sent: dict[tuple[Any, int], float] = {}  # told (peer, our term) when
        self.handed_over_at = float("-inf")  # when this node last sent timeout_now
        self.stepdown_seen = False
        self.lost: tuple[Any, int] | None = None  # the leader whose closed connection was seen
        self.lost_at = float("-inf")  # and when
        #: pre-votes it would grant, answered at the next tick (see :meth:`answer`)
        self.pending: dict[Any, dict[str, Any]] = {}
        transport = obj._SyncObj__transport
        self.send = transport.send
        transport.send = self.marked_send
        self.inner = transport._onMessageReceivedCallback
        transport.setOnMessageReceivedCallback(self.on_message)
        if not obj._SyncObj__otherNodes:
            # A single node has no leader to hear from and no one to split a vote with: it
            # elects itself at its first tick, not after an election timeout.
            obj._SyncObj__raftElectionDeadline = 0
        else:
            # Nor does a node that just started know a leader: it asks at once, in rank, as
            # when its leader's connection closes.  Into a running cluster its pre-vote is
            # refused (the others hear their leader) until the leader's first append reaches
            # it; a round it loses is tried again after an election timeout.
            obj._SyncObj__raftElectionDeadline = min(
                obj._SyncObj__raftElectionDeadline, self.soon(None)
            )
        self.original_tick = obj._onTick
        obj._onTick = self.on_tick
        obj._SyncObj__properies.add("_onTick")  # not replicated state (see read_before_judging)

    # -- sending -----------------------------------------------------------------------------
    def marked_send(self, node: Any, message: Any) -> Any:
        if isinstance(message, dict):
            if message.get("type") == "request_vote" and self.transfer_tick:
                message = {**message, "transfer": True}
            elif message.get("type") == "timeout_now":
                self.handed_over_at = raft_clock()
        return self.send(node, message)

    def majority(self, votes: int) -> bool:
        return votes > (len(self.obj._SyncObj__otherNodes) + 1) / 2

    def log_position(self) -> tuple[int, int]:
        return self.obj._SyncObj__getCurrentLogTerm(), self.obj._SyncObj__getCurrentLogIndex()

    def heard_leader_lately(self) -> bool:
        """Heard from its leader within ``raftMinTimeout``, still connected to it."""
        obj = self.obj
        return (
            raft_clock() - self.contact < self.conf.raftMinTimeout
            and obj._SyncObj__raftLeader in obj._SyncObj__connectedNodes
        )

    def watch_leader(self) -> None:
        """Bring the election deadline forward once the followed leader's connection closed."""
        obj = self.obj
        leader = obj._SyncObj__raftLeader
        if leader is None or obj._isLeader() or leader in obj._SyncObj__connectedNodes:
            self.lost = None
            return
        lost = (leader.id, obj.raftCurrentTerm)
        if lost == self.lost:
            return  # brought forward already for this leader
        self.lost, self.lost_at = lost, raft_clock()
        _bump(self.stats.leader_lost, "connection_closed")
        obj._SyncObj__raftElectionDeadline = min(
            obj._SyncObj__raftElectionDeadline, self.soon(leader.id)
        )

    def soon(self, leader: Any) -> float:
        """When to ask for votes, the leader ``leader`` (an id, or None) being gone: by rank
        among the others."""
        obj = self.obj
        ids = sorted(n.id for n in (obj.selfNode, *obj._SyncObj__otherNodes) if n.id != leader)
        rank = ids.index(obj.selfNode.id)
        return float(raft_clock()) + rank * LOST_LEADER_STEP + LOST_LEADER_JITTER * random.random()

    def adopt(self, node: Any, term: int) -> None:
        """Take ``term`` as pysyncobj does from a vote request, which it then refuses (the
        empty log position is never up to date)."""
        request = {"type": "request_vote", "term": term, "last_log_index": 0, "last_log_term": -1}
        self.inner(node, request)

    # -- receiving ---------------------------------------------------------------------------
    def on_message(self, node: Any, message: Any) -> None:
        kind = message.get("type") if isinstance(message, dict) else None
        leading = self.obj._isLeader()
        if kind == PRE_VOTE:
            self.answer(node, message)
        elif kind == PRE_VOTE_ANSWER:
            self.count(node, message)
        elif kind == STALE_TERM:
            if message["term"] > self.obj.raftCurrentTerm:
                self.adopt(node, message["term"])
                self.stepped_down(leading, "higher_term")
        elif (
            kind == "request_vote"
            and not message.get("transfer")
            and (leading or self.heard_leader_lately())
        ):
            _bump(self.stats.ignored, "leader" if leading else "leader_alive")

        else:
            if kind == "append_entries":
                self.appended(node, message["term"], message.get("commit_index"))
            self.inner(node, message)
            recent = raft_clock() - self.handed_over_at < self.conf.raftMaxTimeout
            self.stepped_down(leading, "transfer" if recent else "higher_term")

    def stepped_down(self, was_leading: bool, cause: str) -> None:
        if was_leading and not self.obj._isLeader():
            _bump(self.stats.stepdowns, cause)
            self.stepdown_seen = True

    def appended(self, node: Any, term: int, commit_index: int | None = None) -> None:
        """A leader's append: contact (and no round), or, from an older term, tell it so."""
        ours = self.obj.raftCurrentTerm
        if term >= ours:
            self.contact, self.round = raft_clock(), None
            if self.new_node is not None and commit_index is not None:
                self.new_node.leader_contact(int(commit_index))
            return
        key = (node.id, ours)
        if raft_clock() - self.stale_sent.get(key, float("-inf")) > self.conf.raftMinTimeout:
            self.stale_sent[key] = raft_clock()
            self.send(node, {"type": STALE_TERM, "term": ours})

    def refusal(self, message: dict[str, Any], node: Any) -> str | None:
        if self.obj._isLeader():
            return "leader"
        if self.heard_leader_lately():
            return "leader_alive"
        if message["term"] <= self.obj.raftCurrentTerm:
            return "stale_term"
        if (message["last_log_term"], message["last_log_index"]) < self.log_position():
            return "log_behind"
        if not self.may_vote():
            return "abstaining"
        if self.campaigning() and self.outranks(message, node) and not self.refused_by(node):
            return "campaigning"
        return None

    def campaigning(self) -> bool:
        """Its own pre-vote round is running, or won with the election still to start."""
        return self.round is not None or self.allow

    def refused_by(self, node: Any) -> bool:
        """The peer refused its running round (it still heard the leader, say): that round
        cannot count on it, and the peer's own round must not be refused for its sake."""
        return self.round is not None and node.id in self.round["refused"]

    def outranks(self, message: dict[str, Any], node: Any) -> bool:
        """Its own round goes before the peer's: a longer log, or as long and a lower id."""
        theirs = (message["last_log_term"], message["last_log_index"])
        ours = self.log_position()
        return ours > theirs or (ours == theirs and str(self.obj.selfNode.id) < str(node.id))

    def answer(self, node: Any, message: dict[str, Any]) -> None:
        """A refusal goes at once; a grant waits for the next tick, which judges it again.
        A node that was stalled (descheduled, swapped out) reads, in one poll, the pre-vote of
        a peer cut off from the leader and the leader's heartbeats queued meanwhile, in the
        order their sockets became readable: judged on the spot, a pre-vote that came first
        finds the last contact a stall old and is granted, although the leader is alive and
        heard in the same poll.  The next tick starts after every message of the poll (and,
        after a pause, a fresh read: :func:`read_before_judging`)."""
        why = self.refusal(message, node)
        if why is None:
            self.pending[node] = message
            return
        self.reply(node, message, why)

    def answer_pending(self) -> None:
        pending, self.pending = self.pending, {}
        for node, message in pending.items():
            why = self.refusal(message, node)
            if why is None and self.campaigning():
                self.stats.rounds["yielded"] += 1
                self.round, self.allow = None, False
                self.obj._SyncObj__raftElectionDeadline = self.retry_at()
            self.reply(node, message, why)

    def reply(self, node: Any, message: dict[str, Any], why: str | None) -> None:
        if why is not None:
            _bump(self.stats.refused, why)
        reply = {"type": PRE_VOTE_ANSWER, "round": message["round"]}
        self.send(
            node, {**reply, "term": self.obj.raftCurrentTerm, "granted": why is None, "reason": why}
        )

    def count(self, node: Any, message: dict[str, Any]) -> None:
        term = self.obj.raftCurrentTerm
        r = self.round
        if r is None or message["round"] != r["id"] or term != r["term"] or self.obj._isLeader():
            return  # an answer to an older round, or the round is over
        if message["granted"]:
            r["granted"].add(node.id)
            if self.majority(len(r["granted"])):
                self.round, self.allow = None, True
                self.obj._SyncObj__raftElectionDeadline = 0  # the real election, next tick
                self.stats.rounds["won"] += 1
        elif message["reason"] == "stale_term" and message["term"] > term:
            self.round = None
            self.adopt(node, message["term"])
        else:
            r["refused"].add(node.id)

    # -- ticking -----------------------------------------------------------------------------
    def start_round(self, term: int) -> None:
        obj = self.obj
        if self.round is not None:
            self.stats.rounds["lost"] += 1
        obj._SyncObj__raftElectionDeadline = self.retry_at()
        self.round = None
        if not self.may_vote():  # a node whose journal abstains does not campaign either
            return
        self.rid += 1
        self.round = {"id": self.rid, "term": term, "granted": {obj.selfNode.id}, "refused": set()}
        last_term, last_index = self.log_position()
        ask = {"type": PRE_VOTE, "round": self.rid, "term": term + 1}
        for peer in obj._SyncObj__otherNodes:
            self.send(peer, {**ask, "last_log_term": last_term, "last_log_index": last_index})

    def retry_at(self) -> float:
        """When to try again after a round lost or yielded: an election timeout from now."""
        low, high = self.conf.raftMinTimeout, self.conf.raftMaxTimeout
        if self.lost is not None and raft_clock() - self.lost_at < high:
            # Its leader's connection closed lately: a round lost to a peer that had not seen
            # it close yet, or whose log was longer, is tried again soon, in rank.
            return self.soon(self.lost[0])
        return float(raft_clock() + low + (high - low) * random.random())

    def election_due(self) -> str | None:
        """Why this tick may run pysyncobj's election (None: it may not, or none is due; a
        due election without leave starts a pre-vote round instead)."""
        obj = self.obj
        others = obj._SyncObj__otherNodes
        if (
            obj._isLeader()
            or obj._SyncObj__raftElectionDeadline >= raft_clock()
            or not (obj._SyncObj__connectedNodes or not others)
        ):  # pysyncobj's own condition for an election (0.3.17 _onTick)
            return None
        if not self.may_campaign():
            self.round = None
            obj._SyncObj__raftElectionDeadline = self.retry_at()
            return None
        if obj._SyncObj__transferInProgress:
            return "transfer"
        if self.allow:
            return "prevote_won"
        if not others:
            return "single_node"
        self.start_round(obj.raftCurrentTerm)  # no election on this tick: the deadline moved
        return None

    def on_tick(self, timeToWait: float = 0.0) -> None:  # pysyncobj's name
        obj = self.obj
        leading, term = obj._isLeader(), obj.raftCurrentTerm
        if self.pending:
            self.answer_pending()
        self.watch_leader()
        allowed = self.election_due()
        self.allow, self.transfer_tick, self.stepdown_seen = False, allowed == "transfer", False
        # Without leave, pysyncobj's own check must not find the deadline passed either: it
        # comes later in the tick, and a deadline that passes in between (the thread preempted
        # on a busy machine) would be an election without a pre-vote.  What the tick's
        # messages set (a leader's append, a transfer's TimeoutNow) is kept.
        deadline = obj._SyncObj__raftElectionDeadline
        guarded = allowed is None and not leading
        if guarded:
            obj._SyncObj__raftElectionDeadline = math.inf
        try:
            self.original_tick(timeToWait)
        finally:
            self.transfer_tick = False
            if guarded and obj._SyncObj__raftElectionDeadline == math.inf:
                obj._SyncObj__raftElectionDeadline = deadline
        if allowed is not None and obj.raftCurrentTerm > term:
            _bump(self.stats.started, allowed)
        if leading and not obj._isLeader() and not self.stepdown_seen:
            _bump(self.stats.stepdowns, "quorum_lost")
