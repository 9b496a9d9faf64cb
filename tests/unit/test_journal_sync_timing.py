"""DurableJournal.on_sync: the seconds of each fdatasync of the journal's file, handed over on
the thread that synced; a hook that fails never fails the journal."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from schedd.raft import journal as jmod
from schedd.raft.journal import DurableJournal

Entry = tuple[bytes, int, int]


def entries(n: int, start: int = 1) -> list[Entry]:
    return [(f"cmd-{i}".encode(), i, 1) for i in range(start, start + n)]


class SlowDisk:
    """The journal's clock, and an fdatasync that takes the next of ``durations`` on it (the
    real one still runs, so what is synced is really on disk)."""

    def __init__(self, durations: list[float]) -> None:
        self.now = 1000.0
        self.durations = list(durations)
        self.synced_on: list[str] = []  # the thread of each fdatasync made

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:  # time.time_ns and the rest: the real ones
        return getattr(time, name)

    def fdatasync(self, fd: int) -> None:
        REAL_FDATASYNC(fd)
        self.synced_on.append(threading.current_thread().name)
        if threading.current_thread() is threading.main_thread():
            self.now += self.durations.pop(0)


REAL_FDATASYNC = jmod._fdatasync


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> SlowDisk:
    d = SlowDisk([0.003, 0.25, 0.0007, 1.5, 0.04])
    monkeypatch.setattr(jmod, "time", d)
    monkeypatch.setattr(jmod, "_fdatasync", d.fdatasync)
    return d


def test_each_sync_of_the_journal_hands_its_seconds_to_the_hook(
    tmp_path: Path, disk: SlowDisk
) -> None:
    path = tmp_path / "raft.journal"
    dump = tmp_path / "raft.dump"
    dump.write_bytes(b"snapshot")
    seen: list[float] = []
    j = DurableJournal(str(path), snapshot_path=str(dump))
    j.on_sync = seen.append
    items = entries(30)
    for e in items[:20]:
        j.add(*e)
    j.sync()
    j.sync()  # nothing pending: no fdatasync, nothing observed
    assert seen == pytest.approx([0.003])
    j.deleteEntriesFrom(15)  # into written records: synced at once
    assert seen == pytest.approx([0.003, 0.25])
    j.deleteEntriesTo(5)  # the copy syncs in the background: not the journal's own syncs
    assert j.finish_compaction(wait=True)  # the copy's last sync, on this thread, before the swap
    assert seen == pytest.approx([0.003, 0.25, 0.0007])
    assert "journal-compaction" in disk.synced_on  # there were syncs the hook was not given
    for e in items[15:20]:
        j.add(*e)
    j._destroy()  # the close syncs what is pending
    assert seen == pytest.approx([0.003, 0.25, 0.0007, 1.5])
    assert list(DurableJournal(str(path))[:]) == items[5:20]


@pytest.mark.parametrize("error", [RuntimeError("metrics broke"), OSError(5, "not the disk")])
def test_a_failing_hook_never_fails_a_sync(
    tmp_path: Path,
    disk: SlowDisk,
    error: Exception,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An OSError out of the hook must not pass for a failed sync (that stops the process).
    failures: list[OSError] = []
    monkeypatch.setattr(DurableJournal, "on_io_failure", staticmethod(failures.append))
    path = tmp_path / "raft.journal"
    calls: list[float] = []

    def hook(seconds: float) -> None:
        calls.append(seconds)
        raise error

    j = DurableJournal(str(path))
    j.on_sync = hook
    items = entries(4)
    with caplog.at_level(logging.ERROR, logger=jmod.__name__):
        for e in items:
            j.add(*e)
            j.sync()
    # called every time, and every time it failed
    assert calls == pytest.approx([0.003, 0.25, 0.0007, 1.5])
    assert failures == [] and j.syncs == 4
    assert len([r for r in caplog.records if "on_sync hook failed" in r.getMessage()]) == 1
    j._destroy()
    assert list(DurableJournal(str(path))[:]) == items
