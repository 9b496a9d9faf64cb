"""The Raft node: the only module that imports pysyncobj.

* One replicated entry point, ``apply_entry(bytes)``; the command codec inside is ours
  (raft-notes #2).
* Commands submitted from asyncio are batched into one entry per loop turn and their results
  bridged back into futures with ``call_soon_threadsafe`` (raft-notes #5, #13).
* The replicated state is built before the tick thread starts (a ``SyncObjConsumer``), and reads
  from the event loop take the same lock as apply (raft-notes #9, #13).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated

from schedd import clock
from schedd.aio import within
from schedd.core import commands as c
from schedd.core.apply import apply_entry
from schedd.core.state import LeaderEvent, Rejected, Result, State
from schedd.errors import ResourceExhausted, SchedError, Unavailable
from schedd.raft.journal import durable_journal

log = logging.getLogger(__name__)

MAX_COMMANDS_PER_ENTRY = 2000
MAX_PENDING = 200_000


@dataclass(frozen=True, slots=True)
class RaftSettings:
    self_addr: str
    peers: tuple[str, ...]
    data_dir: Path
    password: bytes | None = None
    append_entries_period: float = 0.02
    auto_tick_period: float = 0.01
    raft_min_timeout: float = 0.4
    raft_max_timeout: float = 1.4
    leader_fallback_timeout: float = 1.5
    log_compaction_min_entries: int = 5000
    log_compaction_min_time: float = 60.0


class Hooks:
    """Callbacks from the tick thread into asyncio (set by the runtime)."""

    def __init__(self) -> None:
        self.on_applied: Callable[[int, list[LeaderEvent]], None] = lambda i, e: None
        self.on_reset: Callable[[], None] = lambda: None
        self.on_role: Callable[[int], None] = lambda r: None


class _StateMachine(SyncObjConsumer):  # type: ignore[misc]
    def __init__(self, hooks: Hooks) -> None:
        # Attributes set before SyncObjConsumer.__init__ are not replicated.
        self.lock = threading.RLock()
        self.hooks = hooks
        super().__init__()
        self.state = State()  # replicated (pickled into snapshots)

    @replicated  # type: ignore[untyped-decorator]
    def apply_entry(self, blob: bytes) -> list[Result]:
        try:
            index = self._syncObj.raftLastApplied + 1
            with self.lock:
                results, events = apply_entry(self.state, blob, index)
            if events:
                self.hooks.on_applied(index, events)
            return results
        except Exception as exc:  # noqa: BLE001 - never let anything escape (raft-notes #1)
            log.exception("apply failed")
            return [Rejected("internal", f"apply failed: {exc}")]

    def _deserialize(self, data: dict[str, Any]) -> None:
        with self.lock:
            super()._deserialize(data)
        self.hooks.on_reset()


_FAIL_MESSAGES = {
    FAIL_REASON.QUEUE_FULL: "the Raft command queue is full",
    FAIL_REASON.MISSING_LEADER: "the cluster has no leader right now",
    FAIL_REASON.DISCARDED: "the command was discarded by a leader change",
    FAIL_REASON.NOT_LEADER: "the node forwarded to is no longer the leader",
    FAIL_REASON.LEADER_CHANGED: "the leader changed before the command was confirmed",
    FAIL_REASON.REQUEST_DENIED: "the leader denied the request",
}


class RaftNode:
    def __init__(self, settings: RaftSettings, hooks: Hooks) -> None:
        self.settings = settings
        self.hooks = hooks
        self._sm = _StateMachine(hooks)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[c.Command, asyncio.Future[Result]]] = []
        self._flush_scheduled = False
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        conf = SyncObjConf(
            journalFile=str(settings.data_dir / "raft.journal"),
            fullDumpFile=str(settings.data_dir / "raft.dump"),
            password=settings.password,
            bindAddress=settings.self_addr,
            appendEntriesUseBatch=True,
            appendEntriesPeriod=settings.append_entries_period,
            autoTickPeriod=settings.auto_tick_period,
            raftMinTimeout=settings.raft_min_timeout,
            raftMaxTimeout=settings.raft_max_timeout,
            leaderFallbackTimeout=settings.leader_fallback_timeout,
            logCompactionMinEntries=settings.log_compaction_min_entries,
            logCompactionMinTime=settings.log_compaction_min_time,
            commandsWaitLeader=False,
            commandsQueueSize=MAX_PENDING,
            onStateChanged=self._on_state_changed,
            dynamicMembershipChange=False,
        )
        # Built on the calling (main) thread, with the state machine complete (raft-notes #9, #13).
        # Durable journal (raft-notes #7): pysyncobj's createJournal is swapped for this call only,
        # and the transport syncs the journal before the node acknowledges (schedd/raft/journal.py).
        with durable_journal(snapshot_path=conf.fullDumpFile) as durable:
            self._obj = SyncObj(settings.self_addr, list(settings.peers), conf,
                                consumers=[self._sm], transportClass=durable.transport)
        self._on_tick: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._snapshot_started: float | None = None
        self.last_snapshot_duration: float | None = None
        self._obj.addOnTickCallback(self._run_on_tick)

    # -- lifecycle ---------------------------------------------------------------------------
    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def close(self) -> None:
        self._obj.destroy()

    def _on_state_changed(self, old: int, new: int) -> None:
        self.hooks.on_role(new)

    # -- reads -------------------------------------------------------------------------------
    @contextmanager
    def read(self) -> Iterator[State]:
        """Consistent local read of the applied state (may lag the leader on a follower)."""
        with self._sm.lock:
            yield self._sm.state

    def status(self) -> dict[str, Any]:
        return dict(self._obj.getStatus())

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

    def _time_snapshot(self) -> None:
        """Time pysyncobj's snapshot writes (a forked child while its pid is set): the only way
        to see them is its serializer's private pid, read here on the tick thread."""
        serializer = getattr(self._obj, "_SyncObj__serializer", None)
        busy = getattr(serializer, "_Serializer__pid", 0) not in (0, -1, -2)
        if busy and self._snapshot_started is None:
            self._snapshot_started = clock.mono()
        elif not busy and self._snapshot_started is not None:
            self.last_snapshot_duration = clock.mono() - self._snapshot_started
            self._snapshot_started = None

    def snapshot_age(self) -> float | None:
        """Seconds since the snapshot (full dump) file was last written, if there is one."""
        try:
            mtime = (self.settings.data_dir / "raft.dump").stat().st_mtime
        except OSError:
            return None
        return max(0.0, clock.wall_ms() / 1000 - mtime)

    def is_ready(self) -> bool:
        return bool(self._obj.isReady())

    def transfer_leadership(self) -> None:
        """Ask the most caught-up follower to take over (Raft TimeoutNow).  pysyncobj is not
        thread-safe, so the request runs on the tick thread."""
        self._on_tick.put(self._obj.transferLeadership)

    def _run_on_tick(self) -> None:  # tick thread
        self._time_snapshot()
        while True:
            try:
                action = self._on_tick.get_nowait()
            except queue.Empty:
                return
            try:
                action()
            except Exception:  # noqa: BLE001 - never break the tick thread
                log.exception("tick action failed")

    # -- writes ------------------------------------------------------------------------------
    def submit_nowait(self, cmd: c.Command) -> asyncio.Future[Result]:
        """Queue ``cmd`` for the next entry; the future resolves with its result once applied."""
        loop = self._loop
        assert loop is not None, "RaftNode.attach(loop) first"
        fut: asyncio.Future[Result] = loop.create_future()
        if len(self._pending) >= MAX_PENDING:
            fut.set_exception(ResourceExhausted("too many commands waiting for Raft", retry_after=1))
            return fut
        self._pending.append((cmd, fut))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return fut

    async def submit(self, cmd: c.Command, timeout: float = 5.0) -> Result:
        fut = self.submit_nowait(cmd)
        try:
            return await within(fut, timeout)
        except TimeoutError:
            raise Unavailable(
                f"no commit within {timeout:.1f}s (the cluster may be electing a leader)",
                retry_after=1,
            ) from None

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), MAX_COMMANDS_PER_ENTRY):
            chunk = pending[start : start + MAX_COMMANDS_PER_ENTRY]
            blob = c.encode_entry([cmd for cmd, _ in chunk])
            futures = [fut for _, fut in chunk]
            self._sm.apply_entry(blob, callback=self._make_callback(futures))

    def _make_callback(self, futures: list[asyncio.Future[Result]]) -> Callable[[Any, int], None]:
        loop = self._loop
        assert loop is not None

        def callback(res: Any, err: int) -> None:  # runs on the tick thread
            loop.call_soon_threadsafe(_resolve, futures, res, err)

        return callback


def _resolve(futures: list[asyncio.Future[Result]], res: Any, err: int) -> None:
    if err == FAIL_REASON.SUCCESS and isinstance(res, list) and len(res) == len(futures):
        for fut, r in zip(futures, res, strict=True):
            if not fut.done():
                fut.set_result(r)
        return
    if err == FAIL_REASON.SUCCESS:
        error: SchedError = Unavailable("the entry was applied but its results were lost",
                                        retry_after=1)
    elif err == FAIL_REASON.QUEUE_FULL:
        error = ResourceExhausted(_FAIL_MESSAGES[err], retry_after=1)
    else:
        error = Unavailable(_FAIL_MESSAGES.get(err, f"raft failure {err}"), retry_after=1)
    for fut in futures:
        if not fut.done():
            fut.set_exception(error)
