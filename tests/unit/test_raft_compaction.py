"""``compact_log`` (schedd/raft/patches.py) on a real pysyncobj leader ticked by hand: where a
compaction starts, and when none does.

The node leads a one-voter cluster with a learner that is never started: its match index and
when it last answered are set by the test, as the leader would record them.  The serializer is
replaced by one that records where each compaction would cut the log."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.monotonic import monotonic as raft_clock

from schedd.raft.patches import KEEP_FOR_FOLLOWER_S, compact_log, set_members
from tests.conftest import free_port

ENTRIES = 40


class Counter(SyncObj):
    @replicated
    def add(self, n: int) -> int:
        return n


class Recorder:
    """Stands for the serializer: records each compaction's cut, which finishes at once."""

    def __init__(self) -> None:
        self.cuts: list[int] = []
        self._done: int | None = None

    def checkSerializing(self) -> tuple[int, int | None]:
        if self._done is not None:
            done, self._done = self._done, None
            return SERIALIZER_STATE.SUCCESS, done
        return SERIALIZER_STATE.NOT_SERIALIZING, None

    def serialize(self, data: Any, id: int) -> None:
        self.cuts.append(id)
        self._done = id


def addr() -> str:
    port = free_port()
    while port >= 32768:
        port = free_port()
    return f"127.0.0.1:{port}"


class Setup:
    def __init__(self, tmp: Path) -> None:
        conf = SyncObjConf(
            autoTick=False,
            logCompactionMinEntries=10,
            logCompactionMinTime=3600,
            logCompactionSplit=False,
            journalFile=str(tmp / "j"),
            fullDumpFile=str(tmp / "d"),
        )
        self.obj = Counter(addr(), [], conf)
        self.hold = False
        self.log_bytes = 0
        self.recorder = Recorder()
        self.obj._SyncObj__serializer = self.recorder
        compact_log(
            self.obj,
            holding=lambda: self.hold,
            log_bytes=lambda: self.log_bytes,
            keep_max=1000,
        )
        self.tick_until(self.obj._isLeader)
        self.learner = addr()
        set_members(self.obj, {self.obj.selfNode.id}, {self.learner})
        self.node = next(n for n in self.obj._SyncObj__readonlyNodes if n.id == self.learner)
        for n in range(ENTRIES):
            self.obj.add(n)
        self.tick_until(lambda: self.obj.raftLastApplied >= ENTRIES)
        self.recorder.cuts.clear()

    def tick_until(self, done: Any, seconds: float = 5.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.obj.doTick(0.002)
            if done():
                return
        raise AssertionError("not reached")

    def learner_at(self, match: int, heard_ago: float = 0.0) -> None:
        self.obj._SyncObj__raftMatchIndex[self.node] = match
        self.obj._SyncObj__lastResponseTime[self.node] = raft_clock() - heard_ago

    def ticks(self, n: int = 5) -> None:
        for _ in range(n):
            self.obj.doTick(0.001)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = Setup(tmp_path)
    try:
        yield s
    finally:
        s.obj.destroy()


def test_the_log_is_kept_for_a_learner_that_still_needs_it(setup: Setup) -> None:
    setup.learner_at(12)
    setup.ticks()
    assert setup.recorder.cuts == [11]  # up to what the learner holds, not the last applied


def test_a_learner_not_heard_from_for_long_keeps_nothing(setup: Setup) -> None:
    setup.learner_at(12, heard_ago=KEEP_FOR_FOLLOWER_S + 1)
    setup.ticks()
    assert setup.recorder.cuts == [setup.obj.raftLastApplied - 1]


def test_no_compaction_while_a_copy_is_sent(setup: Setup) -> None:
    setup.learner_at(setup.obj.raftLastApplied)  # caught up: nothing to keep for it
    setup.hold = True
    setup.ticks()
    assert setup.recorder.cuts == []
    setup.hold = False
    setup.ticks()
    assert setup.recorder.cuts == [setup.obj.raftLastApplied - 1]


def test_past_the_cap_the_log_is_compacted_whatever_waits(setup: Setup) -> None:
    setup.learner_at(12)
    setup.hold = True
    setup.log_bytes = 1000
    setup.ticks()
    assert setup.recorder.cuts == [setup.obj.raftLastApplied - 1]


def test_a_forced_compaction_cuts_at_the_last_applied_entry(setup: Setup) -> None:
    setup.learner_at(12)
    setup.obj.forceLogCompaction()
    setup.ticks()
    assert setup.recorder.cuts == [setup.obj.raftLastApplied - 1]
