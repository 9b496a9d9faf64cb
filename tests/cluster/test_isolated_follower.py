"""A follower cut off from the others for 30 s rejoins without an election: the leader stays,
the term does not move on any node.  Its frames are dropped both ways by the Raft proxy while
the connections stay up (the worst case: without pre-vote its election timer fires again and
again, its term runs away, and on its return the leader sees the higher term and steps down)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.cluster.harness import Cluster
from tests.cluster.test_stalled_follower import _metric
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(150)]

ISOLATED_S = 30.0


async def test_a_follower_isolated_for_30_s_rejoins_without_an_election(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "c", proxied=True)
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_leader(http)
            view = await cluster.view(http, leader)
            assert view is not None
            term = view["term"]
            follower = next(i for i in range(cluster.size) if i != leader)
            await wait_for(
                lambda: _leader_named(cluster, http, follower, cluster.nodes[leader].node_id),
                timeout=10,
            )
            started = [
                await _metric(http, cluster, i, "schedd_raft_elections_started_total")
                for i in range(cluster.size)
            ]
            for other in range(cluster.size):
                if other != follower:  # silently, both ways: the connections stay up
                    cluster.net.cut_one_way(follower, other)
                    cluster.net.cut_one_way(other, follower)
            await asyncio.sleep(ISOLATED_S)
            lost = await _metric(http, cluster, follower, "schedd_raft_prevote_rounds_total")
            cluster.net.heal()
            await wait_for(
                lambda: _leader_named(cluster, http, follower, cluster.nodes[leader].node_id),
                timeout=10,
            )
            await asyncio.sleep(2)  # a few election timeouts after the heal: nothing happens
            for i in range(cluster.size):
                v = await cluster.view(http, i)
                assert v is not None and v["term"] == term, (i, v, cluster.logs())
                assert v["leader"] == cluster.nodes[leader].node_id
            after = [
                await _metric(http, cluster, i, "schedd_raft_elections_started_total")
                for i in range(cluster.size)
            ]
            assert after == started  # no election anywhere
            assert lost >= 10  # it kept asking while cut off, and was never answered
    finally:
        cluster.stop()


async def _leader_named(cluster: Cluster, http: aiohttp.ClientSession, i: int, leader: str) -> bool:
    v = await cluster.view(http, i)
    return v is not None and v["leader"] == leader
