"""Every place schedd reaches into pysyncobj past its public API: the inventory, the patches,
and the start-up check that they still fit.

pysyncobj is pinned (``pyproject.toml``) because schedd changes its behaviour where it has no
hook.  Each patch below says what it changes, why, and which test shows it; everything private
it touches (name-mangled ``_SyncObj__*`` attributes and methods, one private attribute of a
connection, one module-level factory) is listed in :data:`PRIVATE` and checked by
:func:`check_installed` (before a node is built) and :func:`check_node` (on the built node),
so another pysyncobj stops the node at start with a message that says what is wrong, not with
an ``AttributeError`` in the tick thread or, worse, a patch that silently no longer applies.

=======================  ====================================================  ==============================
patch                    what and why                                          tests
=======================  ====================================================  ==============================
read_before_judging      wraps ``_onTick``: after a pause the tick reads the   tests/unit/test_raft_pauses.py
                         sockets before it judges timeouts (below)
bound_apply              replaces ``__applyLogEntries`` (a copy of 0.3.17's,   tests/unit/test_raft_pauses.py
                         fingerprinted: :data:`APPLY_SOURCE_SHA256`): a time
                         budget per tick, one database transaction per tick
guard_snapshot_commit    wraps the transport's message callback: a snapshot    tests/unit/test_raft_snapshot_guard.py
                         chunk must not commit without log matching
keep_next_index          wraps the transport's message callback: an            tests/unit/test_raft_patches.py
                         acknowledgement never moves a follower's next index
                         back over entries still in flight (they were sent
                         again, and the follower truncated and rewrote them)
append_now               zeroes ``__newAppendEntriesTime`` when no append is   tests/unit/test_raft_patches.py
                         in flight: new entries go out at once, not at the
                         next append period (low-latency commits)
pre_vote                 (in :mod:`schedd.raft.prevote`) wraps ``_onTick``,     tests/unit/test_raft_prevote.py
                         the message callback and ``send``: pre-vote before
                         an election, vote requests ignored while the leader
                         is heard (both fingerprinted: :data:`SOURCES`)
watch_contact            reads ``append_entries`` and ``next_node_idx``: when   tests/cluster/test_cluster_view.py
                         this node last heard from its leader or followers
last_response_times      reads ``__lastResponseTime`` (the stalled-follower     tests/cluster/test_stalled_follower.py
                         watch)
compact_log              replaces ``__tryLogCompaction`` (fingerprinted): no     tests/unit/test_raft_compaction.py
                         new compaction while a copy is sent, the log kept
                         for a follower that still needs it (up to a cap),
                         no staggering (a compaction is a barrier, not a copy)
ship_snapshots           replaces the serializer's transmission methods and    tests/unit/test_raft_compaction.py,
                         wraps ``__sendAppendEntries`` (fingerprinted): a      tests/cluster/test_snapshot_transfer.py
                         copy streamed, paced, from the live database only
                         to a follower that needs one, written beside the
                         follower's database and installed by rename
set_members              rewrites ``__otherNodes`` (the voters), adds learners  tests/unit/test_raft_members.py,
                         to ``__readonlyNodes`` (replicated to, never counted   tests/cluster/test_membership.py
                         in a majority) and keeps the transport and the
                         leader's per-node indexes in step: the membership
                         the log recorded, applied on every node
most_caught_up           reads ``__connectedNodes``, ``__otherNodes`` and        tests/unit/test_raft_handover.py
                         ``__raftMatchIndex``: the one voter a hand-over asks
                         to take over, kept for the whole hand-over
applied_all_committed    calls ``__getCurrentLogIndex``: a voter campaigns,   tests/cluster/test_membership.py,
                         and a removal stops a node, only once it applied     tests/integration/test_journal_compaction.py
                         what it knows committed
swap_create_journal      replaces ``pysyncobj.syncobj.createJournal`` while a   tests/unit/test_journal.py
                         SyncObj is built: the durable journal
swap_create_poller       (in :mod:`schedd.raft.looptick`) replaces              tests/integration/test_raft_start.py
                         ``pysyncobj.syncobj.createPoller`` while a SyncObj is
                         built: an ``epoll`` poller the event loop can watch
peer_address             reads a connection's ``__socket`` to name a peer it    tests/cluster/test_raft_secret.py
                         refused
=======================  ====================================================  ==============================

Not patches but pysyncobj's own options, documented where used: the custom asynchronous
serializer (``schedd/raft/snapshots.py``), the transport class (``schedd/raft/journal.py``,
``schedd/raft/peerguard.py``), ``addOnTickCallback``.

Pauses
------

A node whose Raft thread did not run for a while reads its sockets before judging timeouts.

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

import hashlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import Any, Final

import pysyncobj.syncobj as _syncobj
from pysyncobj import FAIL_REASON, SyncObj
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.monotonic import monotonic as raft_clock
from pysyncobj.syncobj import SyncObjExceptionWrongVer

log = logging.getLogger(__name__)

# -- what is touched, and the check that it is there ---------------------------------------------
PYSYNCOBJ_VERSION: Final = "0.3.17"

#: methods of SyncObj that the patches call or replace
PRIVATE_METHODS: Final = (
    "_onTick",
    "_isLeader",
    "_SyncObj__doApplyCommand",
    "_SyncObj__getEntries",
    "_SyncObj__applyLogEntries",
    "_SyncObj__getCurrentLogIndex",
    "_SyncObj__getCurrentLogTerm",
    "_SyncObj__tryLogCompaction",
    "_SyncObj__sendAppendEntries",
    "_SyncObj__deleteEntriesTo",
    "_SyncObj__sendNextNodeIdx",
    "_getLeader",
)
#: attributes of a built SyncObj that the patches read or write
PRIVATE_ATTRIBUTES: Final = (
    "_poller",
    "_SyncObj__transport",
    "_SyncObj__properies",
    "_SyncObj__conf",
    "_SyncObj__raftCommitIndex",
    "_SyncObj__raftLastApplied",
    "_SyncObj__raftLog",
    "_SyncObj__commandsWaitingCommit",
    "_SyncObj__raftNextIndex",
    "_SyncObj__raftMatchIndex",
    "_SyncObj__connectedNodes",
    "_SyncObj__otherNodes",
    "_SyncObj__newAppendEntriesTime",
    "_SyncObj__lastResponseTime",
    "_SyncObj__forceLogCompaction",
    "_SyncObj__raftElectionDeadline",
    "_SyncObj__transferInProgress",
    "_SyncObj__serializer",
    "_SyncObj__lastSerializedTime",
    "_SyncObj__lastSerializedEntry",
    "_SyncObj__selfNode",
    "_SyncObj__readonlyNodes",
    "_SyncObj__nodeClass",
)
#: a connection's socket, read only to name a refused peer (without it the name is "?")
CONNECTION_SOCKET: Final = "_TcpConnection__socket"

#: sha256 of pysyncobj 0.3.17's ``SyncObj.__applyLogEntries`` source, which :func:`bound_apply`
#: copies: another body means the copy must be brought in step with it first
APPLY_SOURCE_SHA256: Final = "073db677773b5a2dddf17cc51f84ac8803ed456da0f0011e15240d6bd1600684"


#: the sources whose every line a patch depends on: sha256 of each method of pysyncobj 0.3.17,
#: and what depends on it
SOURCES: Final = {
    "_SyncObj__applyLogEntries": (APPLY_SOURCE_SHA256, "schedd's bound_apply copies"),
    "_onTick": (
        "cc9eb08232d005ba4e21a33ec453e5d02fe3537dadebda8571406c57f65a3c37",
        "schedd's pre_vote knows (when it calls an election)",
    ),
    "_SyncObj__onMessageReceived": (
        "ddfe34b6c02821795146dc533fb7c0fcf6574a082a68a227b4c885c9e14be206",
        "schedd's pre_vote knows (how it takes a vote request and a higher term)",
    ),
    "_SyncObj__tryLogCompaction": (
        "c2f8a0ec14cc7312e3ff41a16cde9be71ff0f908bd66aec9e2673d97a775be2c",
        "schedd's compact_log replaces",
    ),
    "_SyncObj__sendAppendEntries": (
        "9cb9073128c392fa9e5efc4691420ba435bfafb4c74e83a34f931fa16aa760c6",
        "schedd's ship_snapshots knows (how it asks for a snapshot's pieces)",
    ),
}


class PysyncobjMismatch(RuntimeError):
    """The installed pysyncobj is not the one schedd's patches were written for."""


_HINT = (
    f"schedd patches pysyncobj {PYSYNCOBJ_VERSION} and runs only with it: reinstall "
    "schedd with its pinned dependencies (pip install schedd, not a newer pysyncobj)"
)


def check_installed() -> None:
    """Raise :class:`PysyncobjMismatch` unless the installed pysyncobj is the expected version,
    with the methods the patches replace or call, and the apply step they copy unchanged."""
    try:
        version = metadata.version("pysyncobj")
    except metadata.PackageNotFoundError:
        version = "unknown"
    if version != PYSYNCOBJ_VERSION:
        raise PysyncobjMismatch(f"pysyncobj {version} is installed; {_HINT}")
    missing = [f"SyncObj.{name}" for name in PRIVATE_METHODS if not hasattr(SyncObj, name)]
    for name in ("createJournal", "createPoller"):
        if not hasattr(_syncobj, name):
            missing.append(f"pysyncobj.syncobj.{name}")
    if missing:
        raise PysyncobjMismatch(f"pysyncobj lacks {', '.join(missing)}; {_HINT}")
    for name, (digest, why) in SOURCES.items():
        try:
            source = inspect.getsource(getattr(SyncObj, name))
        except (OSError, TypeError):
            return  # installed without its source: the version check above is what there is
        if hashlib.sha256(source.encode()).hexdigest() != digest:
            shown = name.replace("_SyncObj__", "__")
            raise PysyncobjMismatch(f"pysyncobj's SyncObj.{shown} is not the one {why}; {_HINT}")


def check_node(obj: SyncObj) -> None:
    """Raise :class:`PysyncobjMismatch` unless the built node has every private attribute the
    patches use (instance attributes exist only once ``SyncObj.__init__`` has run)."""
    missing = [name for name in PRIVATE_ATTRIBUTES if not hasattr(obj, name)]
    if missing:
        raise PysyncobjMismatch(f"this pysyncobj's SyncObj has no {', '.join(missing)}; {_HINT}")


#: a gap between two ticks longer than this counts as a pause (a tick ends with a poll of at
#: most ``autoTickPeriod``, 10 ms by default, so consecutive ticks are normally ~0 apart)
DEFAULT_THRESHOLD_S = 0.05


#: how long one tick may spend applying committed entries before it sends and reads
DEFAULT_APPLY_BUDGET_S = 0.05


def read_before_judging(
    obj: Any,
    threshold: float = DEFAULT_THRESHOLD_S,
    on_start: Callable[[float], None] | None = None,
) -> None:
    """Wrap the pysyncobj ``obj``'s tick (its auto-tick thread and ``doTick`` call
    ``self._onTick``) so that after a pause it reads the network before its timers.
    ``on_start(now)`` is called as each tick starts."""
    original = obj._onTick
    transport = obj._SyncObj__transport
    last_end = [raft_clock()]

    def on_tick(timeToWait: float = 0.0) -> None:  # pysyncobj's name
        now = raft_clock()
        if on_start is not None:
            on_start(now)
        if now - last_end[0] > threshold and transport.ready:
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


def bound_apply(
    obj: Any, budget: float = DEFAULT_APPLY_BUDGET_S, batch: ApplyBatch | None = None
) -> None:
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


# -- commits ------------------------------------------------------------------------------------
def _intercept(
    obj: SyncObj,
    wanted: Callable[[dict[str, Any]], bool],
    around: Callable[[Any, Any, Callable[[Any, Any], None]], None],
) -> None:
    """Route the node's incoming Raft messages that ``wanted`` picks through ``around(node,
    message, inner)``, which calls ``inner`` (pysyncobj's own handling, or the interceptor
    installed before) itself; every other message goes straight to ``inner``."""
    transport = obj._SyncObj__transport
    inner = transport._onMessageReceivedCallback

    def on_message(node: Any, message: Any) -> None:
        if isinstance(message, dict) and wanted(message):
            around(node, message, inner)
        else:
            inner(node, message)

    transport.setOnMessageReceivedCallback(on_message)


def refuse_forwarded(obj: SyncObj, refusing: Callable[[], bool]) -> None:
    """While ``refusing()`` (a leader handing its leadership over), answer the commands
    followers forward to this leader with NOT_LEADER, as pysyncobj does once it has stepped
    down, instead of appending them: the log stops growing, so a follower catches up and the
    transfer can go (pysyncobj transfers only to a follower holding the whole log).  The
    follower's caller gets the refusal and retries.  Tick thread."""

    def wanted(message: dict[str, Any]) -> bool:
        return message.get("type") == "apply_command"

    def around(node: Any, message: Any, inner: Callable[[Any, Any], None]) -> None:
        if not (refusing() and obj._isLeader()):
            inner(node, message)
        elif "request_id" in message:
            answer = {"type": "apply_command_response", "request_id": message["request_id"]}
            obj._SyncObj__transport.send(node, {**answer, "error": FAIL_REASON.NOT_LEADER})

    _intercept(obj, wanted, around)


def guard_snapshot_commit(obj: SyncObj) -> None:
    """Work around a pysyncobj 0.3.17 bug that acknowledged writes which were then lost.

    A follower handles an ``append_entries`` message that carries a snapshot chunk (no
    ``prevLogIdx``; ``serialized`` is a chunk, or None while the leader is still writing the
    snapshot) by falling through to ``commitIndex = min(leaderCommit, own last index)`` without
    the log-matching check.  A deposed leader holding uncommitted entries of its own (client
    writes it accepted while cut off) thus "commits" and applies them, answers the clients that
    sent them, and then loads the snapshot, which does not have them: an acknowledged job lost
    (found by the fault suite: seed 3017, one_way_leader_in).  Only installing the snapshot may
    move the commit index on such a message; otherwise it is put back.  Runs on the tick thread
    (the transport's message callback)."""

    def snapshot_chunk(message: dict[str, Any]) -> bool:
        return message.get("type") == "append_entries" and "prevLogIdx" not in message

    def around(node: Any, message: Any, inner: Callable[[Any, Any], None]) -> None:
        commit = obj._SyncObj__raftCommitIndex
        applied = obj._SyncObj__raftLastApplied
        raft_log = obj._SyncObj__raftLog
        first = raft_log[0] if len(raft_log) else None
        inner(node, message)
        installed = obj._SyncObj__raftLastApplied != applied or (
            (raft_log[0] if len(raft_log) else None) != first
        )
        if not installed and obj._SyncObj__raftCommitIndex > commit:
            obj._SyncObj__raftCommitIndex = commit
            raft_log.setRaftCommitIndex(commit)

    _intercept(obj, snapshot_chunk, around)


def watch_contact(
    obj: SyncObj, heard_leader: Callable[[], None], answered: Callable[[str], None]
) -> None:
    """Call ``heard_leader()`` for each ``append_entries`` (heartbeats included) this node takes
    from the leader it follows, and, while it leads, ``answered(peer)`` for each answer to one
    (pysyncobj's own last response times start at the election, answered or not).  Tick
    thread."""

    def wanted(message: dict[str, Any]) -> bool:
        return message.get("type") in ("append_entries", "next_node_idx")

    def around(node: Any, message: Any, inner: Callable[[Any, Any], None]) -> None:
        inner(node, message)
        leading = obj._isLeader()
        if message.get("type") == "append_entries":
            if not leading and obj._getLeader() == node:
                heard_leader()
        elif leading:
            answered(str(node.id))

    _intercept(obj, wanted, around)


def keep_next_index(obj: SyncObj) -> None:
    """Stop pysyncobj 0.3.17 from sending a follower entries it already has.

    The leader advances a follower's next index as it sends (appends are pipelined), but a
    successful ``next_node_idx`` answer sets it to just after the entries *that* answer
    acknowledges.  When further appends are still in flight (the periodic send went out
    before the answer came back) it moves back over them, and the next send repeats them: the
    follower truncates its log there ("truncating already-applied log entries", a CRITICAL
    line; a truncation and a sync of its journal on its Raft thread) and writes the same
    entries again.  With entries of a thousand jobs (200 KB) under load that was a steady
    stream of duplicate writes on every follower.  Here a success answer only ever moves the
    next index forward; an answer with ``reset`` (the follower lacks the previous entry, or
    its term differs) still moves it wherever the follower says, which is how Raft repairs a
    follower's log.  Runs on the tick thread (the transport's message callback)."""

    def success_answer(message: dict[str, Any]) -> bool:
        return bool(
            message.get("type") == "next_node_idx"
            and message.get("success")
            and not message.get("reset")
        )

    def around(node: Any, message: Any, inner: Callable[[Any, Any], None]) -> None:
        next_index = obj._SyncObj__raftNextIndex
        before = next_index.get(node)
        inner(node, message)
        after = next_index.get(node)
        if before is not None and after is not None and after < before:
            next_index[node] = before

    _intercept(obj, success_answer, around)


def append_due(
    current: int,
    next_index: dict[Any, int],
    match_index: dict[Any, int],
    connected: Any,
    followers: Any,
) -> bool:
    """Whether new entries may be sent now: some connected follower lacks entries up to
    ``current`` and no connected follower has an append in flight (its match index is behind
    the next index it was sent: pysyncobj would send the same entries again)."""
    behind = False
    for node in followers:
        if node not in connected:
            continue
        if match_index.get(node, 0) + 1 < next_index.get(node, 0):
            return False
        if next_index.get(node, 0) <= current:
            behind = True
    return behind


def append_now(obj: SyncObj) -> bool:
    """On a leader, make the next tick send new entries at once instead of at the next
    ``appendEntriesPeriod`` when :func:`append_due` (tick thread).  True if it did: the caller
    wakes the tick thread."""
    if not obj._isLeader():
        return False
    if not append_due(
        obj._SyncObj__getCurrentLogIndex(),
        obj._SyncObj__raftNextIndex,
        obj._SyncObj__raftMatchIndex,
        obj._SyncObj__connectedNodes,
        obj._SyncObj__otherNodes,
    ):
        return False
    obj._SyncObj__newAppendEntriesTime = 0
    return True


# -- the stalled-follower watch ---------------------------------------------------------------------
def last_response_times(obj: SyncObj) -> dict[str, float]:
    """When each follower last answered an append_entries (pysyncobj's monotonic clock; tick
    thread, read only)."""
    return {str(node.id): float(t) for node, t in obj._SyncObj__lastResponseTime.items()}


# -- compaction and snapshots --------------------------------------------------------------------
#: a follower heard from within this many seconds keeps the log it still needs (below the cap):
#: one down for longer is sent a whole copy when it comes back
KEEP_FOR_FOLLOWER_S: Final = 300.0


def compact_log(
    obj: SyncObj,
    *,
    holding: Callable[[], bool],
    log_bytes: Callable[[], int],
    keep_max: int,
) -> None:
    """Replace pysyncobj 0.3.17's ``__tryLogCompaction`` (looked up on the instance by its
    mangled name) with one that compacts as it does (once the log holds more than
    ``logCompactionMinEntries`` entries or ``logCompactionMinTime`` passed, or when forced),
    finishing a compaction the same way, with three differences, while the log holds less than
    ``keep_max`` bytes (``log_bytes()``):

    * no compaction starts while ``holding()`` (a whole copy is being sent: its Raft data is
      the log's start, which must stay where it is until the follower has it);
    * a leader compacts only up to what every follower heard from in the last
      :data:`KEEP_FOR_FOLLOWER_S` seconds holds (its match index): a follower that was
      restarted or fell behind catches up from the log instead of needing a whole copy;
    * there is no staggering of the nodes (``logCompactionSplit``): a compaction is a
      durability barrier now, not a copy of the state that three nodes must not write at once.

    Past ``keep_max``, and when forced (the stalled-follower recovery), it compacts up to the
    last applied entry whatever waits.  Tick thread."""
    serializer = obj._SyncObj__serializer
    conf = obj._SyncObj__conf

    def try_log_compaction() -> None:
        now = raft_clock()
        state, serialize_id = serializer.checkSerializing()
        if state == SERIALIZER_STATE.SUCCESS:
            obj._SyncObj__lastSerializedTime = now
            obj._SyncObj__deleteEntriesTo(serialize_id)
            obj._SyncObj__lastSerializedEntry = serialize_id
        if state != SERIALIZER_STATE.NOT_SERIALIZING:
            return
        forced = obj._SyncObj__forceLogCompaction
        if (
            len(obj._SyncObj__raftLog) <= conf.logCompactionMinEntries
            and now - obj._SyncObj__lastSerializedTime <= conf.logCompactionMinTime
            and not forced
        ):
            return
        point = obj._SyncObj__raftLastApplied
        if not forced and log_bytes() < keep_max:
            if holding():
                return
            if obj._isLeader():
                match, heard = obj._SyncObj__raftMatchIndex, obj._SyncObj__lastResponseTime
                learning = obj.__dict__.get("_schedd_learners", set())  # (set_members)
                for node in obj._SyncObj__otherNodes | learning:
                    if now - heard.get(node, float("-inf")) < KEEP_FOR_FOLLOWER_S:
                        point = min(point, match.get(node, 0))
        obj._SyncObj__forceLogCompaction = False
        entries = obj._SyncObj__getEntries(point - 1, 2)
        if len(entries) < 2 or entries[0][1] == obj._SyncObj__lastSerializedEntry:
            obj._SyncObj__lastSerializedTime = now
            return
        cluster = obj._SyncObj__otherNodes | {obj._SyncObj__selfNode}
        serializer.serialize((None, entries[1], entries[0], cluster), entries[0][1])

    obj._SyncObj__tryLogCompaction = try_log_compaction
    obj._SyncObj__properies.add("_SyncObj__tryLogCompaction")  # not replicated state


#: a follower receiving a whole copy answers the leader at least this often (seconds)
RECEIVING_ANSWER_S: Final = 0.5


def ship_snapshots(
    obj: SyncObj,
    transmission: Callable[[Any, Any], tuple[bytes, bool, bool] | None],
    cancel: Callable[[Any], None],
    receive: Callable[[Any], bool],
    lost: Callable[[Any], None] = lambda node: None,
) -> None:
    """Route pysyncobj's snapshot transfers through schedd's (:mod:`schedd.raft.snapshots`).

    The leader asks its serializer for the next piece of the snapshot
    (``getTransmissionData(node)``) for each follower whose next index is at or before the
    start of its log, and a follower hands each piece it receives to
    ``setTransmissionData(data)``: both are replaced, with ``transmission(node, raft)`` (``raft``
    the Raft data of the log's start: its second entry, its first, the cluster) and
    ``receive(data)``; ``cancelTransmisstion(node)`` (a follower not connected) with
    ``cancel(node)``.

    pysyncobj 0.3.17's send loop asks again at once when a piece is not ready (None), for the
    rest of its append period (20 ms of the tick thread, each ask a message): so when there is
    none, the follower's next index is moved past the log for the rest of this send, which ends
    the loop, and put back when ``__sendAppendEntries`` returns.

    Two more things pysyncobj does not do for a transfer that lasts minutes:

    * a follower answers nothing until the last piece, and a connection that reads nothing for
      its timeout (10 s) is closed: so a follower receiving a copy answers the leader every
      :data:`RECEIVING_ANSWER_S` seconds (``next_node_idx``, neither success nor reset: the
      leader only notes that it answered, which also counts it as alive);
    * a piece whose message the transport could not send (a connection being replaced) is
      dropped without a word: the transport's ``send`` is wrapped, and such a loss is reported
      (``lost(node)``), so the copy starts again instead of arriving with a hole in it.

    Tick thread."""
    serializer = obj._SyncObj__serializer
    next_index = obj._SyncObj__raftNextIndex
    original_send = obj._SyncObj__sendAppendEntries
    held_back: dict[Any, int] = {}

    def get_transmission_data(node: Any) -> tuple[bytes, bool, bool] | None:
        raft_log = obj._SyncObj__raftLog
        raft = (raft_log[1], raft_log[0], obj._SyncObj__otherNodes | {obj._SyncObj__selfNode})
        data = transmission(node, raft)
        if data is None and node in next_index:
            held_back.setdefault(node, next_index[node])
            next_index[node] = obj._SyncObj__getCurrentLogIndex() + 1
        return data

    def send_append_entries() -> None:
        try:
            original_send()
        finally:
            for node, value in held_back.items():
                if node in next_index:
                    next_index[node] = value
            held_back.clear()

    answered = [float("-inf")]

    def set_transmission_data(data: Any) -> bool:
        done = receive(data)
        leader = obj._getLeader()
        if not done and leader is not None and raft_clock() - answered[0] >= RECEIVING_ANSWER_S:
            answered[0] = raft_clock()
            obj._SyncObj__sendNextNodeIdx(leader, reset=False, success=False)
        return done

    transport = obj._SyncObj__transport
    transport_send = transport.send

    def send(node: Any, message: Any) -> bool:
        sent = bool(transport_send(node, message))
        if not sent and isinstance(message, dict) and message.get("serialized") is not None:
            lost(node)
        return sent

    transport.send = send
    serializer.getTransmissionData = get_transmission_data
    serializer.cancelTransmisstion = cancel
    serializer.setTransmissionData = set_transmission_data
    obj._SyncObj__sendAppendEntries = send_append_entries
    obj._SyncObj__properies.add("_SyncObj__sendAppendEntries")  # not replicated state


# -- membership -----------------------------------------------------------------------------------
def set_members(
    obj: SyncObj, voters: Iterable[str], learners: Iterable[str], retired: Iterable[str] = ()
) -> bool:
    """Make the node's cluster ``voters`` plus ``learners`` (Raft addresses; this node's own is
    skipped).  Returns whether anything changed.  Tick thread.

    pysyncobj keeps the voters in ``__otherNodes`` (majorities are counted over them) and sends
    appends to ``__otherNodes | __readonlyNodes``: a learner is put in the second, so the leader
    replicates to it and never waits for it.  (pysyncobj's own anonymous read-only nodes, which
    schedd does not use, are left alone.)  The transport connects to every voter and learner and
    accepts their connections; a node dropped from both has its copy in flight cancelled and
    is disconnected: ``retired`` ones (removed through the log) are handed to the transport's
    ``retire``, which keeps telling them they were removed; others are forgotten."""
    me = obj._SyncObj__selfNode
    others: set[Any] = obj._SyncObj__otherNodes
    readonly: set[Any] = obj._SyncObj__readonlyNodes
    learning: set[Any] = obj.__dict__.setdefault("_schedd_learners", set())
    transport = obj._SyncObj__transport
    want_voters = {a for a in voters if a != me.id}
    want_learners = {a for a in learners if a != me.id} - want_voters
    want_retired = {a for a in retired if a != me.id} - want_voters - want_learners
    known = {n.id: n for n in others | learning}
    retiring: dict[str, Any] = obj.__dict__.setdefault("_schedd_retired", {})
    retire = getattr(transport, "retire", None)
    unretire = getattr(transport, "unretire", None)
    if retire is not None:
        for addr in want_retired - set(known) - set(retiring):
            node = obj._SyncObj__nodeClass(addr)
            transport.addNode(node)
            retiring[addr] = node
            retire(node)
    if {n.id for n in others} == want_voters and {n.id for n in learning} == want_learners:
        return False
    next_index = obj._SyncObj__getCurrentLogIndex() + 1
    now = raft_clock()

    def track(node: Any) -> None:
        obj._SyncObj__raftNextIndex.setdefault(node, next_index)
        obj._SyncObj__raftMatchIndex.setdefault(node, 0)
        obj._SyncObj__lastResponseTime.setdefault(node, now)

    for addr in (want_voters | want_learners) - set(known):
        node = retiring.pop(addr, None)
        if node is not None and unretire is not None:
            unretire(node)  # added back: the transport knows it already
        else:
            node = obj._SyncObj__nodeClass(addr)
            transport.addNode(node)
        known[addr] = node
        track(node)
    for addr, node in known.items():
        if addr in want_voters:
            learning.discard(node)
            readonly.discard(node)
            others.add(node)
            track(node)
        elif addr in want_learners:
            others.discard(node)
            learning.add(node)
            readonly.add(node)
            track(node)
        else:
            others.discard(node)
            learning.discard(node)
            readonly.discard(node)
            obj._SyncObj__serializer.cancelTransmisstion(node)
            if retire is not None and addr in want_retired:
                retiring[addr] = node
                retire(node)
            else:
                transport.dropNode(node)
            obj._SyncObj__raftNextIndex.pop(node, None)
            obj._SyncObj__raftMatchIndex.pop(node, None)
            obj._SyncObj__lastResponseTime.pop(node, None)
    return True


def most_caught_up(obj: SyncObj, keep: Any = None) -> Any:
    """The voter a hand-over goes to: ``keep`` while it is still a connected voter, else the
    connected voter with the highest match index (pysyncobj's own pick), or None.  Tick
    thread.  (Picked again on every call, pysyncobj's pick moves between followers as they
    catch up, and two of them each told to take over split the vote.)"""
    connected: set[Any] = obj._SyncObj__connectedNodes
    others: set[Any] = obj._SyncObj__otherNodes
    if keep is not None and keep in others and keep in connected:
        return keep
    match = obj._SyncObj__raftMatchIndex
    candidates = [(match.get(n, 0), str(n.id), n) for n in others if n in connected]
    return max(candidates, key=lambda c: (c[0], c[1]))[2] if candidates else None


def applied_all_committed(obj: SyncObj) -> bool:
    """Whether the node applied every entry it knows committed (its commit index, or its log's
    end where a journal's commit index passed it after a crash: nothing beyond can apply).
    Any thread (a read of two counters)."""
    known = min(int(obj.raftCommitIndex), int(obj._SyncObj__getCurrentLogIndex()))
    return int(obj.raftLastApplied) >= known


def learners(obj: SyncObj) -> set[str]:
    """The learners :func:`set_members` put in (Raft addresses)."""
    return {str(n.id) for n in obj.__dict__.get("_schedd_learners", ())}


# -- construction ---------------------------------------------------------------------------------
_CREATE_JOURNAL_LOCK = threading.Lock()


@contextmanager
def swap_create_journal(factory: Callable[[str | None], Any]) -> Iterator[None]:
    """While the block runs, ``SyncObj(...)`` builds its journal with ``factory``.

    pysyncobj has no option for a journal: it calls the module-level ``createJournal``
    imported into ``pysyncobj.syncobj``, so that name is swapped for the construction only
    (one construction at a time)."""
    with _CREATE_JOURNAL_LOCK:
        original = _syncobj.createJournal
        _syncobj.createJournal = factory
        try:
            yield
        finally:
            _syncobj.createJournal = original


# -- connections ----------------------------------------------------------------------------------
def peer_address(conn: Any) -> str:
    """``host:port`` of the other end of a pysyncobj connection, or ``"?"``."""
    sock: Any = getattr(conn, CONNECTION_SOCKET, None)
    try:
        host, port = sock.getpeername()[:2]
    except (AttributeError, OSError, TypeError, ValueError):
        return "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
