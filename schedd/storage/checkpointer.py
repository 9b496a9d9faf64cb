"""Copying the write-ahead log back into the database, on a thread of its own, in bounded steps.

Left to itself SQLite checkpoints in the connection that commits: the commit that takes the log
past 1,000 pages also copies them into the database and syncs both files.  The node's writer
is the Raft tick thread, so every few hundred applied entries one of them would wait for two
fsyncs and megabytes of writes, and the heartbeats with it.  Here the writer never checkpoints
(``wal_autocheckpoint = 0``: not even as a backstop at some size, which would fall on the tick
thread right after a long read, with all the log piled up behind it); a :class:`Checkpointer`
thread, on its own connection, runs a ``PASSIVE`` checkpoint whenever something was committed
since its last look.  ``PASSIVE`` takes no lock a writer or a reader waits for: it copies what
no reader still needs, and the writer starts the log again from its beginning once all of it
was copied.  SQLite runs the copy with the interpreter lock released, so it costs the tick
thread nothing.

Bounded steps.  Each checkpoint ends with a sync of the database file, and the Raft journal's
own syncs (every acknowledgement) wait behind that flush when they share a disk: a checkpoint
must never flush hundreds of megabytes at once.  Normally each copies the last 0.2 s of
writes.  But a reader that holds an old view of the database (a whole copy being sent to a
follower or to a backup: minutes, at millions of jobs) keeps every frame after its view in the
log, and when it lets go everything piled up would be copied and flushed in one go.  So while
the log grows past what a checkpoint could copy, the checkpointer pins views of its own at
every :data:`STEP_BYTES` of growth (a read transaction each, at most :data:`MAX_PINS`): a
checkpoint never copies past the oldest view still held, and the checkpointer lets go of one
view per checkpoint, oldest first, once the copy has reached it.  The backlog is then copied
:data:`STEP_BYTES` at a time, with a pause of at least one period between two steps.  (SQLite
keeps a few distinct views at once; past :data:`MAX_PINS` steps the last one is larger.)
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from schedd import clock
from schedd.logs import log_event

log = logging.getLogger(__name__)

PERIOD_S = 0.2  # between two looks at whether anything was committed
STEP_BYTES = 32 << 20  # the most a checkpoint copies while there is a backlog (bytes of log)
MAX_PINS = 3  # views the checkpointer holds at once to cut a backlog into steps
PIN_MAX_AGE_S = 3600.0  # a view held this long is let go whatever (never hold the log forever)
_FRAME_HEADER = 24


@dataclass
class _Pin:
    db: sqlite3.Connection
    frame: int  # the log's frames when it was taken: its view holds at least these
    at: float


class Checkpointer:
    """A thread that checkpoints the database at ``path`` while it runs (:meth:`close`)."""

    def __init__(
        self, path: Path | str, period_s: float = PERIOD_S, step_bytes: int = STEP_BYTES
    ) -> None:
        self.path = path
        self.period_s = period_s
        self.step_bytes = step_bytes
        self.checkpoints = 0  # that copied something
        self.steps = 0  # checkpoints that stopped at a view of the checkpointer's own
        self.copied = threading.Event()  # set by the first checkpoint that copied something
        self.failures = 0
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._page = int(self._db.execute("PRAGMA page_size").fetchone()[0])
        self._pins: list[_Pin] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
        self._thread.start()

    @property
    def frame_bytes(self) -> int:
        return self._page + _FRAME_HEADER

    def _run(self) -> None:
        seen = None
        try:
            while not self._stop.wait(self.period_s):
                version = self._db.execute("PRAGMA data_version").fetchone()[0]
                if version == seen and not self._pins:
                    continue
                seen = version
                self.step()
        finally:
            self._release(len(self._pins))
            self._db.close()

    def step(self) -> tuple[int, int]:
        """One checkpoint, then the views: let go of the oldest one the copy reached (one a
        step), or pin a new one if the log grew by a step past the last.  (frames in the log,
        frames copied)."""
        frames, copied = self.checkpoint()
        pins = self._pins
        if pins and (copied >= pins[0].frame or clock.mono() - pins[0].at > PIN_MAX_AGE_S):
            if copied >= pins[0].frame:
                self.steps += 1
            self._release(1)
        elif frames - copied > 0 and len(pins) < MAX_PINS:
            last = pins[-1].frame if pins else copied
            if (frames - last) * self.frame_bytes >= self.step_bytes:
                self._pin(frames)
        return frames, copied

    def _pin(self, frames: int) -> None:
        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        try:
            db.execute("BEGIN")
            db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone()  # the view is taken
        except sqlite3.Error as exc:
            db.close()
            log_event(log, "storage.checkpoint_pin_failed", logging.DEBUG, error=str(exc))
            return
        self._pins.append(_Pin(db, frames, clock.mono()))

    def _release(self, n: int) -> None:
        for pin in self._pins[:n]:
            with contextlib.suppress(sqlite3.Error):
                pin.db.execute("COMMIT")
            pin.db.close()
        del self._pins[:n]

    @property
    def pins(self) -> int:
        return len(self._pins)

    def checkpoint(self) -> tuple[int, int]:
        """One ``PASSIVE`` checkpoint: (frames in the log, frames copied from it).  An error is
        logged and counted, never raised: the next look tries again."""
        try:
            _, frames, copied = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            self.failures += 1
            log_event(
                log,
                "storage.checkpoint_failed",
                logging.WARNING,
                path=str(self.path),
                error=str(exc),
            )
            return 0, 0
        if copied > 0:
            self.checkpoints += 1
            self.copied.set()
        return int(frames), int(copied)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
