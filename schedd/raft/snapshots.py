"""pysyncobj's log compaction over the node's SQLite database: a barrier, not a copy; and a
whole copy streamed to a follower only when it needs one.

pysyncobj 0.3.17 takes a custom asynchronous serializer (``SyncObjConf(serializer=,
deserializer=, serializeChecker=)``, docs/pysyncobj.md #20).  With one it never forks and never
pickles the state; it calls:

``serializer(tmpFile, raftData)``
    on the tick thread, when it compacts the log up to an entry C (``raftData`` is entry C,
    the entry before it and the cluster).  The database already holds C: every entry commits
    with its index.  What is done here is the durability barrier: the open transaction is
    committed, and a thread syncs the database's write-ahead log and then writes the marker
    (:func:`schedd.storage.snapshots.write_marker`: C's Raft data, the database's applied index,
    the schema) over ``fullDumpFile``.  Milliseconds, whatever the size of the state.
    pysyncobj renames ``tmpFile`` as soon as this returns: nothing is written there (the rename
    fails, pysyncobj ignores that, and the checker's answer is what counts).
``serializeChecker()``
    SERIALIZING while the barrier runs, then SUCCESS (or FAILED) once: only after SUCCESS does
    pysyncobj drop the journal up to C, so a node that stops before keeps the whole journal.
``deserializer(fileName)``
    at start: the marker (or a whole copy written by an older schedd, installed if the live
    database is older).  The live database must hold the marker's entry: the journal after it
    is replayed, and what the database already holds is skipped by its applied index.  When the
    node runs, the file is the marker written for a copy just received (below).

Sending a whole copy (the leader, :meth:`SqlSnapshots.transmission`): pysyncobj asks for the
next piece of "the snapshot" whenever a follower's next index is at or before the start of its
log.  The first ask pins a read transaction on the database (:class:`ImageSource`) and streams
the image from it, paced at ``rate`` bytes a second, with the Raft data of the log's start;
nothing is written on the leader.  Compaction is held while a copy is in flight
(:meth:`holding`); a copy whose log start moved anyway (the log reached its size cap) starts
again with the new one, so the follower never gets a copy that does not match the log the
leader goes on with.  A copy nobody asks for any more (the follower went away, this node no
longer leads) is dropped (:meth:`sweep`).

Receiving it (a follower, :meth:`SqlSnapshots.receive`): the image is written beside the live
database, checked, made one file, and renamed over the live one (see
:mod:`schedd.storage.snapshots`); the marker is written for the copy's Raft data, and the state
is reopened.  A copy newer than its Raft data is fine: the entries after it that the database
already holds are skipped when they come.

A snapshot the node cannot use (damaged, written by a newer schedd, or a database older than
its marker) stops the node with a message that says what to do, rather than let pysyncobj log
the error and go on without it.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pysyncobj.config import SERIALIZER_STATE

from schedd import clock
from schedd.logs import log_event
from schedd.storage import snapshots as store
from schedd.storage.snapshots import (
    CopySink,
    ImageSink,
    ImageSource,
    Marker,
    SnapshotError,
    read_snapshot,
)
from schedd.storage.sqlstate import SqlState, StorageFailure

log = logging.getLogger(__name__)

#: a copy nobody asked for more of for this long is dropped (its read transaction let go)
IDLE_TRANSFER_S = 15.0


class Machine(Protocol):
    """What the snapshots need of the node's state machine."""

    lock: threading.RLock
    state: SqlState

    def commit_now(self) -> None:
        """Commit the entries applied so far."""


@dataclass
class _Outgoing:
    """A copy being sent to one follower (tick thread)."""

    source: ImageSource
    raft_index: int  # the index of the Raft data it carries (the log's start when it began)
    started: float
    polled: float
    first: bool = True


class SqlSnapshots:
    def __init__(
        self,
        machine: Machine,
        live: Path,
        dump: Path,
        on_replaced: Callable[[], None],
        on_fatal: Callable[[str], None],
        *,
        rate: float = 32 << 20,
        node: str = "",
    ) -> None:
        self.machine = machine
        self.live = live
        self.dump = dump
        self.on_replaced = on_replaced
        self.on_fatal = on_fatal
        self.rate = rate
        self.node = node
        #: set once the node has started (pysyncobj loads the snapshot file, if any, on its
        #: first tick): from then on a snapshot handed to the deserializer was just received
        self.running = False
        self._status = SERIALIZER_STATE.NOT_SERIALIZING
        self._barrier: threading.Thread | None = None
        self._started: float | None = None
        self.last_duration: float | None = None
        self.last_index: int | None = None
        #: called at start with the loaded snapshot's entry before last and last entry: the
        #: journal drops the records the snapshot holds if a stop left them there
        self.on_loaded: Callable[[Any, Any], object] | None = None
        #: the journal's entry at an index (None: it does not hold it): the marker's long
        #: commands are taken back from there at start
        self.entry_at: Callable[[int], Any] = lambda index: None
        self._received_raft: Any = None  # the Raft data of the copy just installed, whole
        # shipping (tick thread)
        self._outgoing: dict[Any, _Outgoing] = {}
        self._incoming: ImageSink | CopySink | None = None
        self._incoming_from: float = 0.0
        self._received = False
        #: copies sent and received since the process started, by outcome
        self.sent: dict[str, int] = {"completed": 0, "restarted": 0, "dropped": 0, "failed": 0}
        self.received: dict[str, int] = {"installed": 0, "failed": 0}
        self.bytes_sent = 0
        self.bytes_received = 0

    # -- compaction: the barrier (pysyncobj's hooks, tick thread) ------------------------------
    def serialize(self, tmp_file: str, raft_data: Any) -> None:
        started = clock.mono()
        with self.machine.lock:
            self.machine.commit_now()  # the marker vouches for what is committed
            applied = self.machine.state.applied_index
        marker = Marker(store.raft_from_json(store.raft_json(raft_data)), applied)
        self._started = started
        self._status = SERIALIZER_STATE.SERIALIZING
        thread = threading.Thread(
            target=self._write_barrier, args=(marker,), name="schedd-compaction", daemon=True
        )
        self._barrier = thread
        thread.start()

    def _write_barrier(self, marker: Marker) -> None:  # its own thread
        try:
            wal = Path(f"{self.live}-wal")
            try:
                store.fsync_path(wal)
            except FileNotFoundError:
                pass  # everything is in the database file, synced by the last checkpoint
            store.write_marker(self.dump, marker)
        except OSError as exc:
            log_event(
                log, "raft.snapshot_failed", logging.ERROR, path=str(self.dump), error=str(exc)
            )
            self._status = SERIALIZER_STATE.FAILED
            return
        duration = clock.mono() - (self._started or clock.mono())
        self.last_duration, self.last_index = duration, marker.index
        log_event(
            log,
            "raft.snapshot_written",
            logging.DEBUG,
            path=str(self.dump),
            index=marker.index,
            applied_index=marker.applied_index,
            seconds=round(duration, 4),
        )
        self._status = SERIALIZER_STATE.SUCCESS

    def check(self) -> int:
        status = self._status
        if status in (SERIALIZER_STATE.SUCCESS, SERIALIZER_STATE.FAILED):
            self._status = SERIALIZER_STATE.NOT_SERIALIZING
            self._barrier = None
            self._started = None
        return int(status)

    def busy_for(self) -> float | None:
        """Seconds the barrier being written has taken so far (None: none is)."""
        started = self._started
        return None if started is None else clock.mono() - started

    def wait_barrier(self, timeout: float | None = None) -> bool:
        """Wait for a running barrier's thread (tests, shutdown); True if none runs now."""
        thread = self._barrier
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    # -- start, and a copy just received --------------------------------------------------------
    def deserialize(self, file_name: str) -> tuple[Any, ...]:
        path = Path(file_name)
        try:
            info = read_snapshot(path)
        except SnapshotError as exc:
            self.on_fatal(str(exc))
            raise
        received, self._received = self._received, False
        raft = info.raft
        if received and self._received_raft is not None:
            raft, self._received_raft = self._received_raft, None  # whole, from the leader
        elif info.marker is not None:
            whole = store.resolve_marker(info.marker, self.entry_at)
            if whole is None:
                message = (
                    f"{path}: the Raft journal does not hold the entries the snapshot marker "
                    f"names ({info.raft[1][1]} and {info.raft[0][1]}): the journal was lost or "
                    "replaced. Move this node's data directory (and raft.journal_dir) away to "
                    "rebuild it from the cluster."
                )
                self.on_fatal(message)
                raise SnapshotError(message)
            raft = whole
        if info.copy:
            self._install_copy(path, info.applied_index)
        else:
            with self.machine.lock:
                held = self.machine.state.applied_index
            last_index = info.raft[0][1]
            if held < last_index:
                message = (
                    f"{self.live}: the state database holds the entries up to {held}, but the "
                    f"snapshot marker {path} says the log was compacted up to {last_index}: "
                    "the entries in between are in neither (the database was replaced by an "
                    "older copy, or lost its last writes on a disk that does not keep synced "
                    "data). Move this node's data directory away to rebuild it from the "
                    "cluster, or restore a backup (docs/operations.md)."
                )
                self.on_fatal(message)
                raise SnapshotError(message)
        if received:
            self.on_replaced()
        if not self.running and self.on_loaded is not None:
            last, prev, _ = raft
            try:
                self.on_loaded(prev, last)
            except Exception as exc:  # pysyncobj would log it and go on without the snapshot
                self.on_fatal(f"{path}: dropping the journal's head the snapshot holds: {exc}")
                raise
        return tuple(raft)

    def _install_copy(self, path: Path, index: int) -> None:
        """A format-1 snapshot (a whole copy, from an older schedd): installed when the live
        database is older than it, or when the node runs (it came from a leader)."""
        replaced = False
        with self.machine.lock:
            held = self.machine.state.applied_index
            if self.running or held < index:
                log_event(
                    log,
                    "raft.snapshot_install",
                    path=str(path),
                    live=str(self.live),
                    snapshot_index=index,
                    live_index=held,
                    reason="a whole copy written by an older schedd",
                )
                try:
                    self.machine.state.install(path)
                except StorageFailure as exc:
                    self.on_fatal(str(exc))
                    raise
                replaced = True
        if replaced:
            self.on_replaced()

    # -- sending a copy (the leader, tick thread) -----------------------------------------------
    def holding(self) -> bool:
        """Whether compaction waits: a copy is being sent."""
        return bool(self._outgoing)

    def transmission(self, peer: Any, raft: Any) -> tuple[bytes, bool, bool] | None:
        """The next piece of the copy for ``peer`` (pysyncobj's ``getTransmissionData``), with
        ``raft`` the Raft data of the log's start now: None when none may go yet (the pace,
        the reader, a barrier being written)."""
        now = clock.mono()
        out = self._outgoing.get(peer)
        index = int(raft[0][1])
        if out is not None and out.raft_index != index:
            self._close(peer, "restarted", reason="the log was compacted while it was sent")
            out = None
        if out is None:
            if self._status == SERIALIZER_STATE.SERIALIZING:
                return None  # the log's start is about to move: begin once it has
            out = self._open(peer, raft, now)
            if out is None:
                return None
        out.polled = now
        try:
            block = out.source.take()
        except SnapshotError as exc:
            self._close(peer, "failed", reason=str(exc), level=logging.WARNING)
            return None
        if block is None:
            if out.source.done:
                self._close(peer, "completed")
                return b"", False, True
            return None
        self.bytes_sent += len(block)
        first, out.first = out.first, False
        return block, first, False

    def _open(self, peer: Any, raft: Any, now: float) -> _Outgoing | None:
        try:
            with self.machine.lock:
                self.machine.commit_now()
                source = ImageSource(
                    self.live, rate=self.rate, raft=raft, term=int(raft[0][2]), node=self.node
                )
        except (OSError, SnapshotError, StorageFailure, Exception) as exc:  # noqa: BLE001
            log_event(
                log, "raft.snapshot_send_failed", logging.WARNING, peer=str(peer), error=str(exc)
            )
            self.sent["failed"] += 1
            return None
        out = _Outgoing(source, int(raft[0][1]), now, now)
        self._outgoing[peer] = out
        h = source.header
        log_event(
            log,
            "raft.snapshot_send",
            peer=str(getattr(peer, "id", peer)),
            index=out.raft_index,
            applied_index=h.applied_index,
            bytes=h.db_bytes + h.wal_bytes,
            rate=int(self.rate),
        )
        return out

    def _close(self, peer: Any, outcome: str, reason: str = "", level: int = logging.INFO) -> None:
        out = self._outgoing.pop(peer, None)
        if out is None:
            return
        out.source.close()
        self.sent[outcome] = self.sent.get(outcome, 0) + 1
        log_event(
            log,
            "raft.snapshot_sent" if outcome == "completed" else "raft.snapshot_send_stopped",
            level,
            peer=str(getattr(peer, "id", peer)),
            outcome=outcome,
            bytes=out.source.total,
            seconds=round(clock.mono() - out.started, 3),
            **({"reason": reason} if reason else {}),
        )

    def lost(self, peer: Any) -> None:
        """A piece of the copy to ``peer`` could not be sent (the connection is being
        replaced): the copy starts again from its first piece."""
        if peer in self._outgoing:
            self._close(peer, "restarted", reason="a piece could not be sent")

    def cancel(self, peer: Any) -> None:
        """The follower is not connected (pysyncobj's ``cancelTransmisstion``)."""
        if peer in self._outgoing:
            self._close(peer, "dropped", reason="the follower is not connected")

    def sweep(self, leading: bool) -> None:
        """Drop the copies nobody asks for (tick thread, every tick)."""
        if not self._outgoing:
            return
        now = clock.mono()
        for peer, out in list(self._outgoing.items()):
            if not leading:
                self._close(peer, "dropped", reason="this node no longer leads")
            elif now - out.polled > IDLE_TRANSFER_S:
                self._close(peer, "dropped", reason="not asked for")

    def close(self) -> None:
        for peer in list(self._outgoing):
            self._close(peer, "dropped", reason="the node is stopping")
        if self._incoming is not None:
            self._incoming.abort()
            self._incoming = None

    def sending(self) -> dict[str, tuple[int, int]]:
        """The copies in flight: peer -> (bytes sent, bytes in all)."""
        out = {}
        for peer, o in self._outgoing.items():
            h = o.source.header
            out[str(getattr(peer, "id", peer))] = (o.source.total, h.db_bytes + h.wal_bytes)
        return out

    # -- receiving a copy (a follower, tick thread) ---------------------------------------------
    @property
    def incoming_path(self) -> Path:
        return Path(f"{self.live}{store.INCOMING}")

    def receive(self, data: Any) -> bool:
        """The next piece of a copy from the leader (pysyncobj's ``setTransmissionData``); True
        once the whole copy is installed (pysyncobj then loads the marker written for it)."""
        if data is None:
            return False
        chunk, first, last = data
        if first:
            if self._incoming is not None:
                self._incoming.abort()
            legacy = bytes(chunk[:16]) == b"SQLite format 3\0"  # from a leader of an older
            self._incoming = (CopySink if legacy else ImageSink)(self.incoming_path)  # schedd
            self._incoming_from = clock.mono()
            log_event(
                log,
                "raft.snapshot_receive",
                logging.INFO,
                path=str(self.incoming_path),
                format="a whole copy from an older leader" if legacy else "image",
            )
        sink = self._incoming
        if sink is None:
            return False  # the middle of a copy this node did not see begin: wait for the next
        try:
            if chunk:
                self.bytes_received += len(chunk)
                sink.feed(bytes(chunk))
            if not last:
                return False
            self._incoming = None
            if isinstance(sink, CopySink):
                raft = sink.finish().raft
            elif not sink.complete:
                raise SnapshotError(f"{self.incoming_path}: the copy ended early")
            else:
                assert sink.header is not None
                if sink.header.raft is None:
                    raise SnapshotError(f"{self.incoming_path}: a copy without Raft data")
                raft = sink.header.raft
            self._install(raft, sink.received)
        except (SnapshotError, OSError) as exc:
            self._incoming = None
            sink.abort()
            self.received["failed"] += 1
            log_event(
                log,
                "raft.snapshot_receive_failed",
                logging.WARNING,
                path=str(self.incoming_path),
                error=str(exc),
            )
            return False
        return True

    def _install(self, raft: Any, received: int) -> None:
        applied = store.finalize_incoming(self.incoming_path)
        index = raft[0][1]
        if applied < index:
            raise SnapshotError(
                f"{self.incoming_path}: the copy holds the entries up to {applied}, older than "
                f"its Raft data ({index})"
            )
        store.decide_install(self.incoming_path, self.live)
        store.write_marker(self.dump, Marker(raft, applied))
        self._received_raft = raft
        with self.machine.lock:
            held = self.machine.state.applied_index
            try:
                self.machine.state.reopen(lambda: store.finish_install(self.live))
            except StorageFailure as exc:
                self.on_fatal(str(exc))
                raise
        self._received = True
        self.received["installed"] += 1
        log_event(
            log,
            "raft.snapshot_install",
            path=str(self.live),
            snapshot_index=index,
            applied_index=applied,
            live_index=held,
            bytes=received,
            seconds=round(clock.mono() - self._incoming_from, 3),
            reason="received from the leader",
        )


def prepare(live: Path) -> bool:
    """Before the node opens its database: finish an install a stop interrupted, and drop a
    copy that was still coming in.  True if an install was finished."""
    done = store.finish_install(live)
    if done:
        log_event(log, "raft.snapshot_install_finished", path=str(live))
    store.clear_incoming(live)
    return done


#: pysyncobj's no-op command (``_COMMAND_TYPE.NO_OP``): the entries a restored log starts with
NO_OP = b"\x01"
JOURNAL_FILE = "raft.journal"


def restore_data_dir(
    image: Path, raft_dir: Path, journal_dir: Path | None, cluster: list[str]
) -> store.ImageFile:
    """Seed an empty node for a new cluster from a backup image (``schedd restore``).

    The image is checked whole and its database written and made one file; the node's Raft log
    then starts at the image's applied index P: a marker for entries P - 1 and P of term 0 (the
    same on every node restored from the same file, so their logs match), an empty journal
    whose commit index is P, and the database holding every entry up to P.  All of it is built
    in a directory beside ``raft_dir`` and renamed into place at the end, so a restore that
    stops half-way leaves no node that could start from half a state.  Refuses a ``raft_dir``
    (or journal) that holds a node's state already."""
    from schedd.raft.journal import RaftState, encode_header

    journal_home = journal_dir if journal_dir is not None else raft_dir
    held = [
        str(p)
        for p in (
            raft_dir / "state.db",
            raft_dir / "raft.dump",
            journal_home / JOURNAL_FILE,
            journal_home / f"{JOURNAL_FILE}.state",
        )
        if p.exists()
    ]
    if held:
        raise SnapshotError(
            f"{raft_dir}: this node already holds a state ({', '.join(held)}): a restore seeds "
            "the empty data directory of a node of a new cluster. Stop the node and move its "
            "data directory (and raft.journal_dir, if set) away first."
        )
    if raft_dir.exists() and any(raft_dir.iterdir()):
        raise SnapshotError(f"{raft_dir}: not empty; move what it holds away first")
    staging = raft_dir.with_name(f"{raft_dir.name}.restoring")
    shutil.rmtree(staging, ignore_errors=True)
    journal_target = staging if journal_dir is None else journal_dir
    journal = journal_target / JOURNAL_FILE
    pending = [Path(f"{journal}.restoring"), Path(f"{journal}.state.restoring")]
    try:
        staging.mkdir(parents=True)
        live = staging / "state.db"
        incoming = Path(f"{live}{store.INCOMING}")
        checked = store.verify_image(image, incoming)
        applied = store.finalize_incoming(incoming)
        if applied < 2:
            raise SnapshotError(f"{image}: an image of an empty state (applied index {applied})")
        # a new cluster: its members are its nodes' raft.peers, not the backed-up cluster's;
        # and the shards' images were taken at different moments, so slots of a concurrency
        # cap moved between two of them could count twice: each starts from its share again
        store.write_meta(incoming, {"members": None, "caps": None})
        os.replace(incoming, live)
        os.chmod(live, 0o600)  # every payload is in it
        raft = ((NO_OP, applied, 0), (NO_OP, applied - 1, 0), sorted(cluster))
        store.write_marker(staging / "raft.dump", Marker(raft, applied))
        # an empty journal whose commit index is P, under names the node does not read until
        # the state is in place
        journal_target.mkdir(parents=True, exist_ok=True)
        store.atomic_write(pending[0], encode_header())
        store.atomic_write(pending[1], RaftState(commit_index=applied).encode())
        if raft_dir.exists():
            raft_dir.rmdir()
        os.replace(staging, raft_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for path in pending:
            path.unlink(missing_ok=True)
        raise
    home = raft_dir if journal_dir is None else journal_dir  # where the journal is read
    os.replace(home / pending[0].name, home / JOURNAL_FILE)
    os.replace(home / pending[1].name, home / f"{JOURNAL_FILE}.state")
    store.fsync_path(home, directory=True)
    store.fsync_path(raft_dir.parent, directory=True)
    log_event(
        log,
        "raft.restored",
        logging.WARNING,
        path=str(raft_dir),
        image=str(image),
        applied_index=applied,
        jobs=checked.header.counts.get("jobs"),
    )
    return checked
