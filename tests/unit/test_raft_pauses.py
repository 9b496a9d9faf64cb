"""schedd/raft/pauses.py on real pysyncobj nodes (real sockets), ticked by hand: one of three can
be paused exactly (not ticked for longer than its election timeout while the others go on, which
is what a long garbage collection or a starved tick thread does to a node), and one tick's
applies can be counted."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from schedd.raft.patches import ApplyBatch, bound_apply, read_before_judging
from tests.conftest import free_port

MIN_TIMEOUT, MAX_TIMEOUT = 0.3, 0.6
T = TypeVar("T")


def hand_ticked(tmp_path: Path, i: int) -> SyncObjConf:
    """Node ``i`` of a three-node test cluster: ticked by hand, short election timeouts."""
    return SyncObjConf(
        autoTick=False,
        raftMinTimeout=MIN_TIMEOUT,
        raftMaxTimeout=MAX_TIMEOUT,
        leaderFallbackTimeout=MAX_TIMEOUT,
        appendEntriesPeriod=0.05,
        journalFile=str(tmp_path / f"j{i}"),
        fullDumpFile=str(tmp_path / f"d{i}"),
    )


@contextmanager
def three(tmp_path: Path, cls: Callable[..., T]) -> Iterator[list[T]]:
    """Three hand-ticked nodes of class ``cls`` (a SyncObj), destroyed afterwards."""
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    made: list[T] = []
    try:
        for i, addr in enumerate(addrs):
            made.append(cls(addr, [a for a in addrs if a != addr], hand_ticked(tmp_path, i)))
        yield made
    finally:
        for n in made:
            cast(Any, n).destroy()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[SyncObj]]:
    with three(tmp_path, SyncObj) as made:
        yield made


def tick(nodes: list[SyncObj], seconds: float, skip: SyncObj | None = None) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for n in nodes:
            if n is not skip:
                n.doTick(0.002)


def settled(nodes: list[SyncObj]) -> tuple[int, SyncObj]:
    """Tick until one leader every node follows has lasted a whole election timeout."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        tick(nodes, MAX_TIMEOUT)
        leaders = [n for n in nodes if n._isLeader()]
        terms = {n.raftCurrentTerm for n in nodes}
        if len(leaders) == 1 and len(terms) == 1 and all(n._getLeader() for n in nodes):
            term = terms.pop()
            tick(nodes, MAX_TIMEOUT)
            if leaders[0]._isLeader() and {n.raftCurrentTerm for n in nodes} == {term}:
                return term, leaders[0]
    raise AssertionError("no stable leader within 30 s")


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_paused_follower_reads_the_heartbeats_before_its_election_deadline(
    nodes: list[SyncObj], wrapped: bool
) -> None:
    if wrapped:
        for n in nodes:
            read_before_judging(n)
    term, leader = settled(nodes)
    follower = next(n for n in nodes if n is not leader)
    tick(nodes, 2 * MAX_TIMEOUT, skip=follower)  # the follower's thread does not run
    follower.doTick(0.002)  # its first tick after the pause
    if wrapped:
        assert follower.raftCurrentTerm == term and follower._getLeader() is not None
        tick(nodes, 2 * MAX_TIMEOUT)
        assert leader._isLeader() and {n.raftCurrentTerm for n in nodes} == {term}
    else:  # pysyncobj alone: the heartbeats wait in its socket, it calls an election
        assert follower.raftCurrentTerm == term + 1


def test_a_follower_whose_leader_died_meanwhile_still_calls_an_election(
    nodes: list[SyncObj],
) -> None:
    for n in nodes:
        read_before_judging(n)
    term, leader = settled(nodes)
    follower = next(n for n in nodes if n is not leader)
    others = [n for n in nodes if n is not leader]
    leader.destroy()  # gone while the follower was paused: nothing waits in its socket
    nodes.remove(leader)
    tick(others, 2 * MAX_TIMEOUT, skip=follower)
    deadline = time.monotonic() + 10
    while follower.raftCurrentTerm == term and time.monotonic() < deadline:
        tick(others, 0.05)
    assert follower.raftCurrentTerm > term


def test_a_wrapped_node_still_writes_snapshots(tmp_path: Path) -> None:
    """pysyncobj pickles the SyncObj's own attributes into snapshots: the wrapper must not be
    one of them (a closure does not pickle, and every snapshot write failed)."""
    conf = SyncObjConf(
        autoTick=False,
        journalFile=str(tmp_path / "j"),
        fullDumpFile=str(tmp_path / "d"),
        logCompactionMinEntries=2,
        logCompactionMinTime=0.01,
    )
    obj = SyncObj(f"127.0.0.1:{free_port()}", [], conf)
    try:
        read_before_judging(obj)
        deadline = time.monotonic() + 10
        while not obj._isLeader() and time.monotonic() < deadline:
            obj.doTick(0.01)
        obj.forceLogCompaction()
        while not (tmp_path / "d").exists() and time.monotonic() < deadline:
            obj.doTick(0.01)
        assert (tmp_path / "d").exists(), "no snapshot was written"
    finally:
        obj.destroy()


class Slow(SyncObj):
    """A replicated method that takes a while to apply, like an entry of a thousand jobs."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.applied: list[int] = []

    @replicated
    def work(self, n: int) -> int:
        time.sleep(0.02)
        self.applied.append(n)
        return n


@pytest.mark.parametrize("bounded", [False, True])
def test_one_tick_applies_at_most_its_budget_of_entries(tmp_path: Path, bounded: bool) -> None:
    # pysyncobj takes queued commands into its log for one appendEntriesPeriod a tick; a long
    # one makes "all ten in one tick" hold on a loaded machine (four were taken in 100 ms once)
    conf = SyncObjConf(
        autoTick=False,
        journalFile=str(tmp_path / "j"),
        fullDumpFile=str(tmp_path / "d"),
        appendEntriesPeriod=0.5,
        raftMinTimeout=1.6,
        raftMaxTimeout=1.8,
    )
    obj = Slow(f"127.0.0.1:{free_port()}", [], conf)
    try:
        if bounded:
            bound_apply(obj, budget=0.05)
        deadline = time.monotonic() + 10
        while not obj._isLeader() and time.monotonic() < deadline:
            obj.doTick(0.01)
        results: list[tuple[object, int]] = []
        for n in range(10):
            obj.work(n, callback=lambda res, err: results.append((res, err)))
        per_tick = []  # entries applied by each tick
        while len(obj.applied) < 10 and time.monotonic() < deadline:
            before = len(obj.applied)
            obj.doTick(0)
            per_tick.append(len(obj.applied) - before)
        if bounded:  # what fits in 50 ms of 20 ms entries, over several ticks
            assert 1 <= max(per_tick) <= 4 and sum(1 for k in per_tick if k) >= 3
        else:  # pysyncobj alone: everything committed, in one tick
            assert max(per_tick) == 10
        assert obj.applied == list(range(10))  # all of them, in order, each once
        assert results == [(n, FAIL_REASON.SUCCESS) for n in range(10)]
    finally:
        obj.destroy()


def test_the_entries_of_a_tick_are_applied_between_begin_and_end_and_answered_after(
    tmp_path: Path,
) -> None:
    conf = SyncObjConf(
        autoTick=False, journalFile=str(tmp_path / "j"), fullDumpFile=str(tmp_path / "d")
    )
    obj = Slow(f"127.0.0.1:{free_port()}", [], conf)
    seen: list[object] = []
    flags: list[bool] = []  # before each entry: whether a caller here waits for it

    class Around(ApplyBatch):
        def begin(self) -> None:
            seen.append("begin")

        def end(self) -> None:
            seen.append(("end", list(obj.applied)))

        def idle(self) -> None:
            seen.append("idle")

        def awaited(self, waited: bool) -> None:
            flags.append(waited)

    try:
        bound_apply(obj, budget=0.05, batch=Around())
        deadline = time.monotonic() + 10
        while not obj._isLeader() and time.monotonic() < deadline:
            obj.doTick(0.01)
        seen.clear()
        flags.clear()  # (the new leader's own first entry: nobody waits for it)
        for n in range(6):
            obj.work(n, callback=lambda res, err: seen.append(("answer", res, list(obj.applied))))
        while len(obj.applied) < 6 and time.monotonic() < deadline:
            obj.doTick(0)
        seen[:] = [x for x in seen if x != "idle"]  # ticks before the entries were committed
        ticks = [k for k, x in enumerate(seen) if x == "begin"]
        assert len(ticks) >= 2  # 20 ms entries, 50 ms budget: several ticks
        for start, stop in zip(ticks, [*ticks[1:], len(seen)], strict=True):
            one = seen[start:stop]
            end = next(k for k, x in enumerate(one) if isinstance(x, tuple) and x[0] == "end")
            assert not [x for x in one[:end] if isinstance(x, tuple)]  # none before the end
            answered = [x for x in one[end + 1 :] if isinstance(x, tuple)]
            # every answer of the tick comes after its end, when all its entries were applied
            assert all(a[0] == "answer" and a[2] == one[end][1] for a in answered)
            assert [a[1] for a in answered] == one[end][1][len(one[end][1]) - len(answered) :]
        assert [x[1] for x in seen if isinstance(x, tuple) and x[0] == "answer"] == list(range(6))
        seen.clear()
        obj.doTick(0)  # nothing left to apply
        assert seen == ["idle"]
        assert flags == [True] * 6
        obj.work(6)  # nobody waits for this one
        while len(obj.applied) < 7 and time.monotonic() < deadline:
            obj.doTick(0)
        assert flags == [True] * 6 + [False]
    finally:
        obj.destroy()
