"""A slow disk: every fsync on one node takes 50-500 ms longer (a lossy FUSE mount that delays
it, tests/cluster/lossyfs.py), under a steady load of submits.  A majority stays healthy, so
the cluster keeps its leader - no election, the term unchanged - and keeps acknowledging jobs;
once the disk is fast again the slow node catches up: every acknowledged job is there, and it
has applied everything the leader committed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.cluster.lossyfs import available, lossy_cluster
from tests.cluster.test_power_loss import check_every_node, submitting
from tests.cluster.test_stalled_follower import _metric
from tests.conftest import wait_for

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(300),
    pytest.mark.skipif(available() is not None, reason=str(available())),
    pytest.mark.long,  # the fault-injection tier (scripts/test --long)
]

LOAD_S = 10.0
ELECTIONS = "schedd_raft_elections_started_total"


@pytest.mark.parametrize("role", ["follower", "leader"])
async def test_a_slow_disk_on_one_node_keeps_the_leader_and_the_node_catches_up(
    tmp_path: Path, role: str
) -> None:
    with lossy_cluster(tmp_path) as (cluster, disks):
        cluster.start()
        async with aiohttp.ClientSession() as http:
            leader = await cluster.wait_leader(http)
            view = await cluster.view(http, leader)
            assert view is not None
            term = view["term"]
            slow = leader if role == "leader" else (leader + 1) % cluster.size
            await wait_for(lambda: cluster.view(http, slow), timeout=30)  # it has started
            started = [await _metric(http, cluster, i, ELECTIONS) for i in range(cluster.size)]
            disks[slow].call("seed 19")
            disks[slow].call("delay 50 500")
            acked: list[str] = []
            async with submitting(http, cluster, acked):
                await asyncio.sleep(LOAD_S)
            status = disks[slow].call("status")
            disks[slow].call("delay 0")
            # the disk was slow: at least 20 delayed syncs on that node
            assert status["fsyncs"] >= 20 and status["fsync_delayed_s"] >= 20 * 0.05, status
            assert len(acked) >= 30, len(acked)  # the cluster kept taking jobs
            for i in range(cluster.size):
                v = await cluster.view(http, i)
                assert v is not None, i
                assert (v["term"], v["leader"]) == (term, cluster.nodes[leader].node_id), (i, v)
            after = [await _metric(http, cluster, i, ELECTIONS) for i in range(cluster.size)]
            assert after == started  # no election anywhere
            await check_every_node(http, cluster, acked)

            async def caught_up() -> bool:
                lv = await cluster.view(http, leader)
                sv = await cluster.view(http, slow)
                return bool(lv and sv and sv["applied_index"] >= lv["commit_index"])

            await wait_for(caught_up, timeout=30)
