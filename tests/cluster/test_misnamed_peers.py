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


async def test_a_node_that_alone_names_the_leader_otherwise_keeps_the_membership_unrecorded(
    tmp_path: Path,
) -> None:
    """Only node 2 reaches node 1 through a forwarder (its raft.peers names the forwarder);
    node 1 knows node 2 by its raft.listen and leads.  Node 1 cannot see the other name in its
    own peers, only in node 2's hello: a membership recorded now would name node 1 by its
    raft.listen, and node 2 would go round the forwarder.  Nothing is recorded."""
    from tests.cluster.test_raft_secret import Tap
    from tests.conftest import free_port

    p1, tap_port, p2 = sorted(free_port() for _ in range(3))
    cluster = Cluster(
        tmp_path / "c",
        size=2,
        http_ports=[p1, p2],
        node_raft={
            # node 2 times out later, so node 1 (the one that cannot tell) is elected
            1: {
                "peers": [f"127.0.0.1:{tap_port}"],
                "peer_http": [f"http://127.0.0.1:{p1}"],
                "raft_min_timeout": "2500ms",
                "raft_max_timeout": "3500ms",
            },
        },
    )
    tap = Tap(tap_port, p1 + 1)
    tap.start()
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            assert await cluster.wait_leader(http) == 0
            log = cluster.nodes[0].log
            said = await wait_for(
                lambda: [
                    line
                    for line in log.read_text().splitlines()
                    if "cluster.membership_not_recorded" in line or "op=record" in line
                ],
                timeout=30,
            )
            assert "cluster.membership_not_recorded" in said[0], said
            assert f"127.0.0.1:{tap_port}" in said[0], said  # names the other name
            for i in range(2):
                view = await members(http, cluster, i)
                assert view is not None and view["source"] == "config", view
    finally:
        cluster.stop()
        tap.stop()
