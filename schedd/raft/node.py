"""The Raft node: the only module that imports pysyncobj.

* One replicated entry point, ``apply_entry(bytes)``; the command codec inside is ours
  (docs/pysyncobj.md #2).
* Commands submitted from asyncio are batched into one entry per loop turn and their results
  handed back into futures (docs/pysyncobj.md #5, #13).
* The ticks run on the event loop (``raft.ticks = "loop"``, schedd/raft/looptick.py) or on a
  thread of their own (``"thread"``): "the tick thread" below is whichever thread runs them.
  They start with :meth:`RaftNode.start`, once the node is built with its replicated state
  (a ``SyncObjConsumer``) and every patch; reads take the same lock as apply
  (docs/pysyncobj.md #9, #13).
* The leader watches each follower's match index and recovers a stalled one (docs/pysyncobj.md #6;
  see :meth:`RaftNode._watch_followers`).
* The replicated state is the node's SQLite database (``<data_dir>/state.db``, see
  schedd/storage): each entry is applied in one transaction with its index.  Log compaction
  is a durability barrier (the database synced, a small marker written), not a copy; a whole
  copy is streamed from the live database only to a follower that needs one, and installed
  there by rename (schedd/raft/snapshots.py).
* A failure of the database under apply stops the node (exit status 70, like a failed journal
  write): a result that depended on a full disk could differ between nodes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.pipe_notifier import PipeNotifier

from schedd import clock
from schedd.aio import within
from schedd.core import commands
from schedd.core.events import ChangeLog
from schedd.core.members import LEARNER, VOTER, Member, Membership
from schedd.core.state import Committed, LeaderEvent, Rejected, Result, State
from schedd.errors import Code, ConfigError, ResourceExhausted, SchedError, Unavailable
from schedd.logs import log_event
from schedd.raft.feed import DEFAULT_SIZE as DEFAULT_EVENTS_BUFFER
from schedd.raft.feed import EventFeed
from schedd.raft.gaps import KINDS, Gaps, GapView
from schedd.raft.journal import durable_journal
from schedd.raft.looptick import EpollPoller, swap_create_poller
from schedd.raft.patches import (
    DEFAULT_APPLY_BUDGET_S,
    ApplyBatch,
    append_now,
    applied_all_committed,
    bound_apply,
    check_installed,
    check_node,
    compact_log,
    guard_snapshot_commit,
    keep_next_index,
    last_response_times,
    learners,
    most_caught_up,
    read_before_judging,
    refuse_forwarded,
    set_members,
    ship_snapshots,
    watch_contact,
)
from schedd.raft.peerguard import PeerGuard
from schedd.raft.prevote import pre_vote
from schedd.raft.snapshots import SqlSnapshots, prepare
from schedd.storage.space import free_space
from schedd.storage.sqlstate import SqlState, StorageFailure, apply_entry

log = logging.getLogger(__name__)

MAX_COMMANDS_PER_ENTRY = 2000
MAX_PENDING = 200_000
#: entries this node encoded and has not applied yet, kept with their commands (an entry a
#: leader change discarded is never applied: past this many they are all forgotten, and the
#: few still to come are decoded as a follower decodes them)
MAX_OWN_ENTRIES = 4096
#: the longest the database keeps applied leader commands uncommitted (_StateMachine)
LAZY_COMMIT_S = 0.1
FOLLOWER_CHECK_PERIOD = 0.5  # seconds between two looks at the followers' match indexes
STATUS_PERIOD = 0.05  # the published RaftStatus is at most this old (or a role change)
Role = Literal["leader", "follower", "candidate", "unknown"]
ROLES: dict[int, Role] = {0: "follower", 1: "candidate", 2: "leader"}
FOLLOWER_ANSWERED_WITHIN = 1.0  # a follower that answered the leader this recently is alive
FOLLOWER_STALL_MAX_BACKOFF = 60.0  # longest wait between two recoveries of one stalled follower


@dataclass(frozen=True, slots=True)
class PeerStatus:
    """Another node, as this one sees it."""

    addr: str  # its Raft address
    connected: bool
    match_index: int | None  # the last entry it is known to hold (only a leader knows)
    next_index: int | None  # the next entry the leader sends it (only a leader knows)
    stalled: bool  # this leader sees its replication stalled (see _watch_followers)
    stall_recoveries: int  # recoveries this node started for it since the process began
    #: when it last answered this node's append_entries (clock.mono; only a leader knows)
    answered_at: float | None = None
    role: str = VOTER  # a voter, or a learner (catching up; it neither votes nor counts)


@dataclass(frozen=True, slots=True)
class RaftStatus:
    """This node's Raft state as the tick thread last saw it.

    pysyncobj's state belongs to its tick thread; its status dict, built there and read
    elsewhere, can change under the reader.  So the tick thread publishes this instead: a new
    object at most :data:`STATUS_PERIOD` old (at once on a change of role, term or leader),
    never changed once published, read by any thread without a lock."""

    role: Role
    term: int
    leader: str | None  # the Raft address of the leader it follows (or is)
    commit_index: int
    applied_index: int
    has_quorum: bool
    peers: tuple[PeerStatus, ...]
    #: when this node last heard from the leader it follows (clock.mono; None: never, or leads)
    leader_heard_at: float | None = None

    def peer(self, addr: str) -> PeerStatus | None:
        return next((p for p in self.peers if p.addr == addr), None)


@dataclass(frozen=True, slots=True)
class RaftSettings:
    self_addr: str
    peers: tuple[str, ...]
    data_dir: Path
    #: pysyncobj's timings and compaction thresholds, in ms as the config (``raft``) declares
    #: them, with their defaults there: the node converts them for pysyncobj
    append_entries_period_ms: int
    auto_tick_period_ms: int
    raft_min_timeout_ms: int
    raft_max_timeout_ms: int
    leader_fallback_timeout_ms: int
    log_compaction_min_entries: int
    log_compaction_min_time_ms: int
    #: waiting runs due within this many ms stay decoded in memory (scheduler.hot_window)
    hot_window_ms: int
    password: bytes | None = None
    #: a follower that keeps answering the leader but whose match index has not moved for this
    #: long while it is behind the commit index is stalled (docs/pysyncobj.md #6)
    follower_stall_timeout_ms: int = 3_000
    #: the changes of the latest entries kept for the clients that follow them (GET /events)
    events_buffer: int = DEFAULT_EVENTS_BUFFER
    #: where the Raft journal lives (None: beside the state, in ``data_dir``); another
    #: filesystem keeps its syncs away from the database's writes
    journal_dir: Path | None = None
    #: bytes a second a copy of the state is sent at (to a follower that needs one, or a backup)
    snapshot_rate: int = 32 << 20
    #: the log keeps the entries a follower still needs (and those of a copy in flight) up to
    #: this many bytes; past it, it is compacted anyway (that follower then needs a copy)
    log_keep_max: int = 1 << 30
    #: this node's id and API URL, and the peers' API URLs by Raft address: what the
    #: membership says of the nodes before they said it themselves
    node_id: str = ""
    http_url: str = ""
    peer_http: tuple[tuple[str, str], ...] = ()
    #: the membership a cluster gave this node when it asked to join (raft.join)
    joined: Membership | None = None
    #: the event loop runs the ticks (schedd/raft/looptick.py; raft.ticks = "loop"), else a
    #: thread of their own
    loop_ticks: bool = True
    #: the cluster's shards (cluster.shards) and the one this group is: said in the hello, so
    #: that a port wired to another shard's group, or a node of another layout, is refused
    shards: int = 1
    shard: int = 0


class Hooks:
    """Callbacks from the tick thread into asyncio (set by the runtime)."""

    def __init__(self) -> None:
        #: the leader events of the entries a tick applied while this node leads, as (index,
        #: events), in log order: one call per tick (each call wakes the event loop).  Set by
        #: the node itself (RaftNode.attach), which hands them to its leader
        self.on_applied: Callable[[list[tuple[int, list[LeaderEvent]]]], None] = lambda b: None
        self.on_reset: Callable[[], None] = lambda: None
        self.on_role: Callable[[int], None] = lambda r: None
        #: this node cannot join any cluster as configured (the message says why)
        self.on_fatal: Callable[[str], None] = lambda m: None
        #: seconds one entry took to apply into the database (tick thread)
        self.on_apply_time: Callable[[float], None] = lambda s: None


def _holds_data(journal: Any) -> bool:
    return journal is not None and not journal.holds_no_data()


def _peer_data(journal: Any, peer: str, data: bool) -> None:
    """A peer's hello: one that holds data, met by a node that started empty and holds none,
    makes it abstain until caught up (``DurableJournal.abstain_as_new``)."""
    if data and journal is not None and journal.new and journal.holds_no_data():
        journal.abstain_as_new(peer)


def _snapshot_lost(journal: Any, dump: Path) -> str | None:
    """Why this node cannot start from its files: a journal compacted past its first entry,
    without the snapshot (raft.dump) it was compacted into.  Started so, a node applies nothing
    and stays behind for good, silently (it never asks for a copy: its log looks whole)."""
    if journal is None or not len(journal) or dump.exists():
        return None
    first = int(journal[0][1])
    if first <= 1:
        return None
    return (
        f"{dump}: missing, and the Raft journal beside it starts at index {first}: the entries "
        "before it are only in that snapshot. To rebuild this node from the cluster, stop it "
        "and move everything in its data directory away, the journal included (and "
        "raft.journal_dir's, if set); it is then sent a whole copy"
    )


def stop_node(message: str, path: str | None = None) -> None:
    """The database failed, or a snapshot cannot be used: log why (with the room left on the
    filesystem of ``path``, the file that failed) and exit with status 70 (EX_SOFTWARE), so
    the supervisor restarts the node from its disk and the journal."""
    where = {} if path is None else {"path": path, **free_space(path)}
    log_event(log, "storage.failed", logging.CRITICAL, error=message, **where)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(70)


class _StateMachine(SyncObjConsumer, ApplyBatch):  # type: ignore[misc]
    """The state machine pysyncobj applies entries to.  With the custom serializer pysyncobj
    never pickles it: the state is the database, and snapshots are copies of it.

    Applied entries share one database transaction, committed with the last one's index:

    * at the end of a tick (:class:`ApplyBatch`, called by :func:`bound_apply`) that applied a
      command whose answer may be read back at once (a client's command, a claim, a barrier)
      on the leader, or on a follower that a caller waits on for it, before any result is
      handed back: a client that reads after its write finds it on the leader and on the node
      that answered it.  Other followers apply the command without committing at once: nobody
      was told about it there, and what they show may lag the leader anyway;
    * otherwise once the transaction is :data:`LAZY_COMMIT_S` old, at the end of a tick or on
      a tick with nothing to apply.  The leader's own commands (fires, leases, results) come
      in a stream, and a run is often fired, leased and finished within that time: its row is
      then written once, not three times.  The API's readers see such changes that much later
      (the leader itself reads the open transaction).

    The journal, not the database, is what was acknowledged: a node that stops before the
    commit applies those entries again from it.  A snapshot commits first (``commit_now``)."""

    #: what a database failure under apply does (tests replace it)
    on_storage_failure: Callable[..., None] = staticmethod(stop_node)

    def __init__(self, hooks: Hooks, live: Path, hot_ms: int) -> None:
        self.lock = threading.RLock()
        self.hooks = hooks
        super().__init__()
        try:
            self.state = SqlState(live, hot_ms=hot_ms)
        except StorageFailure as exc:  # at start: as when it fails later (a full disk, say)
            self.on_storage_failure(str(exc), str(live))
            raise
        self._batch = False  # between ApplyBatch.begin and end: commit at the end
        self._began = 0.0  # when the open transaction began (monotonic)
        self._events: list[tuple[int, list[LeaderEvent]]] = []  # to hand on (_emit)
        self._awaited = True  # whether a caller here waits for the entry applied next
        self._visible = False  # the open transaction holds such an entry that wants visibility
        #: the lowest entry a read waits to see (min_index; 0: none): once it is applied, the
        #: next tick commits instead of waiting out LAZY_COMMIT_S
        self.wanted_visible = 0
        self._members_seen = self.state.members
        #: the commands of the entries this node encoded, by the entry's bytes: applied as they
        #: are, not decoded again (put on the event loop, taken on the tick thread)
        self.own: dict[bytes, list[commands.Command]] = {}
        #: called with a membership that an applied entry recorded (tick thread)
        self.on_members: Callable[[Membership], None] = lambda members: None

    def begin(self) -> None:
        self._batch = True

    def end(self) -> None:
        self._batch = False
        self._emit()
        self._commit(due_only=True)

    def _emit(self) -> None:
        """Hand the applied entries' leader events on.  Runs on the tick thread outside any
        apply (in ``end``): nothing may escape from here into pysyncobj's tick."""
        if self._events:
            events, self._events = self._events, []
            try:
                self.hooks.on_applied(events)
            except Exception:  # e.g. the event loop closed while stopping
                log.exception("handing on the leader events failed")

    def awaited(self, waited: bool) -> None:
        self._awaited = waited

    def leading(self) -> bool:
        """Whether this node leads (pysyncobj's view, on the tick thread)."""
        return bool(self._syncObj._isLeader())

    def idle(self) -> None:
        self._commit(due_only=True)

    def commit_now(self) -> None:
        """Commit what was applied (before a snapshot copy, at shutdown)."""
        self._commit(due_only=False)

    def replaced(self) -> None:
        """A copy of the leader's state replaced this one: its membership is the one to go by."""
        recorded = self.state.members
        if recorded is not None:
            self._members_seen = recorded
            self.on_members(recorded)

    def _commit(self, *, due_only: bool) -> None:
        # Only the tick thread opens transactions, so whether one is open and due is known
        # without the lock, which a read on the event loop may hold a while: an idle tick must
        # not wait for it to learn that there is nothing to commit.  (Checked again under the
        # lock for close(), which commits from another thread once the ticks have stopped.)
        state = self.state
        wanted = self.wanted_visible
        if not state.in_transaction or (
            due_only
            and not self._visible
            and not (wanted and state.applied_index >= wanted)
            and clock.mono() - self._began < LAZY_COMMIT_S
        ):
            return
        with self.lock:
            if not state.in_transaction:
                return
            try:
                state.commit()
                self._visible = False
                if self.wanted_visible and state.committed_index >= self.wanted_visible:
                    self.wanted_visible = 0  # (a read wanting more sets it again)
            except StorageFailure as exc:
                self.on_storage_failure(str(exc), str(self.state.path))
                raise

    @replicated  # type: ignore[untyped-decorator]
    def apply_entry(self, blob: bytes) -> list[Result]:
        index = int(self._syncObj.raftLastApplied) + 1
        try:
            started = clock.mono()
            awaited, self._awaited = self._awaited, True
            state = self.state
            with self.lock:
                if not state.in_transaction:
                    self._began = started
                try:
                    # (only bytes are looked up: anything else is no entry of ours, and an
                    # unhashable one must not fail this node's apply alone)
                    own = self.own
                    held = own.pop(blob, None) if own and isinstance(blob, bytes) else None
                    applied = apply_entry(state, blob, index, commit=not self._batch, decoded=held)
                    if state.visible_now:
                        state.visible_now = False
                        self._visible = self._visible or awaited or self.leading()
                except StorageFailure as exc:
                    self.on_storage_failure(str(exc), str(self.state.path))
                    raise
            if applied is None:  # the database already held it (a replay after a restart)
                return []
            if state.members is not self._members_seen and state.members is not None:
                self._members_seen = state.members
                self.on_members(state.members)
            self.hooks.on_apply_time(clock.mono() - started)
            results, events = applied
            results = Applied(results)
            results.entry = index
            results.position = state.stamp if state.stamped else index
            # Only a leader acts on them: a follower would wake its event loop for nothing.
            # (A node elected later rebuilds from the state once its claim is applied.)
            if events and self.leading():
                self._events.append((index, events))
                if not self._batch:
                    self._emit()
            return results
        except Exception as exc:  # never let anything escape (docs/pysyncobj.md #1)
            log.exception("apply failed")
            failed = Applied([Rejected(Code.INTERNAL, f"apply failed: {exc}")])
            failed.entry = index
            failed.position = self.state.stamp if self.state.stamped else index
            return failed


@dataclass(slots=True)
class _FollowerProgress:
    """What the leader saw of one follower (tick thread only)."""

    match: int
    since: float  # since when it has answered without its match index moving while behind
    stalled: bool = False
    next_recovery: float = 0.0
    backoff: float = 0.0


_FAIL_MESSAGES = {
    FAIL_REASON.QUEUE_FULL: "the Raft command queue is full",
    FAIL_REASON.MISSING_LEADER: "the cluster has no leader right now",
    FAIL_REASON.DISCARDED: "the command was discarded by a leader change",
    FAIL_REASON.NOT_LEADER: "the node forwarded to is no longer the leader",
    FAIL_REASON.LEADER_CHANGED: "the leader changed before the command was confirmed",
    FAIL_REASON.REQUEST_DENIED: "the leader denied the request",
}


CONNECTION_RETRY_S = 1.0
#: on the loop, a tick applies at most this long before the loop's other callbacks run
LOOP_APPLY_BUDGET_S = 0.01

#: how long a leader handing its leadership over holds new commands at most (s), and how
#: often it looks whether it may send them (to the new leader) meanwhile
HAND_OVER_HOLD = 3.0
HAND_OVER_POLL = 0.005


class RaftNode:
    def __init__(self, settings: RaftSettings, hooks: Hooks) -> None:
        self.settings = settings
        self.hooks = hooks
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        if settings.journal_dir is not None:
            settings.journal_dir.mkdir(parents=True, exist_ok=True)
        # an install of a copy from the leader that a stop interrupted is finished first
        prepare(settings.data_dir / "state.db")
        self._sm = _StateMachine(hooks, settings.data_dir / "state.db", settings.hot_window_ms)
        #: the membership this node goes by: the log's once it recorded one, else what this
        #: node was given when it joined, else its raft.peers (published; see _adopt_members)
        self.members = self._starting_members()
        self._removal_pending = False  # a removal to look at once caught up (_check_removed)
        self._removed = False  # its log's membership removed it (``removed``)
        self._sm.on_members = self._adopt_members
        #: what each applied entry changed, for the API's event streams (GET /events)
        # gated: an event is sent once the API's reads see its entry (the lazy commit)
        state = self._sm.state
        # several shards: the feed's positions are stamps, which compare across shards
        state.stamped = settings.shards > 1
        self.events = EventFeed(settings.events_buffer, state.committed_position, gated=True)
        state.changes = ChangeLog(self.events.append)
        state.on_commit = self.events.visible_upto
        self._loop: asyncio.AbstractEventLoop | None = None
        self._leader_listener: Callable[[int, list[LeaderEvent]], None] | None = None
        self._pending: list[tuple[commands.Command, asyncio.Future[Committed]]] = []
        self._flush_scheduled = False
        #: when this node began handing its leadership over (None: it is not); set once, by
        #: the stopping daemon (transfer_leadership)
        self._handing_over: float | None = None
        self._handover_target: Any = None  # the follower asked to take over (tick thread)
        self.snapshots = SqlSnapshots(
            self._sm,
            settings.data_dir / "state.db",
            settings.data_dir / "raft.dump",
            on_replaced=self._replaced,
            on_fatal=lambda message: _StateMachine.on_storage_failure(message),
            rate=settings.snapshot_rate,
            node=settings.self_addr,
        )
        conf = SyncObjConf(
            journalFile=str((settings.journal_dir or settings.data_dir) / "raft.journal"),
            fullDumpFile=str(settings.data_dir / "raft.dump"),
            password=settings.password,
            bindAddress=settings.self_addr,
            appendEntriesUseBatch=True,
            # the node ticks once start() is called, every patch installed (_tick_loop)
            autoTick=False,
            appendEntriesPeriod=settings.append_entries_period_ms / 1000,
            autoTickPeriod=settings.auto_tick_period_ms / 1000,
            raftMinTimeout=settings.raft_min_timeout_ms / 1000,
            raftMaxTimeout=settings.raft_max_timeout_ms / 1000,
            leaderFallbackTimeout=settings.leader_fallback_timeout_ms / 1000,
            # A node reconnects to a peer this often (pysyncobj's 5 s default held a restarted
            # node off its cluster for 5 s when the other end was the one to connect).
            connectionRetryTime=CONNECTION_RETRY_S,
            logCompactionMinEntries=settings.log_compaction_min_entries,
            logCompactionMinTime=settings.log_compaction_min_time_ms / 1000,
            # A compaction is a barrier, not a copy: no need to stagger the nodes' (see
            # compact_log, which replaces pysyncobj's and ignores this).
            logCompactionSplit=False,
            commandsWaitLeader=False,
            commandsQueueSize=MAX_PENDING,
            onStateChanged=self._on_state_changed,
            dynamicMembershipChange=False,
            serializer=self.snapshots.serialize,
            deserializer=self.snapshots.deserialize,
            serializeChecker=self.snapshots.check,
        )
        self._transport: PeerGuard  # built by SyncObj.__init__ through transportClass
        # Built on the calling (main) thread, with the state machine complete (docs/pysyncobj.md #9, #13).
        # Durable journal (docs/pysyncobj.md #7): pysyncobj's createJournal is swapped for this call only,
        # and the transport syncs the journal before the node acknowledges (schedd/raft/journal.py).
        # The transport also reports the peers it refuses (another Raft secret, an address not
        # in raft.peers), which pysyncobj drops without a word (schedd/raft/peerguard.py).
        check_installed()  # the patches below fit this pysyncobj (schedd/raft/patches.py)
        with durable_journal(snapshot_path=conf.fullDumpFile) as durable:
            guarded = type(
                "GuardedTransport",
                (PeerGuard, durable.transport),
                {
                    "on_fatal": staticmethod(lambda message: hooks.on_fatal(message)),
                    # A node that starts empty beside peers that hold data is a replacement
                    # (a lost disk), not a node of a new cluster: it votes once caught up.
                    "holds_data": staticmethod(lambda: _holds_data(durable.journal)),
                    "on_peer_data": staticmethod(
                        lambda peer, data: _peer_data(durable.journal, peer, data)
                    ),
                    "node_id": settings.node_id,
                    "http_url": settings.http_url,
                    "shards": settings.shards,
                    "shard": settings.shard,
                    "was_removed": staticmethod(lambda addr: addr in self.members.removed),
                    "members_index": staticmethod(lambda: self.members.index),
                    # a node that is not a voter (not yet) waits to be let in
                    "joining": staticmethod(lambda: self.role_in_cluster != VOTER),
                },
            )

            def transport(sync_obj: SyncObj, *args: Any) -> Any:
                self._transport = guarded(sync_obj, *args)
                return self._transport

            self._poller = EpollPoller() if settings.loop_ticks else None
            with swap_create_poller(self._poller) if self._poller else nullcontext():
                self._obj = SyncObj(
                    settings.self_addr,
                    sorted(self.members.voter_addresses() - {settings.self_addr}),
                    conf,
                    consumers=[self._sm],
                    transportClass=transport,
                )
        check_node(self._obj)
        lost = _snapshot_lost(durable.journal, Path(conf.fullDumpFile))
        if lost is not None:
            self._obj.destroy()  # (autoTick off: at once, on this thread)
            raise ConfigError([lost])
        #: the durable journal (None only for a node without a journal file, in tests)
        self.journal = durable.journal
        if durable.journal is not None:
            self.snapshots.on_loaded = durable.journal.skip_to
            self.snapshots.entry_at = durable.journal.entry_at
        # Compaction as a barrier, held while a copy is sent and for followers that still need
        # the log; copies streamed to the followers that need one (schedd/raft/patches.py).
        journal_bytes = durable.journal.size_bytes if durable.journal is not None else (lambda: 0)
        compact_log(
            self._obj,
            holding=self.snapshots.holding,
            log_bytes=journal_bytes,
            keep_max=settings.log_keep_max,
        )
        ship_snapshots(
            self._obj,
            self.snapshots.transmission,
            self.snapshots.cancel,
            self.snapshots.receive,
            self.snapshots.lost,
        )
        self._on_tick: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        # Low-latency commits (BENCHMARKS.md, S1c): with appendEntriesUseBatch pysyncobj picks a command
        # up only when its poll times out (autoTickPeriod) and replicates it only at the next
        # appendEntriesPeriod.  A pipe wakes the tick thread when commands are queued, and new
        # entries are sent at once when no append is in flight to any follower (see
        # _fast_append); under load appends are still batched, one round trip at a time.
        guard_snapshot_commit(self._obj)
        keep_next_index(self._obj)  # no duplicate appends to a follower (schedd/raft/patches.py)
        # Elections only when the leader is really gone: a node asks its peers first
        # (pre-vote), and a follower that hears from its leader ignores vote requests; so a
        # node cut off or stalled for a while comes back without deposing a healthy leader
        # (schedd/raft/patches.py).  Inside read_before_judging: the sockets are read first.
        journal = durable.journal
        # (the journal learns a leader's commit index: a node abstaining since it started empty
        # beside peers with data votes again once caught up, DurableJournal.abstain_as_new)
        self._elections = pre_vote(
            self._obj,
            journal.may_vote if journal is not None else (lambda: True),
            journal,
            may_campaign=self.may_campaign,
        )
        # A pause of the tick thread (a garbage collection, the event loop holding the GIL)
        # deposes no one whose messages wait in the sockets, and one tick applies at most
        # ~50 ms of entries before it sends heartbeats and reads again (schedd/raft/pauses.py).
        self.gaps = {kind: Gaps() for kind in KINDS}  # tick thread (see schedd/raft/gaps.py)
        read_before_judging(self._obj, on_start=self.gaps["tick"].mark)
        # when this follower last heard from its leader, and (leading) when each follower last
        # answered: tick thread, published in the status
        self._leader_heard_at: float | None = None
        self._answered_at: dict[str, float] = {}
        self._gap_leader: tuple[Any, int] | None = None
        self._gap_term = -1
        watch_contact(self._obj, self._heard_from_leader, self._answered)
        refuse_forwarded(self._obj, lambda: self._handing_over is not None)
        bound_apply(
            self._obj,
            budget=LOOP_APPLY_BUDGET_S if settings.loop_ticks else DEFAULT_APPLY_BUDGET_S,
            batch=self._sm,
        )
        # A tick thread waits in its poll: a pipe wakes it (on the loop, _wake schedules a tick)
        self._woken = threading.Event()  # set while a wake-up is in the pipe
        self._waker = (
            None
            if settings.loop_ticks
            else PipeNotifier(self._obj._poller, callback=self._woken.clear)
        )
        self._followers: dict[str, _FollowerProgress] = {}  # tick thread only
        self._followers_checked = 0.0
        self._stall_recoveries: dict[str, int] = {}  # per peer, for the life of the process
        # Read from other threads: a new object is published, never changed (_publish_status).
        self._status = RaftStatus("follower", 0, None, 0, 0, False, ())
        self._status_at = 0.0
        self._obj.addOnTickCallback(self._run_on_tick)
        # The starting membership (its learner among it), adopted now: nothing ticks before
        # start().  Queued for the first tick, it ran after that tick's apply, and over a
        # membership the apply had just adopted from the log (entries the database lost to a
        # kill, committed in the journal): the node then went by its raft.peers for good.
        self._adopt_members(self.members)
        self._ticker: threading.Thread | None = None  # start()
        self._closing = False
        self._destroyed = False
        self._started = False
        self._tick_scheduled = False
        self._loop_ident = 0
        self._timer: asyncio.TimerHandle | None = None

    # -- membership ----------------------------------------------------------------------------
    def _known(self) -> list[Member]:
        """What the configuration and the peers' hellos say of each node (id, API URL)."""
        st = self.settings
        known = [Member(st.self_addr, st.node_id, st.http_url)]
        known += [Member(addr, "", url) for addr, url in st.peer_http]
        transport = getattr(self, "_transport", None)
        if transport is not None:
            for addr, hello in transport.hellos().items():
                known.append(Member(addr, str(hello.get("id", "")), str(hello.get("http", ""))))
        return known

    def _starting_members(self) -> Membership:
        st = self.settings
        recorded = self._sm.state.members
        configured = Membership(
            voters=(Member(st.self_addr), *(Member(p) for p in st.peers)),
        ).with_known(self._known())
        if recorded is None:
            return st.joined or configured
        if st.self_addr in recorded.removed and st.self_addr not in recorded.addresses():
            # (absent but not removed: a node still catching up from before it was added)
            raise ConfigError(
                [
                    f"raft.listen: this node ({st.self_addr}) was removed from its cluster"
                    + f" (the membership its data directory {st.data_dir} recorded at log "
                    f"index {recorded.index} names "
                    + ", ".join(m.raft for m in recorded.voters)
                    + "); it cannot start with that data: to use this machine again, empty "
                    "the data directory and add the node anew (schedctl node add, or "
                    "raft.join; docs/operations.md, Membership)"
                ]
            )
        moved = self._moved_alone(recorded)
        if moved is not recorded:
            return moved
        if st.self_addr not in recorded.addresses() and st.node_id:
            mine = [m for m in recorded.voters if m.id == st.node_id]
            if mine:
                raise ConfigError(
                    [
                        f"raft.listen: this node ({st.node_id}) is a member of its cluster at "
                        f"{mine[0].raft}, not {st.self_addr}: a member keeps its Raft address; "
                        "to move it, remove it (schedctl node remove) and add it anew with an "
                        "empty data directory (docs/operations.md, Membership)"
                    ]
                )
        configured_peers = set(st.peers)
        logged_peers = recorded.voter_addresses() - {st.self_addr}
        if st.peers and configured_peers != logged_peers:
            log_event(
                log,
                "raft.peers_differ",
                logging.WARNING,
                node=st.self_addr,
                raft_peers=sorted(configured_peers),
                members=sorted(logged_peers),
                learner=None if recorded.learner is None else recorded.learner.raft,
                index=recorded.index,
                hint="the membership the log recorded wins over raft.peers; update raft.peers "
                "to match it (schedctl node list) to silence this",
            )
        return recorded.with_known(self._known())

    def _moved_alone(self, members: Membership) -> Membership:
        """A one-node cluster whose node moved (another raft.listen) is the cluster under its
        new address (recorded so at the next membership change): ``members`` with it there,
        else ``members`` itself.  At start, from the state; and on the tick thread for a
        membership its log applies after the start (recorded just before it stopped)."""
        st = self.settings
        if st.self_addr in members.addresses() or not st.node_id or members.learner is not None:
            return members
        mine = [m for m in members.voters if m.id == st.node_id]
        if not mine or len(members.voters) != 1:
            return members
        log_event(
            log,
            "raft.address_changed",
            logging.WARNING,
            node=st.node_id,
            was=mine[0].raft,
            now=st.self_addr,
        )
        return replace(members, voters=(Member(st.self_addr, st.node_id, st.http_url),))

    def _adopt_members(self, members: Membership) -> None:  # tick thread
        members = self._moved_alone(members).with_known(self._known())
        voters = members.voter_addresses()
        learner = set() if members.learner is None else {members.learner.raft}
        changed = set_members(self._obj, voters, learner, members.removed)
        self.members = members
        self._republish()
        if changed:
            log_event(
                log,
                "raft.members",
                node=self.settings.self_addr,
                index=members.index,
                voters=sorted(voters),
                learner=members.learner.raft if members.learner else None,
            )
        self._check_removed()

    def _check_removed(self) -> None:  # tick thread
        """Stop if the membership this node goes by removed it.  Not while it applies older
        entries than it knows committed: a node catching up from the log meets the memberships
        from before it was added (and removed, if it was added back since)."""
        members, me = self.members, self.settings.self_addr
        self._removal_pending = False
        if not members.index or me in members.addresses() or me not in members.removed:
            return
        if not applied_all_committed(self._obj):
            self._removal_pending = True  # looked at again once caught up (_run_on_tick)
            return
        self._removed = True
        self.hooks.on_fatal(
            f"this node ({me}) was removed from its cluster at log index {members.index}; "
            "it stops. To use this machine again, empty its data directory and add it "
            "anew (schedctl node add, or raft.join; docs/operations.md, Membership)"
        )

    @property
    def removed(self) -> bool:
        """Whether this node was removed from its cluster (it stops: ``hooks.on_fatal``): its
        log's membership says so, or a member refused it saying so."""
        transport = getattr(self, "_transport", None)
        return self._removed or bool(transport is not None and transport.removed)

    @property
    def raft_self(self) -> str:
        return self.settings.self_addr

    def peer_hellos(self) -> dict[str, dict[str, Any]]:
        """Each peer's latest hello (its id, API URL, version, features)."""
        return self._transport.hellos()

    def sending_copies(self) -> set[str]:
        """The peers a whole copy of the state is being sent to now."""
        return set(self.snapshots.sending())

    @property
    def role_in_cluster(self) -> str | None:
        """``voter``, ``learner``, or None (not a member)."""
        return self.members.role(self.settings.self_addr)

    def may_campaign(self) -> bool:  # tick thread
        """Only a voter that applied everything it knows committed runs for leader: the
        membership it counts votes over is then the latest one committed (etcd's rule)."""
        return self.role_in_cluster == VOTER and applied_all_committed(self._obj)

    # -- lifecycle ---------------------------------------------------------------------------
    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.events.attach(loop)

        #: how the ticks hand work to the loop: as a callback of the loop they run on, or from
        #: their own thread
        self._to_loop = loop.call_soon if self._poller is not None else loop.call_soon_threadsafe

        def on_applied(batch: list[tuple[int, list[LeaderEvent]]]) -> None:  # tick thread
            self._to_loop(self._hand_on, batch)

        self.hooks.on_applied = on_applied

    def follow_events(self, listener: Callable[[int, list[LeaderEvent]], None] | None) -> None:
        """Hand the leader events of every entry applied from now on to ``listener`` (index,
        events), on the event loop, in log order; None: to no one.  One listener at a time:
        the leader of this node's current term (it replaces any other).  Event loop."""
        self._leader_listener = listener

    def unfollow_events(self, listener: Callable[[int, list[LeaderEvent]], None]) -> None:
        """Stop handing events to ``listener``, if it is still the one (event loop)."""
        if self._leader_listener == listener:
            self._leader_listener = None

    def _hand_on(self, batch: list[tuple[int, list[LeaderEvent]]]) -> None:
        listener = self._leader_listener
        if listener is not None:
            for index, events in batch:
                listener(index, events)

    def _heard_from_leader(self) -> None:  # tick thread
        now = clock.mono()
        self._leader_heard_at = now
        leader = (self._obj._getLeader(), self._obj.raftCurrentTerm)
        if leader != self._gap_leader:  # a gap across an election is not the leader's
            self._gap_leader = leader
            self.gaps["leader_contact"].forget_all()
        self.gaps["leader_contact"].mark(now)

    def _answered(self, peer: str) -> None:  # tick thread
        now = clock.mono()
        self._answered_at[peer] = now
        term = self._obj.raftCurrentTerm
        if term != self._gap_term:  # answers to an earlier reign are another series
            self._gap_term = term
            self.gaps["follower_answer"].forget_all()
        self.gaps["follower_answer"].mark(now, peer)

    def _replaced(self) -> None:
        """A snapshot replaced the state: the changes before it are not known here."""
        self._sm.replaced()
        self.events.restart(self._sm.state.committed_position)
        self.hooks.on_reset()

    def start(self) -> None:
        """Run the node: its ticks start now, once construction installed every patch.
        (pysyncobj's own thread would start inside its constructor and tick 0.1 s later,
        patched or not: on a loaded machine, a tick without pre-vote or the durable journal's
        hooks.)  Once."""
        assert not self._started, "RaftNode.start is called once"
        self._started = True
        if self._poller is not None:  # the event loop drives the ticks (looptick.py)
            loop = self._loop
            assert loop is not None, "RaftNode.attach(loop) first"
            self._loop_ident = threading.get_ident()
            loop.add_reader(self._poller.fileno(), self._tick_soon)
            self._timer = loop.call_later(0, self._timer_tick)
            return
        self._ticker = threading.Thread(target=self._tick_loop, name="schedd-raft-tick")
        self._ticker.start()

    def _tick_soon(self) -> None:  # event loop
        if not self._tick_scheduled and not self._closing:
            self._tick_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._loop_tick)

    def _timer_tick(self) -> None:  # event loop
        assert self._loop is not None
        self._tick_soon()
        self._timer = self._loop.call_later(
            self.settings.auto_tick_period_ms / 1000, self._timer_tick
        )

    def _loop_tick(self) -> None:  # event loop
        self._tick_scheduled = False
        if self._closing:
            return
        try:
            self._obj.doTick(0)
        except Exception:  # as pysyncobj's loop: log and go on
            log.exception("raft tick failed")
        assert self._poller is not None
        if self._poller.events:  # messages were handled: act on them at once
            self._tick_soon()

    def _stop_loop_ticks(self) -> None:  # event loop
        self._closing = True
        assert self._loop is not None and self._poller is not None
        self._loop.remove_reader(self._poller.fileno())
        if self._timer is not None:
            self._timer.cancel()

    def _tick_loop(self) -> None:  # the tick thread
        """pysyncobj's auto-tick loop: tick until closed (or the main thread is gone), then
        destroy the node on this thread (the journal's last sync happens here)."""
        obj, period = self._obj, self.settings.auto_tick_period_ms / 1000
        main = threading.main_thread()
        try:
            while not self._closing and main.is_alive():
                try:
                    obj.doTick(period)
                except Exception:  # as pysyncobj's loop: log, wait a little and go on
                    log.exception("raft tick failed")
                    time.sleep(period)
        finally:
            self._destroy()

    def _destroy(self) -> None:
        if not self._destroyed:
            self._destroyed = True
            self._obj.destroy()  # (autoTick off: at once, on this thread)
            if self._poller is not None:
                self._poller.close()

    def close(self) -> None:
        # Waits for the tick thread to close the journal (its last sync included): the
        # process may exit next, and an entry appended meanwhile must be on disk first.
        # It blocks for up to a tick and a sync: call it off the event loop.
        ticker = self._ticker
        if self._poller is not None and self._started and not self._closing:
            loop = self._loop
            assert loop is not None
            if threading.get_ident() == self._loop_ident or not loop.is_running():
                with suppress(RuntimeError):  # (a closed loop has nothing left to remove)
                    self._stop_loop_ticks()
            else:
                stopped = threading.Event()

                def stop() -> None:
                    self._stop_loop_ticks()
                    stopped.set()

                loop.call_soon_threadsafe(stop)
                stopped.wait(10)
            self._destroy()
        elif ticker is not None and ticker.is_alive():
            self._closing = True
            self._wake()
            ticker.join()
        else:  # never started, or its thread is gone
            self._destroy()
        self.snapshots.close()
        self._sm.commit_now()

    def _on_state_changed(self, old: int, new: int) -> None:
        self.hooks.on_role(new)

    # -- reads -------------------------------------------------------------------------------
    @contextmanager
    def read(self) -> Iterator[State]:
        """Consistent local read of the applied state (may lag the leader on a follower)."""
        with self._sm.lock:
            yield self._sm.state

    async def wait_visible(self, index: int, timeout: float) -> bool:
        """Wait until the API's reads see entry ``index`` (``state_index``), at most
        ``timeout`` seconds; whether they do.  What is applied but not yet committed to the
        database is committed at the next tick instead of within LAZY_COMMIT_S."""
        if self.state_index >= index:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        feed = self.events
        waiter = feed.listen()  # before looking again: a commit in between sets it
        try:
            while self.state_index < index and not feed.closed:
                sm = self._sm
                if not sm.wanted_visible or index < sm.wanted_visible:
                    sm.wanted_visible = index  # the nearest of those waited for
                self._wake()
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                waiter.clear()
                with suppress(TimeoutError):
                    await within(waiter.wait(), remaining)
            return self.state_index >= index
        finally:
            feed.unlisten(waiter)

    @property
    def state_index(self) -> int:
        """The last applied entry the database is committed up to: what the API's reads see
        (at most LAZY_COMMIT_S behind ``applied_index``)."""
        return int(self._sm.state.committed_index)

    @property
    def state_position(self) -> int:
        """Where the API's reads are in the change feed (GET /events): ``state_index``, or
        in a cluster of several shards the stamp of that entry."""
        return int(self._sm.state.committed_position)

    def hot_set(self) -> int:
        """How many runs the state keeps decoded in memory (SqlState.hot_set)."""
        with self._sm.lock:
            return self._sm.state.hot_set()

    @property
    def raft_status(self) -> RaftStatus:
        """The Raft state the tick thread last published (any thread)."""
        return self._status

    def leader_reachable(self) -> bool:
        """Whether the leader this node names is this node, or a peer it is connected to."""
        status = self._status
        if status.leader is None:
            return False
        if status.role == "leader":
            return True
        peer = status.peer(status.leader)
        return peer is not None and peer.connected

    def _publish_status(self, now: float) -> None:  # tick thread
        obj = self._obj
        leader = obj._getLeader()
        leader_addr = None if leader is None else str(leader.id)
        old = self._status
        changed = (
            old.leader != leader_addr
            or old.term != obj.raftCurrentTerm
            or (old.role == "leader") != bool(obj._isLeader())
        )
        if not changed and now - self._status_at < STATUS_PERIOD:
            return
        self._status_at = now
        raw = obj.getStatus()
        leading = bool(obj._isLeader())
        answered = self._answered_at if leading else {}
        peers = []
        members = self.members
        learning = learners(obj)
        for addr in sorted(members.addresses() - {self.settings.self_addr}):
            seen = self._followers.get(addr)
            match = raw.get(f"match_idx_server_{addr}")
            nxt = raw.get(f"next_node_idx_server_{addr}")
            peers.append(
                PeerStatus(
                    addr=addr,
                    connected=2
                    in (
                        raw.get(f"partner_node_status_server_{addr}"),
                        raw.get(f"readonly_node_status_server_{addr}"),
                    ),
                    match_index=None if match is None else int(match),
                    next_index=None if nxt is None else int(nxt),
                    stalled=seen is not None and seen.stalled,
                    stall_recoveries=self._stall_recoveries.get(addr, 0),
                    answered_at=answered.get(addr),
                    role=LEARNER if addr in learning else VOTER,
                )
            )
        self._status = RaftStatus(
            role=ROLES.get(int(raw.get("state", 0)), "unknown"),
            term=int(raw.get("raft_term", obj.raftCurrentTerm)),
            leader=leader_addr,
            commit_index=int(raw.get("commit_idx", obj.raftCommitIndex)),
            applied_index=int(raw.get("last_applied", obj.raftLastApplied)),
            has_quorum=bool(raw.get("has_quorum", obj.hasQuorum)),
            peers=tuple(peers),
            leader_heard_at=None if leading else self._leader_heard_at,
        )

    @property
    def is_leader(self) -> bool:
        return bool(self._obj._isLeader())

    @property
    def leader_addr(self) -> str | None:
        leader = self._obj._getLeader()
        return None if leader is None else str(leader.id)

    @property
    def term(self) -> int:
        return int(self._obj.raftCurrentTerm)

    @property
    def commit_index(self) -> int:
        return int(self._obj.raftCommitIndex)

    @property
    def applied_index(self) -> int:
        return int(self._obj.raftLastApplied)

    def has_quorum(self) -> bool:
        return bool(self._obj.hasQuorum)

    def database_bytes(self) -> tuple[int, int]:
        """Sizes of the state database file and of its write-ahead log, in bytes."""
        sizes = []
        for name in ("state.db", "state.db-wal"):
            try:
                sizes.append((self.settings.data_dir / name).stat().st_size)
            except OSError:
                sizes.append(0)
        return sizes[0], sizes[1]

    @property
    def last_snapshot_duration(self) -> float | None:
        """How long the last compaction (the barrier and the marker) took (None before the
        first)."""
        return self.snapshots.last_duration

    def snapshot_stats(self) -> dict[str, Any]:
        """The last compaction's index, and the whole copies sent and received since the
        process started (read from any thread: plain numbers and copies)."""
        s = self.snapshots
        return {
            "index": s.last_index,
            "sent": dict(s.sent),
            "received": dict(s.received),
            "bytes_sent": s.bytes_sent,
            "bytes_received": s.bytes_received,
            "sending": len(s.sending()),
        }

    def snapshot_age(self) -> float | None:
        """Seconds since the snapshot (full dump) file was last written, if there is one."""
        try:
            mtime = (self.settings.data_dir / "raft.dump").stat().st_mtime
        except OSError:
            return None
        return max(0.0, clock.wall_ms() / 1000 - mtime)

    def elections(self) -> dict[str, dict[str, int]]:
        """What pre-vote counted since this node started: elections started (by why), pre-vote
        rounds (won, lost, yielded), pre-votes refused and vote requests ignored (by reason),
        leader step-downs (by cause).  Copies, read from any thread."""
        e = self._elections
        return {
            "started": dict(e.started),
            "rounds": dict(e.rounds),
            "refused": dict(e.refused),
            "ignored": dict(e.ignored),
            "stepdowns": dict(e.stepdowns),
            "leader_lost": dict(e.leader_lost),
        }

    def gap_views(self) -> dict[str, GapView]:
        """The histograms of :mod:`schedd.raft.gaps`, by kind (read from any thread)."""
        return {kind: gaps.view() for kind, gaps in self.gaps.items()}

    def peer_refusals(self) -> dict[str, int]:
        """Connections this node refused since it started, by reason (see PeerGuard)."""
        return dict(self._transport.refusals)

    @property
    def fatal(self) -> str | None:
        """Why this node cannot join any cluster as configured, once that is known."""
        return self._transport.fatal

    def is_ready(self) -> bool:
        return bool(self._obj.isReady())

    def voting(self) -> bool:
        """Whether this node grants votes: False while it abstains, having started empty
        beside peers that hold data, until it has caught up with a leader."""
        return self.journal is None or self.journal.may_vote()

    def transfer_leadership(self, to: str | None = None) -> None:
        """Hand the leadership over (the daemon is stopping): ask the most caught-up follower
        to take over (Raft TimeoutNow) on every tick until this node no longer leads.
        pysyncobj sends TimeoutNow only to a follower that holds the whole log, which under
        load it never does while commands keep coming: so from now on this node appends no
        new command - its own wait (and are sent to the new leader once it is known) and those
        followers forward are refused (their callers retry) - and a follower catches up
        within one round trip.  ``to``: the Raft address of the voter to hand it to (while it
        is a connected voter), else the most caught-up one."""
        if to is not None:
            for node in list(self._obj._SyncObj__otherNodes):
                if str(node.id) == to:
                    self._handover_target = node
        if self._handing_over is None:
            self._handing_over = clock.mono()
        self._wake()

    @property
    def handing_over(self) -> bool:
        return self._handing_over is not None

    def stop_handing_over(self) -> None:
        """The hand-over did not happen in time, and the node goes on (a removal that did not
        take place): it leads again, taking commands."""
        self._handing_over = None
        self._handover_target = None

    def _hand_over(self) -> None:  # tick thread
        """Ask one follower to take over, the same one for the whole hand-over (while it is a
        connected voter): told one after the other, two followers ran for the same term and
        split the vote (seen with four voters)."""
        if self._handing_over is None or not self._obj._isLeader():
            return
        target = most_caught_up(self._obj, self._handover_target)
        if target is not None and target is not self._handover_target:
            log_event(log, "raft.handover_to", node=self.settings.self_addr, peer=str(target.id))
        self._handover_target = target
        if target is not None:
            self._obj.transferLeadership(target)

    def _holding_writes(self) -> bool:
        """While handing over: until this node no longer leads and knows the new leader (at
        most HAND_OVER_HOLD), new commands wait."""
        since = self._handing_over
        if since is None or clock.mono() - since > HAND_OVER_HOLD:
            return False
        return bool(self._obj._isLeader()) or self._obj._getLeader() is None

    # -- stalled followers (docs/pysyncobj.md #6) ------------------------------------------------------
    def _watch_followers(self) -> None:  # tick thread
        """Find a follower whose replication is stalled and recover it with a snapshot.

        pysyncobj 0.3.17 can live-lock a follower: after a leader pause, the old leader comes
        back with a tail of entries it never sent (``F`` = its last index) while the new
        leader's ``nextIndex`` for it ran ahead.  It answers "no such prevLogIdx" with ``reset,
        next = F + 1``; the probe at ``F`` fails on the term (``reset, next = F``), but every
        append_entries the leader pipelined behind the probe is answered ``reset, next =
        F + 1`` again, and the leader takes whichever answer came last.  ``nextIndex`` never
        reaches the common prefix, ``matchIndex`` stays where it was, the connection looks
        healthy and the follower's election timer is fed -- until the leader's log compaction
        moves its log start past ``F`` and the follower is sent a snapshot instead.

        So: a follower that is connected and keeps answering (pysyncobj's last response time
        from it is recent: a follower that is down or stopped does not answer; one receiving a
        copy does, and is left alone), is behind the commit index, and whose match index has not moved for
        ``follower_stall_timeout_ms`` of that, is stalled.  It is logged, exposed in
        :attr:`raft_status`, and the leader compacts its log now (``forceLogCompaction``), which
        sends the follower the snapshot at once instead of at the next scheduled compaction.
        Repeated (with a doubling wait up to a minute) while the stall lasts.  A snapshot only
        holds applied (committed) entries, so installing it on a follower is always safe.
        """
        now = clock.mono()
        if now - self._followers_checked < FOLLOWER_CHECK_PERIOD:
            return
        self._followers_checked = now
        if not self._obj._isLeader():
            if self._followers:
                self._followers.clear()
                self._republish()
            return
        status = self._status  # at most STATUS_PERIOD old: parsed once, in _publish_status
        commit = int(self._obj.raftCommitIndex)
        # Read-only, on the tick thread: when each follower last answered an append_entries.
        answered = last_response_times(self._obj)
        timeout = self.settings.follower_stall_timeout_ms / 1000
        changed = False
        receiving = self.snapshots.sending()  # a follower being sent a copy is not stalled
        for view in status.peers:
            peer, match = view.addr, view.match_index
            alive = view.connected and now - answered.get(peer, -1e9) < FOLLOWER_ANSWERED_WITHIN
            alive = alive and peer not in receiving
            seen = self._followers.get(peer)
            if match is None or not alive or match >= commit or seen is None or match != seen.match:
                if seen is not None and seen.stalled:
                    changed = True
                    moved = match is not None and (match != seen.match or match >= commit)
                    log_event(
                        log,
                        "raft.follower_recovered" if moved else "raft.follower_silent",
                        logging.WARNING,
                        peer=peer,
                        match_index=match,
                        commit_index=commit,
                        answering=alive,
                        stalled_for=round(now - seen.since, 1),
                    )
                self._followers[peer] = _FollowerProgress(match or 0, now)
                continue
            stalled_for = now - seen.since
            if stalled_for < timeout or now < seen.next_recovery:
                continue
            seen.stalled = True
            seen.backoff = min(FOLLOWER_STALL_MAX_BACKOFF, max(timeout, 2 * seen.backoff))
            seen.next_recovery = now + seen.backoff
            self._stall_recoveries[peer] = self._stall_recoveries.get(peer, 0) + 1
            changed = True
            log_event(
                log,
                "raft.follower_stalled",
                logging.WARNING,
                peer=peer,
                match_index=match,
                commit_index=commit,
                next_index=view.next_index,
                stalled_for=round(stalled_for, 1),
                recovery="compacting the log now, so the follower is sent a snapshot",
                recoveries=self._stall_recoveries[peer],
                next_attempt_in=seen.backoff,
            )
            self._force_compaction()
        if changed:
            self._republish()

    def _force_compaction(self) -> None:  # tick thread
        """Compact the log up to the last applied entry at the next tick, whatever waits (see
        compact_log)."""
        self._obj.forceLogCompaction()

    def _republish(self) -> None:  # tick thread
        self._status_at = 0.0  # publish the change at the end of this tick

    def _run_on_tick(self) -> None:  # tick thread
        self._hand_over()
        if self._removal_pending:
            self._check_removed()
        self._fast_append()
        self.snapshots.running = True  # pysyncobj loaded the snapshot file (if any) before
        self.snapshots.sweep(bool(self._obj._isLeader()))
        try:
            self._watch_followers()
            self._publish_status(clock.mono())
        except Exception:  # never break the tick thread
            log.exception("follower watch failed")
        while True:
            try:
                action = self._on_tick.get_nowait()
            except queue.Empty:
                return
            try:
                action()
            except Exception:  # never break the tick thread
                log.exception("tick action failed")

    def _fast_append(self) -> None:  # tick thread
        """Send new log entries now instead of at the next append period, when every connected
        follower has acknowledged everything sent to it (one append in flight per follower at
        most, so pysyncobj never resends entries a follower already holds)."""
        if append_now(self._obj):
            self._wake()

    def _wake(self) -> None:
        """Make the tick thread's poll return now (any thread)."""
        if self._poller is not None:
            loop = self._loop
            if loop is None or not self._started:
                return
            if threading.get_ident() == self._loop_ident:
                self._tick_soon()
            else:
                loop.call_soon_threadsafe(self._tick_soon)
            return
        if self._waker is not None and not self._woken.is_set():
            self._woken.set()
            try:
                self._waker.notify()
            except BlockingIOError:  # the pipe is full: the tick thread is awake anyway
                pass

    # -- writes ------------------------------------------------------------------------------
    def submit_nowait(self, cmd: commands.Command) -> asyncio.Future[Committed]:
        """Queue ``cmd`` for the next entry; the future resolves with its result, and the
        entry's index, once applied."""
        loop = self._loop
        assert loop is not None, "RaftNode.attach(loop) first"
        fut: asyncio.Future[Committed] = loop.create_future()
        if len(self._pending) >= MAX_PENDING:
            fut.set_exception(
                ResourceExhausted("too many commands waiting for Raft", retry_after=1)
            )
            return fut
        self._pending.append((cmd, fut))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return fut

    async def submit(self, cmd: commands.Command, timeout: float = 5.0) -> Result:
        return (await self.submit_indexed(cmd, timeout)).result

    async def submit_indexed(self, cmd: commands.Command, timeout: float = 5.0) -> Committed:
        """Commit ``cmd``: its result, and the index and position of the entry it was applied
        in."""
        fut = self.submit_nowait(cmd)
        try:
            return await within(fut, timeout)
        except TimeoutError:
            raise Unavailable(
                f"no commit within {timeout:.1f}s (the cluster may be electing a leader)",
                retry_after=1,
            ) from None

    def _flush(self) -> None:
        if self._holding_writes():
            assert self._loop is not None
            self._loop.call_later(HAND_OVER_POLL, self._flush)
            return
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        own = self._sm.own
        for start in range(0, len(pending), MAX_COMMANDS_PER_ENTRY):
            chunk = pending[start : start + MAX_COMMANDS_PER_ENTRY]
            cmds = [cmd for cmd, _ in chunk]
            blob = commands.encode_entry(cmds)
            if len(own) >= MAX_OWN_ENTRIES:
                own.clear()
            own[blob] = cmds
            futures = [fut for _, fut in chunk]
            self._sm.apply_entry(blob, callback=self._make_callback(futures))
        self._wake()

    def _make_callback(
        self, futures: list[asyncio.Future[Committed]]
    ) -> Callable[[Any, int], None]:
        assert self._loop is not None, "RaftNode.attach(loop) first"
        to_loop = self._to_loop

        def callback(res: Any, err: int) -> None:  # runs on the tick thread
            to_loop(_resolve, futures, res, err)

        return callback


class Applied(list[Result]):
    """An entry's results, as this node applied them, with the entry's index and position."""

    __slots__ = ("entry", "position")
    entry: int  # its index
    position: int  # its index, or its stamp in a cluster of several shards


def _resolve(futures: list[asyncio.Future[Committed]], res: Any, err: int) -> None:
    if err == FAIL_REASON.SUCCESS and isinstance(res, Applied) and len(res) == len(futures):
        entry, position = res.entry, res.position
        for fut, r in zip(futures, res, strict=True):
            if not fut.done():
                fut.set_result(Committed(r, entry, position))
        return
    if err == FAIL_REASON.SUCCESS:
        error: SchedError = Unavailable(
            "the entry was applied but its results were lost", retry_after=1
        )
    elif err == FAIL_REASON.QUEUE_FULL:
        error = ResourceExhausted(_FAIL_MESSAGES[err], retry_after=1)
    else:
        error = Unavailable(_FAIL_MESSAGES.get(err, f"raft failure {err}"), retry_after=1)
    for fut in futures:
        if not fut.done():
            fut.set_exception(error)
