"""schedd/raft/patches.py: the start-up check that the installed pysyncobj is the one the patches
fit, and the fast append (new entries sent at once, not at the next append period, unless an
append is still in flight) on real pysyncobj nodes ticked by hand."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.monotonic import monotonic as raft_clock

from schedd.raft import patches
from schedd.raft.patches import (
    PysyncobjMismatch,
    append_due,
    append_now,
    check_installed,
    check_node,
    keep_next_index,
)
from tests.conftest import free_port

APPEND_PERIOD = 1.0


# -- the start-up check -----------------------------------------------------------------------------
def test_the_installed_pysyncobj_passes_the_check() -> None:
    check_installed()


def test_another_version_is_refused_saying_which_and_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(patches.metadata, "version", lambda name: "0.3.18")
    with pytest.raises(
        PysyncobjMismatch,
        match=r"pysyncobj 0\.3\.18 is installed; schedd "
        r"patches pysyncobj 0\.3\.17 and runs only",
    ):
        check_installed()


def test_a_missing_private_method_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(SyncObj, "_SyncObj__getEntries")
    with pytest.raises(PysyncobjMismatch, match=r"pysyncobj lacks SyncObj\._SyncObj__getEntries;"):
        check_installed()


def test_an_apply_step_unlike_the_copied_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        patches.inspect, "getsource", lambda obj: "def __applyLogEntries(self): pass\n"
    )
    with pytest.raises(
        PysyncobjMismatch,
        match=r"__applyLogEntries is not the one schedd's "
        r"bound_apply copies",
    ):
        check_installed()


def test_an_election_step_unlike_the_one_pre_vote_knows_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = patches.inspect.getsource

    def source(obj: object) -> str:
        return "def _onTick(self): pass\n" if obj is SyncObj._onTick else real(obj)  # type: ignore[arg-type]

    monkeypatch.setattr(patches.inspect, "getsource", source)
    with pytest.raises(
        PysyncobjMismatch, match=r"SyncObj\._onTick is not the one schedd's pre_vote knows"
    ):
        check_installed()


def test_a_built_node_missing_an_attribute_is_named(tmp_path: Path) -> None:
    conf = SyncObjConf(
        autoTick=False, journalFile=str(tmp_path / "j"), fullDumpFile=str(tmp_path / "d")
    )
    obj = SyncObj(f"127.0.0.1:{free_port()}", [], conf)
    try:
        check_node(obj)
        del obj._SyncObj__lastResponseTime
        with pytest.raises(PysyncobjMismatch, match=r"SyncObj has no _SyncObj__lastResponseTime;"):
            check_node(obj)
    finally:
        obj.destroy()


# -- the fast append: when ------------------------------------------------------------------------
A, B = "a", "b"


@pytest.mark.parametrize(
    ("nxt", "match", "connected", "due"),
    [
        ({A: 11, B: 11}, {A: 10, B: 10}, {A, B}, False),  # all caught up: nothing new to send
        ({A: 10, B: 11}, {A: 9, B: 10}, {A, B}, True),  # A lacks entry 10, nothing in flight
        ({A: 11, B: 11}, {A: 9, B: 10}, {A, B}, False),  # entry 10 is in flight to A: wait
        ({A: 10, B: 11}, {A: 9, B: 8}, {A, B}, False),  # entries in flight to B: wait
        ({A: 10, B: 11}, {A: 9, B: 8}, {A}, True),  # ... unless B is not connected
        ({A: 10, B: 10}, {A: 9, B: 9}, set(), False),  # nobody connected
    ],
)
def test_new_entries_go_out_only_when_no_append_is_in_flight(
    nxt: dict[str, int], match: dict[str, int], connected: set[str], due: bool
) -> None:
    assert append_due(10, nxt, match, connected, [A, B]) is due


# -- the fast append: on real nodes --------------------------------------------------------------------
class Counter(SyncObj):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.values: list[int] = []

    @replicated
    def add(self, n: int) -> int:
        self.values.append(n)
        return n


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Counter, Counter]]:
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    made: list[Counter] = []
    try:
        for i, addr in enumerate(addrs):
            conf = SyncObjConf(
                autoTick=False,
                appendEntriesPeriod=APPEND_PERIOD,
                raftMinTimeout=3.5 * APPEND_PERIOD,
                raftMaxTimeout=4.5 * APPEND_PERIOD,
                connectionTimeout=5 * APPEND_PERIOD,
                journalFile=str(tmp_path / f"j{i}"),
                fullDumpFile=str(tmp_path / f"d{i}"),
            )
            made.append(Counter(addr, [a for a in addrs if a != addr], conf))
        made[0]._SyncObj__raftElectionDeadline = 0  # the first one calls the election at once
        yield made[0], made[1]
    finally:
        for n in made:
            n.destroy()


def tick_until(nodes: list[Counter], done: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for n in nodes:
            n.doTick(0.002)
        if done():
            return True
    return False


def test_a_new_entry_reaches_the_follower_before_the_append_period_would_send_it(
    pair: tuple[Counter, Counter],
) -> None:
    leader, follower = pair
    nodes = [leader, follower]
    assert tick_until(nodes, lambda: leader._isLeader() and follower._getLeader() is not None, 10)
    leader.add(0)
    assert tick_until(nodes, lambda: follower.values == [0], 3 * APPEND_PERIOD)
    # Right after an append went out, pysyncobj sends the next one a whole period later.
    assert tick_until(
        nodes,
        lambda: leader._SyncObj__newAppendEntriesTime > raft_clock() + 0.8 * APPEND_PERIOD,
        3 * APPEND_PERIOD,
    )
    scheduled = leader._SyncObj__newAppendEntriesTime
    leader.add(1)
    leader.doTick(0.002)  # the command is in the leader's log now; nothing has been sent yet
    follower.doTick(0.002)
    assert follower.values == [0] and not append_due(
        leader._SyncObj__getCurrentLogIndex(),
        leader._SyncObj__raftNextIndex,
        leader._SyncObj__raftMatchIndex,
        set(),
        leader._SyncObj__otherNodes,
    )

    assert append_now(leader)  # the follower lacks it, nothing in flight: send it now
    leader.doTick(0.002)  # sends
    assert not append_now(leader)  # in flight until the follower answers: no second copy
    # The follower holds it and acknowledged it: committed (and answered) on the leader before
    # pysyncobj would even have sent it.
    assert tick_until(nodes, lambda: 1 in leader.values, 0.5 * APPEND_PERIOD)
    assert raft_clock() < scheduled


def test_a_follower_is_not_sent_anything_by_a_node_that_does_not_lead(
    pair: tuple[Counter, Counter],
) -> None:
    leader, follower = pair
    assert tick_until([leader, follower], lambda: follower._getLeader() is not None, 10)
    assert not append_now(follower)
    assert not append_now(SimpleNamespace(_isLeader=lambda: False))  # type: ignore[arg-type]


# -- acknowledgements never send entries in flight again ----------------------------------------
@pytest.mark.parametrize("patched", [False, True])
def test_an_acknowledgement_does_not_make_the_leader_send_entries_in_flight_again(
    pair: tuple[Counter, Counter], patched: bool
) -> None:
    leader, follower = pair
    nodes = [leader, follower]
    if patched:
        keep_next_index(leader)
    assert tick_until(nodes, lambda: leader._isLeader() and follower._getLeader() is not None, 10)
    leader.add(0)
    assert tick_until(nodes, lambda: follower.values == [0], 3 * APPEND_PERIOD)
    truncated: list[int] = []
    journal = follower._SyncObj__raftLog
    delete_from = journal.deleteEntriesFrom
    journal.deleteEntriesFrom = lambda i: (truncated.append(i), delete_from(i))[1]
    [peer] = list(leader._SyncObj__raftNextIndex)

    def send_now() -> None:
        leader._SyncObj__newAppendEntriesTime = 0
        leader.doTick(0.0)

    leader.add(1)
    leader.doTick(0.0)  # entry A in the leader's log
    a = leader._SyncObj__getCurrentLogIndex()
    send_now()  # A goes out
    leader.add(2)
    leader.doTick(0.0)  # entry B in the leader's log, not sent yet
    assert tick_until([follower], lambda: follower._SyncObj__getCurrentLogIndex() == a, 2)
    # The follower answered A.  B goes out, and the leader reads that answer in the same tick.
    leader._SyncObj__newAppendEntriesTime = 0
    leader.doTick(0.2)
    assert leader._SyncObj__raftMatchIndex[peer] == a
    in_flight_kept = leader._SyncObj__raftNextIndex[peer] == a + 2
    send_now()  # pysyncobj alone sends B again from there
    assert tick_until(nodes, lambda: leader._SyncObj__raftMatchIndex[peer] == a + 1, 2)
    for _ in range(20):  # let any second copy arrive and be answered
        for n in nodes:
            n.doTick(0.005)
    assert follower.values[:1] == [0] and follower._SyncObj__getCurrentLogIndex() == a + 1
    if patched:
        assert in_flight_kept and truncated == []
    else:  # what pysyncobj 0.3.17 does: B again, and the follower cuts its log to write it again
        assert not in_flight_kept and len(truncated) == 1
