"""A one-node cluster whose node was restarted under another ``raft.listen`` is that cluster,
under its new address, whether the membership naming the old address is in its state at start
or applied from its log after the start (a record appended just before it stopped: the clean
stop now keeps it in the journal, and it commits once the node leads again)."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from schedd import clock
from schedd.core import commands
from schedd.core.state import Ok
from schedd.leader.leader import leader_rid
from tests.conftest import start_node, wait_for
from tests.integration.test_api import post


async def test_a_lone_node_follows_a_membership_its_log_names_it_in_by_an_old_address(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    node = await start_node(tmp_path / "n1")
    rt = node.rt
    try:
        await wait_for(lambda: rt.node.members.index > 0, timeout=20)  # recorded
        current = rt.node.members
        [me] = current.voters
        old = "127.0.0.1:9"  # an address this node does not have (any more)
        moved = {**current.to_json(), "voters": [[old, me.id, me.http]]}
        res = await rt.node.submit(
            commands.Members(
                leader_rid(), clock.wall_ms(), rt.leader.fence, current.index, "record", old, moved
            )
        )
        assert isinstance(res, Ok), res
        await wait_for(lambda: rt.node.members.index == res.value, timeout=10)
        assert rt.node.role_in_cluster == "voter"
        assert rt.node.members.voter_addresses() == {rt.node.raft_self}
        status, body = await post(http, node, "/jobs", {"task": "t", "schedule": {"in": "1h"}})
        assert status == 201, body  # it still leads: a write commits
    finally:
        await rt.stop()
