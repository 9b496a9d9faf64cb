"""The leader's hot window (``scheduler.hot_window``): runs due later than the window wait in the
state database, not in the leader's memory; they are loaded as time comes near and fire on
time; a new leader loads only the window (plus what is queued or running)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from schedd.protocol import messages
from tests.conftest import Node, restart_leader_in_new_term, running_node, start_node, wait_for
from tests.integration.test_worker_protocol import connect, submit


@pytest.fixture
async def windowed(tmp_path: Path) -> AsyncIterator[Node]:
    async with running_node(tmp_path / "n1", hot_window="2s", dispatch_ahead="0s") as n:
        yield n


def in_wheel(node: Node, run_id: str) -> bool:
    leader = node.rt.leader
    assert leader is not None
    return run_id in leader.wheel


async def test_a_run_due_beyond_the_window_waits_on_disk_and_fires_on_time(
    windowed: Node, http: aiohttp.ClientSession
) -> None:
    w = await connect(http, windowed, "w-window")
    near = await submit(http, windowed, {"task": "t", "schedule": {"in": "500ms"}})
    far = await submit(http, windowed, {"task": "t", "schedule": {"in": "4s"}})
    near_run, far_run = near["latest_run"]["id"], far["latest_run"]["id"]
    assert in_wheel(windowed, near_run) and not in_wheel(windowed, far_run)
    first = await w.expect(messages.Lease, timeout=10)
    assert first.run_id == near_run
    await w.send(messages.Complete(run_id=first.run_id, fence=first.fence))
    assert (await w.expect(messages.Ack)).accepted
    await wait_for(lambda: in_wheel(windowed, far_run), timeout=10)  # loaded as it came near
    second = await w.expect(messages.Lease, timeout=10)
    received = time.time()
    assert second.run_id == far_run
    due = int(far_run.rpartition("@")[2]) / 1000
    assert due <= received < due + 1.5, received - due
    await w.ws.close()


async def test_a_new_leader_loads_only_the_window_and_what_is_live(
    windowed: Node, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = await connect(http, windowed, "w-live")
    soon = await submit(http, windowed, {"task": "t"})
    lease = await w.expect(messages.Lease, timeout=10)  # running: must be tracked by the new leader
    assert lease.run_id == soon["latest_run"]["id"]
    far = [await submit(http, windowed, {"task": "t", "schedule": {"in": "1h"}}) for _ in range(5)]
    near = await submit(http, windowed, {"task": "t", "schedule": {"in": "1500ms"}})
    leader = await restart_leader_in_new_term(windowed.rt, monkeypatch)
    new = windowed.rt.leader
    assert new is not None and new is not leader
    assert in_wheel(windowed, near["latest_run"]["id"])
    assert not any(in_wheel(windowed, j["latest_run"]["id"]) for j in far)
    assert soon["latest_run"]["id"] in new.leases
    await w.ws.close()


async def test_a_new_leader_reads_a_large_window_a_chunk_per_tick(
    tmp_path: Path, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each read of the window holds the state's lock, which the Raft thread needs: a window of
    # many runs is read in chunks of LOAD_CHUNK (3 here), one per tick of the leader's loop;
    # runs due in the same millisecond as many as a chunk come in one read.
    from schedd.leader import core as leader_core

    monkeypatch.setattr(leader_core, "LOAD_CHUNK", 3)
    node = await start_node(tmp_path / "n1", hot_window="1h", dispatch_ahead="0s")
    try:
        spread = [
            await submit(http, node, {"task": "t", "schedule": {"in": f"{30 + k}s"}})
            for k in range(8)
        ]
        same = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
        together = [
            await submit(http, node, {"task": "t", "schedule": {"at": same}}) for _ in range(4)
        ]
        ids = [j["latest_run"]["id"] for j in spread + together]
        added: list[int] = []
        real = leader_core.LeaderCore._load_window

        def counting(self: leader_core.LeaderCore, until: int) -> None:
            before = len(self.wheel)
            real(self, until)
            added.append(len(self.wheel) - before)

        monkeypatch.setattr(leader_core.LeaderCore, "_load_window", counting)
        await restart_leader_in_new_term(node.rt, monkeypatch)
        await wait_for(lambda: all(in_wheel(node, r) for r in ids), timeout=10)
        new = node.rt.leader
        assert new is not None
        await wait_for(lambda: not new.core.loading, timeout=10)
        loaded = [n for n in added if n]
        assert sum(loaded) == len(ids)
        assert len(loaded) >= 4 and max(loaded) == 4  # chunks of at most 3, and the 4 together
    finally:
        await node.rt.stop()
