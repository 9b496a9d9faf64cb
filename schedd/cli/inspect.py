"""``schedd inspect --data-dir DIR [--journal-dir DIR] [-o json]``: what a stopped node holds.

Reads a node's data directory without changing a byte of it and prints the index its state
database applied up to and that entry's term; the Raft journal (its first and last index, the
last entry's term, and the commit index, current term and vote stored beside it); the
compaction marker (``raft.dump``); the schema version and the numbers of jobs, runs and dead
letters; and the membership, when the log recorded one (after a membership change).  The first line
is the one to compare between nodes when a majority is lost and a survivor must be chosen:
``applied index N (term T)``.

``--data-dir`` is the node's ``node.data_dir`` (the state is in its ``raft`` directory) or that
``raft`` directory itself; ``--journal-dir`` is ``raft.journal_dir`` when the node has one.  A
node of a cluster of several shards holds one such state per shard (``shards/<k>``): each is
reported in turn (with ``-o json``, a list of the reports under ``shards``).

How it reads without writing
    ``state.db``: SQLite opened read-only -- with ``immutable=1`` when no write-ahead log holds
    anything (``mode=ro`` alone would create the ``-wal`` and ``-shm`` files), with
    ``readonly_shm=1`` when the log and its shared-memory file are both there (a node that
    crashed or is running: SQLite reads the log and writes nothing), and from a private copy of
    the database and its log in a temporary directory when the log is there without its
    ``-shm``.  A received copy the node had decided to install (``state.db.install``) is read
    instead of ``state.db``: it is what the node starts from.  The journal is read whole and
    checked record by record as a node's start does, without the repair that start makes (no
    cut, no import of pysyncobj's format, no state file written):
    :func:`schedd.raft.journal.read_journal`.

A running node
    The daemon takes no lock of its own on its data directory, but a process that has
    ``state.db`` open holds SQLite's locks on its files, which ``/proc/locks`` lists.  A running
    node is inspected all the same (every read above is safe beside it) and the output says so:
    its figures are those of one moment.

Failures are one line on stderr naming the path: exit 2 for the command line (no such
directory, one that holds no node, no journal where it was looked for), 1 for what the
directory holds (a damaged state database, files that cannot be read).  A damaged journal,
journal state file or marker leaves the rest readable: the report is printed, then a line for
each, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from schedd.cli import render
from schedd.cli.schedctl import terminal_style
from schedd.config import JOURNAL_FILE, STATE_FILE
from schedd.core.durations import format_time
from schedd.core.members import LEARNER, VOTER, Membership
from schedd.raft.journal import UNTIL_LEADER_CONTACT, JournalError, JournalFiles, read_journal
from schedd.storage.schema import SCHEMA_VERSION, schema_version
from schedd.storage.snapshots import (
    INSTALL,
    SnapshotError,
    SnapshotInfo,
    read_snapshot,
    state_counts,
)

PREFIX = "schedd inspect: "
MARKER_FILE = "raft.dump"
SQLITE_MAGIC = b"SQLite format 3\0"
#: a running node's journal may be read while a record is half written: read again this often
JOURNAL_READS = 3
JOURNAL_RETRY_S = 0.05


class Failure(Exception):
    """Nothing can be shown: one line, and the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="schedd inspect",
        description="Show what a stopped node's data directory holds, without changing it: the "
        "index its state applied (and that entry's term), its Raft journal, its compaction "
        "marker and its counts. After a lost majority, compare the first line, applied index "
        "N (term T), across the surviving nodes.",
    )
    p.add_argument(
        "--data-dir",
        required=True,
        metavar="DIR",
        help="the node's node.data_dir (or the raft directory in it)",
    )
    p.add_argument(
        "--journal-dir",
        metavar="DIR",
        help="the node's raft.journal_dir, when it has one (default: beside the state)",
    )
    p.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="text (default) or json"
    )
    return p.parse_args(argv)


# ---- where things are ----------------------------------------------------------------------


def _directory(option: str, path: Path) -> None:
    if not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        raise Failure(f"{option}: {path}: {what}", 2)


def find_raft_dir(data: Path) -> Path:
    """The directory that holds the node's ``state.db``: ``DIR/raft``, or ``DIR`` itself."""
    _directory("--data-dir", data)
    for where in (data / "raft", data):
        try:
            names = set(os.listdir(where))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise Failure(f"{where}: cannot read it: {exc.strerror or exc}") from None
        if STATE_FILE in names or f"{STATE_FILE}{INSTALL}" in names:
            return where
    raise Failure(
        f"--data-dir: {data}: not a schedd data directory (it holds no raft/{STATE_FILE}, nor "
        f"a {STATE_FILE})",
        2,
    )


def find_journal(raft_dir: Path, journal_dir: str | None) -> Path:
    if journal_dir is None:
        path = raft_dir / JOURNAL_FILE
        if not path.is_file():
            raise Failure(
                f"{raft_dir}: no Raft journal ({JOURNAL_FILE}) beside the state: if the node "
                "has raft.journal_dir set, give that directory as --journal-dir",
                2,
            )
        return path
    where = Path(journal_dir)
    _directory("--journal-dir", where)
    if not (where / JOURNAL_FILE).is_file():
        raise Failure(f"--journal-dir: {where}: no Raft journal ({JOURNAL_FILE}) in it", 2)
    return where / JOURNAL_FILE


def lock_holder(paths: list[Path], locks: Path = Path("/proc/locks")) -> int | None:
    """The id of a process that holds a lock on one of ``paths`` (-1 for a lock no process id
    is given for), or None when none does; ``OSError`` when the kernel's list of locks cannot
    be read."""
    keys: dict[str, None] = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        keys[f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"] = None
    text = locks.read_text()
    for line in text.splitlines():
        # "1: POSIX  ADVISORY  READ 4242 fe:00:2148033 128 128" (a waiter has "->" after "1:")
        fields = line.split()
        for at, field in enumerate(fields[1:], 1):
            if field in keys:
                try:
                    return int(fields[at - 1])
                except ValueError:
                    return -1
    return None


# ---- the state database --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateView:
    path: Path
    read: str  # how it was read
    applied_index: int
    schema: int
    counts: dict[str, int]
    leader: dict[str, Any]  # the last leader claim applied: node, term, http
    members: list[dict[str, Any]] | None  # None: the state records no membership


@contextmanager
def _connect(path: Path) -> Iterator[tuple[sqlite3.Connection, str]]:
    """A read-only connection to the database at ``path`` that writes nothing beside it."""
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    logged = wal.is_file() and wal.stat().st_size > 0
    if logged and not shm.is_file():
        with tempfile.TemporaryDirectory(prefix="schedd-inspect-") as tmp:
            copy = Path(tmp) / path.name
            shutil.copyfile(path, copy)
            shutil.copyfile(wal, f"{copy}-wal")
            db = sqlite3.connect(str(copy))
            try:
                yield db, f"from a copy (its write-ahead log is there without {shm.name})"
            finally:
                db.close()
        return
    both = wal.is_file() and shm.is_file()
    params = "mode=ro&readonly_shm=1" if both else "mode=ro&immutable=1"
    db = sqlite3.connect(f"{path.resolve().as_uri()}?{params}", uri=True)
    try:
        yield db, "read-only"
    finally:
        db.close()


def _members(db: sqlite3.Connection) -> list[dict[str, Any]] | None:
    """The membership the log recorded (``meta.members``), if a change was ever made: one
    entry per member (id, address, role), then the removed addresses."""
    row = db.execute("SELECT value FROM meta WHERE key = 'members'").fetchone()
    if row is None:
        return None
    m = Membership.from_json(orjson.loads(row[0]))
    out = [{"id": v.id or None, "address": v.raft, "role": VOTER} for v in m.voters]
    if m.learner is not None:
        out.append({"id": m.learner.id or None, "address": m.learner.raft, "role": LEARNER})
    out += [{"id": None, "address": a, "role": "removed"} for a in m.removed]
    return out


def read_state(raft_dir: Path) -> StateView:
    live = raft_dir / STATE_FILE
    install = Path(f"{live}{INSTALL}")
    path = install if install.is_file() else live
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise Failure(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if head != SQLITE_MAGIC:
        what = "an empty file" if not head else "not an SQLite database"
        raise Failure(f"{path}: {what}, not a schedd state database")
    keys = ("applied_index", "leader_node", "leader_term", "leader_http")
    try:
        with _connect(path) as (db, how):
            meta = dict(
                db.execute(
                    f"SELECT key, value FROM meta WHERE key IN ({', '.join('?' * len(keys))})",
                    keys,
                ).fetchall()
            )
            schema = schema_version(db)
            counts = state_counts(db)
            members = _members(db)
    except (sqlite3.Error, ValueError, KeyError, TypeError) as exc:
        raise Failure(f"{path}: a damaged or foreign state database: {exc}") from None
    except OSError as exc:
        raise Failure(f"{path}: cannot read it: {exc.strerror or exc}") from None
    leader = {
        "node": meta.get("leader_node") or None,
        "term": meta.get("leader_term"),
        "http": meta.get("leader_http") or None,
    }
    if path == install:
        how += f"; {install.name}, which replaces {STATE_FILE} when the node starts"
    return StateView(path, how, int(meta.get("applied_index", 0)), schema, counts, leader, members)


# ---- the journal and the marker ------------------------------------------------------------


def load_journal(path: Path, running: bool) -> JournalFiles:
    try:
        for _ in range(JOURNAL_READS if running else 1):
            files = read_journal(str(path))
            if files.damage is None:
                break
            time.sleep(JOURNAL_RETRY_S)  # a running node may be writing its last record
    except JournalError as exc:
        raise Failure(str(exc)) from None
    except OSError as exc:
        raise Failure(f"{path}: cannot read it: {exc.strerror or exc}") from None
    return files


def read_marker(raft_dir: Path) -> tuple[SnapshotInfo | None, str | None]:
    path = raft_dir / MARKER_FILE
    if not path.exists():
        return None, None
    try:
        return read_snapshot(path), None
    except SnapshotError as exc:
        return None, str(exc)


# ---- the report ----------------------------------------------------------------------------


def _entry_term(files: JournalFiles, index: int) -> int | None:
    if not files.entries:
        return None
    at = index - files.entries[0][1]
    return files.entries[at][2] if 0 <= at < len(files.entries) else None


def applied_term(
    applied: int, files: JournalFiles, snapshot: SnapshotInfo | None, leader_term: Any
) -> tuple[int | None, str | None]:
    """The term of the entry at the applied index, and where it was found."""
    term = _entry_term(files, applied)
    if term is not None:
        return term, "journal"
    if snapshot is not None:
        for _, index, marked in snapshot.raft[:2]:
            if index == applied:
                return marked, "marker"
    if isinstance(leader_term, int) and leader_term > 0:
        return leader_term, "leader claim"
    return None, None


def _problems(journal: Path, files: JournalFiles, marker_error: str | None) -> list[str]:
    out = []
    if files.header_damaged:
        out.append(f"{journal}: a damaged header (a node's start rebuilds it, keeping a copy)")
    d = files.damage
    if d is not None:
        after = "at its start" if d.last_kept_index is None else f"after index {d.last_kept_index}"
        out.append(
            f"{journal}: {d.reason} at offset {d.offset}: a node's start cuts the "
            f"{d.dropped_bytes:,} bytes from there ({d.dropped_records} records) {after}"
        )
    if files.state_error is not None:
        out.append(
            f"{journal}.state: damaged ({files.state_error}): a node's start forgets its vote "
            "and abstains from elections until it has caught up"
        )
    if marker_error is not None:
        out.append(marker_error)
    return out


def build_report(data: Path, journal_dir: str | None) -> dict[str, Any]:
    raft_dir = find_raft_dir(data)
    journal = find_journal(raft_dir, journal_dir)
    live = raft_dir / STATE_FILE
    running: bool | None
    try:
        pid = lock_holder([Path(f"{live}-shm"), live])
        running = pid is not None
    except OSError:  # not Linux: whether it runs cannot be told, and it is read as if it did
        pid, running = None, None
    state = read_state(raft_dir)
    files = load_journal(journal, running is not False)
    snapshot, marker_error = read_marker(raft_dir)
    term, term_from = applied_term(state.applied_index, files, snapshot, state.leader["term"])
    entries = files.entries
    rs = files.state
    marker: dict[str, Any] | None = None
    if snapshot is not None:
        (_, index, mterm), (_, prev_index, prev_term), cluster = snapshot.raft
        m = snapshot.marker
        marker = {
            "path": str(raft_dir / MARKER_FILE),
            "format": "copy" if snapshot.copy else "marker",
            "index": index,
            "term": mterm,
            "prev_index": prev_index,
            "prev_term": prev_term,
            "applied_index": snapshot.applied_index,
            "schema": None if m is None else m.schema,
            "written_at": format_time(m.written_ms) if m is not None and m.written_ms else None,
            "cluster": list(cluster),
        }
    damage = files.damage
    return {
        "data_dir": str(raft_dir),
        "running": running,
        "running_pid": pid,
        "applied": {"index": state.applied_index, "term": term, "term_from": term_from},
        "state": {
            "path": str(state.path),
            "read": state.read,
            "schema": state.schema,
            "counts": state.counts,
            "leader": state.leader,
        },
        "journal": {
            "path": str(journal),
            "format": "pysyncobj" if files.legacy else "schedd",
            "bytes": files.size,
            "entries": len(entries),
            "first_index": entries[0][1] if entries else None,
            "last_index": entries[-1][1] if entries else None,
            "last_term": entries[-1][2] if entries else None,
            "commit_index": None if rs is None else rs.commit_index,
            "current_term": None if rs is None else rs.term,
            "voted_for": None if rs is None else rs.voted_for,
            "abstain_until": None if rs is None else rs.abstain_until,
            "state_file": "damaged" if files.state_error else "missing" if rs is None else "ok",
            "damage": None
            if damage is None
            else {
                "offset": damage.offset,
                "reason": damage.reason,
                "dropped_bytes": damage.dropped_bytes,
                "dropped_records": damage.dropped_records,
                "last_kept_index": damage.last_kept_index,
            },
        },
        "marker": marker,
        "members": state.members,
        "problems": _problems(journal, files, marker_error),
        "conclusion": conclusion(state.applied_index, term),
    }


def conclusion(applied: int, term: int | None) -> str:
    return f"applied index {applied} (term {'unknown' if term is None else term})"


# ---- text ----------------------------------------------------------------------------------


def _journal_line(j: dict[str, Any]) -> str:
    if not j["entries"]:
        text = "empty"
    else:
        text = (
            f"indexes {j['first_index']} to {j['last_index']}, last term {j['last_term']} "
            f"({j['entries']:,} entries)"
        )
    text += f", {j['bytes']:,} bytes"
    if j["format"] == "pysyncobj":
        text += ", in pysyncobj's format (imported when the node starts)"
    if j["damage"] is not None:
        text += f"; damaged at offset {j['damage']['offset']}: {j['damage']['reason']}"
    return f"{j['path']}: {text}"


def _journal_state(j: dict[str, Any]) -> str:
    if j["state_file"] == "damaged":
        return "damaged"
    if j["state_file"] == "missing":
        return "no state file (a node that never stored a term)"
    vote = j["voted_for"]
    text = (
        f"commit index {j['commit_index']}, current term {j['current_term']}, voted for "
        f"{'nobody' if vote is None else vote}"
    )
    until = j["abstain_until"]
    if until == UNTIL_LEADER_CONTACT:
        text += "; abstains from elections until it has caught up with a leader"
    elif until is not None:
        text += f"; abstains from elections until its log reaches index {until}"
    return text


def _marker_line(m: dict[str, Any] | None) -> str:
    if m is None:
        return "none (the log was never compacted)"
    text = (
        f"{m['path']}: index {m['index']} (term {m['term']}), the entry before "
        f"{m['prev_index']} (term {m['prev_term']}); the state held index {m['applied_index']}"
    )
    if m["format"] == "copy":
        return text + "; a whole copy of the state, in an older schedd's format"
    text += f", schema {m['schema']}"
    if m["written_at"]:
        text += f", written {m['written_at']}"
    return text + f"; cluster {', '.join(m['cluster']) or '-'}"


def render_text(r: dict[str, Any], width: int) -> str:
    s, j, a = r["state"], r["journal"], r["applied"]
    first = r["conclusion"]
    if j["last_index"] is not None:
        first += f"; its journal reaches index {j['last_index']} (term {j['last_term']})"
    pid = r["running_pid"]
    if r["running"] is None:
        where = f"{r['data_dir']} (whether a process has its state open cannot be told here)"
    elif pid is None:
        where = f"{r['data_dir']} (no process has its state open: the node is stopped)"
    else:
        who = "a process" if pid < 0 else f"process {pid}"
        where = (
            f"{r['data_dir']} (RUNNING: {who} has its state open; these are the figures of "
            "one moment: stop the node for figures to act on)"
        )
    schema = str(s["schema"])
    if s["schema"] > SCHEMA_VERSION:
        schema += f" (newer than this schedd's {SCHEMA_VERSION})"
    c = s["counts"]
    applied = str(a["index"])
    if a["term_from"] is not None:
        applied += f" (term {a['term']}, from the {a['term_from']})"
    pairs = [
        ("data directory", where),
        ("state", f"{s['path']}, {s['read']}"),
        ("schema", schema),
        ("applied index", applied),
        ("jobs", f"{c.get('jobs', 0):,}"),
        ("runs", f"{c.get('runs', 0):,}"),
        ("dead letters", f"{c.get('dead_letters', 0):,}"),
    ]
    leader = s["leader"]
    if leader["node"]:
        pairs.append(
            ("last leader", f"{leader['node']} (term {leader['term']}) {leader['http'] or ''}")
        )
    pairs += [
        ("journal", _journal_line(j)),
        ("journal state", _journal_state(j)),
        ("marker", _marker_line(r["marker"])),
    ]
    if r["members"] is not None:
        listed = [f"{m['id']} {m['address']} ({m['role']})" for m in r["members"]]
        pairs.append(("members", "; ".join(listed) or "none"))
    return render.clean(first) + "\n" + render.details(pairs, width)


# ---- the command ---------------------------------------------------------------------------


def shard_dirs(data: Path, journal_dir: str | None) -> list[tuple[Path, str | None]]:
    """The data and journal directories of each shard of a node of several shards (its data
    directory holds ``shards/<k>`` and no state of its own); [] for a node of one shard."""
    top = data / "shards"
    if (data / "raft" / STATE_FILE).exists() or not top.is_dir():
        return []
    found = sorted(int(p.name) for p in top.iterdir() if p.name.isdigit() and p.is_dir())
    return [
        (top / str(k), None if journal_dir is None else str(Path(journal_dir) / "shards" / str(k)))
        for k in found
    ]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    data = Path(args.data_dir)
    try:
        shards = shard_dirs(data, args.journal_dir)
        if shards:
            reports = [build_report(d, j) for d, j in shards]
            return _said_shards(data, reports, args.output)
        report = build_report(data, args.journal_dir)
    except Failure as exc:
        print(f"{PREFIX}{exc}", file=sys.stderr)
        return exc.code
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        message = f"unexpected error: {type(exc).__name__}: {exc}; please report it"
        print(f"{PREFIX}{message}", file=sys.stderr)
        return 1
    if args.output == "json":
        sys.stdout.buffer.write(orjson.dumps(report) + b"\n")
    else:
        width = terminal_style("text", sys.stdout.isatty(), os.environ).width
        text = render_text(report, width) + "\n"
        sys.stdout.buffer.write(text.encode("utf-8", "replace"))
    sys.stdout.flush()
    for problem in report["problems"]:
        print(f"{PREFIX}{render.clean(problem)}", file=sys.stderr)
    return 1 if report["problems"] else 0


def _said_shards(data: Path, reports: list[dict[str, Any]], output: str) -> int:
    """A node of several shards: each shard's report, in turn."""
    if output == "json":
        sys.stdout.buffer.write(orjson.dumps({"data_dir": str(data), "shards": reports}) + b"\n")
    else:
        width = terminal_style("text", sys.stdout.isatty(), os.environ).width
        parts = [f"shard {k}: " + render_text(r, width) for k, r in enumerate(reports)]
        text = f"{data}: a node of {len(reports)} shards\n\n" + "\n\n".join(parts) + "\n"
        sys.stdout.buffer.write(text.encode("utf-8", "replace"))
    sys.stdout.flush()
    problems = [(k, p) for k, r in enumerate(reports) for p in r["problems"]]
    for k, problem in problems:
        print(f"{PREFIX}shard {k}: {render.clean(problem)}", file=sys.stderr)
    return 1 if problems else 0
