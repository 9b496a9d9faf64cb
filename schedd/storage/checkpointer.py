"""Copying the write-ahead log back into the database, on a thread of its own.

Left to itself SQLite checkpoints in the connection that commits: the commit that takes the log
past 1,000 pages also copies them into the database and syncs both files.  The node's writer
is the Raft tick thread, so every few hundred applied entries one of them would wait for two
fsyncs and megabytes of writes, and the heartbeats with it.  Here the writer never checkpoints
(``wal_autocheckpoint = 0``: not even as a backstop at some size, which would fall on the tick
thread right after a long snapshot copy, with all the log piled up behind it); a
:class:`Checkpointer` thread, on its own connection, runs a ``PASSIVE`` checkpoint whenever
something was committed since its last look.  ``PASSIVE`` takes
no lock a writer or a reader waits for: it copies what no reader still needs, and the writer
starts the log again from its beginning once all of it was copied.  SQLite runs the copy with
the interpreter lock released, so it costs the tick thread nothing.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

from schedd.logs import log_event

log = logging.getLogger(__name__)

PERIOD_S = 0.2  # between two looks at whether anything was committed


class Checkpointer:
    """A thread that checkpoints the database at ``path`` while it runs (:meth:`close`)."""

    def __init__(self, path: Path | str, period_s: float = PERIOD_S) -> None:
        self.path = path
        self.period_s = period_s
        self.checkpoints = 0  # that copied something
        self.copied = threading.Event()  # set by the first checkpoint that copied something
        self.failures = 0
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seen = None
        try:
            while not self._stop.wait(self.period_s):
                version = self._db.execute("PRAGMA data_version").fetchone()[0]
                if version == seen:
                    continue
                seen = version
                self.checkpoint()
        finally:
            self._db.close()

    def checkpoint(self) -> tuple[int, int]:
        """One ``PASSIVE`` checkpoint: (pages in the log, pages copied from it).  An error is
        logged and counted, never raised: the next look tries again."""
        try:
            _, pages, copied = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
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
        return int(pages), int(copied)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
