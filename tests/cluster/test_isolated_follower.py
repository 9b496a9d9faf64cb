"""A follower cut off from its leader for 30 s rejoins without an election: the leader stays,
the term does not move on any node.  The Raft proxy cuts only the leader's link to it, so it
still reaches the other follower - the classic disruptive node: without pre-vote its election
timer fires again and again, each time with a higher term, and the other follower, taking the
higher term, stops following the healthy leader: an election, and another when it comes back.
With pre-vote it asks first, the other follower refuses (it hears from the leader), and nothing
changes."""

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
            cluster.net.cut(leader, follower)  # it still reaches the other follower
            await asyncio.sleep(ISOLATED_S)
            during = await cluster.view(http, leader)
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
            assert during is not None and (during["role"], during["term"]) == ("leader", term)
            # it kept asking while cut off, and the other follower kept saying no
            other = next(i for i in range(cluster.size) if i not in (leader, follower))
            refused = await _metric(http, cluster, other, "schedd_raft_prevotes_refused_total")
            assert refused >= 10, refused
            # and the gap it went without its leader is what its histogram shows, as is the
            # leader's wait for its answers (the same leader and term on both sides of it)
            # (the connection comes back within pysyncobj's connectionRetryTime, 5 s)
            contact = 'schedd_raft_gap_max_seconds{kind="leader_contact"}'
            answer = 'schedd_raft_gap_max_seconds{kind="follower_answer"}'

            async def back() -> bool:
                return await _metric(http, cluster, follower, contact) >= ISOLATED_S - 1

            await wait_for(back, timeout=15)
            assert await _metric(http, cluster, leader, answer) >= ISOLATED_S - 1
            assert await _metric(http, cluster, other, contact) < ISOLATED_S / 3
    finally:
        cluster.stop()


async def _leader_named(cluster: Cluster, http: aiohttp.ClientSession, i: int, leader: str) -> bool:
    v = await cluster.view(http, i)
    return v is not None and v["leader"] == leader
