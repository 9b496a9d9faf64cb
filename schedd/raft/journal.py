"""A durable, checksummed Raft journal for pysyncobj (docs/pysyncobj.md #7).

pysyncobj's ``FileJournal`` is an mmap flushed only on ``destroy()``: no fsync, no checksum; a
torn tail made a node unable to start and a flipped byte went undetected. This journal keeps
the same in-memory list of ``(command, index, term)`` entries (so ``journal[i]`` and slices
stay O(1) list operations) and stores them in two files:

``<journalFile>``
    A 16-byte header ``"SCHDJRNL" | version:u16 | flags:u16 | crc32(previous 12 bytes):u32``,
    then append-only records ``length:u32 | crc:u32 | index:u64 | term:u64 | command`` where
    ``length`` counts index, term and command and ``crc = crc32(length bytes || index || term ||
    command)``. All integers little-endian. Version 1.
``<journalFile>.state``
    ``"SCHDSTAT" | version:u16 | flags:u16 | length:u32 | crc32(payload):u32`` then a JSON
    payload ``{"commit_index", "term", "voted_for"[, "abstain_until"]}``; replaced atomically
    (temp file, fsync, rename, fsync of the directory).

Durability (where, and why that is enough)
    ``add()`` only appends to memory; ``sync()`` writes what is pending and ``fdatasync``\\ s it.
    ``sync()`` runs, when anything is pending, (1) in :class:`DurableTransport` before an
    ``append_entries`` or ``next_node_idx`` message leaves the node: ``next_node_idx`` is a
    follower's acknowledgement, which the leader turns into its match index, and pysyncobj
    sends it right after the ``add()`` calls for one message; (2) in ``setRaftCommitIndex``
    when the commit index passes the last synced entry: that is where a leader that counted
    itself towards the majority (or a one-node cluster) commits, before anything is applied or
    answered; (3) before the state file is written (a stored commit index never points past
    the durable log), before truncation, compaction and close. So a follower syncs once per
    ``append_entries`` message and a leader once per append-entries round, whatever the
    number of entries: group commit.

Recovery
    At open, records are read in order and each one's length, checksum and position (index =
    previous + 1, term never decreasing) is checked. At the first bad one the file is cut
    there (the cut bytes are kept in ``<journalFile>.dropped.<time>`` for forensics), a
    ``raft.journal_truncated`` event says where and how much, and the node starts with the
    intact prefix: Raft repairs a follower's log from the leader. That is safe for a torn tail
    (nothing after the last sync was ever acknowledged) and, for damage in synced data, only
    because a committed entry is on a majority of nodes -- and only if this node does not help
    elect a leader that lacks what it lost (possible when the other copy's holder is down or
    lagging). So when the stored commit index proves acknowledged entries were cut (or the
    state file is damaged too, so nothing proves they were not), the node abstains
    (:meth:`DurableJournal.may_vote`: no vote grants, a candidate log nobody accepts) until its
    synced log is back past what it had; a torn tail after a power loss never triggers this,
    so a cluster that lost power everywhere still elects a leader. A journal
    in pysyncobj's FileJournal format is imported once (kept as ``<journalFile>.pysyncobj.bak``).
    I/O errors on write or sync are fail-stop (:func:`exit_process`).

Compaction (``deleteEntriesTo``) never stops the Raft tick thread for the file's size.  It drops
the head from memory at once; a background thread then makes the snapshot (``fullDumpFile``)
that replaces the head durable (pysyncobj writes that file with a rename but no fsync), copies
the kept records written so far into ``<journalFile>.compact`` and syncs it.  The tick thread
finishes the job at its next ``sync()`` (or its one-second timer): it appends what was written
since the copy started, syncs, renames the copy over the journal and syncs the directory --
work proportional to the records added meanwhile, not to the journal.  A truncation into the
copied records (a new leader overwriting this node's tail, a snapshot installed) cancels the
copy, and a compaction starts again at the next one.  Until the rename the file still holds
the dropped head: a node that stops then finds records the snapshot already holds, and
:meth:`DurableJournal.skip_to` (called with the snapshot's last two entries when the node
loads it at start) drops them again, so pysyncobj does not mistake that journal for another
log and discard it.  A leftover ``.compact`` file is removed at open.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Final

from pysyncobj.journal import Journal, MemoryJournal
from pysyncobj.pickle import loads as _legacy_loads
from pysyncobj.pickle import to_bytes
from pysyncobj.transport import TCPTransport

from schedd.logs import log_event
from schedd.raft.patches import swap_create_journal
from schedd.storage.space import free_space

log = logging.getLogger(__name__)

Entry = tuple[bytes, int, int]  # (command, index, term), as pysyncobj stores them

MAGIC: Final = b"SCHDJRNL"
VERSION: Final = 1
_HEAD: Final = struct.Struct("<8sHH")
HEADER_SIZE: Final = _HEAD.size + 4
_U32: Final = struct.Struct("<I")
_REC: Final = struct.Struct("<II")  # payload length, crc
_ENTRY: Final = struct.Struct("<QQ")  # index, term
MAX_PAYLOAD: Final = 1 << 30

STATE_MAGIC: Final = b"SCHDSTAT"
STATE_VERSION: Final = 1
_STATE_HEAD: Final = struct.Struct("<8sHHII")  # magic, version, flags, length, crc(payload)
UNKNOWN_VOTE: Final = "<unknown: state file damaged>"

_LEGACY_MAGIC: Final = b"PYSYNCOBJ"
_LEGACY_FIRST: Final = 40  # name(24) + version(8) + format(4) + last record offset(4)

# Messages whose meaning depends on the local log being on stable storage.
SYNC_BEFORE: Final = frozenset({"append_entries", "next_node_idx"})
_VOTES: Final = frozenset({"request_vote", "response_vote"})

_fdatasync = getattr(os, "fdatasync", os.fsync)


class JournalError(Exception):
    """The journal cannot be used (written by a newer version, or its disk failed)."""


# -- format ------------------------------------------------------------------------------------
def encode_header(version: int = VERSION) -> bytes:
    head = _HEAD.pack(MAGIC, version, 0)
    return head + _U32.pack(zlib.crc32(head))


def encode_record(command: bytes, idx: int, term: int) -> bytes:
    payload = _ENTRY.pack(idx, term) + command
    length = _U32.pack(len(payload))
    return length + _U32.pack(zlib.crc32(payload, zlib.crc32(length))) + payload


def _read_record(buf: memoryview, off: int) -> tuple[Entry, int] | str:
    """The record at ``off`` and where it ends, or why it cannot be trusted."""
    if len(buf) - off < _REC.size:
        return "torn record header"
    length, crc = _REC.unpack_from(buf, off)
    if length < _ENTRY.size or length > MAX_PAYLOAD:
        return f"impossible record length {length}"
    end = off + _REC.size + length
    if end > len(buf):
        return "torn record (runs past the end of the file)"
    payload = buf[off + _REC.size : end]
    if zlib.crc32(payload, zlib.crc32(buf[off : off + 4])) != crc:
        return "checksum mismatch"
    idx, term = _ENTRY.unpack_from(payload)
    return (bytes(payload[_ENTRY.size :]), idx, term), end


def _count_records(buf: memoryview, off: int) -> int:
    """How many records follow ``off`` by their length fields (best effort, for the log)."""
    n = 0
    while off < len(buf):
        n += 1
        if len(buf) - off < _REC.size:
            break
        (length,) = _U32.unpack_from(buf, off)
        if length < _ENTRY.size or off + _REC.size + length > len(buf):
            break
        off += _REC.size + length
    return n


@dataclass(frozen=True, slots=True)
class Damage:
    """Where recovery cut the journal, and what it dropped."""

    offset: int
    reason: str
    dropped_records: int  # the bad record and whatever record-shaped data followed it
    dropped_bytes: int
    last_kept_index: int | None


def scan(buf: memoryview, start: int = HEADER_SIZE) -> tuple[list[Entry], list[int], Damage | None]:
    """Entries, the end offset of each record, and the first damage found (if any)."""
    entries: list[Entry] = []
    ends: list[int] = []
    off = start
    while off < len(buf):
        rec = _read_record(buf, off)
        if not isinstance(rec, str):
            entry, end = rec
            if entries and (entry[1] != entries[-1][1] + 1 or entry[2] < entries[-1][2]):
                rec = (
                    f"out of sequence: index {entry[1]} term {entry[2]} after index "
                    f"{entries[-1][1]} term {entries[-1][2]}"
                )
        if isinstance(rec, str):
            last = entries[-1][1] if entries else None
            return entries, ends, Damage(off, rec, _count_records(buf, off), len(buf) - off, last)
        entries.append(entry)
        ends.append(end)
        off = end
    return entries, ends, None


def parse_legacy(buf: bytes) -> list[Entry]:
    """Entries of a pysyncobj ``FileJournal`` (format 1), up to the first inconsistency."""
    if len(buf) < _LEGACY_FIRST:
        return []
    last = min(_U32.unpack_from(buf, _LEGACY_FIRST - 4)[0], len(buf))
    out: list[Entry] = []
    off = _LEGACY_FIRST
    while off + 4 <= last:
        (size,) = _U32.unpack_from(buf, off)
        end = off + 8 + size
        if size < _ENTRY.size or end > last or _U32.unpack_from(buf, end - 4)[0] != size:
            break
        idx, term = _ENTRY.unpack_from(buf, off + 4)
        if out and idx != out[-1][1] + 1:
            break
        out.append((bytes(buf[off + 4 + _ENTRY.size : end - 4]), idx, term))
        off = end
    return out


@dataclass(slots=True)
class RaftState:
    term: int = 0
    voted_for: Any = None
    commit_index: int = 1
    abstain_until: int | None = None  # see DurableJournal.may_vote; stored only when set

    def encode(self) -> bytes:
        d = {"commit_index": self.commit_index, "term": self.term, "voted_for": self.voted_for}
        if self.abstain_until is not None:
            d["abstain_until"] = self.abstain_until
        payload = json.dumps(d, sort_keys=True).encode()
        return (
            _STATE_HEAD.pack(STATE_MAGIC, STATE_VERSION, 0, len(payload), zlib.crc32(payload))
            + payload
        )

    @classmethod
    def decode(cls, buf: bytes) -> RaftState:
        """Raises ValueError (or a subclass) unless ``buf`` is an intact state file."""
        if len(buf) < _STATE_HEAD.size:
            raise ValueError("short state file")
        magic, version, _, length, crc = _STATE_HEAD.unpack_from(buf)
        if magic != STATE_MAGIC or version != STATE_VERSION:
            raise ValueError(f"bad state header (magic {magic!r}, version {version})")
        payload = buf[_STATE_HEAD.size :]
        if length != len(payload):
            raise ValueError(
                f"state file has {len(payload)} payload bytes, its header says {length}"
            )
        if zlib.crc32(payload) != crc:
            raise ValueError("state checksum mismatch")
        d = json.loads(payload)
        until = d.get("abstain_until")
        return cls(
            int(d["term"]),
            d["voted_for"],
            int(d["commit_index"]),
            None if until is None else int(until),
        )


def load_state_file(path: str) -> tuple[RaftState | None, str | None]:
    """The state file at ``path``: ``(state, None)``; ``(None, None)`` when there is none;
    ``(None, why)`` when it cannot be read or is damaged."""
    try:
        with open(path, "rb") as f:
            return RaftState.decode(f.read()), None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, str(exc)


def legacy_state(path: str) -> RaftState:
    """The term, vote and commit index pysyncobj's ``FileJournal`` at ``path`` kept beside it
    (``<path>.meta``); the defaults when that file is missing or unreadable."""
    meta: dict[str, Any]
    try:
        with open(path + ".meta", "rb") as f:
            meta = dict(_legacy_loads(f.read()))  # our own file, written by FileJournal
    except Exception:  # noqa: BLE001 - a missing or unreadable meta means defaults
        meta = {}
    return RaftState(
        int(meta.get("currentTerm", 0)),
        meta.get("votedForNodeId"),
        int(meta.get("raftCommitIndex", 1)),
    )


def check_format(path: str, data: bytes) -> None:
    """:class:`JournalError` when ``data`` (a journal's bytes) has an intact header of a format
    newer than this schedd's."""
    if len(data) >= HEADER_SIZE and data[:8] == MAGIC:
        _magic, version, _flags = _HEAD.unpack_from(data)
        intact = _U32.unpack_from(data, _HEAD.size)[0] == zlib.crc32(data[: _HEAD.size])
        if intact and version > VERSION:
            raise JournalError(
                f"{path} has journal format {version}, newer than this "
                f"schedd ({VERSION}): upgrade schedd, do not delete it"
            )


@dataclass(frozen=True, slots=True)
class JournalFiles:
    """A journal and its state file as they are on disk (:func:`read_journal`)."""

    size: int  # the journal file's bytes
    entries: list[Entry]  # the intact records, up to the first bad one
    damage: Damage | None  # the first bad record: where a node's start would cut the file
    header_damaged: bool
    legacy: bool  # pysyncobj's FileJournal format, imported when the node next starts
    state: RaftState | None  # None: no state file (or, with ``state_error``, a damaged one)
    state_error: str | None


def read_journal(path: str) -> JournalFiles:
    """The journal at ``path`` and its state file, read as they are: no recovery, no import,
    nothing written (``schedd inspect``).  ``OSError`` when the journal cannot be read,
    :class:`JournalError` when a newer schedd wrote it."""
    with open(path, "rb") as f:
        data = f.read()
    state, state_error = load_state_file(path + ".state")
    if data.startswith(_LEGACY_MAGIC):
        if state is None and state_error is None:
            state = legacy_state(path)
        return JournalFiles(len(data), parse_legacy(data), None, False, True, state, state_error)
    check_format(path, data)
    header_damaged = bool(data) and data[:HEADER_SIZE] != encode_header()
    with memoryview(data) as buf:
        entries, _, damage = scan(buf)
    return JournalFiles(len(data), entries, damage, header_damaged, False, state, state_error)


# -- file helpers ------------------------------------------------------------------------------
def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _read_all(fd: int, size: int, offset: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            raise OSError(f"short read at offset {offset}")
        chunks.append(chunk)
        size, offset = size - len(chunk), offset + len(chunk)
    return b"".join(chunks)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync the directory."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def _fsync_file(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


# -- background compaction ---------------------------------------------------------------------
#: the copy is written and synced this much at a time: an ext4 journal commit (which the Raft
#: thread's own fdatasync may have to wait for) then never has more than this of the copy's
#: dirty pages to flush first, as the snapshot copy does (schedd/storage/snapshots.py)
COPY_CHUNK: Final = 4 << 20


class _Compaction(threading.Thread):
    """Copies the records ``[cut, upto)`` of the journal behind a fresh header into ``tmp`` and
    syncs it (after syncing the snapshot that replaces the head).  Never touches the journal's
    own state: the tick thread looks at ``done`` and finishes or drops the copy."""

    def __init__(
        self, src_fd: int, cut: int, upto: int, gen: int, tmp: str, snapshot_path: str | None
    ) -> None:
        super().__init__(name="journal-compaction", daemon=True)
        self.src_fd, self.cut, self.upto, self.gen, self.tmp = src_fd, cut, upto, gen, tmp
        self.snapshot_path = snapshot_path
        self.fd = -1
        self.error: OSError | None = None
        self.failed_op = "compact"
        self.cancelled = False
        self.done = False
        self.seconds = 0.0

    def run(self) -> None:
        started = time.monotonic()
        try:
            if self.snapshot_path is not None:
                self.failed_op = "sync snapshot"
                _fsync_file(self.snapshot_path)
            self.failed_op = "compact"
            self.fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            _write_all(self.fd, encode_header(), 0)
            off, out = self.cut, HEADER_SIZE
            while off < self.upto and not self.cancelled:
                chunk = _read_all(self.src_fd, min(COPY_CHUNK, self.upto - off), off)
                _write_all(self.fd, chunk, out)
                _fdatasync(self.fd)
                off, out = off + len(chunk), out + len(chunk)
            if not self.cancelled:
                _fdatasync(self.fd)  # the header, when there was nothing to copy
        except OSError as exc:
            self.error = exc
        finally:
            os.close(self.src_fd)
            self.seconds = time.monotonic() - started
            self.done = True

    def discard(self) -> None:
        """Stop and remove the copy (the journal's tail changed under it, or the node closes)."""
        self.cancelled = True
        self.join()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        with suppress(OSError):
            os.unlink(self.tmp)


#: ``abstain_until`` of an empty node in a cluster with data, until it hears from a leader
UNTIL_LEADER_CONTACT: Final = 1 << 62


# -- the journal -------------------------------------------------------------------------------
def exit_process(exc: OSError) -> None:
    """Default reaction to a failed journal write or sync: exit with status 70 (EX_SOFTWARE),
    so the supervisor (systemd ``Restart=on-failure``) restarts the node from its disk."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(70)


class DurableJournal(Journal):  # type: ignore[misc]
    """pysyncobj journal with checksummed records, group-committed fdatasync and recovery."""

    on_io_failure: Callable[[OSError], None] = staticmethod(exit_process)

    def __init__(self, path: str, snapshot_path: str | None = None) -> None:
        self.path = path
        self.state_path = path + ".state"
        self.snapshot_path = snapshot_path
        self.syncs = 0  # fdatasync calls on the journal (for measurements)
        #: given the seconds each fdatasync of the journal's file took, on the thread that made
        #: it (the Raft tick thread): must be cheap; what it raises is logged once and dropped
        self.on_sync: Callable[[float], None] | None = None
        self._on_sync_failed = False
        self._pending = bytearray()  # records added but not yet written
        self._dirty = False  # written but not yet fdatasync'ed
        self._state_dirty = False
        self._failed: BaseException | None = None
        self._compaction: _Compaction | None = None
        self._gen = 0  # bumped when written records are truncated: a copy of them is stale
        self._head = HEADER_SIZE  # file offset of the first record still in the log
        self.compactions = 0  # compactions finished (for measurements and tests)
        #: this node started with no journal and no Raft state: a node of a new cluster, or one
        #: whose data directory was lost (see :meth:`abstain_as_new`)
        self.new = not os.path.exists(self.state_path) and (
            not os.path.exists(path) or os.path.getsize(path) == 0
        )
        # Set by _open:
        self.damage: Damage | None  # what recovery cut at open, for health and tests
        self._entries: list[Entry]
        self._ends: list[int]  # end offset of each record in the file
        self._written: int  # the file's length; _pending goes after it
        self._synced_index: int  # index of the last entry known to be on stable storage
        self._fd: int  # -1 once closed
        self._state, state_ok = self._load_state()
        self._open(state_ok)
        if not state_ok:
            # Unknown vote: refuse to vote in the last known term rather than vote twice.
            self._state = RaftState(
                max(self._state.term, self._last_term()), UNKNOWN_VOTE, 1, self._state.abstain_until
            )
            self._store_state()

    # -- open and recovery ---------------------------------------------------------------------
    def _load_state(self) -> tuple[RaftState, bool]:
        state, error = load_state_file(self.state_path)
        if error is not None:
            log_event(log, "raft.state_damaged", logging.ERROR, path=self.state_path, error=error)
            return RaftState(), False
        return state or RaftState(), True

    def _open(self, state_known: bool) -> None:
        with suppress(FileNotFoundError):
            os.unlink(self.path + ".compact")  # a copy a stop interrupted: the journal is whole
        if not os.path.exists(self.path) or os.path.getsize(self.path) == 0:
            atomic_write(self.path, encode_header())
        with open(self.path, "rb") as f:
            data = f.read()
        if data.startswith(_LEGACY_MAGIC):
            data = self._import_legacy(data)
        header_ok = len(data) >= HEADER_SIZE and data[:HEADER_SIZE] == encode_header()
        if not header_ok:
            self._check_newer(data)
            log_event(
                log,
                "raft.journal_header_damaged",
                logging.ERROR,
                path=self.path,
                header=data[:HEADER_SIZE].hex(),
            )
        with memoryview(data) as buf:
            entries, ends, damage = scan(buf)
            if damage is not None:
                self._keep_dropped(buf[damage.offset :])
        good_end = damage.offset if damage is not None else len(data)
        if not header_ok:  # keep the original, rebuild the file around the intact records
            shutil.copyfile(self.path, f"{self.path}.damaged.{time.time_ns()}")
            atomic_write(self.path, encode_header() + data[HEADER_SIZE:good_end])
        self._fd = os.open(self.path, os.O_RDWR)
        if damage is not None and header_ok:
            os.ftruncate(self._fd, good_end)
        os.fsync(self._fd)  # after a crash of the process only, part of it may be in the cache
        self._entries, self._ends, self._written = entries, ends, good_end
        self._synced_index = entries[-1][1] if entries else 0
        self.damage = damage
        if damage is not None:
            self._report(damage, state_known)

    def _check_newer(self, data: bytes) -> None:
        check_format(self.path, data)

    def _keep_dropped(self, tail: memoryview) -> None:
        try:
            with open(f"{self.path}.dropped.{time.time_ns()}", "wb") as f:
                f.write(tail)
        except OSError:
            log.exception("could not keep the dropped journal bytes")

    def _report(self, d: Damage, state_known: bool) -> None:
        last_kept = d.last_kept_index or 0
        # The state file is written only after the log is synced, so a stored commit index past
        # what survived means acknowledged, committed entries were lost here: not a torn write
        # after a power loss, but damage to synced data (or an operator's edit). A damaged state
        # file (never the result of a power loss: it is replaced by a rename) proves nothing, so
        # then whatever was cut may have been acknowledged.
        lost_acknowledged = not state_known or self._state.commit_index > last_kept
        if lost_acknowledged:
            self._state.abstain_until = max(
                self._state.abstain_until or 0,
                self._state.commit_index,
                last_kept + d.dropped_records,
            )
            self._store_state()  # until caught up, even across restarts
        log_event(
            log,
            "raft.journal_truncated",
            logging.ERROR if lost_acknowledged else logging.WARNING,
            path=self.path,
            offset=d.offset,
            reason=d.reason,
            dropped_records=d.dropped_records,
            dropped_bytes=d.dropped_bytes,
            kept_records=len(self._entries),
            last_kept_index=d.last_kept_index,
            stored_commit_index=self._state.commit_index if state_known else None,
            lost_acknowledged=lost_acknowledged,
            abstain_until=self._state.abstain_until,
            note="the node re-syncs the rest from the leader",
        )

    def may_vote(self) -> bool:
        """False while this node has lost entries it had acknowledged and has not got them back.

        Such a node could otherwise help elect a leader that lacks them (if the only other
        copy is on a node that is down or lagging): it must neither grant votes nor look like
        a worthy candidate until its synced log reaches ``abstain_until`` again (that state is
        stored, so it survives a restart).
        """
        return self._state.abstain_until is None

    @property
    def abstain_until(self) -> int | None:
        return self._state.abstain_until

    def holds_no_data(self) -> bool:
        """The log holds nothing a leader wrote (no entry of a term above 0)."""
        return not self._entries or self._entries[-1][2] == 0

    def abstain_as_new(self, peer: str = "") -> None:
        """This node started empty (:attr:`new`), holds no data yet, and a peer (``peer``) said
        in its hello that its log holds some: the cluster existed before this node's data
        directory did (a lost disk, a wiped or replaced node).  It may have voted in this
        cluster before and acknowledged entries that only it and a leader now gone held:
        voting now, it could help elect a candidate that lacks them.  So it abstains until it
        has heard from a leader and caught up to the commit index that leader had then
        (:meth:`leader_contact`); stored, so a restart keeps it abstaining.  The nodes of a new
        cluster start empty together and meet empty: they vote, and a cluster forms."""
        if self._state.abstain_until is not None:
            return
        self._state.abstain_until = UNTIL_LEADER_CONTACT
        self._store_state()
        log_event(
            log,
            "raft.journal_abstains",
            logging.WARNING,
            path=self.path,
            peer=peer,
            reason="started empty beside a peer that holds data: it votes once it has caught "
            "up with a leader",
        )

    def leader_contact(self, commit_index: int) -> None:
        """A leader was heard, with its commit index: an empty node abstaining since it saw
        that the cluster has data (:meth:`abstain_as_new`) now knows how far to catch up."""
        if self._state.abstain_until == UNTIL_LEADER_CONTACT:
            self._state.abstain_until = max(1, commit_index)
            self._store_state()
            self._check_caught_up()

    def _check_caught_up(self) -> None:
        until = self._state.abstain_until
        if until is not None and self._synced_index >= until:
            self._state.abstain_until = None
            self._store_state()
            log_event(
                log,
                "raft.journal_caught_up",
                logging.WARNING,
                path=self.path,
                index=self._synced_index,
            )

    def _import_legacy(self, data: bytes) -> bytes:
        entries = parse_legacy(data)
        if not os.path.exists(self.state_path):
            self._state = legacy_state(self.path)
            atomic_write(self.state_path, self._state.encode())
        shutil.copyfile(self.path, self.path + ".pysyncobj.bak")
        new = encode_header() + b"".join(encode_record(*e) for e in entries)
        atomic_write(self.path, new)
        log_event(
            log,
            "raft.journal_imported",
            logging.WARNING,
            path=self.path,
            entries=len(entries),
            backup=self.path + ".pysyncobj.bak",
        )
        return new

    def _last_term(self) -> int:
        return self._entries[-1][2] if self._entries else 0

    # -- durability ----------------------------------------------------------------------------
    @contextmanager
    def _io(self, what: str) -> Iterator[None]:
        """Fail-stop: after a failed write or sync the process stops (``on_io_failure``). A
        later fsync could succeed although the data is gone (the kernel drops the dirty pages
        and reports the error once), so nothing may be acknowledged any more; the restart
        recovers from what is really on disk."""
        if self._failed is not None:
            raise JournalError(f"journal {self.path} failed earlier: {self._failed}")
        try:
            yield
        except OSError as exc:
            self._failed = exc
            log_event(
                log,
                "raft.journal_failed",
                logging.CRITICAL,
                path=self.path,
                op=what,
                error=str(exc),
                **free_space(self.path),
            )
            self.on_io_failure(exc)
            raise JournalError(f"journal {self.path}: {what} failed: {exc}") from exc

    def _timed_sync(self, fd: int) -> None:
        """``fdatasync`` of the journal's file (or of the copy about to replace it), timed for
        :attr:`on_sync`.  Inside :meth:`_io`, so nothing but the sync's own error may escape."""
        started = time.monotonic()
        _fdatasync(fd)
        hook = self.on_sync
        if hook is None:
            return
        try:
            hook(time.monotonic() - started)
        except Exception:  # a measurement never fails the journal
            if not self._on_sync_failed:
                self._on_sync_failed = True
                log.exception("the journal's on_sync hook failed (further failures not logged)")

    def sync(self) -> None:
        """Write what is pending and make it durable (no-op when nothing is)."""
        self.finish_compaction()
        if not self._pending and not self._dirty:
            return
        with self._io("sync"):
            if self._pending:
                data, self._pending = bytes(self._pending), bytearray()
                _write_all(self._fd, data, self._written)
                self._written += len(data)
                self._dirty = True
            self._timed_sync(self._fd)
        self._dirty = False
        self.syncs += 1
        self._synced_index = self._entries[-1][1] if self._entries else 0
        if self._state.abstain_until is not None:
            self._check_caught_up()

    def _sync_snapshot(self) -> None:
        if self.snapshot_path is not None:
            with self._io("sync snapshot"):
                _fsync_file(self.snapshot_path)

    def _store_state(self) -> None:
        self.sync()  # the stored commit index must never point past the durable log
        with self._io("write state"):
            atomic_write(self.state_path, self._state.encode())
        self._state_dirty = False

    # -- pysyncobj's Journal API ---------------------------------------------------------------
    def add(self, command: Any, idx: int, term: int) -> None:
        data = to_bytes(command)
        if self._entries and idx != self._entries[-1][1] + 1:
            log_event(log, "raft.journal_gap", logging.ERROR, index=idx, after=self._entries[-1][1])
        record = encode_record(data, idx, term)
        self._ends.append((self._ends[-1] if self._ends else self._head) + len(record))
        self._entries.append((data, idx, term))
        self._pending += record

    def clear(self) -> None:
        self._sync_snapshot()  # the snapshot replaces everything: it must be durable first
        self._truncate(0)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        if entryFrom < len(self._entries):
            self._truncate(max(entryFrom, 0))

    def _truncate(self, keep: int) -> None:
        # Nothing left: the file is cut back to its header, dropped head included (whatever
        # comes next need not follow the records before it).
        new_end = self._ends[keep - 1] if keep else HEADER_SIZE
        del self._entries[keep:]
        del self._ends[keep:]
        if not keep:
            self._head = HEADER_SIZE
        if self._compaction is not None and new_end < self._compaction.upto:
            self._gen += 1  # the copy being made holds records that are no longer the log
        if new_end >= self._written:  # only unwritten records go
            del self._pending[new_end - self._written :]
        else:
            # Durable before any new record is written over the old ones: a crash must never
            # leave new records mixed with the old ones they replace.
            self._pending = bytearray()
            with self._io("truncate"):
                os.ftruncate(self._fd, new_end)
                self._timed_sync(self._fd)
            self._written, self._dirty = new_end, False
        last = self._entries[-1][1] if self._entries else 0
        self._synced_index = min(self._synced_index, last)

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Compaction: drop the head (now in the snapshot); the file follows in the background."""
        entryTo = min(entryTo, len(self._entries))
        if entryTo <= 0:
            return
        self._head = self._ends[entryTo - 1]
        del self._entries[:entryTo]
        del self._ends[:entryTo]
        if self._head >= self._written:
            self._drop_written()
        else:
            self._start_compaction()

    def _drop_written(self) -> None:
        """The head reaches past what is written: the file holds nothing of the log, and the
        records after the head, if any, are all pending.  The file is cut back to its header
        now (cheap, whatever its size) rather than copied: left there, the written head would
        not be followed by the next record on disk."""
        if self._compaction is not None:
            self._gen += 1
        self._sync_snapshot()
        with self._io("compact"):
            os.ftruncate(self._fd, HEADER_SIZE)
            self._timed_sync(self._fd)
        del self._pending[: self._head - self._written]
        shift = self._head - HEADER_SIZE
        self._ends = [end - shift for end in self._ends]
        self._head = self._written = HEADER_SIZE
        self._dirty = False

    def skip_to(self, first: Entry, second: Entry) -> bool:
        """Drop the records before ``first`` if ``first`` and ``second`` follow each other in
        the log (a compaction the node's stop interrupted; the snapshot holds them)."""
        if not self._entries:
            return False
        at = first[1] - self._entries[0][1]
        if at <= 0 or at + 1 >= len(self._entries):
            return False
        if self._entries[at] != first or self._entries[at + 1] != second:
            return False
        log_event(
            log, "raft.journal_head_dropped", path=self.path, records=at, first_index=first[1]
        )
        self.deleteEntriesTo(at)
        return True

    def _start_compaction(self) -> None:
        if self._compaction is not None or self._head <= HEADER_SIZE or self._fd < 0:
            return
        src = os.dup(self._fd)
        # The copy takes the records written so far; the rest (and a head not yet written, in
        # which case there is nothing to copy) is left for the tick thread at the swap.
        job = _Compaction(
            src,
            self._head,
            max(self._written, self._head),
            self._gen,
            self.path + ".compact",
            self.snapshot_path,
        )
        self._compaction = job
        job.start()

    def finish_compaction(self, wait: bool = False) -> bool:
        """Put the background copy in place if it is ready (or, with ``wait``, once it is);
        True if a compaction was finished."""
        job = self._compaction
        if job is None:
            return False
        if wait:
            job.join()
        if not job.done:
            return False
        return self._finish_compaction()

    def _finish_compaction(self) -> bool:
        job = self._compaction
        assert job is not None and job.done
        self._compaction = None
        if job.gen != self._gen:  # the copied records were truncated meanwhile (its read of
            job.discard()  # them may have failed for that reason alone)
            self._start_compaction()
            return False
        if job.error is not None:
            job.discard()
            with self._io(job.failed_op):
                raise job.error
        shift = job.cut - HEADER_SIZE
        with self._io("compact"):
            if self._pending:
                data, self._pending = bytes(self._pending), bytearray()
                _write_all(self._fd, data, self._written)
                self._written += len(data)
            # What was appended while the copy ran (small: entries of seconds, not the log).
            delta = _read_all(self._fd, self._written - job.upto, job.upto)
            _write_all(job.fd, delta, job.upto - shift)
            os.ftruncate(job.fd, self._written - shift)
            self._timed_sync(job.fd)
            os.replace(job.tmp, self.path)
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
            fd, self._fd, job.fd = self._fd, job.fd, -1
            os.close(fd)
        self._head -= shift
        self._ends = [end - shift for end in self._ends]
        self._written -= shift
        self._dirty = False
        self._synced_index = self._entries[-1][1] if self._entries else 0
        self.compactions += 1
        log_event(
            log,
            "raft.journal_compacted",
            logging.DEBUG,
            path=self.path,
            dropped_bytes=shift,
            kept_bytes=self._written - HEADER_SIZE,
            copy_seconds=round(job.seconds, 3),
        )
        if self._state.abstain_until is not None:
            self._check_caught_up()
        if self._head > HEADER_SIZE:  # more was dropped while the copy ran
            self._start_compaction()
        return True

    def entry_at(self, index: int) -> Entry | None:
        """The entry at log index ``index``, if the journal holds it."""
        if not self._entries:
            return None
        at = index - self._entries[0][1]
        return self._entries[at] if 0 <= at < len(self._entries) else None

    def size_bytes(self) -> int:
        """The bytes of the records the log holds (in memory, and in the file once written)."""
        return (self._ends[-1] - self._head) if self._ends else 0

    def __getitem__(self, item: int | slice) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        if self._fd < 0:
            return
        if self._compaction is not None:
            job = self._compaction
            if job.done and job.error is None and job.gen == self._gen and self._failed is None:
                self._finish_compaction()
            if self._compaction is not None:
                self._compaction.discard()
                self._compaction = None
        try:
            if self._failed is None:
                self.sync()
                if self._state_dirty:
                    self._store_state()
        finally:
            os.close(self._fd)
            self._fd = -1

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        if raftCommitIndex > self._synced_index:
            # A leader counts itself towards the majority: its copy must be durable before
            # the commit is acted upon (applied, answered, sent to followers).
            self.sync()
        if raftCommitIndex != self._state.commit_index:
            self._state.commit_index = raftCommitIndex
            self._state_dirty = True

    def getRaftCommitIndex(self) -> int:
        # Never past the log we have: after recovery cut it, the rest comes from the leader.
        if self._entries:
            return min(self._state.commit_index, self._entries[-1][1])
        return self._state.commit_index

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        # Raft: term and vote are durable before any message reflecting them is sent.
        self._state.term = term
        self._state.voted_for = votedForNodeId
        self._store_state()

    def getCurrentTerm(self) -> int:
        return self._state.term

    def getVotedForNodeId(self) -> Any:
        return self._state.voted_for

    def onOneSecondTimer(self) -> None:
        self.finish_compaction()
        if self._state_dirty:
            self._store_state()


# -- installation ------------------------------------------------------------------------------
class DurableTransport(TCPTransport):  # type: ignore[misc]
    """TCPTransport that syncs the journal before a message that depends on it leaves."""

    durable_journal: DurableJournal | None = None

    def send(self, node: Any, message: Any) -> bool:
        journal = self.durable_journal
        if journal is not None and isinstance(message, dict):
            kind = message.get("type")
            if kind in SYNC_BEFORE:
                journal.sync()
            elif kind in _VOTES and not journal.may_vote():
                if kind == "response_vote":
                    return True  # the grant is withheld: to the candidate, a lost message
                # Still announce the term (so the cluster moves on and this node can follow
                # the next leader), but with a log no voter will find up to date.
                message = {**message, "last_log_index": 0, "last_log_term": -1}
        return bool(super().send(node, message))


@dataclass
class Installed:
    transport: type[DurableTransport]
    journals: list[DurableJournal]

    @property
    def journal(self) -> DurableJournal | None:
        return self.journals[-1] if self.journals else None


@contextmanager
def durable_journal(snapshot_path: str | None = None) -> Iterator[Installed]:
    """While the block runs, ``SyncObj(...)`` builds a :class:`DurableJournal`; pass
    ``.transport`` as its ``transportClass`` so the journal is synced before acknowledgements
    (pysyncobj has no option for a journal: :func:`schedd.raft.patches.swap_create_journal`)."""
    journals: list[DurableJournal] = []

    def create_journal(journal_file: str | None = None) -> Any:
        if journal_file is None:
            return MemoryJournal()
        journal = DurableJournal(journal_file, snapshot_path=snapshot_path)
        journals.append(journal)
        return journal

    class _Transport(DurableTransport):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # SyncObj.__init__ creates the journal before the transport.
            self.durable_journal = journals[-1] if journals else None
            super().__init__(*args, **kwargs)

    with swap_create_journal(create_journal):
        yield Installed(_Transport, journals)
