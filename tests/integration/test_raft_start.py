"""A Raft node is built, then run: nothing ticks (no election) until ``start()``, so every
hook and patch is in place before the first tick; the ticks run on the event loop (no thread
of their own: ``raft.ticks = "loop"``) or on a thread of their own (``"thread"``); ``close()``
stops them, and a node closed without being started is closed all the same."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from schedd.config import load_config
from schedd.core.members import Member, Membership
from schedd.raft.node import Hooks, RaftNode, RaftSettings
from tests.conftest import free_port, wait_for


def settings(data_dir: Path, peers: tuple[str, ...] = (), loop: bool = True) -> RaftSettings:
    raft = load_config(None, env={}).raft  # the config's defaults
    return RaftSettings(
        self_addr=f"127.0.0.1:{free_port()}",
        peers=peers,
        data_dir=data_dir,
        append_entries_period_ms=raft.append_entries_period_ms,
        auto_tick_period_ms=raft.auto_tick_period_ms,
        raft_min_timeout_ms=raft.raft_min_timeout_ms,
        raft_max_timeout_ms=raft.raft_max_timeout_ms,
        leader_fallback_timeout_ms=raft.leader_fallback_timeout_ms,
        log_compaction_min_entries=raft.log_compaction_min_entries,
        log_compaction_min_time_ms=raft.log_compaction_min_time_ms,
        hot_window_ms=600_000,
        loop_ticks=loop,
    )


def ticking() -> bool:
    return any(t.name == "schedd-raft-tick" for t in threading.enumerate())


@pytest.mark.parametrize("loop", [True, False], ids=["loop", "thread"])
async def test_a_node_ticks_only_once_started(tmp_path: Path, loop: bool) -> None:
    node = RaftNode(settings(tmp_path / "n1", loop=loop), Hooks())
    node.attach(asyncio.get_running_loop())
    try:
        # a lone voter elects itself within its election timeout (1-2 s) once it ticks
        await asyncio.sleep(2.5)
        assert not node.is_leader and not ticking()
        threads = threading.active_count()
        node.start()
        # on the loop: no thread; else one, the tick thread
        assert ticking() is not loop and threading.active_count() == threads + (not loop)
        await wait_for(lambda: node.is_leader, timeout=10)
    finally:
        await asyncio.to_thread(node.close)
    assert not ticking()


@pytest.mark.parametrize("loop", [True, False], ids=["loop", "thread"])
async def test_a_node_never_started_closes(tmp_path: Path, loop: bool) -> None:
    config = settings(tmp_path / "n1", loop=loop)
    node = RaftNode(config, Hooks())
    await asyncio.to_thread(node.close)
    assert not ticking()
    # its journal and state were closed: a new node opens them again
    again = RaftNode(config, Hooks())
    again.attach(asyncio.get_running_loop())
    again.start()
    try:
        await wait_for(lambda: again.is_leader, timeout=10)
    finally:
        await asyncio.to_thread(again.close)


async def test_a_membership_the_first_apply_adopts_is_not_undone_by_the_start(
    tmp_path: Path,
) -> None:
    # A node killed before its database committed the membership entry finds it in its
    # journal, committed, and applies it in its first tick: that must stay the membership it
    # goes by, not the raft.peers it started with.
    peers = ("127.0.0.1:9", "127.0.0.1:10")  # never reached: the node is not started
    config = settings(tmp_path / "n1", peers)
    node = RaftNode(config, Hooks())
    try:
        assert node.members.index == 0  # raft.peers, nothing recorded yet
        recorded = Membership(
            voters=(Member(config.self_addr, "n1"), Member(peers[0], "n2"), Member(peers[1], "n3")),
            index=7,
            cluster="c1",
        )
        node._sm.on_members(recorded)  # as the first tick's apply does
        node._run_on_tick()  # then the same tick's callbacks
        assert node.members.index == 7 and node.members.cluster == "c1"
    finally:
        await asyncio.to_thread(node.close)


def test_a_node_whose_loop_stopped_closes_at_once(tmp_path: Path) -> None:
    # (a process stopping after its loop ended: nothing is left to run the loop's ticks)
    loop = asyncio.new_event_loop()
    try:
        node = RaftNode(settings(tmp_path / "n1"), Hooks())
        node.attach(loop)
        node.start()
        started = time.monotonic()
        node.close()
        assert time.monotonic() - started < 5
    finally:
        loop.close()
