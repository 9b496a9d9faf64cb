"""pysyncobj's log compaction over the node's SQLite database, without a fork and without a stop.

pysyncobj 0.3.17 takes a custom asynchronous serializer (``SyncObjConf(serializer=,
deserializer=, serializeChecker=)``, docs/pysyncobj.md #20).  With one it never forks and never
pickles the state (its own data argument is None); it calls:

``serializer(tmpFile, raftData)``
    on the tick thread, right after an apply, when it wants to compact.  The state database is
    committed up to the last applied entry first, so a read transaction opened then is pinned at
    that entry (:func:`schedd.storage.snapshots.pin`, milliseconds); the copy is written by a
    thread into its own temporary file, synced and renamed over ``fullDumpFile`` when
    complete.  pysyncobj renames ``tmpFile`` as soon as this returns: nothing is written there
    (the rename fails, pysyncobj ignores that, and the checker's answer is what counts).
``serializeChecker()``
    SERIALIZING while the copy runs, then SUCCESS (or FAILED) once: only after SUCCESS does
    pysyncobj drop the journal up to the snapshot, so a node killed during a copy restarts from
    the previous snapshot and the whole journal.
``deserializer(fileName)``
    at start, when there is a snapshot file: the live database is kept when it already holds
    the snapshot's entries (the journal after the snapshot is then replayed, and what the
    database already holds is skipped by its applied index), else it is replaced by a copy of
    the snapshot.  When the node runs, the file is a snapshot just received from the leader
    (this node fell behind): it always replaces the live content, and the leader-side indexes
    are rebuilt (``Hooks.on_reset``).  Returns pysyncobj's Raft data stored in the snapshot.

A snapshot the node cannot use (damaged, or written by a newer schedd) stops the node with a
message that says what to do, rather than let pysyncobj log the error and go on without it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pysyncobj.config import SERIALIZER_STATE

from schedd import clock
from schedd.logs import log_event
from schedd.storage.snapshots import CopyThread, SnapshotError, read_snapshot
from schedd.storage.sqlstate import SqlState, StorageFailure

log = logging.getLogger(__name__)


class Machine(Protocol):
    """What the snapshots need of the node's state machine."""

    lock: threading.RLock
    state: SqlState

    def commit_now(self) -> None:
        """Commit the entries applied so far."""


class SqlSnapshots:
    def __init__(
        self,
        machine: Machine,
        live: Path,
        dump: Path,
        on_replaced: Callable[[], None],
        on_fatal: Callable[[str], None],
    ) -> None:
        self.machine = machine
        self.live = live
        self.dump = dump
        self.on_replaced = on_replaced
        self.on_fatal = on_fatal
        #: set once the node has started (pysyncobj loads the snapshot file, if any, on its
        #: first tick): from then on every snapshot handed to the deserializer is installed
        self.running = False
        self._status = SERIALIZER_STATE.NOT_SERIALIZING
        self._copy: CopyThread | None = None
        self._started: float | None = None
        self.last_duration: float | None = None
        self.last_index: int | None = None
        #: called at start with the loaded snapshot's entry before last and last entry: the
        #: journal drops the records the snapshot holds if a stop left them there
        self.on_loaded: Callable[[Any, Any], object] | None = None

    # -- pysyncobj's hooks (tick thread) ----------------------------------------------------
    def serialize(self, tmp_file: str, raft_data: Any) -> None:
        copy = CopyThread()
        self._started = clock.mono()
        self.machine.commit_now()  # the copy is pinned at the last applied entry
        self._status = SERIALIZER_STATE.SERIALIZING
        try:
            copy.start(self.live, self.dump, raft_data, self._copied)
        except Exception as exc:  # noqa: BLE001 - a failed snapshot is retried later
            self._status = SERIALIZER_STATE.FAILED
            log_event(
                log, "raft.snapshot_failed", logging.ERROR, path=str(self.dump), error=str(exc)
            )
            return
        self._copy = copy

    def _copied(self, copy: CopyThread) -> None:  # the copy's thread
        duration = clock.mono() - (self._started or clock.mono())
        if copy.error is not None:
            log_event(
                log,
                "raft.snapshot_failed",
                logging.ERROR,
                path=str(self.dump),
                error=str(copy.error),
            )
            self._status = SERIALIZER_STATE.FAILED
            return
        self.last_duration, self.last_index = duration, copy.pinned
        log_event(
            log,
            "raft.snapshot_written",
            path=str(self.dump),
            applied_index=copy.pinned,
            seconds=round(duration, 3),
        )
        self._status = SERIALIZER_STATE.SUCCESS

    def check(self) -> int:
        status = self._status
        if status in (SERIALIZER_STATE.SUCCESS, SERIALIZER_STATE.FAILED):
            self._status = SERIALIZER_STATE.NOT_SERIALIZING
            self._copy = None
            self._started = None
        return int(status)

    def busy_for(self) -> float | None:
        """Seconds the snapshot being written has taken so far (None: none is)."""
        started = self._started
        return None if started is None else clock.mono() - started

    def deserialize(self, file_name: str) -> tuple[Any, ...]:
        path = Path(file_name)
        try:
            info = read_snapshot(path)
        except SnapshotError as exc:
            self.on_fatal(str(exc))
            raise
        replaced = False
        with self.machine.lock:
            held = self.machine.state.applied_index
            if self.running or held < info.applied_index:
                log_event(
                    log,
                    "raft.snapshot_install",
                    path=str(path),
                    live=str(self.live),
                    snapshot_index=info.applied_index,
                    live_index=held,
                    reason="received from the leader"
                    if self.running
                    else "the live database is older than the snapshot",
                )
                try:
                    self.machine.state.install(path)
                except StorageFailure as exc:
                    self.on_fatal(str(exc))
                    raise
                replaced = True
        if replaced:
            self.on_replaced()
        if not self.running and self.on_loaded is not None:
            last, prev, _ = info.raft
            try:
                self.on_loaded(prev, last)
            except Exception as exc:  # pysyncobj would log it and go on without the snapshot
                self.on_fatal(f"{path}: dropping the journal's head the snapshot holds: {exc}")
                raise
        return info.raft
