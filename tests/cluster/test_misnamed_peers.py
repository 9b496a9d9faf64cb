"""Nodes that know each other by other addresses than their own ``raft.listen`` (a proxy or a
NAT between them: here tests/cluster/proxy.py, through which every other node reaches node i
at its proxy port) must keep running: the leader records no membership that would name a node
by an address the node does not know as its own (each would be told it is not a member, and
stop), and refuses membership changes, saying why."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.cluster.harness import Cluster
from tests.cluster.members import NODES, call, members
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


async def test_a_proxied_cluster_keeps_its_configured_membership(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "c", proxied=True)
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_serving(http)
            log = cluster.nodes[leader].log
            await wait_for(  # the leader says why it records nothing, or a node has stopped
                lambda: (
                    "cluster.membership_not_recorded" in log.read_text()
                    or not all(n.alive for n in cluster.nodes)
                ),
                timeout=30,
            )
            await asyncio.sleep(2.0)  # four more looks of the leader's membership loop
            assert all(n.alive for n in cluster.nodes), cluster.logs()
            for i in range(3):
                view = await members(http, cluster, i)
                assert view is not None and view["source"] == "config", view
            status, body = await call(
                http, cluster, leader, "POST", NODES, {"raft": "127.0.0.1:31990"}
            )
            assert status == 409 and "raft.listen" in body["error"]["message"], body
            assert all(n.alive for n in cluster.nodes), cluster.logs()
            view = await members(http, cluster, leader)
            assert view is not None and view["index"] == 0 and len(view["nodes"]) == 3, view
    finally:
        cluster.stop()
