"""What an applied entry changes reaches the node's leader from the node itself (the runtime
does not pass it on), and a leader whose term ended hears no more of it."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.conftest import start_node, wait_for
from tests.integration.test_api import post


async def test_applied_events_reach_the_leader_and_stop_with_its_term(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    node = await start_node(tmp_path / "n1")
    rt = node.rt
    try:
        await wait_for(lambda: rt.leader is not None and rt.leader.ready.is_set(), timeout=20)
        first = rt.leader
        status, body = await post(http, node, "/jobs", {"task": "t", "schedule": {"in": "5m"}})
        assert status == 201, body
        # the run waits in this leader's wheel: it heard of the entry from the node
        await wait_for(lambda: len(first.wheel) == 1, timeout=10)

        rt._deposed()  # the term ends (as when a newer claim is applied)
        await wait_for(lambda: rt.leader is not None and rt.leader is not first, timeout=20)
        second = rt.leader
        await wait_for(lambda: second.ready.is_set(), timeout=20)
        status, body = await post(http, node, "/jobs", {"task": "t", "schedule": {"in": "6m"}})
        assert status == 201, body
        await wait_for(lambda: len(second.wheel) == 2, timeout=10)  # rebuilt 1, heard 1
        assert len(first.wheel) == 1  # the old leader heard nothing more
    finally:
        await rt.stop()
    assert rt.node._leader_listener is None  # a stopped node's leader follows nothing
